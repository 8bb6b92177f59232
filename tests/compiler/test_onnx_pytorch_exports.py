"""Conformance on real PyTorch exports: the onnx wheel's `backend/test/data/pytorch-converted`
(82 single-layer nn.Modules) and `pytorch-operator` (35 torch functions), each a model.onnx
(old opsets and IR versions, fixed batches of 1-20) with a reference input and output.

Every model whose input a K210 model can take (one float input: a vector, a (C, L) signal or a
(C, H, W) map) ends in exactly one of:
* converted (`tl2k210.compiler.convert`, --format auto, calibrated on the reference input and
  seeded perturbations of it) and the kmodel on the bit-exact emulator, fed what the device gets
  (the metadata's pixel mapping, one sample at a time), matches output_0.pb: SQNR >= 30 dB
  (8-bit activations and weights on a single layer: the input's own 8-bit rounding alone costs
  about 40 dB);
* refused by a Tl2k210Error whose message names the node, the op, its attributes (when it has
  any) and what to change -- never another exception.
Multi-input models and integer/float64 inputs are out of scope (a kmodel has one float/uint8
input) and skipped with that reason.

`pytest tests/test_onnx_pytorch_exports.py -s` prints the table (outcome and SQNR per model).
"""
import re
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import numpy_helper  # noqa: E402

from tl2k210 import metadata  # noqa: E402
from tl2k210.compiler import ConvertOptions, convert  # noqa: E402
from tl2k210.errors import Tl2k210Error  # noqa: E402
from tl2k210.k210.fit import BudgetError  # noqa: E402
from tl2k210.k210.emulator import Emulator  # noqa: E402
from tl2k210.quantize.metrics import sqnr_db  # noqa: E402
from tl2k210.tables import text_table  # noqa: E402

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
DIRS = sorted(p for sub in ("pytorch-converted", "pytorch-operator")
              for p in (DATA / sub).glob("test_*") if (p / "model.onnx").exists())
MIN_SQNR_DB = 30.0
SLOW = {"test_operator_conv", "test_MaxPool1d_stride_padding_dilation", "test_Conv2d_dilated"}
# words of a message that says what to change
ACTION = ("use ", "export", "give ", "fold", "run ", "needs ", "replace", "choose", "remove",
          "drop ", "split", "pass ", "resize", "reshape", "convert it", "smaller", "prune", "calibrate",
          "clamp")
# what a K210 cannot take, refused: {model: words the message must hold}; every other model in
# scope must convert (so a regression in either direction fails)
VOLUMETRIC = "volumetric (3-D) op"
REFUSED = {**{m: VOLUMETRIC for m in (
    "test_AvgPool3d", "test_AvgPool3d_stride", "test_AvgPool3d_stride1_pad0_gpu_input", "test_BatchNorm3d_eval",
    "test_BatchNorm3d_momentum_eval", "test_Conv3d", "test_Conv3d_dilated", "test_Conv3d_dilated_strided",
    "test_Conv3d_groups", "test_Conv3d_no_bias", "test_Conv3d_stride", "test_Conv3d_stride_padding",
    "test_MaxPool3d", "test_MaxPool3d_stride", "test_MaxPool3d_stride_padding", "test_PReLU_3d",
    "test_PReLU_3d_multiparam")},
    # a 1000x1000 float map: 6 MB of main memory
    "test_MaxPool2d_stride_padding_dilation": "exceeds what 'maixpy' firmware leaves",
    # a (10, 10) / (2, 2) constant broadcast against the batch: the graph is not per sample
    "test_PoissonNLLLLoss_no_reduce": "works across the samples", "test_operator_params": "works across the samples",
    "test_operator_chunk": "a vector without a batch axis",         # torch.chunk of a (3,) vector
    "test_operator_permute2": "of 6 dims",                          # a 6-D input
    "test_operator_sqrt": "gives NaN on the calibration data",       # sqrt of randn: the reference is NaN too
}
RESULTS = {}


def _tensor(path):
    return numpy_helper.to_array(onnx.load_tensor(str(path)))


def _scope(inputs):
    """None when a K210 model can take these inputs, else the reason it cannot."""
    if len(inputs) != 1:
        return f"{len(inputs)} inputs {[a.shape for a in inputs]}: a kmodel has one input"
    x = inputs[0]
    if x.dtype != np.float32:
        return f"{x.dtype} input {x.shape} (indices or float64): a kmodel takes float32/uint8"
    return None


