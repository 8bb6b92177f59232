"""The speed paths change nothing: the fused numba kernels, onnxruntime's integer conv sums, the
pure numpy path (TL2K210_NO_NUMBA=1, a fresh process), 1 or several band threads, and the paged
activation tables all give the same bytes on real kmodels."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, TESTDATA, data_path
from tl2k210.errors import EmulatorError
from tl2k210.k210 import hardware as hw, kmodel
from tl2k210.k210.emulator import Emulator, fast
from tl2k210.k210.emulator import kpu as K

MODELS = [("kmodels", "facedetect_320x240_v3"), ("kmodels", "yolo20_v4"),
          ("corpus/kmodels", "kendryte_mobile_yolo__yolo")]

RUN = """
import json, sys
import numpy as np
from tl2k210.k210.emulator import Emulator, fast
out = {}
for path in sys.argv[1:]:
    e = Emulator.load(path, threads=2)
    shape, dtype = e.input_spec()
    x = np.random.default_rng(5).integers(0, 256, shape).astype(np.uint8)
    out[path] = [o.tobytes().hex() for o in e.run(x)]
print(json.dumps({"numba": fast.available(), "out": out}))
"""


@pytest.mark.slow
def test_numba_and_numpy_paths_give_the_same_bytes():
    pytest.importorskip("numba")
    paths = [str(data_path(*d.split("/"), f"{n}.kmodel")) for d, n in MODELS]
    env = dict(os.environ, PYTHONPATH=str(REPO), TL2K210_NO_NUMBA="1")
    r = subprocess.run([sys.executable, "-c", RUN, *paths], capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    plain = json.loads(r.stdout.strip().splitlines()[-1])
    assert plain["numba"] is False and fast.available()
    for p in paths:
        e = Emulator.load(p, threads=1)
        assert all(pr.use_fast for pr in e.prepared.values())   # the fused kernels did run
        shape, _ = e.input_spec()
        x = np.random.default_rng(5).integers(0, 256, shape).astype(np.uint8)
        assert [o.tobytes().hex() for o in e.run(x)] == plain["out"][p], p


def test_integer_sums_and_float_blas_give_the_same_bytes(monkeypatch):
    """onnxruntime's ConvInteger sums (intconv.py) against the float BLAS path, on real kmodels."""
    pytest.importorskip("numba")
    pytest.importorskip("onnxruntime")
    from tl2k210.k210.emulator import intconv
    for d, n in MODELS[:2]:
        model = kmodel.load(data_path(*d.split("/"), f"{n}.kmodel"))
        e = Emulator(model, threads=1)
        assert any(p.int_sums is not None for p in e.prepared.values())
        shape, _ = e.input_spec()
        x = np.random.default_rng(6).integers(0, 256, shape).astype(np.uint8)
        with monkeypatch.context() as m:
            m.setattr(intconv, "available", lambda: False)
            blas = Emulator(model, threads=1)
        assert all(p.int_sums is None for p in blas.prepared.values())
        assert [o.tobytes() for o in e.run(x)] == [o.tobytes() for o in blas.run(x)], n


def test_paged_activation_table_is_exact():
    """Wide V spans use the paged table; every V in the span (and beyond) maps as the direct
    activation does."""
    rng = np.random.default_rng(1)
    for span_bits in (18, 21, 24):
        starts = np.sort(rng.integers(-(1 << span_bits), 1 << span_bits, 16))
        starts[0] = -(1 << 35)
        act = {"x_start": starts, "y_mul": rng.integers(1, 3000, 16),
               "shift_number": rng.integers(8, 24, 16), "bias": rng.integers(0, 256, 16).astype(np.uint8)}
        lo, hi = -(1 << span_bits) - 5, (1 << span_bits) + 5
        t = K.compile_activation(act, "nncase02", lo, hi)
        assert t is not None and t.fine is not None
        assert (t.q > 0) == (t.span > K.FLAT_MAX) and t.fine.size <= K.FINE_MAX
        v = np.concatenate([rng.integers(lo, hi + 1, 200_000), starts[1:], starts[1:] + 1,
                            starts[1:] - 1, [lo, hi]]).astype(np.int64)
        v = v[(v >= lo) & (v <= hi)]
        assert np.array_equal(t(v), K.activation(v, act, "nncase02"))


def test_output_channel_parts_give_the_same_bytes():
    """With several threads a normal conv summed by onnxruntime may run as output-channel parts
    (each its own session and kernels, into one output): the same bytes as one thread."""
    pytest.importorskip("numba")
    pytest.importorskip("onnxruntime")
    for d, n in MODELS[:2]:
        model = kmodel.load(data_path(*d.split("/"), f"{n}.kmodel"))
        one, two = Emulator(model, threads=1), Emulator(model, threads=2)
        parted = [p for p in two.prepared.values() if p.part_cuts]
        assert parted and all(len(p.part_cuts) == 2 for p in parted)
        for p in parted:                          # parts on every call, whatever trials say
            p.parallel, p._trials = True, None
        shape, _ = one.input_spec()
        for seed in (7, 8):
            x = np.random.default_rng(seed).integers(0, 256, shape).astype(np.uint8)
            assert [o.tobytes() for o in two.run(x)] == [o.tobytes() for o in one.run(x)], n
        assert all(len(p._parts) == 2 for p in parted)      # the parts did run


