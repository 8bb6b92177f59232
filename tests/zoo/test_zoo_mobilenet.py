"""Zoo: MobileNetV1 recipe build and the transfer-learning recipe (folder of images per class)."""
import json
import sys
from pathlib import Path

import pytest

from conftest import REPO, data_path

pytest.importorskip("tensorflow")
pytest.importorskip("tensorlayer")


def test_zoo_list_and_build_mobilenet(zoo_build, capsys):
    from tl2k210.cli import main
    from tl2k210.flash.kfpkg import read_kfpkg
    data_path("weights", "mobilenetv1_0.25_tensorlayer.npz")
    assert main(["zoo", "list"]) == 0
    assert "mobilenet_v1" in capsys.readouterr().out
    rep = zoo_build("mobilenet_v1")
    out = Path(rep["kmodel"]).parent
    kbytes = (out / "mobilenet_v1.kmodel").read_bytes()
    images = read_kfpkg(out / "mobilenet_v1.kfpkg")
    assert [(i.address, i.data) for i in images] == [(0x300000, kbytes)]
    r = rep["receipt"]
    assert r["file_size"] + r["main_memory"] <= 2 * 1024 * 1024
    assert json.loads((out / "mobilenet_v1.report.json").read_text())["flash_address"] == "0x300000"


@pytest.mark.slow
def test_transfer_learning_faces(tmp_path):
    sys.path.insert(0, str(REPO))
    from models.mobilenet_v1 import transfer
    data_path("weights", "mobilenetv1_0.25_tensorlayer.npz")
    data = transfer.demo_faces_dataset(tmp_path / "faces")
    rep = transfer.run(data, tmp_path / "out", progress=False)
    print(rep)
    assert rep["classes"] == ["face", "not_face"] and rep["heldout"] == 60
    assert rep["float_accuracy"] >= 0.95 and rep["kmodel_accuracy"] >= 0.95   # measured 1.000 / 0.983
    assert rep["agreement"] >= 0.95
    assert (tmp_path / "out" / "classifier.kmodel").exists()


@pytest.mark.slow
def test_larger_alphas_convert_and_which_firmware_they_need(tmp_path):
    """α = 0.5 / 0.75 (untrained weights: only α = 0.25 ImageNet weights ship in the testdata):
    with --kpu-padding α = 0.5 fits the full MaixPy firmware's ~2 MiB, α = 0.75 needs a *_minimum
    build, and the compiler says so before writing anything (sizes: models/mobilenet_v1/README.md)."""
    sys.path.insert(0, str(REPO))
    from models.mobilenet_v1.network import mobilenet_v1
    from tl2k210.compiler import BudgetError, ConvertOptions, convert
    calib = data_path("imagenet")

    def opts(runtime):     # sizes and budgets do not depend on the calibration set: 4 images will do
        return ConvertOptions(dataset=str(calib), input_range=(-1, 1), progress=False, runtime=runtime,
                              calib_limit=4, sqnr_samples=1, min_sqnr=0)   # untrained: no quality to gate

    half = convert(mobilenet_v1(0.5, kpu_friendly=True), tmp_path / "a050.kmodel", opts("maixpy"))
    assert 1_300_000 < half.file_size < 1_450_000 and half.file_size + half.main_memory <= 2 * 1024 * 1024
    assert half.peak_kpu_ram <= 2 * 1024 * 1024
    net = mobilenet_v1(0.75, kpu_friendly=True)
    with pytest.raises(BudgetError, match="maixpy-minimum"):
        convert(net, tmp_path / "a075.kmodel", opts("maixpy"))
    assert not (tmp_path / "a075.kmodel").exists()
    big = convert(net, tmp_path / "a075.kmodel", opts("maixpy-minimum"))
    assert 2_600_000 < big.file_size < 2_700_000 and big.file_size + big.main_memory <= 4 * 1024 * 1024
    assert (tmp_path / "a075.kmodel").stat().st_size == big.file_size
