"""The developer corpus (tests/devcorpus.py, built offline, seeded) through `convert`: a lean
subset here -- every architecture of the ONNX zoo is either converted or refused by the weight
budget before any slow work; the NHWC 320x240 detector, the zoo's SqueezeNet and ShuffleNet and
one MobileNetV2 convert and agree with their float model. The whole corpus, with numbers, is
`python bench/corpus.py` (README table)."""
import time

import numpy as np
import pytest

import devcorpus
from conftest import data_path

pytestmark = pytest.mark.slow
BIG = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "vgg19", "zfnet512"]


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    from PIL import Image
    from skimage import data
    d = tmp_path_factory.mktemp("photos")
    for n in devcorpus.PHOTOS:
        Image.fromarray(getattr(data, n)()).convert("RGB").save(d / f"{n}.png")
    return d


@pytest.mark.parametrize("name", BIG)
def test_zoo_models_over_the_budget_are_refused_at_once(name, tmp_path, capsys):
    """The budget check reads the weight shapes (ConstantOfShape operands) before folding,
    shape inference or calibration: VGG-19 took over 120 s to fail before."""
    from tl2k210.cli import main
    out = tmp_path / "m.kmodel"
    t = time.perf_counter()
    rc = main(["convert", str(devcorpus.zoo_path(name)), str(out), "--dataset", str(tmp_path), "--runtime", "sdk",
               "-q"])
    took = time.perf_counter() - t
    err = capsys.readouterr().err
    assert rc == 2 and "more than the 5,242,880 B 'sdk' firmware leaves" in err and "largest:" in err, err
    assert took < 60 and not out.exists()


def _convert_and_compare(model, tmp_path, calib, **opts):
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.compiler_cli import compare_graph
    from tl2k210.frontends import load_model
    from tl2k210.graph import from_onnx
    from tl2k210.passes import run_pipeline
    onnx_model = load_model(model)
    out = tmp_path / "m.kmodel"
    receipt = convert(onnx_model, out, ConvertOptions(dataset=str(calib), progress=False, **opts))
    g, _ = run_pipeline(from_onnx(onnx_model))
    pre = {k: v for k, v in opts.items() if k == "input_range"}
    from tl2k210.compiler import ConvertOptions as CO
    rep = compare_graph(g, out, str(data_path("imagenet")), opts=CO(**pre))
    return receipt, rep


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_zoo_models_that_fit_convert(name, tmp_path, calib):
    receipt, rep = _convert_and_compare(devcorpus.zoo_seeded(name), tmp_path, calib, runtime="sdk")
    sq = min(o["sqnr_db"] for o in rep["outputs"].values())
    print(f"{name}: {receipt.file_size:,} B, SQNR {sq:.1f} dB on {rep['samples']} photos")
    assert receipt.file_size + receipt.main_memory <= 5 * 1024 * 1024 and sq >= 20


def test_ulffd_slim_320x240_nhwc(tmp_path, calib):
    """A 320x240 NHWC Keras detector (the shape that crashed the image loader) with 2-class
    softmax score heads: converts, every head on the KPU, agrees with the float model."""
    receipt, rep = _convert_and_compare(devcorpus.ulffd_slim(), tmp_path, calib, input_range=(-1, 1), runtime="sdk")
    assert receipt.layers[0]["in_shape"] == (3, 240, 320)
    sq = {k: v["sqnr_db"] for k, v in rep["outputs"].items()}
    print("ULFFD slim SQNR per output:", {k[-14:]: round(v, 1) for k, v in sq.items()})
    assert len(sq) == 8 and min(sq.values()) >= 20
    assert not any(r["op"] in ("Softmax", "Exp", "ReduceMax") for r in receipt.layers)


def test_mobilenet_v2_matches_ideal_quantization(tmp_path, calib):
    """keras.applications MobileNetV2 a0.35 160 (weights=None, BN statistics from photos): all on
    the KPU but the residual adds and the pool; the kmodel is within a few dB of ideal 8-bit
    quantization of the same float model (quantize.fake_quant), which is what such a deep seeded
    network allows."""
    from tl2k210.compiler import ConvertOptions, model_inputs
    from tl2k210.quantize import calibrate
    from tl2k210.quantize.fake_quant import fake_quant_graph
    from tl2k210.quantize.metrics import sqnr_db
    m = devcorpus.mobilenet_v2(0.35, 160)()
    receipt, rep = _convert_and_compare(m, tmp_path, calib, input_range=(-1, 1), runtime="maixpy-minimum")
    ours = min(o["sqnr_db"] for o in rep["outputs"].values())
    from tl2k210.frontends import load_model
    from tl2k210.graph import from_onnx
    from tl2k210.passes import run_pipeline
    g, _ = run_pipeline(from_onnx(load_model(m)))
    opts = ConvertOptions(input_range=(-1, 1))
    cal, _ = model_inputs(g, str(calib), 100, opts)
    ev, _ = model_inputs(g, str(data_path("imagenet")), 100, opts)
    rng = calibrate.ranges(calibrate.collect(g, [c[None] for c in cal], histograms=False), "minmax")
    fr, qr = calibrate.FloatRunner(g, False), calibrate.FloatRunner(fake_quant_graph(g, rng), False)
    o = g.outputs[0]
    ideal = sqnr_db(np.stack([fr(x[None])[o] for x in ev]), np.stack([qr(x[None])[o] for x in ev]))
    print(f"MobileNetV2 a0.35 160: kmodel {ours:.1f} dB, ideal 8-bit {ideal:.1f} dB")
    assert ours >= ideal - 5
    assert receipt.totals["kpu_layers"] >= 55
