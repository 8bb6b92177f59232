"""A dilated 3x3 conv on more channels than the shift stages hold (OpenCV's res10 SSD face
detector: 128 channels, dilation 2, at 19x19, 1.6 s of its 1.8 s on the CPU) runs as one 3x3
KPU conv over a mosaic of its sub-grids (pass dilated_mosaic, kmodel v4): float-exact, its
output at the 8-bit ideal, its weights once; --optimize size keeps the CPU conv."""
import json

import numpy as np
import onnx
import pytest
from onnx import helper

from front_helpers import make_model, noise_photos, ort_run
from tl2k210.cli import main
from tl2k210.graph import from_onnx, run
from tl2k210.k210.flow import run_pipeline


def _model(size, c=128, o=16, dilation=2, group=1):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w1", "b1"], ["c"], name="atrous", pads=[dilation] * 4,
                              dilations=[dilation, dilation], group=group),
             helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, [("x", [1, 3, size, size])], [("y", None)],
                      {"w0": rng.normal(0, 0.3, (c, 3, 3, 3)).astype(np.float32),
                       "b0": rng.normal(0, 0.1, c).astype(np.float32),
                       "w1": rng.normal(0, 0.03, (o, c // group, 3, 3)).astype(np.float32),
                       "b1": rng.normal(0, 0.1, o).astype(np.float32)})


@pytest.mark.parametrize("size, dilation, group", [(19, 2, 1), (16, 2, 1), (17, 3, 1), (17, 4, 192)])
def test_the_mosaic_is_the_dilated_conv(size, dilation, group):
    """... and DeepLab's atrous depthwise convs (960 channels, dilation 2 and 4, whose channel
    windows store every shifted copy's one-hot weights)."""
    m = _model(size, c=max(128, group), o=max(16, group), dilation=dilation, group=group)
    g, log = run_pipeline(from_onnx(m))
    done = next(r["changes"] for r in log if r["pass"] == "dilated_mosaic")
    assert [name for name, _ in done] == ["atrous"]
    convs = [n for n in g.nodes if n.op == "Conv"]
    assert [tuple(n.attrs["dilations"]) for n in convs] == [(1, 1), (1, 1)] and convs[1].attrs["pads"] == [1, 1, 1, 1]
    x = np.random.default_rng(1).normal(size=(1, 3, size, size)).astype(np.float32)
    ref = ort_run(m, x)[0]
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ref, atol=1e-5 * np.abs(ref).max())
    few = _model(size, c=16, dilation=dilation)        # 16 x 9 shifted channels: the shift stages hold it
    g, log = run_pipeline(from_onnx(few))
    assert not next(r["changes"] for r in log if r["pass"] == "dilated_mosaic")


def test_a_wide_dilated_conv_runs_on_the_kpu_at_its_ideal(tmp_path):
    src = tmp_path / "atrous.onnx"
    onnx.save(_model(19), src)
    rng = np.random.default_rng(0)
    photos = noise_photos(tmp_path / "photos", 19, 19, rng)
    reports = {}
    for mode in ("latency", "size"):
        out, rep = tmp_path / f"{mode}.kmodel", tmp_path / f"{mode}.json"
        assert main(["convert", str(src), str(out), "--dataset", str(photos), "--optimize", mode, "--report", str(rep),
                     "-q"]) == 0
        reports[mode] = json.loads(rep.read_text())
    fast, small = reports["latency"], reports["size"]
    units = {r["node"]: r["unit"] for r in fast["layers"]}
    assert units["atrous/mosaic/conv"] == "KPU" and "atrous" not in units
    assert {r["node"]: r["unit"] for r in small["layers"]}["atrous"] == "CPU"
    assert fast["latency_ms"] < small["latency_ms"] / 20
    out = fast["totals"]["outputs"]["y"]
    assert out["sqnr_db"] > out["ideal_db"] - 0.2 > 30
    # the weights once (16 x 128 x 9 bytes, and the KPU's arguments and tables); the ideal is the
    # network's: the mosaic's maps are the form's
    conv = next(r for r in fast["layers"] if r["node"] == "atrous/mosaic/conv")
    assert 16 * 128 * 9 < conv["weight_bytes"] < 1.15 * 16 * 128 * 9
    assert fast["ideal"]["live_bytes"] == small["ideal"]["live_bytes"]
