"""The receipt is a gate: `convert` refuses (exit 2, nothing written) a kmodel whose outputs are
NaN/Inf on the calibration data or below --min-sqnr dB vs the float model, naming the first layer
whose SQNR collapses; --min-sqnr 0 accepts anything. Every number in the JSON receipt is finite
or says why not."""
import json

import numpy as np
import onnx
import pytest
from onnx import helper

from front_helpers import make_model

pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(5)


def _cli(*args):
    from tl2k210.cli import main
    return main(["convert", *map(str, args), "-q"])


def _conv_net(tmp_path):
    """Two 3x3 convs on a 16x16 RGB image, and 12 calibration images as uint8 pixels."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], pads=[1, 1, 1, 1])]
    m = make_model(nodes, [("x", [1, 3, 16, 16])], [("y", [1, 4, 16, 16])],
                   {"w1": RNG.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
                    "b1": RNG.standard_normal(8).astype(np.float32) * 0.1,
                    "w2": RNG.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.3,
                    "b2": RNG.standard_normal(4).astype(np.float32) * 0.1})
    onnx.save(m, tmp_path / "net.onnx")
    np.save(tmp_path / "px.npy", RNG.integers(0, 256, (12, 3, 16, 16)).astype(np.uint8))
    return tmp_path / "net.onnx", tmp_path / "px.npy"


def test_low_sqnr_is_refused_and_nothing_written(tmp_path, capsys):
    src, data = _conv_net(tmp_path)
    out, report = tmp_path / "m.kmodel", tmp_path / "r.json"
    assert _cli(src, out, "--dataset", data, "--report", report) == 0
    r = json.loads(report.read_text())
    achieved = r["totals"]["outputs"]["y"]["sqnr_db"]
    assert 25 < achieved < 60 and r["totals"]["min_sqnr"] == 15
    assert "8-bit ideal" in capsys.readouterr().out
    for f in (out, report, tmp_path / "m.kmodel.json"):
        f.unlink()
    assert _cli(src, out, "--dataset", data, "--report", report, "--min-sqnr", achieved + 5) == 2
    err = capsys.readouterr().err
    assert f"output SQNR vs the float model y {achieved:.1f} dB" in err and f"below --min-sqnr {achieved + 5:g} dB" in err
    assert f"y {achieved:.1f} dB (8-bit ideal {r['totals']['outputs']['y']['ideal_db']:.1f} dB)" in err
    assert "first collapses at layer" in err and "--calibrate-method" in err and "--min-sqnr 0 accepts it" in err
    assert "Traceback" not in err and "SQNR dB" in err          # the per-layer receipt, then the error
    assert not out.exists() and not report.exists() and not (tmp_path / "m.kmodel.json").exists()
    assert _cli(src, out, "--dataset", data, "--min-sqnr", "0") == 0 and out.exists()


def test_the_receipt_says_which_samples_it_measured_and_sqnr_samples_measures_more(tmp_path, capsys):
    """The SQNR (and the gate) is measured on the first --sqnr-samples of the calibration samples
    (8): a hunt's voice-gender model read 37.4 dB on 8 of its 60 samples, 25.2 on all of them.
    The receipt says how many of how many, and the flag measures more."""
    src, data = _conv_net(tmp_path)
    out, report = tmp_path / "m.kmodel", tmp_path / "r.json"
    assert _cli(src, out, "--dataset", data, "--report", report) == 0
    assert "on the first 8 of 12 calibration samples (8-bit ideal" in capsys.readouterr().out
    assert json.loads(report.read_text())["totals"]["sqnr_samples"] == 8
    assert _cli(src, out, "--dataset", data, "--report", report, "--sqnr-samples", 12) == 0
    said = capsys.readouterr().out
    assert "on 12 calibration samples (8-bit ideal" in said and "--sqnr-samples N" not in said
    assert json.loads(report.read_text())["totals"]["sqnr_samples"] == 12


def _softmax_of_very_negative_logits(tmp_path):
    """Logits all near -200: the SDK's v3 SOFTMAX starts its max at FLT_MIN, so exp underflows to
    0 everywhere and 0 / 0 is NaN on the board (the emulator does what the firmware does)."""
    m = make_model([helper.make_node("Gemm", ["x", "w", "b"], ["g"]), helper.make_node("Softmax", ["g"], ["y"], axis=1)],
                   [("x", [1, 4])], [("y", [1, 6])], {"w": RNG.standard_normal((4, 6)).astype(np.float32),
                                                       "b": np.full(6, -200, np.float32)})
    onnx.save(m, tmp_path / "sm.onnx")
    np.save(tmp_path / "v.npy", RNG.standard_normal((16, 4)).astype(np.float32))
    return tmp_path / "sm.onnx", tmp_path / "v.npy"


def test_nan_outputs_are_refused(tmp_path, capsys, monkeypatch):
    """The logits' shift before the SDK's SOFTMAX (cpu.softmax, fc._softmax_shift) avoids this NaN
    now; switched off, the NaN it gave is what the gate must refuse."""
    from tl2k210.k210.lower import cpu, fc
    src, data = _softmax_of_very_negative_logits(tmp_path)
    out = tmp_path / "m.kmodel"
    assert _cli(src, out, "--dataset", data, "--format", "v3") == 0          # shifted: no NaN
    out.unlink()
    capsys.readouterr()
    for mod in (cpu, fc):
        monkeypatch.setattr(mod, "SOFTMAX_LOW", -np.inf)
    with np.errstate(all="ignore"):
        assert _cli(src, out, "--dataset", data, "--format", "v3") == 2
    err = capsys.readouterr().err
    assert "output y (48 values) is NaN/Inf on 8 calibration samples" in err
    assert "first collapses at layer 'Softmax_1' (CPU: float SOFTMAX, NaN dB)" in err and not out.exists()
    assert _cli(src, out, "--dataset", data, "--format", "v4", "--report", tmp_path / "r.json") == 0   # max-subtracted


def test_receipt_numbers_are_finite_or_say_why(tmp_path):
    """The max of a float vector is exact: no finite SQNR, the JSON says why (strict JSON)."""
    m = make_model([helper.make_node("LogSoftmax", ["x"], ["y"], axis=1)], [("x", [1, 10])], [("y", [1, 10])])
    onnx.save(m, tmp_path / "ls.onnx")
    np.save(tmp_path / "v.npy", RNG.standard_normal((16, 10)).astype(np.float32) * 50)
    assert _cli(tmp_path / "ls.onnx", tmp_path / "m.kmodel", "--dataset", tmp_path / "v.npy",
                "--report", tmp_path / "r.json") == 0

    def refuse(c):
        raise AssertionError(f"{c} in the JSON receipt")
    r = json.loads((tmp_path / "r.json").read_text(), parse_constant=refuse)
    rows = r["layers"] + list(r["totals"]["outputs"].values())
    assert all(row["sqnr_db"] is not None or row["sqnr_note"] for row in rows)
    assert r["layers"][0]["sqnr_note"] == "exact: no error at all"


@pytest.mark.parametrize("fmt", ["v3", "v4"])
def test_scores_concatenated_with_boxes_keep_their_precision(fmt, tmp_path):
    """A detector head's sigmoid scores (0..1) concatenated with boxes (0..300) as the model output:
    one uint8 grid over both rounded every score to 0; a float concat keeps each input's own steps."""
    from front_helpers import ort_run
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.k210.emulator import Emulator
    from tl2k210.quantize.metrics import sqnr_db
    w = {"w1": RNG.standard_normal((8, 3, 3, 3)) * 0.3, "b1": RNG.standard_normal(8) * 0.3,
         "ws": RNG.standard_normal((2, 8, 1, 1)) * 0.3, "bs": RNG.standard_normal(2) * 0.3 - 2,
         "wb": RNG.standard_normal((4, 8, 1, 1)) * 0.3, "bb": RNG.standard_normal(4) * 0.3}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["f"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["f"], ["r"]),
             helper.make_node("Conv", ["r", "ws", "bs"], ["s"]), helper.make_node("Sigmoid", ["s"], ["p"]),
             helper.make_node("Conv", ["r", "wb", "bb"], ["b"]), helper.make_node("Mul", ["b", "k"], ["bk"]),
             helper.make_node("Concat", ["p", "bk"], ["y"], axis=1)]
    m = make_model(nodes, [("x", [1, 3, 16, 16])], [("y", [1, 6, 16, 16])],
                   {**{k: v.astype(np.float32) for k, v in w.items()}, "k": np.array(100, np.float32)})
    px = RNG.integers(0, 256, (12, 3, 16, 16)).astype(np.uint8)
    np.save(tmp_path / "px.npy", px)
    convert(m, tmp_path / "m.kmodel", ConvertOptions(dataset=str(tmp_path / "px.npy"), format=fmt, progress=False))
    emu = Emulator.load(tmp_path / "m.kmodel")
    ref = np.stack([ort_run(m, (p[None] / np.float32(255)).astype(np.float32))[0][0] for p in px])
    got = np.stack([np.asarray(emu.run(p)[0]).reshape(6, 16, 16) for p in px])
    assert sqnr_db(ref[:, :2], got[:, :2]) > 30 and sqnr_db(ref[:, 2:], got[:, 2:]) > 30