def _few_pieces_act(rng, pieces, shift, span_bits):
    """An activation with `pieces` - 1 segment starts inside ±2^span_bits (the rest far
    outside), slopes of either sign or 0, one shift for all."""
    inner = np.sort(rng.choice(np.arange(-(1 << span_bits), 1 << span_bits), pieces - 1,
                               replace=False))
    starts = np.concatenate([[-(1 << 35)], inner, (1 << 35) - np.arange(16 - pieces, 0, -1)])
    ym = rng.integers(-(1 << 12), 1 << 12, 16)
    ym[rng.random(16) < 0.2] = 0
    return {"x_start": starts, "y_mul": ym, "shift_number": np.full(16, shift),
            "bias": rng.integers(0, 256, 16).astype(np.uint8)}


@pytest.mark.parametrize("pieces", range(1, K.MAX_PIECES + 1))
def test_activation_pieces_are_exact(pieces):
    """The fused kernels' piecewise arithmetic (kpu.act_pieces, fast._look_rows) gives the step
    table's byte, and the direct activation's, for every u = V - lo of the span and past it;
    and whole layers that use it give the reference's bytes."""
    pytest.importorskip("numba")
    import test_kpu_stages as S
    rng = np.random.default_rng(40 + pieces)
    for i in range(12):
        shift, span_bits = int(rng.integers(0, 20)), 12 + i % 3
        act = _few_pieces_act(rng, pieces, shift, span_bits)
        lo, hi = -(1 << span_bits), 1 << span_bits   # narrow: negative slopes tabulate
        t = K.compile_activation(act, "nncase02", lo, hi)
        pc = K.act_pieces(act, "nncase02", t)
        assert 1 <= pc[0] <= pieces and K.act_pieces(act, "nncase01", t)[0] == 0
        u = np.arange(-3, t.top + 4, dtype=np.int64)
        out = np.empty((1, u.size), np.uint8)
        one = np.ones(1, np.int64)
        fast.bn_lut(u[None], 0 * one, one, 0 * one, 0 * one, t.pages, t.fine, t.q, t.top, pc,
                    np.empty(u.size, np.int64), out)
        v = np.clip(u, 0, t.top) + t.lo
        assert np.array_equal(out[0], t.shifted(u)), (pieces, i)
        assert np.array_equal(out[0], K.activation(v, act, "nncase02")), (pieces, i)
        depthwise = i % 2 == 0
        conv = S._random_conv(rng, depthwise, 3, 0 if depthwise else int(rng.integers(10)))
        a = conv.args
        a["arg_x"] = (a["arg_x"] >> a["shr_x"]) << a["shr_x"]   # a whole zero point: fused path
        conv.act = _few_pieces_act(rng, pieces, shift, 16)
        x = rng.integers(0, 256, conv.in_shape).astype(np.uint8)
        wshape = (conv.in_shape[0], 3, 3) if depthwise else (conv.out_shape[0], conv.in_shape[0], 3, 3)
        want = K.reference_layer(x, conv.weights.reshape(wshape), a, conv.bn, conv.act)
        p = K.PreparedConv(conv)
        if p.bn_args is not None:
            assert p.bn_args[-1][0] > 0
        assert np.array_equal(p(x), want), (pieces, i)


def test_kpu_ram_read_after_write_is_the_written_map_and_raw_access_forgets_it():
    from tl2k210.k210.emulator.memory import KpuRam
    ram = KpuRam()
    x = np.arange(2 * 5 * 20, dtype=np.uint8).reshape(2, 5, 20)
    ram.write(7, x)
    assert ram.read(7, 2, 5, 20) is x
    ram.mem[7 * 64] = 99                       # a raw write: the shortcut is dropped
    y = ram.read(7, 2, 5, 20)
    assert y is not x and y[0, 0, 0] == 99 and np.array_equal(y.reshape(-1)[1:], x.reshape(-1)[1:])


