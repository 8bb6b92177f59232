"""The lowering registry and its functions, TF-free: hand-made ONNX graphs, onnxruntime as the
float reference, the bit-exact emulator for the kmodel."""
import ast
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from lower_helpers import compile_model, conv_node, make_model, pixels, sqnr
from tl2k210.errors import UnsupportedOpError
from tl2k210.graph import from_onnx
from tl2k210.k210.lower import REGISTRY, Options, registry, select, supported_ops
from tl2k210.passes import run_pipeline

pytest.importorskip("onnxruntime")
LOWER = Path(__file__).resolve().parents[1] / "tl2k210" / "k210" / "lower"


def test_every_registered_op_has_a_lowering_or_names_its_format():
    for op, alts in REGISTRY.items():
        assert alts == sorted(alts, key=lambda a: registry.UNIT_RANK[a.unit]), op   # KPU first
        for a in alts:
            assert a.fn is not None or a.formats != ("v3",), (op, a.name)
    assert {"Conv", "Add", "Concat", "Resize", "MaxPool", "Softmax", "Reshape", "Squeeze",
            "Identity", "Unsqueeze", "LeakyRelu", "Tanh", "HardSigmoid", "HardSwish"} <= set(supported_ops())
    assert "Slice" not in supported_ops() and any("v4" in a.formats for a in REGISTRY["Slice"])


def test_no_hardware_numbers_in_the_lowering():
    """KPU facts come from hardware.py: no literal that is a KPU limit, size or code
    (4 is left out: it is also the size of a float32)."""
    facts = {16, 30720, 32768, 1024, 512, 256, 64, 63, 144}
    for f in LOWER.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and type(node.value) is int:
                assert node.value not in facts, f"{f.name}:{node.lineno}: literal {node.value}"


def test_check_supported_asks_the_registry():
    """'Supported' means 'lowered': the pass refuses what the lowering refuses, before calibration."""
    m = make_model([helper.make_node("Resize", ["x", "", "s"], ["y"], name="up", mode="linear")],
                   [("x", [1, 4, 8, 8])], [("y", None)], {"s": np.array([1, 1, 2, 2], np.float32)})
    with pytest.raises(UnsupportedOpError) as e:
        run_pipeline(from_onnx(m))
    msg = str(e.value)
    assert "'up'" in msg and "mode=linear" in msg and "mode nearest" in msg and "needs `--format v4`" in msg


def test_refusal_lists_every_alternative():
    m = make_model([conv_node("c", "x", "w", dilations=[2, 2], pads=[2, 2, 2, 2])],
                   [("x", [1, 4, 8, 8])], [("c", None)], {"w": np.ones((4, 4, 3, 3), np.float32)})
    g = from_onnx(m)
    with pytest.raises(UnsupportedOpError, match=r"(?s)'c'.*dilations=\(2, 2\).*kpu_conv \(KPU\): dilations"):
        select(g, g.nodes[0], Options())


def test_dense_first_layer_is_float_fully_connected():
    """A dense layer on the model's float input must be FULLY_CONNECTED (MaixPy and the SDK start
    a kmodel with K210_CONV or FULLY_CONNECTED): chosen without --float-fc, and the receipt says why."""
    from tl2k210.k210.emulator import Emulator
    from tl2k210.quantize import calibrate
    from tl2k210.k210.lower import lower
    rng = np.random.default_rng(1)
    n = helper.make_node
    m = make_model([n("Gemm", ["x", "w1", "b1"], ["h"], transB=1), n("Relu", ["h"], ["r"]),
                    n("Gemm", ["r", "w2", "b2"], ["y"], transB=1)], [("x", [1, 6])], [("y", None)],
                   {"w1": rng.normal(size=(12, 6)).astype(np.float32), "b1": rng.normal(size=12).astype(np.float32),
                    "w2": rng.normal(size=(3, 12)).astype(np.float32), "b2": rng.normal(size=3).astype(np.float32)})
    g, _ = run_pipeline(from_onnx(m))
    xs = [rng.normal(size=(1, 6)).astype(np.float32) for _ in range(16)]
    model, rows, _, _ = lower(g, calibrate.ranges(calibrate.collect(g, xs, histograms=False)))
    assert [L.name for L in model.layers] == ["FULLY_CONNECTED", "FULLY_CONNECTED"]
    assert "reads the model's float input" in rows[0].notes[0]
    assert "float layer is cheaper" in rows[1].notes[0]
    from front_helpers import ort_run
    emu = Emulator(model)
    for x in xs:
        np.testing.assert_allclose(emu.run(x.reshape(-1))[0], ort_run(m, x)[0].reshape(-1), rtol=1e-5, atol=1e-5)


def test_relabels_are_free():
    """Squeeze/Unsqueeze/Identity/Transpose of size-1 axes: no kmodel layer at all."""
    n = helper.make_node
    nodes = [conv_node("c", "x", "w", "b", pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
             n("GlobalAveragePool", ["r"], ["p"]), n("Transpose", ["p"], ["t"], perm=[0, 2, 3, 1]),
             n("Squeeze", ["t", "ax"], ["s"]), n("Identity", ["s"], ["y"])]
    rng = np.random.default_rng(2)
    m = make_model(nodes, [("x", [1, 3, 16, 16])], [("y", None)],
                   {"w": rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "b": np.zeros(8, np.float32),
                    "ax": np.array([1, 2], np.int64)})
    px = pixels(6, 3, 16, 16)
    model, rows, _, _ = compile_model(m, px)
    assert [L.name for L in model.layers] == ["K210_CONV", "DEQUANTIZE", "GLOBAL_AVERAGE_POOL2D"]
    assert sqnr(m, model, px) > 30
