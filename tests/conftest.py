"""Shared fixtures and suite-speed rules.

* Real files come from ../shared/testdata (override: TL2K210_TESTDATA): `data_path(...)` skips
  with a reason when one is missing.
* `zoo_build(name)` (session fixture) builds a zoo model ONCE per test run, shared by the xdist
  workers (file lock; the second worker waits and reuses the files): never call `zoo.build` in
  a test for a model the fixture gives you.
* Tests that take seconds are marked `slow` (`make test-fast` skips them, `make test` runs them):
  anything using `zoo_build` is marked automatically; mark the rest yourself with
  `@pytest.mark.slow` (conversions of real-size networks, fault trials, fuzzing, training).
  Slow tests are scheduled first so that no long test starts last on one worker.
* One BLAS thread per test process (see below).
* A module-level `RNG` (in a test module, `front_helpers`, `lower_helpers`) is reseeded from the
  test's own id before each test, so a test sees the same numbers whichever tests xdist ran
  before it on its worker. Draw from `RNG`, never from a generator kept across tests.
"""
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path

# Before numpy/numba are imported: the xdist workers already share the cores, so threads
# inside a test process only oversubscribe them, and waiting OpenBLAS / OpenMP threads spin.
# One BLAS thread per process, sleeping OpenMP (numba) waits: the same results, and on this
# 2-core machine under load an emulated facedetect frame took 73 ms instead of 506 ms.
# Subprocesses of the tests inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# A suite started with SIGINT ignored (`make test &` from a script, `nohup` under some shells)
# would hand SIG_IGN to every subprocess through exec, and the tests that send Ctrl-C to a CLI
# would wait for an interrupt that never comes. A handled signal is reset to the default at
# exec: restore Python's handler here, in every test process (xdist workers import this too).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402

from tl2k210 import paths  # noqa: E402

REPO = paths.checkout()            # tests run from a checkout
TESTDATA = paths.testdata_dir()
KMODELS = TESTDATA / "kmodels"
KMODEL_FILES = sorted(KMODELS.glob("*.kmodel")) if KMODELS.is_dir() else []

# the MANIFEST's decode settings for the YOLOv2 models
FACE_ANCHORS = [1.889, 2.5245, 2.9465, 3.94056, 3.99987, 5.3658, 5.155437, 6.92275, 6.718375, 9.01025]
VOC_ANCHORS = [1.08, 1.19, 3.42, 4.41, 6.63, 11.38, 9.42, 5.11, 16.62, 10.52]
VOC_CLASSES = ["aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
               "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep",
               "sofa", "train", "tvmonitor"]


