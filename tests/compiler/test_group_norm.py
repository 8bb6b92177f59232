"""Keras' GroupNormalization as TF writes it (round 48's grouped96 of never-seen set 4), TF-free
on a hand-made ONNX graph: an NHWC map reshaped to (1, H, W, G, C/G), moments summed over H, W
and C/G with div_no_nan (a Where of a constant condition), an Expand, and reshaped back. Passes
static_where and merge_5d make it 4-D, equal to onnxruntime in float; it compiles and runs on
the emulator. And PyTorch's GroupNorm export (a 3-D InstanceNormalization)."""
import numpy as np
import pytest
from onnx import helper

from front_helpers import make_model, ort_run
from tl2k210.compiler import ConvertOptions, convert
from tl2k210.graph import from_onnx, run
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.flow import run_pass
from tl2k210.quantize.metrics import sqnr_db

pytest.importorskip("onnxruntime")
N = helper.make_node
RNG = np.random.default_rng(48)
H, W, C, G = 6, 6, 8, 4


def group_norm_model():
    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    count = np.full((1, 1, 1, G, 1), H * W * C // G, np.float32)
    nodes = [N("Transpose", ["x"], ["nhwc"], perm=[0, 2, 3, 1]),
             N("Reshape", ["nhwc", "split"], ["g"]),
             N("ReduceSum", ["g", "axes"], ["s"], keepdims=1),
             N("Div", ["s", "count"], ["q"]),
             N("Where", ["never", "zero", "q"], ["mean"]),          # div_no_nan by a constant count
             N("Sub", ["g", "mean"], ["d"]), N("Mul", ["d", "d"], ["d2"]),
             N("ReduceSum", ["d2", "axes"], ["s2"], keepdims=1),
             N("Div", ["s2", "count"], ["var"]), N("Add", ["var", "eps"], ["ve"]),
             N("Sqrt", ["ve"], ["std"]), N("Reciprocal", ["std"], ["rinv"]),
             N("Expand", ["rinv", "pshape"], ["rinv_c"]),
             N("Mul", ["rinv_c", "gamma"], ["k"]),
             N("Mul", ["g", "k"], ["gk"]), N("Mul", ["mean", "k"], ["mk"]),
             N("Sub", ["beta", "mk"], ["b"]), N("Add", ["gk", "b"], ["yg"]),
             N("Reshape", ["yg", "merge"], ["y4"]), N("Relu", ["y4"], ["r"]),
             N("Transpose", ["r"], ["y"], perm=[0, 3, 1, 2])]
    inits = {"split": i64([1, H, W, G, C // G]), "axes": i64([1, 2, 4]), "count": count,
             "never": np.zeros((1, 1, 1, G, 1), bool), "zero": np.zeros((1, 1, 1, G, 1), np.float32),
             "eps": np.array(1e-3, np.float32), "pshape": i64([1, 1, 1, G, C // G]),
             "gamma": RNG.uniform(0.5, 1.5, (1, 1, 1, G, C // G)).astype(np.float32),
             "beta": RNG.uniform(-0.2, 0.2, (1, 1, 1, G, C // G)).astype(np.float32),
             "merge": i64([1, H, W, C])}
    return make_model(nodes, [("x", [1, C, H, W])], [("y", [1, C, H, W])], inits)


def test_group_norm_made_4d_is_exact_in_float():
    m = group_norm_model()
    g, changes = run_pass("static_where", from_onnx(m))
    assert not any(n.op in ("Where", "Expand") for n in g.nodes)
    g, changes = run_pass("merge_5d", g)
    assert changes and all(len(t.shape) <= 4 for t in g.tensors.values() if t.shape is not None)
    for _ in range(3):
        x = (RNG.standard_normal((1, C, H, W)) * 2 + 1).astype(np.float32)
        np.testing.assert_allclose(run(g, x)["y"], ort_run(m, x)[0], rtol=1e-4, atol=1e-5)


def kmodel_sqnrs(m, tmp_path, shape, n):
    """Convert `m` on 8 random uint8 frames of `shape` (a 4-D input is pixels: range 0..1) and
    return the kmodel's SQNR against onnxruntime on the first `n` of them."""
    data = RNG.integers(0, 256, (8,) + shape).astype(np.uint8)
    np.save(tmp_path / "d.npy", data)
    convert(m, tmp_path / "m.kmodel", ConvertOptions(dataset=str(tmp_path / "d.npy"), progress=False,
                                                     min_sqnr=0))
    emu = Emulator.load(tmp_path / "m.kmodel")
    out = []
    for x in data[:n]:
        want = ort_run(m, x[None].astype(np.float32) / 255)[0]
        got = np.asarray(emu.run(x.reshape(-1))[0], np.float32).reshape(want.shape)
        out.append(sqnr_db(want.astype(np.float64), got.astype(np.float64)))
    return out


def test_group_norm_compiles_and_runs(tmp_path):
    assert min(kmodel_sqnrs(group_norm_model(), tmp_path, (C, H, W), 3)) > 30


def test_merge_5d_leaves_a_region_whose_axes_differ():
    """A 5-D map scaled per row (H) but not per column (W): merging H and W would change the
    broadcast, and no other adjacent pair fits, so the region stays 5-D (the lowering refuses it)."""
    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    nodes = [N("Reshape", ["x", "split"], ["g"]), N("Mul", ["g", "rows"], ["m"]),
             N("ReduceSum", ["m", "axes"], ["s"], keepdims=1), N("Sub", ["m", "s"], ["d"]),
             N("Reshape", ["d", "merge"], ["y"])]
    m = make_model(nodes, [("x", [1, C, H, W])], [("y", [1, C, H, W])],
                   {"split": i64([1, G, C // G, H, W]),
                    "rows": RNG.uniform(0.5, 1.5, (1, 1, 1, H, 1)).astype(np.float32),
                    "axes": i64([2, 3]), "merge": i64([1, C, H, W])})
    g, changes = run_pass("merge_5d", from_onnx(m))
    assert not changes and len(g.shape("g")) == 5


def torch_group_norm_model():
    """nn.GroupNorm(4, 8) as torch.onnx exports it before opset 18: Reshape to (1, G, -1),
    InstanceNormalization with unit scale, Reshape back, per-channel Mul and Add."""
    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    nodes = [N("Conv", ["x", "w0", "b0"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             N("Reshape", ["c", "s3"], ["r"]), N("InstanceNormalization", ["r", "one", "zero"], ["n"], epsilon=1e-5),
             N("Reshape", ["n", "s4"], ["n4"]), N("Mul", ["n4", "gamma"], ["m"]), N("Add", ["m", "beta"], ["y"])]
    return make_model(nodes, [("x", [1, 3, 16, 16])], [("y", [1, C, 16, 16])],
                      {"w0": (RNG.standard_normal((C, 3, 3, 3)) * 0.3).astype(np.float32),
                       "b0": np.zeros(C, np.float32), "s3": i64([1, G, -1]), "one": np.ones(G, np.float32),
                       "zero": np.zeros(G, np.float32),
                       "s4": i64([1, C, 16, 16]), "gamma": RNG.uniform(0.5, 1.5, (C, 1, 1)).astype(np.float32),
                       "beta": RNG.uniform(-0.2, 0.2, (C, 1, 1)).astype(np.float32)})


def test_torch_group_norm_export_compiles_and_runs(tmp_path):
    m = torch_group_norm_model()
    g, changes = run_pass("instance_norm", from_onnx(m))
    assert changes and not any(n.op == "InstanceNormalization" for n in g.nodes)
    x = RNG.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(run(g, x)["y"], ort_run(m, x)[0], rtol=1e-4, atol=1e-5)
    assert min(kmodel_sqnrs(m, tmp_path, (3, 16, 16), 3)) > 28


@pytest.mark.parametrize("opset", [18, 21])
def test_onnx_group_normalization_op(opset, tmp_path):
    """The ONNX GroupNormalization op (opset 18: scale and bias per group; 21: per channel)."""
    n = (G if opset == 18 else C)
    node = N("GroupNormalization", ["c", "scale", "bias"], ["y"], num_groups=G, epsilon=1e-5)
    m = make_model([N("Conv", ["x", "w0", "b0"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), node],
                   [("x", [1, 3, 16, 16])], [("y", [1, C, 16, 16])],
                   {"w0": (RNG.standard_normal((C, 3, 3, 3)) * 0.3).astype(np.float32), "b0": np.zeros(C, np.float32),
                    "scale": RNG.uniform(0.5, 1.5, n).astype(np.float32),
                    "bias": RNG.uniform(-0.2, 0.2, n).astype(np.float32)}, opset=opset)
    g, changes = run_pass("group_norm", from_onnx(m))
    g, _ = run_pass("instance_norm", g)
    assert not any(n.op in ("GroupNormalization", "InstanceNormalization") for n in g.nodes)
    x = RNG.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(run(g, x)["y"], ort_run(m, x)[0], rtol=1e-4, atol=1e-5)
    assert min(kmodel_sqnrs(m, tmp_path, (3, 16, 16), 1)) > 28
