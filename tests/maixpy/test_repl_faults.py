"""Uploads over a noisy line: the emulated MaixPy board corrupts or drops host->board bytes at
1e-4 per byte (the ISP board's seeded faults); 20 seeded runs of `put` of a 64 KiB file. Every
run either ends with the file byte-exact on the board and reported as verified, or fails with an
error that says so; never a silent corruption (the board's SHA-256 decides), and a failed run
leaves no file under the final name."""
import multiprocessing
import random
from concurrent.futures import ProcessPoolExecutor

import pytest

from repl_helpers import board
from tl2k210.flash.emulated_board import FaultConfig
from tl2k210.maixpy.repl import Repl, ReplError

SIZE = 64 * 1024
PARALLEL = 4        # a trial mostly waits (line timing, retry timeouts): run a few at once, each
                    # in its own process (one emulated board is current per process: maixpy/board.py)


def trial(tmp_path, seed, rate=1e-4):
    data = random.Random(500 + seed).randbytes(SIZE)
    (tmp_path / f"s{seed}").mkdir()
    bd = board(tmp_path / f"s{seed}", faults=FaultConfig(rate=rate, seed=seed))
    try:
        assert bd.wait_idle()
        with Repl.open(bd.port) as r:
            try:
                r.enter_raw()
                res = r.put(data, "/sd/model.kmodel")
                reported, msg = True, f"{res.status}, {res.retries} retries"
            except ReplError as exc:
                reported, msg = False, str(exc)
        final = bd.sd / "model.kmodel"
        exact = final.exists() and final.read_bytes() == data
        status = ("exact" if exact else "silent_corruption") if reported else \
            ("failed_no_file" if not final.exists() else "failed_but_file")
        return status, msg, sum(bd.stats.faults.values())
    finally:
        bd.close()


@pytest.mark.slow
def test_uploads_under_line_faults_are_exact_or_fail_loudly(tmp_path, record_property):
    with ProcessPoolExecutor(PARALLEL, mp_context=multiprocessing.get_context("spawn")) as pool:
        outcomes = list(pool.map(trial, [tmp_path] * 20, range(20)))
    counts = {}
    for status, _, _ in outcomes:
        counts[status] = counts.get(status, 0) + 1
    record_property("outcomes", counts)
    print(f"\n20 uploads of 64 KiB at 1e-4 faults/byte: {counts}, "
          f"{sum(f for *_, f in outcomes)} faults injected")
    assert sum(f for *_, f in outcomes) > 20 * 5, "the line must actually be noisy"
    assert counts.get("silent_corruption", 0) == 0
    for status, msg, _ in outcomes:
        assert status in ("exact", "failed_no_file"), (status, msg)
        if status != "exact":
            assert len(msg) > 40, msg               # says what happened and what to do
    assert counts.get("exact", 0) >= 18, counts