@pytest.mark.parametrize("ideal, says", [(11.2, True), (25.0, False), (None, False)])
def test_refusal_says_when_the_ideal_itself_is_that_low(ideal, says):
    """YuNet's objectness outputs: ours 10.7 dB where the float model with uint8 tensors at the same
    ranges gets 11.2 dB -- no mapping to the K210 can fix that; the refusal says so."""
    from types import SimpleNamespace

    from tl2k210.errors import QualityError
    from tl2k210.quality import quality_gate
    out = {"sqnr_db": 10.7, **({"ideal_db": ideal} if ideal is not None else {})}
    rec = SimpleNamespace(source="m.onnx", layers=[], totals={"outputs": {"obj": out}, "sqnr_samples": 8})
    with pytest.raises(QualityError) as e:
        quality_gate(rec, {"obj": 0}, 15)
    assert ("within 1 dB of the 8-bit ideal" in str(e.value)) is says
    assert "obj 10.7 dB" in str(e.value) and "--calibrate-method" in str(e.value)


@pytest.mark.parametrize("method, bits, fmt", [("minmax", 8, "v3"), ("mse", 8, "v3"), ("percentile", 16, "v3"),
                                              ("minmax", 8, "v4")])
def test_refusal_does_not_suggest_what_the_conversion_did(method, bits, fmt):
    """MediaPipe's hand landmarks refused after --calibrate-method mse were told to try mse; a
    kmodel v4 (8-bit KPU weights only) was told to try --weight-bits 16, which it refuses."""
    from types import SimpleNamespace

    from tl2k210.errors import QualityError
    from tl2k210.quality import quality_gate
    rec = SimpleNamespace(source="m.tflite", layers=[], ideal={"weight_bits": bits},
                          totals={"outputs": {"y": {"sqnr_db": 2.1}}, "sqnr_samples": 8, "method": method,
                                  "format": fmt})
    with pytest.raises(QualityError) as e:
        quality_gate(rec, {"y": 0}, 15)
    tries = str(e.value).split("Try: ")[1]
    assert (f"--calibrate-method {'percentile' if method == 'mse' else 'mse'}" in tries) and \
        (method not in tries.split(" (ranges")[0] or method == "minmax")
    assert ("--weight-bits 16" in tries) is (bits == 8 and fmt == "v3")


