"""tl2k210/paths.py: one place for every location, the same answers from a checkout and from an
installed wheel (whose build hook, setup.py, bundles models/ and firmware/). The wheel itself is
built, installed outside the checkout and used by .ci/wheel_check.sh (run by .ci/run)."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO
from tl2k210 import paths


def test_checkout_locations():
    assert paths.checkout() == REPO
    assert paths.models_dir() == REPO / "models" and paths.firmware_dir() == REPO / "firmware"
    assert paths.import_root() == REPO


def test_testdata_and_cache_overrides(monkeypatch, tmp_path):
    monkeypatch.delenv("TL2K210_TESTDATA", raising=False)
    assert paths.testdata_dir() == REPO.parent / "shared" / "testdata"
    monkeypatch.setenv("TL2K210_TESTDATA", str(tmp_path))
    (tmp_path / "kmodels").mkdir()
    assert paths.testdata_dir() == tmp_path and paths.testdata("kmodels") == tmp_path / "kmodels"
    assert paths.testdata("kmodels", "missing.kmodel") is None
    monkeypatch.delenv("TL2K210_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.cache_dir() == tmp_path / "home" / ".cache" / "tl2k210"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.zoo_dir() == tmp_path / "xdg" / "tl2k210" / "zoo"
    monkeypatch.setenv("TL2K210_CACHE", str(tmp_path / "mine"))
    assert paths.zoo_dir() == tmp_path / "mine" / "zoo"


def test_installed_layout_reads_the_bundled_data(tmp_path):
    """A copy of the package with no checkout around it (what pip installs): paths points at
    tl2k210/data/, the zoo lists the bundled recipes, and there is no default test data."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "tl2k210", site / "tl2k210", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("models", "firmware"):
        shutil.copytree(REPO / name, site / "tl2k210" / "data" / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import os; os.environ.pop('TL2K210_TESTDATA', None)\n"
            "from tl2k210 import paths, zoo\n"
            "print(paths.checkout(), paths.testdata_dir())\n"
            "print(paths.models_dir()); print(paths.firmware_dir())\n"
            "print(sorted(zoo.recipes()))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}, check=True).stdout.splitlines()
    assert out[0] == "None None"
    assert out[1] == str(site / "tl2k210" / "data" / "models")
    assert out[2] == str(site / "tl2k210" / "data" / "firmware")
    assert out[3] == "['face_detect', 'face_recognition', 'mobilenet_v1', 'style_transfer']"


def test_the_build_hook_bundles_recipes_weights_and_scripts():
    spec = importlib.util.spec_from_file_location("tl2k210_setup", REPO / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    import setuptools
    real, setuptools.setup = setuptools.setup, lambda **kw: None      # import without building
    try:
        spec.loader.exec_module(mod)
    finally:
        setuptools.setup = real
    rel = {str(r) for _, r in mod.bundled_files()}
    for name in ("face_detect", "face_recognition", "mobilenet_v1", "style_transfer"):
        assert f"models/{name}/recipe.toml" in rel and f"models/{name}/network.py" in rel
    for name in ("face_detect", "face_recognition", "style_transfer"):
        assert f"models/{name}/weights.npz" in rel
    assert {f"firmware/{p.name}" for p in (REPO / "firmware").glob("*.py")} <= rel
    assert not any("__pycache__" in r or r.endswith(".pyc") for r in rel)
    # everything the checkout tracks under models/ and firmware/ is bundled
    tracked = subprocess.run(["git", "ls-files", "models", "firmware"], cwd=REPO, capture_output=True,
                             text=True).stdout.split()
    assert tracked and set(tracked) <= rel, set(tracked) - rel


def test_no_module_guesses_locations_from_its_own_file():
    """Every location is paths.py's: no other module of the package derives the checkout, the
    models/firmware folders or the test data from __file__."""
    offenders = []
    for f in sorted((REPO / "tl2k210").rglob("*.py")):
        if f.name == "paths.py" or "__pycache__" in f.parts:
            continue
        text = f.read_text()
        if "Path(__file__)" in text or "os.path.abspath(__file__)" in text or "shared\" / \"testdata" in text:
            offenders.append(str(f.relative_to(REPO)))
    assert offenders == []
    assert Path(paths.__file__).name == "paths.py"
