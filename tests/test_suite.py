"""The suite's own rules (tests/conftest.py): heavy tests carry the `slow` marker, and no zoo
model is built twice in a run (the build log that pytest_sessionfinish checks)."""
import re

import pytest

from conftest import built_twice

# fuzzing, fault-injection trials, MobileNet alpha conversions, transfer learning, zoo builds
HEAVY = re.compile(r"fuzz|_faults\.py|alphas|transfer_learning")


def test_heavy_tests_are_marked_slow(request):
    """Of the tests collected in this run (after `-m "not slow"` deselection in make test-fast),
    none that is heavy by name or uses a zoo build lacks the marker."""
    items = request.session.items
    assert request.node in items
    unmarked = [it.nodeid for it in items if it.get_closest_marker("slow") is None and
                (HEAVY.search(it.nodeid.split("[")[0]) or "zoo_build" in getattr(it, "fixturenames", ()))
                and it.nodeid != request.node.nodeid]
    assert unmarked == []
    assert HEAVY.search("tests/test_flash_faults.py::test_x") and not HEAVY.search("t.py::test_default")


def test_zoo_build_log_finds_a_model_built_twice():
    log = ("face_detect the zoo_build fixture\nmobilenet_v1 the zoo_build fixture\n"
           "face_detect tests/test_x.py::test_builds_it_again\n")
    assert built_twice(log) == {"face_detect": ["the zoo_build fixture", "tests/test_x.py::test_builds_it_again"]}
    assert built_twice("face_detect the zoo_build fixture\n") == {} and built_twice("") == {}


def test_an_in_process_zoo_build_is_logged(request, tmp_path, monkeypatch):
    """tl2k210.zoo.build is wrapped for the whole run: a test that calls it (here with the
    conversion stubbed out) is logged under its own id; a refused build is not."""
    import conftest
    from tl2k210 import zoo
    calls = []
    monkeypatch.setattr(conftest, "_log_build", lambda shared, name, where: calls.append((name, where)))
    monkeypatch.setattr(zoo, "_build", lambda r, out, progress: {"name": r.name})
    assert zoo.build("face_detect", tmp_path / "z", progress=False) == {"name": "face_detect"}
    assert calls == [("face_detect", request.node.nodeid)]
    with pytest.raises(Exception):
        zoo.build("no_such_model", tmp_path / "y")
    assert len(calls) == 1
