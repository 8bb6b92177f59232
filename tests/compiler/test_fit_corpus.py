"""Real files of the kinds users export (../shared/testdata/corpus/fit, issue 23), each converted
as a user types it and measured like bench/fit.py (whose README table covers every file): the
kmodel on the emulator against the source model on photos calibration never saw -- a .tflite's
own TFLite interpreter (a fully quantized file's integer output), a float file's float graph.

The quick ones of each kind run here: fully int8 TFLite with and without --dataset (its own
scales), Keras 2 .h5 read by Keras 3's legacy loader and by tf-keras, a tf2onnx ONNX export
whose last pool is under the KPU's 4x4 minimum, an SSD with a constant anchors output."""
import sys

import pytest

from conftest import REPO, data_path

pytestmark = pytest.mark.slow
sys.path.insert(0, str(REPO / "bench"))

# file -> (own int8 ranges instead of --dataset?, min output SQNR dB, min top-1 agreement); the
# int8 files at the targets (>= 25 dB, top-1 >= 95 % vs the TFLite interpreter's output)
CASES = {
    "st_stmnist_v1_int8.tflite": (True, 25, 0.95),
    "mlperf_resnet8_cifar_int8.tflite": (True, 25, 0.95),
    "mlperf_vww_96_int8.tflite": (False, 30, 0.95),
    "st_fdmobilenet_0.25_128_food101_int8.tflite": (False, 25, 0.95),
    "mlperf_resnet8_cifar.h5": (False, 26, 0.95),                # Keras 3 legacy loader
    "st_mobilenet_v1_0.25_96_grayscale.h5": (False, 26, 0.9),    # tf-keras (DepthwiseConv2D groups=)
    "st_mobilenet_v2_128_0.5.onnx": (False, 25, 0.9),            # 4x4 pool of a 4x4 map: CPU
    "st_ssd_mobilenet_v1_025_192_int8.tflite": (False, 25, None),  # anchors: a constant output
}


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    from devcorpus import photo_folder
    return photo_folder(tmp_path_factory.mktemp("calib"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_fit_file_converts_and_agrees_with_its_source(name, calib):
    import fit
    own, min_db, min_top1 = CASES[name]
    extra, classifier = fit.FILES[name]
    row = fit.measure(data_path("corpus", "fit", name), extra, calib, classifier, own_ranges=own)
    print(row)
    assert row["result"] == "converted", row
    assert row["sqnr_db"] >= min_db
    if min_top1 is not None:
        assert row["top1_agreement"] >= min_top1