@pytest.mark.parametrize("own", [True, False])
def test_refusal_of_a_model_with_its_own_ranges_suggests_no_calibration_method(own):
    """MLPerf's keyword spotter as PPQ exports it (hunt 20) was refused at 13.7 dB and told to try
    --calibrate-method, which changes no range its own int8 quantization fixes: its MFCCs used 30 %
    of its input's int8 range. The refusal asks for samples over that range instead."""
    from types import SimpleNamespace

    from tl2k210.errors import QualityError
    from tl2k210.quality import quality_gate
    rec = SimpleNamespace(source="m.onnx", layers=[], ideal={"weight_bits": 8},
                          totals={"outputs": {"y": {"sqnr_db": 13.7}}, "sqnr_samples": 8, "method": "minmax",
                                  "format": "v4", "own_quantization": own})
    with pytest.raises(QualityError) as e:
        quality_gate(rec, {"y": 0}, 15)
    tries = str(e.value).split("Try: ")[1]
    assert ("--calibrate-method" in tries) is not own
    assert ("samples over the range the model's own input quantization stands for" in tries) is own


@pytest.mark.parametrize("optimize, says", [("size", True), ("latency", False)])
def test_refusal_names_the_weights_size_mode_rounded_again(optimize, says):
    """A size-mode receipt with uint8 CPU forms that round a file's per-channel int8 weights again
    (TFLite Micro's int8 MobileNetV2 has 21) and an output below the gate: the refusal says what
    size mode did and that the default would not, besides the calibration advice."""
    from types import SimpleNamespace

    from tl2k210.errors import QualityError
    from tl2k210.quality import quality_gate
    trades = ["conv_a: quantized_conv2d (uint8 weights per layer, 41.0 dB), 576 B, est. 96.34 ms; kpu_conv would "
              "take 784 B, 0.51 ms", "pick_b: kpu_conv (stride 1 + CPU pick), 2,592 B, est. 0.89 ms",
              "conv_c: quantized_conv2d (uint8 weights in 3 channel ranges of their own scale, 38.1 dB), 3,552 B"]
    rec = SimpleNamespace(source="m.tflite", layers=[], trades=trades,
                          totals={"outputs": {"y": {"sqnr_db": -12.2, "ideal_db": 14.4}}, "sqnr_samples": 8,
                                  "optimize": optimize})
    with pytest.raises(QualityError) as e:
        quality_gate(rec, {"y": 0}, 15)
    text = str(e.value)
    assert ("--optimize size gave 2 layer(s) a uint8 CPU form that rounds the weights again" in text and
            "the first 'conv_a'" in text) is says
    assert "y -12.2 dB (8-bit ideal 14.4 dB)" in text and "--calibrate-method" in text


