"""The real third-party source models of ../shared/testdata/corpus/models, converted the way a
new user types it (`tl2k210 convert FILE OUT --dataset photos/`): each one converts and agrees
with its float model on photos calibration never saw, or is refused with a precise reason (the
node, its op, and what to change; or the budget and the firmware that holds it) and nothing
written. The comparison with the kmodels nncase made of the same files is bench/corpus.py's
(README table): it needs every photo through nncase's v4 graphs, too slow for the suite.

Old Keras 2 .h5 files are checked against the same project's .tflite: same weights, same numbers.
"""
import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import data_path
from front_helpers import tf

pytestmark = pytest.mark.slow

# file -> (extra CLI args, minimum output SQNR vs float on the held-out photos, or None: refused)
CASES = {
    "DAE_for_M5StickV__Model.tflite": ([], 18),
    "K210_mnist__mnist_lenet_K210_model.tflite": ([], 25),          # LeNet: VALID convs + pools
    "K210_mnist__mnist_lenet_K210_model.pb": ([], 25),              # the same, frozen TF1 graph
    # 3.35 MB in the fastest forms (v3: a float dense layer of 2,600 KiB); for full MaixPy that layer
    # becomes kmodel v4's uint8 quantized_matmul, 1.33 MB in all (the receipt's trade)
    "DonkeyCar_on_M5StickV__Model_Original.tflite": ([], 24),      # 27.6 dB (v3 float: 28.4)
    "LFFD-LP-K210__LPbox_1_branch.tflite": ([], 40),                # VALID stride-2 chain: 'stride-2 phases'
    "SemanticSegmentation4M5StickV__Model_V0_1.tflite": ([], 25),    # v4 (--format auto): its Pad; 28.3 dB
    "animal_classification_k210__Classifier_best_val_accuracy_animals.tflite": (["--input-range", "-1,1"], 22),
    "k210-dronet__model.tflite": ([], 22),
}
# file -> (nncase's kmodel of it, dB ours must be above its SQNR on the same held-out photos):
# compared in the suite where nncase's v4 graph is quick enough to run on every photo
NNCASE = {"LFFD-LP-K210__LPbox_1_branch.tflite": ("LFFD-LP-K210__LPbox_1_branch.kmodel", 15)}
# a refusal names the node in quotes and says what the hardware or format cannot do, or names the
# budget and the firmware that would hold the model
PRECISE = re.compile(r"node '[^']+'.*(KPU|kmodel v3|--format|supported|kernel|channels|RAM)|"
                     r"exceeds what '[a-z-]+' firmware leaves .*--runtime [a-z-]+", re.S)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from devcorpus import photo_folder
    return photo_folder(tmp_path_factory.mktemp("calib")), data_path("imagenet")


def _convert(src, out, calib, extra, capsys):
    from tl2k210.cli import main
    rc = main(["convert", str(src), str(out), "--dataset", str(calib), "-q", "--report", str(out) + ".receipt.json"] + extra)
    if rc == 0:
        _no_op_writes_over_its_input(out)
    return rc, capsys.readouterr().err


def _no_op_writes_over_its_input(path):
    """Every kmodel we write: no v4 op's output range overlaps one of its inputs
    (docs/kmodel-format.md#v4-interpreter)."""
    from tl2k210.k210 import kmodel
    from tl2k210.k210.kmodel import v4
    m = kmodel.load(path)
    assert m.version == 3 or v4.overlapping_io(m) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_corpus_model_converts_or_is_refused_precisely(name, folders, tmp_path, capsys):
    from tl2k210.compare import compare
    src = data_path("corpus", "models", name)
    extra, min_db = CASES[name]
    calib, photos = folders
    out = tmp_path / "ours.kmodel"
    rc, err = _convert(src, out, calib, extra, capsys)
    if min_db is None:
        assert rc == 2 and "Traceback" not in err and PRECISE.search(err), err
        assert not out.exists()
        print(f"{name}: refused: {err.strip().splitlines()[-1]}")
        return
    assert rc == 0, err
    pre = {"input_range": (-1.0, 1.0)} if "--input-range" in extra else {}
    ours = min(o["sqnr_db"] for o in compare(str(src), str(out), str(photos), limit=12, **pre)["outputs"].values())
    print(f"{name}: {ours:.1f} dB on 12 held-out photos")
    assert ours >= min_db
    r = json.loads(Path(str(out) + ".receipt.json").read_text())
    print(f"{name}: kmodel {r['totals']['format']}, {r['file_size']:,} B + {r['main_memory']:,} B main memory "
          f"(runtime {r['totals']['runtime']}), est. {r['latency_ms']:.0f} ms")
    if name.startswith("LFFD"):
        # refused before: its VALID stride-2 first conv ran at stride 1, a 64x240x320 map (5.2 MB of
        # main memory). Its four VALID stride-2 convs are now exact KPU layers: 'stride-2 phases' where
        # the cost model prefers them and their maps fit the KPU RAM, else the stride-1 map + CPU pick
        # in chunks: kmodel v3 in the full MaixPy build's 2 MiB (nncase's v4 kmodel of it needs
        # 394,280 B + 2,449,984 B: a minimum build). The later ones take the stride-1 map + CPU
        # pick, their weights once, for at most 10 % of the time (fit.LATENCY_SLACK)
        phases = [L["node"] for L in r["layers"] if "'stride-2 phases'" in L["why"]]
        assert r["totals"]["format"] == "v3" and r["totals"]["runtime"] == "maixpy"
        assert r["file_size"] + r["main_memory"] <= 2 * 1024 * 1024
        assert phases == ["model_1/relu_conv1/Relu"] and len(r["trades"]) == 2, (phases, r["trades"])
        assert all("within 10% of the fastest forms' estimated time" in t for t in r["trades"])
        assert r["latency_ms"] <= 1.1 * r["totals"]["fastest_ms"]
    if name in NNCASE:
        km, margin = NNCASE[name]
        theirs = min(o["sqnr_db"] for o in compare(str(src), str(data_path("corpus", "kmodels", km)), str(photos),
                                                    limit=12, **pre)["outputs"].values())
        print(f"{name}: nncase's kmodel {theirs:.1f} dB on the same photos")
        assert ours >= theirs + margin


