"""The real third-party source models of ../shared/testdata/corpus/models, converted the way a
new user types it (`tl2k210 convert FILE OUT --dataset photos/`): each one converts and agrees
with its float model on photos calibration never saw, or is refused with a precise reason (the
node, its op, and what to change) and nothing written. Where the project also published a kmodel
made by nncase, ours must agree with the float model at least about as well.

Old Keras 2 .h5 files are checked against the same project's .tflite: same weights, same numbers.
"""
import re

import numpy as np
import pytest

from conftest import TESTDATA, data_path
from front_helpers import tf

pytestmark = pytest.mark.slow
MODELS = TESTDATA / "corpus" / "models"
KMODELS = TESTDATA / "corpus" / "kmodels"

# file -> (extra CLI args, nncase kmodel of the same model or None)
CASES = {
    "DAE_for_M5StickV__Model.tflite": ([], "DAE_for_M5StickV__Model.kmodel"),
    "DonkeyCar_on_M5StickV__Model_Original.tflite": ([], "DonkeyCar_on_M5StickV__Model_Original.kmodel"),
    "K210_mnist__mnist_lenet_K210_model.tflite": ([], "K210_mnist__test1.kmodel"),
    "LFFD-LP-K210__LPbox_1_branch.tflite": ([], "LFFD-LP-K210__LPbox_1_branch.kmodel"),
    "SemanticSegmentation4M5StickV__Model_V0_1.tflite": ([], "SemanticSegmentation4M5StickV__Model_V0_1.kmodel"),
    "animal_classification_k210__Classifier_best_val_accuracy_animals.tflite":
        (["--input-range", "-1,1"], "animal_classification_k210__Classifier_best_val_accuracy_animals.kmodel"),
    "k210-dronet__model.tflite": ([], "k210-dronet__model.kmodel"),
}
MUST_CONVERT = {"LFFD-LP-K210__LPbox_1_branch.tflite",
                "animal_classification_k210__Classifier_best_val_accuracy_animals.tflite"}
# a refusal names the node in quotes and says what the hardware or format can't do
PRECISE = re.compile(r"node '[^']+'.*(KPU|kmodel v3|--format|supported|kernel|channels|RAM|budget)", re.S)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from PIL import Image
    from skimage import data

    from devcorpus import PHOTOS
    d = tmp_path_factory.mktemp("calib")
    for n in PHOTOS:
        Image.fromarray(getattr(data, n)()).convert("RGB").save(d / f"{n}.png")
    return d, data_path("imagenet")


def _convert(src, out, calib, extra, capsys):
    from tl2k210.cli import main
    rc = main(["convert", str(src), str(out), "--dataset", str(calib), "-q", "--report", str(out) + ".json"] + extra)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(CASES))
def test_corpus_model_converts_or_is_refused_precisely(name, folders, tmp_path, capsys):
    from tl2k210.compiler_cli import compare
    src = data_path("corpus", "models", name)
    extra, theirs = CASES[name]
    calib, photos = folders
    out = tmp_path / "ours.kmodel"
    rc, err = _convert(src, out, calib, extra, capsys)
    if rc != 0:
        assert name not in MUST_CONVERT, err
        assert rc == 2 and "Traceback" not in err and PRECISE.search(err), err
        assert not out.exists()
        print(f"{name}: refused: {err.strip().splitlines()[-1]}")
        return
    pre = {"input_range": (-1.0, 1.0)} if "--input-range" in extra else {}
    ours = min(o["sqnr_db"] for o in compare(str(src), str(out), str(photos), **pre)["outputs"].values())
    line = f"{name}: ours {ours:.1f} dB"
    if theirs and (KMODELS / theirs).exists():
        nn = min(o["sqnr_db"] for o in compare(str(src), str(KMODELS / theirs), str(photos), **pre)["outputs"].values())
        line += f", nncase {nn:.1f} dB"
        assert ours >= nn - 3, line
    print(line)
    assert ours >= 20, line


@pytest.mark.parametrize("stem", ["DAE_for_M5StickV__Model", "K210_mnist__mnist_lenet_K210_model",
                                  "SemanticSegmentation4M5StickV__Model_V0_1"])
def test_keras2_h5_loads_and_matches_its_tflite(stem):
    """Keras 2.2 files Keras 3 refuses (SpatialDropout2D arguments, Sequential batch_input_shape):
    rebuilt, they compute what the project's own TFLite export computes."""
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
