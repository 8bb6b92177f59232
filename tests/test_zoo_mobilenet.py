"""Zoo: MobileNetV1 recipe build and the transfer-learning recipe (folder of images per class)."""
import json
import sys

import pytest

from conftest import REPO, data_path

pytest.importorskip("tensorflow")
pytest.importorskip("tensorlayer")


def test_zoo_list_and_build_mobilenet(tmp_path, capsys):
    from tl2k210 import zoo
    from tl2k210.cli import main
    from tl2k210.flash.kfpkg import read_kfpkg
    data_path("weights", "mobilenetv1_0.25_tensorlayer.npz")
    assert main(["zoo", "list"]) == 0
    assert "mobilenet_v1" in capsys.readouterr().out
    rep = zoo.build("mobilenet_v1", tmp_path, progress=False)
    kbytes = (tmp_path / "mobilenet_v1.kmodel").read_bytes()
    images = read_kfpkg(tmp_path / "mobilenet_v1.kfpkg")
    assert [(i.address, i.data) for i in images] == [(0x300000, kbytes)]
    r = rep["receipt"]
    assert r["file_size"] + r["main_memory"] <= 2 * 1024 * 1024
    assert json.loads((tmp_path / "mobilenet_v1.report.json").read_text())["flash_address"] == "0x300000"


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