def test_donkeycar_fits_the_minimum_firmware(folders, tmp_path, capsys):
    """For a minimum firmware (its nncase kmodel is 2.98 MB and needs one) the fastest forms fit:
    kmodel v3 with the float dense layer."""
    calib, photos = folders
    out = tmp_path / "donkey.kmodel"
    rc, err = _convert(data_path("corpus", "models", "DonkeyCar_on_M5StickV__Model_Original.tflite"), out, calib,
                       ["--runtime", "maixpy-minimum"], capsys)
    if rc != 0:     # what is left is a precise refusal of a layer (5x5 kernels: the rewrites' work)
        assert PRECISE.search(err) and "Traceback" not in err, err
        pytest.skip(f"refused: {err.strip().splitlines()[-1]}")
    assert out.stat().st_size < 4 * 1024 * 1024


@pytest.mark.parametrize("stem", ["DAE_for_M5StickV__Model", "SemanticSegmentation4M5StickV__Model_V0_1"])
def test_keras2_h5_loads_and_matches_its_tflite(stem):
    """Keras 2.2 files Keras 3 refuses (SpatialDropout2D arguments): rebuilt, they compute what
    the project's own TFLite export computes. (K210_mnist's .h5 -- a Sequential with
    batch_input_shape, which Keras 3 reads with a second batch dim -- loads too, but holds other
    weights than its .tflite: its nncase kmodel agrees with the .h5, 30.7 dB, not the .tflite.)"""
    from tl2k210.frontends import load_graph
    from tl2k210.graph import run
    tf()
    h5, lite = data_path("corpus", "models", stem + ".h5"), data_path("corpus", "models", stem + ".tflite")
    gh, gl = load_graph(h5), load_graph(lite)
    shape = gh.shape(gh.inputs[0])
    x = np.random.default_rng(0).uniform(0, 1, shape).astype(np.float32)
    a, b = run(gh, x), run(gl, x)
    for oh, ol in zip(gh.outputs, gl.outputs):
        np.testing.assert_allclose(a[oh].reshape(-1), b[ol].reshape(-1), rtol=1e-3, atol=1e-4)


def test_keras_weights_only_h5_says_where_the_architecture_is(tmp_path, capsys):
    """dronet ships best_weights.h5 (no model config) + model_struct.json: the weights file alone
    gets told to bring the JSON; the JSON with --weights loads."""
    from tl2k210.cli import main
    from tl2k210.frontends import load_graph
    from tl2k210.graph import run
    w = data_path("corpus", "models", "k210-dronet__best_weights.h5")
    js = data_path("corpus", "models", "k210-dronet__model_struct.json")
    rc = main(["convert", str(w), str(tmp_path / "d.kmodel"), "--dataset", str(tmp_path), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "weights-only" in err and "--weights k210-dronet__best_weights.h5" in err
    assert "k210-dronet__model_struct.json" in err and not (tmp_path / "d.kmodel").exists()
    g = load_graph(js, weights=str(w))
    lite = load_graph(data_path("corpus", "models", "k210-dronet__model.tflite"))
    zero = np.zeros(g.shape(g.inputs[0]), np.float32)   # same weights (the .tflite rescales its input)
    a, b = run(g, zero), run(lite, zero)
    assert sorted(float(v.ravel()[0]) for v in a.values() if v.size == 1) == \
        pytest.approx(sorted(float(v.ravel()[0]) for v in b.values() if v.size == 1), abs=1e-4)
