"""tl2k210/paths.py: one place for every location, the same answers from a checkout and from an
installed wheel (whose build hook, setup.py, bundles models/ and firmware/). The wheel itself is
built, installed outside the checkout and used by .ci/wheel_check.sh (run by .ci/run)."""
import ast
import importlib.util
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

from tl2k210 import paths

# the one independent answer (everything else, conftest's REPO included, asks paths.py)
REPO = Path(__file__).resolve().parents[1]


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


def test_the_build_hook_drops_stale_bundled_files(tmp_path):
    """pip builds in the checkout's build/ folder: a model deleted from models/ must not ship
    from an old build. The hook replaces tl2k210/data/ of the build folder as a whole."""
    stale = tmp_path / "tl2k210" / "data" / "models" / "deleted_model" / "recipe.toml"
    stale.parent.mkdir(parents=True)
    stale.write_text("name = 'deleted_model'\n")
    p = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    data = tmp_path / "tl2k210" / "data"
    assert sorted(d.name for d in (data / "models").iterdir()) == [
        "face_detect", "face_recognition", "mobilenet_v1", "style_transfer"]
    assert (data / "models" / "face_detect" / "weights.npz").read_bytes() == \
        (REPO / "models" / "face_detect" / "weights.npz").read_bytes()
    assert (data / "firmware" / "face_detect.py").is_file() and (tmp_path / "tl2k210" / "paths.py").is_file()


# code that derives a location from its own file's place, and string literals that spell out a
# path component of the test data or the user cache
CODE_GUESS = re.compile(r"(Path|abspath|dirname|realpath)\(__file__\)|\.parents\[\d\]")
STRING_GUESS = {"shared", "../shared", "../shared/testdata", ".cache", "~/.cache"}
SHELL_GUESS = re.compile(r"\.\./shared|\.cache")
ALLOWED = {"tl2k210/paths.py",      # the one place
           "setup.py",              # the build hook: runs before any tl2k210 is importable
           "tests/test_paths.py"}   # the independent check of paths.py (above)


def guesses(rel: str, text: str) -> list[str]:
    """Lines of a .py/.sh file that guess a location (docstrings, help texts and comments may
    still name the defaults)."""
    if not rel.endswith(".py"):
        return [ln for ln in text.splitlines() if SHELL_GUESS.search(ln.split(" #", 1)[0])
                and not ln.lstrip().startswith("#")]
    found, code = set(), {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and tok.string[:1] not in "fFrRbB" \
                and ast.literal_eval(tok.string) in STRING_GUESS:
            found.add(tok.start[0])
        elif tok.type not in (tokenize.STRING, tokenize.COMMENT):
            code[tok.start[0]] = code.get(tok.start[0], "") + tok.string     # strings left out
    found |= {n for n, c in code.items() if CODE_GUESS.search(c)}
    lines = text.splitlines()
    return [lines[n - 1].strip() for n in sorted(found)]


def test_no_file_guesses_locations_itself():
    """Every location is paths.py's: no other Python or shell file of the tree (package, tests,
    bench, zoo scripts, CI) derives the checkout, models/, firmware/, the test data or the cache
    from its own place."""
    files = subprocess.run(["git", "ls-files", "*.py", "*.sh", ".ci/*"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    assert "tl2k210/cli/__init__.py" in files and "bench/emulator.py" in files and ".ci/wheel_check.sh" in files
    offenders = [f"{rel}: {ln}" for rel in sorted(set(files) - ALLOWED)
                 for ln in guesses(rel, (REPO / rel).read_text())]
    assert offenders == [], "\n".join(offenders)
    # the check finds what it is for
    assert guesses("x.py", 'HERE = Path(__file__).resolve().parent\ny = HERE.parents[1]\n') == [
        "HERE = Path(__file__).resolve().parent", "y = HERE.parents[1]"]
    assert guesses("x.py", 'p = ROOT / ".." / "shared" / "testdata"\nq = os.path.join(h, ".cache")\n') == [
        'p = ROOT / ".." / "shared" / "testdata"', 'q = os.path.join(h, ".cache")']
    assert guesses("x.py", '"""Data in ../shared/testdata."""\nhelp="default ~/.cache/tl2k210"\n') == []
    assert guesses("x.sh", 'D="$REPO/../shared/testdata"\n# ../shared beside it\n') == ['D="$REPO/../shared/testdata"']
