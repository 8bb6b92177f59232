"""The numba warm-up (`make venv`): its signatures parse to the argument types the cache keys on,
and name kernels that exist."""
import pytest

from tl2k210.k210.emulator import fast, warm


@pytest.mark.skipif(not fast.available(), reason="numba is not installed")
def test_signatures_name_kernels_and_parse_to_types():
    from numba.core import types
    from numba.core.sigutils import normalize_signature
    funcs = warm.dispatchers()
    assert set(warm.SIGNATURES) <= set(funcs)
    for name, sigs in warm.SIGNATURES.items():
        assert len(set(sigs)) == len(sigs), name
        for s in sigs:
            args, _ = normalize_signature(s)
            assert all(isinstance(t, types.Type) for t in args)
            assert warm._signature(args) == s       # --record prints what SIGNATURES holds


@pytest.mark.skipif(not fast.available(), reason="numba is not installed")
def test_a_stale_signature_is_reported_not_raised(monkeypatch):
    monkeypatch.setattr(warm, "SIGNATURES", {"no_such_kernel": ["(int64,)"], "_step": ["(float32,)"]})
    ready, stale = warm.warm()
    assert ready == 0 and len(stale) == 2 and stale[0].startswith("no_such_kernel")