def cli_env() -> dict:
    """Environment for a `python -m tl2k210.cli` subprocess as a user starts it: this tree
    importable, none of the run's TF_* / TL2K210_VERBOSE settings (they would let TF talk)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TL2K210_VERBOSE"))}
    env["PYTHONPATH"] = str(paths.import_root())
    return env


def data_path(*parts) -> Path:
    p = TESTDATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"testdata missing: {p} (set TL2K210_TESTDATA to ../shared/testdata)")
    return p


@pytest.fixture
def kmodel_path():
    return lambda name: data_path("kmodels", name)


# ---------------------------------------------------------------------------------------------
# one build per zoo model per test run, shared across xdist workers
def _shared_dir(tmp_path_factory) -> Path:
    """A folder every worker of this run sees (pytest-xdist: the parent of the workers' basetemp)
    and no other run does."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _seeded_inputs(request):
    """Each test's random numbers depend on its id only, not on the tests xdist ran before it on
    its worker: every module-level `RNG` (the test module's, the helpers') is reseeded from it."""
    import numpy as np

    import front_helpers
    import lower_helpers
    seed = zlib.crc32(request.node.nodeid.encode())
    for mod in (request.module, front_helpers, lower_helpers):
        if isinstance(getattr(mod, "RNG", None), np.random.Generator):
            mod.RNG = np.random.default_rng(seed)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """tl2k210's user cache (built zoo models, ~/.cache/tl2k210) is a folder of this run:
    tests neither read a model the user built nor leave files in their home."""
    old = os.environ.get("TL2K210_CACHE")
    os.environ["TL2K210_CACHE"] = str(_shared_dir(tmp_path_factory) / "user-cache")
    yield
    if old is None:
        os.environ.pop("TL2K210_CACHE", None)
    else:
        os.environ["TL2K210_CACHE"] = old


BUILD_LOG = "zoo-builds.log"       # one line per zoo model built in this run: NAME WHERE


def _log_build(shared: Path, name: str, where: str):
    with _locked(shared / f"{BUILD_LOG}.lock"), open(shared / BUILD_LOG, "a") as fh:
        fh.write(f"{name} {where}\n")


def built_twice(log_text: str) -> dict[str, list[str]]:
    """{model: [where, ...]} for the zoo models the log shows built more than once."""
    seen: dict[str, list[str]] = {}
    for line in log_text.splitlines():
        name, _, where = line.partition(" ")
        seen.setdefault(name, []).append(where)
    return {k: v for k, v in seen.items() if len(v) > 1}


@pytest.fixture(scope="session")
def zoo_build(tmp_path_factory):
    """zoo_build(NAME) -> the report dict of `tl2k210 zoo build NAME --out FOLDER` (kmodel,
    kfpkg, receipt, ...; "stdout"/"stderr": what the command printed), built once per run by the
    real CLI in a subprocess. Treat the files as read-only."""
    shared = _shared_dir(tmp_path_factory)
    root = shared / "zoo-builds"
    root.mkdir(exist_ok=True)
    cache = {}

    def get(name):
        if name not in cache:
            pytest.importorskip("tensorflow", reason="zoo builds need TensorFlow")
            pytest.importorskip("tensorlayer", reason="zoo builds need TensorLayer")
            out = root / name
            report = out / f"{name}.report.json"
            with _locked(root / f"{name}.lock"):
                if not report.is_file():
                    p = subprocess.run([sys.executable, "-m", "tl2k210.cli", "zoo", "build", name,
                                        "--out", str(out)], env=cli_env(), capture_output=True, text=True)
                    assert p.returncode == 0, p.stderr
                    _log_build(shared, name, "the zoo_build fixture")
                    (root / f"{name}.stdout").write_text(p.stdout)
                    (root / f"{name}.stderr").write_text(p.stderr)
            cache[name] = {**json.loads(report.read_text()), "stdout": (root / f"{name}.stdout").read_text(),
                           "stderr": (root / f"{name}.stderr").read_text()}
        return cache[name]
    return get


@pytest.fixture(scope="session", autouse=True)
def _count_other_zoo_builds(tmp_path_factory):
    """A test that builds a zoo model itself (tl2k210.zoo.build, in-process) is logged too; the
    run fails at its end when any model was built twice (pytest_sessionfinish)."""
    from tl2k210 import zoo
    shared = _shared_dir(tmp_path_factory)
    real = zoo.build

    def build(name, *args, **kwargs):
        report = real(name, *args, **kwargs)
        _log_build(shared, name, os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0])
        return report
    zoo.build = build
    yield
    zoo.build = real


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return                        # the controller (or a run without xdist) checks the log
    # the run's base temp folder, if it made one (asking getbasetemp() would make one now)
    base = getattr(getattr(session.config, "_tmp_path_factory", None), "_basetemp", None)
    if base is None or not (base / BUILD_LOG).is_file():
        return
    twice = built_twice((base / BUILD_LOG).read_text())
    if twice:
        rep = session.config.pluginmanager.get_plugin("terminalreporter")
        for name, where in twice.items():
            msg = f"ERROR: zoo model {name} was built {len(where)} times: {'; '.join(where)} (use the zoo_build fixture)"
            if rep is not None:
                rep.write("\n")
                rep.write_line(msg, red=True)
            else:
                print(msg, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---------------------------------------------------------------------------------------------
def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) or {}
    return any(d and d[-1].scope in ("module", "class") for d in defs.values())


@pytest.hookimpl(tryfirst=True)      # before xdist turns xdist_group marks into scopes
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "zoo_build" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
        # with `--dist loadgroup` (make test) the tests sharing a module-scoped fixture run on
        # one worker, so that fixture is built once; the other tests spread one by one
        if _uses_module_fixture(item) and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    # modules holding slow tests first, each module kept contiguous (module fixtures are set up
    # once): long tests start while the other worker still has many short ones to take
    first = {}
    for i, item in enumerate(items):
        mod = item.nodeid.split("::")[0]
        slow = item.get_closest_marker("slow") is not None
        first[mod] = min(first.get(mod, (1, i)), (0 if slow else 1, i))
    items.sort(key=lambda it: first[it.nodeid.split("::")[0]])


def pytest_runtest_setup(item):
    # TensorLayer layers cost seconds each to construct under pytest (inspect.stack); once a test
    # module has imported tensorlayer, make construction cheap (same layers, see fast_layer_init)
    if "tensorlayer.layers.core" in sys.modules:
        from tl2k210.frontends.tensorlayer import fast_layer_init
        fast_layer_init()
