"""A ReLU / ReLU6 fused into a uint8 CPU layer is the uint8 clamp of its output grid only where
that grid starts at 0 and ends within the bound. A quantized model's own grid need not: the
MobileNetV2 that TFLite Micro exports from PyTorch has fused ReLU6 convs whose int8 output grid
reaches down to -0.80, and their uint8 CPU form (`--optimize size`) let the negatives through
(its output -12.2 dB against 14.1 with the clamp). Here a calibrated range is widened the same
way: the kmodel must still apply the activation (v4: bit for bit as the reference runner) and
agree with onnxruntime."""
import numpy as np
import pytest
from onnx import helper

import v4_reference as ref
from lower_helpers import calibrated, conv_node, make_model, ort_run, pixels
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.lower import Options, lower
from tl2k210.k210.lower.cpu import grid_clamp
from tl2k210.quantize.metrics import sqnr_db

pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(53)
PX = pixels(6, 3, 12, 12, seed=5)


def W(*s, scale=0.4):
    return (RNG.standard_normal(s) * scale).astype(np.float32)


def _model(act):
    """conv -> conv 'y' + act -> a residual difference with act -> conv: 'y' and the Sub write
    uint8 on the CPU (y in its smaller form, quantized_conv2d; the Sub QUANTIZED_ADD)."""
    clip = [np.float32(0), np.float32(1.5)] if act == "Clip" else []
    inits = {"w0": W(8, 3, 3, 3), "b0": W(8), "w1": W(8, 8, 1, 1), "b1": W(8), "w2": W(4, 8, 1, 1)}
    nodes = [conv_node("c0", "x", "w0", "b0", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"]),
             conv_node("y", "r0", "w1", "b1"),
             helper.make_node(act, ["y"] + (["lo", "hi"] if clip else []), ["a1"]),
             helper.make_node("Sub", ["a1", "r0"], ["s"]),
             helper.make_node(act, ["s"] + (["lo", "hi"] if clip else []), ["a2"]),
             conv_node("z", "a2", "w2")]
    if clip:
        inits.update(lo=clip[0], hi=clip[1])
    return make_model(nodes, [("x", [1, 3, 12, 12])], [("z", None)], inits)


def _widened(g, rng):
    """Every range after an activation (and the Sub's) reaching below 0 by 0.6 of its top: a
    quantized model's grid, not a calibrated one."""
    out = dict(rng)
    for n in g.nodes:
        t = n.outputs[0]
        if n.attrs.get("activation") or n.op in ("Relu", "Clip") or t == "s":
            lo, hi = out[t]
            out[t] = (-0.6 * hi, hi)
    return out


def _sqnr(m, model):
    emu = Emulator(model)
    want = np.stack([ort_run(m, (p[None] / 255.0).astype(np.float32))[0].reshape(-1) for p in PX])
    got = np.stack([emu.run(p)[0].reshape(-1) for p in PX])
    return sqnr_db(want, got)


def _clamps(rows):
    return sum(n.startswith(("Relu as a clamp", "Clip as a clamp")) for r in rows for n in r.notes)


@pytest.mark.parametrize("fmt", ["v3", "v4"])
@pytest.mark.parametrize("act", ["Relu", "Clip"])
def test_a_fused_relu_is_applied_on_a_grid_reaching_below_zero(act, fmt, monkeypatch):
    m = _model(act)
    g, rng = calibrated(m, PX)
    small = frozenset({"y"}) if fmt == "v4" else frozenset()     # v3: 'y' on the KPU, its own table
    model, rows, _, _ = lower(g, _widened(g, rng), Options(format=fmt, small=small))
    assert _clamps(rows) == (2 if fmt == "v4" else 1)
    if fmt == "v4":     # every node bit for bit against the C loops written out
        assert all(ref.mismatches(Emulator(model), p) == [] for p in PX[:2])
    assert _sqnr(m, model) > 30
    # calibrated ranges start at 0: the uint8 clamp is the activation, no table
    assert _clamps(lower(g, rng, Options(format=fmt, small=small))[1]) == 0
    # without the clamps the negatives pass (the bug)
    monkeypatch.setattr("tl2k210.k210.lower.cpu.grid_clamp", lambda *a: None)
    bare, *_ = lower(g, _widened(g, rng), Options(format=fmt, small=small))
    assert _sqnr(m, bare) < 25


def test_grid_clamp_codes():
    assert grid_clamp((0.0, np.inf), 0.01, 0) is None             # a calibrated ReLU range: the uint8 clamp
    assert grid_clamp((0.0, 6.0), 6 / 255, 0) is None
    assert grid_clamp((0.0, 6.0), 0.0066, 121) == (121, 255)      # MobileNetV2's grid: codes below 121 are < 0
    assert grid_clamp((0.0, 1.0), 0.01, 50) == (50, 150)
    assert grid_clamp(None, 0.01, 50) is None                     # no clamp activation