def _device_input(x, meta):
    """What the board feeds the kmodel for one float sample `x`: 0..255 pixels through the
    metadata's --input-range mapping (an image kmodel), else the floats."""
    inp = meta.input
    if inp["dtype"] == "uint8":
        lo, hi = inp["range"]
        return np.clip(np.rint((x - lo) / (hi - lo) * 255), 0, 255).astype(np.uint8).reshape(-1)
    return x.astype(np.float32).reshape(-1)


def _node_facts(model):
    """{node name (as the IR names it): (op, [attribute names])}."""
    return {(n.name or f"{n.op_type}_{i}"): (n.op_type, [a.name for a in n.attribute])
            for i, n in enumerate(model.graph.node) if n.op_type != "Constant"}


def outcome(d, tmp):
    name = d.name
    if name in RESULTS:
        return RESULTS[name]
    inputs = [_tensor(f) for f in sorted((d / "test_data_set_0").glob("input_*.pb"))]
    outputs = [_tensor(f) for f in sorted((d / "test_data_set_0").glob("output_*.pb"))]
    r = {"model": name, "input": "x".join(map(str, inputs[0].shape)) if inputs else "-"}
    why = _scope(inputs)
    if why:
        r.update(outcome="out of scope", why=why)
        RESULTS[name] = r
        return r
    x = inputs[0]
    rng = np.random.default_rng(0)
    calib = np.concatenate([x] + [x + rng.normal(0, 0.05 * (float(x.std()) + 1e-6), x.shape).astype(np.float32)
                                  for _ in range(7)])
    lo, hi = float(calib.min()), float(calib.max())
    if hi <= lo:
        lo, hi = lo - 1.0, hi + 1.0
    np.save(tmp / "calib.npy", calib)
    out = tmp / f"{name}.kmodel"
    try:
        rec = convert(str(d / "model.onnx"), str(out),
                      ConvertOptions(dataset=str(tmp / "calib.npy"), input_range=(lo, hi), progress=False))
    except Tl2k210Error as e:
        assert not out.exists() and not metadata.path_for(out).exists(), f"{name}: refused, but {out} was written"
        r.update(outcome="refused", error=e, why=str(e).splitlines()[0][:150])
        RESULTS[name] = r
        return r
    meta = metadata.load_for(out)
    emu = Emulator.load(str(out))
    batch = x.shape[0] if x.ndim >= 2 else 1
    samples = x if x.ndim >= 2 else x[None]
    got = np.concatenate([np.asarray(emu.run(_device_input(s, meta))[0], np.float64).reshape(-1)
                          for s in samples[:batch]])
    ref = outputs[0].astype(np.float64).reshape(-1)
    r.update(outcome="converted", format=rec.totals["format"],
             units=f"{rec.totals['kpu_layers']} / {rec.totals['cpu_layers']}",
             sqnr=sqnr_db(ref, got) if got.size == ref.size else None,
             sizes=(got.size, ref.size))
    RESULTS[name] = r
    return r


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    yield tmp_path_factory.mktemp("pytorch_exports")
    if RESULTS:
        rows = []
        for r in sorted(RESULTS.values(), key=lambda r: r["model"]):
            sq = r.get("sqnr")
            rows.append((r["model"][5:], r["input"], r["outcome"], r.get("format", "-"), r.get("units", "-"),
                         "-" if sq is None else ("inf" if np.isinf(sq) else f"{sq:.1f}"),
                         r.get("why", "")[:90]))
        n = {k: sum(r["outcome"] == k for r in RESULTS.values()) for k in ("converted", "refused", "out of scope")}
        print("\n" + "\n".join(text_table(("model", "input", "outcome", "kmodel", "KPU / CPU", "SQNR dB",
                                           "why"), rows)))
        print(f"{n['converted']} converted (SQNR >= {MIN_SQNR_DB:g} dB vs output_0.pb), {n['refused']} "
              f"refused, {n['out of scope']} out of scope, of {len(RESULTS)}")


@pytest.mark.parametrize("d", [pytest.param(d, id=d.name, marks=[pytest.mark.slow] if d.name in SLOW else [])
                               for d in DIRS])