@pytest.mark.parametrize("own", [True, False])
def test_only_a_quantized_models_output_at_its_ideal_is_excused(own):
    """An output below --min-sqnr within 1 dB of its 8-bit ideal passes for a quantized model (its
    own int8 ranges: the loss is its own) and is refused for a float one -- whose receipt had
    still printed "passed because ... its 8-bit ideal" above the refusal (BlazeFace back, float
    TFLite, 14.6 dB against an ideal of 13.0). The receipt's warning and the gate share `excused`."""
    from types import SimpleNamespace

    from tl2k210.errors import QualityError
    from tl2k210.quality import excused, quality_gate
    totals = {"outputs": {"scores": {"sqnr_db": 14.6, "ideal_db": 13.0}, "boxes": {"sqnr_db": 17.8, "ideal_db": 17.2}},
              "sqnr_samples": 8, "own_quantization": own, "min_sqnr": 15}
    rec = SimpleNamespace(source="m.tflite", layers=[], trades=[], totals=totals)
    assert excused(totals, 15) == (["scores"] if own else []) and excused(totals, 0) == []
    if own:
        quality_gate(rec, {}, 15)
    else:
        with pytest.raises(QualityError, match="scores 14.6 dB"):
            quality_gate(rec, {}, 15)


def test_no_excuse_when_the_samples_lie_outside_the_models_own_input_range():
    """zye1996's int8 MobileFaceNet quantizes its float input at 1/128 (it takes -1..1); converted at
    --input-range 0,255 its 0.0 dB kmodel passed as 'at its own ideal' (exit 0). Where the samples
    lie outside the input range the model states, nothing is excused and the refusal says which
    range to give."""
    from types import SimpleNamespace

    from tl2k210.compiler import ModelRanges
    from tl2k210.errors import QualityError
    from tl2k210.graph import Graph
    from tl2k210.quality import excused, quality_gate
    g = Graph(["x"], ["y"], [], {}, {"quant_ranges": {"x": (-0.9921875, 1.0)}})
    g.tensors["x"] = SimpleNamespace(shape=(1, 3, 8, 8))
    own = ModelRanges(g)
    assert own.input_mismatch(g, {"x": (-1.0, 0.98)}) is None                   # -1,1 as it should
    assert own.input_mismatch(g, {"x": (-0.5, 0.5)}) is None                    # within it: dark photos
    narrow = own.input_mismatch(g, {"x": (0.0, 0.1)})      # a sliver of it (hunt 22: PoseNet at -1,1 of 0..255)
    assert "the samples use 5.0% of it" in narrow and "--input-range -0.9922,1" in narrow
    says = own.input_mismatch(g, {"x": (0.0, 255.0)})
    assert "stands for -0.9922..1" in says and "--input-range -0.9922,1" in says
    totals = {"outputs": {"emb": {"sqnr_db": 0.0, "ideal_db": 0.0}}, "sqnr_samples": 8, "own_quantization": True,
              "min_sqnr": 15, "input_mismatch": says}
    assert excused(totals, 15) == []
    with pytest.raises(QualityError, match=r"The samples reach 0\.\.255 .* convert with --input-range -0.9922,1"):
        quality_gate(SimpleNamespace(source="m.tflite", layers=[], trades=[], totals=totals), {}, 15)