@pytest.mark.parametrize("pool_code", [1, 3, 5, 6, 7, 9])
def test_pool_before_bn_is_exact(pool_code):
    """Pick pools run before the BN stage on the fused path, and so do max pools of a layer
    whose table is monotone (the min of the sums where norm_mul < 0); a max pool of a
    non-monotone table runs after it, on uint8. Same bytes as the reference, in one band or
    several (a stride-1 window reaches into the next band), from int32 or float sums."""
    pytest.importorskip("numba")
    import test_kpu_stages as S
    rng = np.random.default_rng(pool_code)
    for i in range(8):
        conv = S._random_conv(rng, False, int(rng.choice([1, 3])), pool_code)
        conv.bn["norm_mul"][: conv.out_shape[0] // 2] *= -1 if i % 2 else 0   # <0 and 0 mul too
        a = conv.args
        a["arg_x"] = (a["arg_x"] >> a["shr_x"]) << a["shr_x"]   # a whole zero point: fused path
        monotone = i < 6          # a ReLU; else a step down from 200 to 0 at V = 0
        slope = int(rng.integers(1, 2000)) if monotone else 0
        conv.act = {"x_start": np.array([-(1 << 35), 0] + [(1 << 35) - 1] * 14),
                    "y_mul": np.array([0, slope] + [0] * 14),
                    "shift_number": np.array([0, int(rng.integers(8, 20))] + [0] * 14),
                    "bias": np.array([0 if monotone else 200] + [0] * 15, np.uint8)}
        x = rng.integers(0, 256, conv.in_shape).astype(np.uint8)
        x[:, :2] = 255
        wshape = (conv.out_shape[0], conv.in_shape[0], conv.k, conv.k)
        want = K.reference_layer(x, conv.weights.reshape(wshape), conv.args, conv.bn, conv.act)
        for threads, int_sums in ((1, True), (3, True), (1, False)):   # int32 or float sums
            p = K.PreparedConv(conv, threads=threads, int_sums=int_sums)
            assert p.pool_first == (monotone or hw.POOL[pool_code].kind == "pick"), (pool_code, i)
            cut = max(2, hw.POOL[pool_code].stride)              # bands align to the stride
            if threads > 1 and conv.in_shape[1] >= 2 * cut:
                p.bands = p.serial_bands = [(0, cut), (cut, conv.in_shape[1])]
            assert np.array_equal(p(x), want), (pool_code, i, threads)


def test_kpu_ram_lays_out_queued_writes_in_order_before_other_reads():
    """Writes reach the line layout lazily; a read of another map (or of raw bytes) sees every
    earlier write, the later one winning where they overlap."""
    from tl2k210.k210.emulator.memory import KpuRam
    ram = KpuRam()
    a = np.full((4, 3, 8), 1, np.uint8)
    b = np.full((1, 3, 8), 2, np.uint8)
    ram.write(0, a)
    ram.write(0, b)                     # overwrites channel 0 of a (same lines)
    got = ram.read(0, 4, 3, 8)          # a different shape: laid-out bytes
    assert (got[0] == 2).all() and (got[1:] == 1).all()
    ram.write(10, b)
    assert ram.mem[10 * 64] == 2


@pytest.mark.parametrize("use_fast", [True, False])
def test_band_threads_are_kept_only_where_measured_to_pay(use_fast, monkeypatch):
    """A multi-band layer alternates threads / one thread for its first 2 x TRIALS calls, then
    keeps threads only if they were PAY_OFF times faster; every call gives the same bytes."""
    import test_kpu_stages as S
    rng = np.random.default_rng(3)
    conv = S._random_conv(rng, False, 3, 0)
    x = rng.integers(0, 256, conv.in_shape).astype(np.uint8)
    wshape = (conv.out_shape[0], conv.in_shape[0], conv.k, conv.k)
    want = K.reference_layer(x, conv.weights.reshape(wshape), conv.args, conv.bn, conv.act)
    for pay_off, keeps in ((1e-9, True), (1e9, False)):
        monkeypatch.setattr(K, "PAY_OFF", pay_off)
        p = K.PreparedConv(conv, threads=3, use_fast=use_fast)
        p.bands = [(0, 1), (1, conv.in_shape[1])]     # force two bands whatever the size
        p.parallel, p._trials = True, ([], [])
        for _ in range(2 * K.TRIALS + 2):
            assert np.array_equal(p(x), want)
        assert p._trials is None and p.parallel is keeps


@pytest.mark.parametrize("name", ["yolo20_v3", "yolo20_v4"])
def test_frames_at_once_give_the_bytes_of_one_at_a_time(name, kmodel_path):
    """run_frames: frames on threads, each on its own 1-thread copy (kept for the next call),
    outputs in input order and byte for byte those of run."""
    e = Emulator.load(kmodel_path(f"{name}.kmodel"), threads=1)
    shape, _ = e.input_spec()
    xs = [np.random.default_rng(i).integers(0, 256, shape).astype(np.uint8) for i in range(5)]
    want = [[o.tobytes() for o in e.run(x)] for x in xs]
    copies = None
    for _ in range(2):
        got = e.run_frames(xs, threads=2)
        assert [[o.tobytes() for o in outs] for outs in got] == want
        assert 1 <= len(e._clones) <= 2 and all(c.prepared is not e.prepared for c in e._clones)
        now = {id(c) for c in e._clones}
        assert copies is None or copies <= now   # the second call reuses the first's copies
        copies = now
    assert all(p.threads == 1 for c in e._clones for p in c.prepared.values())
    assert e.run_frames([], threads=2) == [] and len(e.run_frames(xs[:1], threads=2)) == 1
    done = []
    with pytest.raises(EmulatorError):   # a bad frame raises in its turn, after the ones before
        for outs in e.iter_frames(xs[:2] + [xs[0][..., :1]] + xs[2:], threads=2):
            done.append([o.tobytes() for o in outs])
    assert done == want[:2]