def test_pytorch_export(d, workdir):
    r = outcome(d, workdir)
    if r["outcome"] == "out of scope":
        pytest.skip(r["why"])
    if d.name in REFUSED:
        assert r["outcome"] == "refused", f"{d.name} was expected to be refused ({REFUSED[d.name]}), it {r['outcome']}"
        assert REFUSED[d.name] in str(r["error"]), r["error"]
    else:
        assert r["outcome"] == "converted", f"{d.name} should convert: {r.get('error')}"
    if r["outcome"] == "converted":
        assert r["sqnr"] is not None, f"{d.name}: the kmodel gives {r['sizes'][0]} values, the reference {r['sizes'][1]}"
        assert r["sqnr"] >= MIN_SQNR_DB, f"{d.name}: SQNR {r['sqnr']:.1f} dB vs the PyTorch reference"
        return
    msg = str(r["error"])
    assert "Traceback" not in msg and "please report" not in msg.lower(), f"{d.name}: an internal error: {msg}"
    assert any(w in msg.lower() for w in ACTION), f"{d.name}: the refusal says nothing to change: {msg}"
    if isinstance(r["error"], BudgetError):      # the whole model: names the biggest buffers instead
        assert "biggest buffers" in msg and "Nothing was written" in msg, msg
        return
    facts = _node_facts(onnx.load(str(d / "model.onnx")))
    # nodes without a name in the file are called OP_INDEX, the index after the opset upgrade
    named = [k for k, (op, _) in facts.items() if f"'{k}'" in msg or re.search(rf"'{op}_\d+'", msg)]
    assert named, f"{d.name}: the refusal names no node of the model ({sorted(facts)}): {msg}"
    op, attrs = facts[named[0]]
    assert op in msg, f"{d.name}: the refusal does not name the op {op}: {msg}"
    shown = [a for a in attrs if f"{a}=" in msg]
    assert shown or not attrs or "kernel" in msg, f"{d.name}: the refusal shows none of {attrs}: {msg}"


def test_batch_of_pytorch_exports_runs_one_sample():
    """The exports have fixed batches (2, 4, 10, 20): the kmodel takes one sample, and a graph
    whose outputs mix the samples is refused with what to do."""
    from tl2k210.errors import ModelLoadError
    from tl2k210.graph import from_onnx
    g = from_onnx(onnx.load(str(DATA / "pytorch-converted" / "test_Conv2d" / "model.onnx")))
    assert g.shape(g.inputs[0]) == (1, 3, 7, 5) and g.shape(g.outputs[0]) == (1, 4, 5, 4)
    with pytest.raises(ModelLoadError, match="export the model with batch 1"):
        from_onnx(onnx.load(str(DATA / "pytorch-operator" / "test_operator_params" / "model.onnx")))



def test_cli_refusal_is_one_line_and_writes_nothing(tmp_path):
    """`tl2k210 convert` on a refused export: exit code 2, one line naming the node, the op and
    the fix on stderr, no traceback, no kmodel or metadata."""
    import subprocess
    import sys
    np.save(tmp_path / "x.npy", _tensor(DATA / "pytorch-converted" / "test_Conv3d" / "test_data_set_0" / "input_0.pb"))
    out = tmp_path / "m.kmodel"
    p = subprocess.run([sys.executable, "-m", "tl2k210.cli", "convert",
                        str(DATA / "pytorch-converted" / "test_Conv3d" / "model.onnx"), str(out),
                        "--dataset", str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and "'Conv_0'" in p.stderr and "kernel_shape=[2, 3, 4]" in p.stderr
    assert "fold the depth into the channels" in p.stderr
    assert not out.exists() and not metadata.path_for(out).exists()


def test_receipt_says_the_batch_was_one_sample(workdir):
    x = _tensor(DATA / "pytorch-converted" / "test_Conv2d" / "test_data_set_0" / "input_0.pb")
    np.save(workdir / "c2d.npy", x)
    rec = convert(str(DATA / "pytorch-converted" / "test_Conv2d" / "model.onnx"), str(workdir / "c2d.kmodel"),
                  ConvertOptions(dataset=str(workdir / "c2d.npy"), input_range=(-4, 4), progress=False))
    assert "fixed batch of 2: the kmodel takes one sample" in rec.table()