def test_a_kpu_padding_rewrite_that_changes_the_model_is_refused():
    """--kpu-padding changed MobileNet v1 (float TFLite) to 4.4 dB against its exact graph; the gate
    measured the kmodel against the rewritten graph (17.2 dB) and wrote it: 1.9 dB against TFLite.
    The rewrite's own effect is gated too."""
    from types import SimpleNamespace

    from tl2k210.errors import QualityError
    from tl2k210.quality import quality_gate
    totals = {"outputs": {"p": {"sqnr_db": 17.2, "ideal_db": 17.0}}, "sqnr_samples": 8,
              "kpu_padding_effect": {"p": {"sqnr_db": 4.4, "cosine": 0.802}}}
    rec = SimpleNamespace(source="m.tflite", layers=[], trades=[], totals=totals)
    with pytest.raises(QualityError, match=r"--kpu-padding changed the float model itself, output p 4\.4 dB .*"
                                           r"Convert without --kpu-padding"):
        quality_gate(rec, {}, 15)
    totals["kpu_padding_effect"]["p"]["sqnr_db"] = 31.0
    quality_gate(rec, {}, 15)
    quality_gate(SimpleNamespace(**{**vars(rec), "totals": {**totals, "kpu_padding_effect": {"p": {
        "sqnr_db": 4.4, "cosine": 0.8}}}}), {}, 0)       # --min-sqnr 0 accepts it


def test_the_receipts_ideal_names_its_weight_bits():
    """With --weight-bits 16 the ideal beside each output has 16-bit weights: the receipt had
    called it the 8-bit ideal (round 64's hunt)."""
    from tl2k210.quality import ideal_text
    assert ideal_text({"ideal_db": 30.04}) == " (8-bit ideal 30.0 dB)"
    assert ideal_text({"ideal_db": 41.2, "ideal_weight_bits": 16}) == " (ideal at 16-bit weights and 8-bit maps: 41.2 dB)"
    assert ideal_text({"ideal_db": None}) == ""
