"""The main-memory planner (tl2k210/k210/lower/memory.py): buffers re-placed offline from their
lifetimes, greedy by size; the plan is checked (two live buffers never overlap) and the kmodel's
outputs are bit for bit those of the online first-fit allocation."""
import numpy as np
import pytest

from tl2k210.k210.lower.memory import Block, MainAllocator, check, plan

pytest.importorskip("onnxruntime")


def test_greedy_by_size_beats_first_fit_where_a_small_buffer_splits_memory():
    """First fit puts a long-lived small buffer after a short-lived big one, so the next big
    buffer cannot reuse the gap; placing the big ones first keeps them together."""
    t = [0]
    m = MainAllocator(lambda: t[0])
    m.alloc("big1", 1000)
    m.alloc("small", 8)          # lives to the end
    t[0] = 1
    m.free("big1")
    m.alloc("big2", 1600)
    t[0] = 2
    m.free("big2")
    assert m.high == 1008 + 1600
    at, peak = plan(m.history, 2)
    assert peak == 1600 + 8 and peak < m.high
    check(m.history, at, 2)


def test_an_overlap_of_two_live_buffers_is_an_error():
    blocks = [Block("a", 0, 64, 0, 3), Block("b", 0, 64, 2, 5), Block("c", 0, 64, 3, 5)]
    check(blocks, {0: 0, 2: 0}, 5)                 # a and c: one after the other
    with pytest.raises(AssertionError, match="a .* and b .* are live together"):
        check(blocks, {0: 0, 1: 32}, 5)


@pytest.mark.parametrize("fmt", ["v3", "v4"])
def test_planned_kmodel_gives_the_same_outputs_in_less_memory(fmt, monkeypatch):
    """A tiled chain (row bands, channel chunks, CPU picks and pools): the planned kmodel's outputs
    equal the first-fit one's bit for bit, in no more main memory."""
    from lower_helpers import compile_model, pixels
    from test_lower import _chain
    from tl2k210.k210.emulator import Emulator
    from tl2k210.k210.lower import state
    m = _chain(40, 48)
    px = pixels(3, 3, 40, 48)
    planned = compile_model(m, px, format=fmt, kpu_ram_lines=500)[0]
    monkeypatch.setattr(state, "plan", lambda blocks, end: ({}, float("inf")))
    online = compile_model(m, px, format=fmt, kpu_ram_lines=500)[0]
    mem = (lambda k: k.main_mem) if fmt == "v4" else (lambda k: k.main_mem_usage)
    assert mem(planned) <= mem(online)
    for p in px:
        for a, b in zip(Emulator(planned).run(p), Emulator(online).run(p)):
            np.testing.assert_array_equal(a, b)
