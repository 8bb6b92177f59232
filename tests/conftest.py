"""Shared fixtures: the real files in ../shared/testdata (override: TL2K210_TESTDATA)."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTDATA = Path(os.environ.get("TL2K210_TESTDATA", REPO.parent / "shared" / "testdata"))
KMODELS = TESTDATA / "kmodels"
KMODEL_FILES = sorted(KMODELS.glob("*.kmodel")) if KMODELS.is_dir() else []

# the MANIFEST's decode settings for the YOLOv2 models
FACE_ANCHORS = [1.889, 2.5245, 2.9465, 3.94056, 3.99987, 5.3658, 5.155437, 6.92275, 6.718375, 9.01025]
VOC_ANCHORS = [1.08, 1.19, 3.42, 4.41, 6.63, 11.38, 9.42, 5.11, 16.62, 10.52]
VOC_CLASSES = ["aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
               "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep",
               "sofa", "train", "tvmonitor"]


def data_path(*parts) -> Path:
    p = TESTDATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"testdata missing: {p} (set TL2K210_TESTDATA to ../shared/testdata)")
    return p


@pytest.fixture
def kmodel_path():
    return lambda name: data_path("kmodels", name)
