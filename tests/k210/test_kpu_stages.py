"""Each KPU stage against hand-computed values (docs/kpu.md#pipeline, #sum-rule)."""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
import pytest

from tl2k210.k210 import hardware as hw
from tl2k210.k210.emulator import kpu as K
from tl2k210.k210.emulator.memory import KpuRam
from tl2k210.k210.kmodel.kpu import KpuConv


# ---------------------------------------------------------------- rounding shifts
@pytest.mark.parametrize("t,s,expect", [
    (5, 1, 2),     # 2.5 -> tie, q=2 even -> 2
    (7, 1, 4),     # 3.5 -> tie, q=3 odd -> 4
    (6, 2, 2),     # 1.5 -> tie, q=1 odd -> 2
    (10, 2, 2),    # 2.5 -> tie, q=2 even -> 2
    (9, 2, 2),     # 2.25 -> 2
    (11, 2, 3),    # 2.75 -> 3
    (-1, 2, -2),   # vendor quirk: q=-1, f=3 > h=2 -> q + sign(T) = -2 (true value -0.25)
    (-3, 1, -2),   # -1.5: q=-2, f=1 == h, q even -> -2
    (-5, 1, -4),   # -2.5: q=-3, f=1 == h, q odd -> q - 1 = -4
    (123, 0, 123),
])
def test_carry_shift_nncase02(t, s, expect):
    assert int(K.carry_shift_nncase02(np.int64(t), s)) == expect


@pytest.mark.parametrize("t,s,expect", [
    (5, 1, 3),     # 2.5 -> half up -> 3
    (7, 1, 4),
    (9, 2, 2),     # v = 9>>1 = 4 even -> 2
    (11, 2, 3),    # v = 5 odd -> 3
    (-3, 1, -3),   # v = -3 odd, negative -> (-3>>1) - 1 = -3  (literal SDK code)
    (-4, 1, -2),
    (17, 0, 17),
])
def test_carry_shift_nncase01(t, s, expect):
    assert int(K.carry_shift_nncase01(np.int64(t), s)) == expect


# ---------------------------------------------------------------- batch-norm
def test_batchnorm_floor_shift():
    acc = np.array([[-3, 3, 100]])
    bn = {"norm_mul": [3], "norm_shift": [2], "norm_add": [-10]}
    # (-9 >> 2) = -3 (floor), (9 >> 2) = 2, (300 >> 2) = 75
    assert K.batchnorm(acc, bn).tolist() == [[-13, -8, 65]]


# ---------------------------------------------------------------- activation
def _act(starts, muls, shifts, biases):
    starts = list(starts) + [(1 << 34) + i for i in range(16 - len(starts))]  # unreachable
    pad = lambda v, fill: list(v) + [fill] * (16 - len(v))  # noqa: E731
    return {"x_start": np.array(starts, np.int64), "y_mul": np.array(pad(muls, 0), np.int64),
            "shift_number": np.array(pad(shifts, 0), np.int64),
            "bias": np.array(pad(biases, 0), np.uint8)}


def test_activation_segments_boundary_and_rounding():
    act = _act([-(1 << 35), 0, 1000], [0, 3, -2], [0, 2, 1], [7, 10, 250])
    v = np.array([-5, 0, 1, 2, 999, 1000, 1001, 1002, 10_000])
    # nncase02: segment = highest i with V > start; V=0 stays in segment 0, V=1000 in segment 1
    # V=1: (1*3)=3 >>2: q=0,f=3>h=2 -> 1, +10 = 11; V=2: 6>>2: q=1,f=2==h, q odd -> 2, +10 = 12
    # V=999: 2997: q=749, f=1 -> 749 + 10 = 759 -> clamp 255; V=1000 (seg 1): 3000 -> 750+10 -> 255
    # V=1001 (seg 2): (1)(-2) = -2, s=1: q=-1, f=0 -> -1, +250 = 249; V=1002: -4 >>1 = -2 -> 248
    # V=10000: (9000)(-2) = -18000 >> 1 = -9000 + 250 -> clamp 0
    assert K.activation(v, act, "nncase02").tolist() == [7, 7, 11, 12, 255, 255, 249, 248, 0]
    # nncase01: V >= start; V=0 -> segment 1: 0 + 10 = 10; V=1000 -> segment 2: 0 + 250
    # V=1: 3: v = 3>>1 = 1 odd -> 1, +10 = 11; V=1001: -2: v=-2 even -> -1 -> 249
    assert K.activation(v, act, "nncase01").tolist() == [7, 10, 11, 12, 255, 250, 249, 248, 0]


def test_activation_duplicate_starts_highest_index_wins():
    act = _act([-(1 << 35), 50, 50], [0, 0, 0], [0, 0, 0], [1, 2, 3])
    assert K.activation(np.array([49, 50, 51]), act).tolist() == [1, 1, 3]


@pytest.mark.parametrize("rule", K.ACT_RULES)
def test_compiled_activation_equals_direct(rule):
    rng = np.random.default_rng(5)
    for _ in range(60):
        starts = np.sort(rng.integers(-(1 << 20), 1 << 20, 16))
        starts[0] = -(1 << 35)
        act = {"x_start": starts, "y_mul": rng.integers(-300, 3000, 16),
               "shift_number": rng.integers(0, 21, 16), "bias": rng.integers(0, 256, 16).astype(np.uint8)}
        vmin, vmax = sorted(rng.integers(-(1 << 21), 1 << 21, 2))
        table = K.compile_activation(act, rule, int(vmin), int(vmax))
        v = np.concatenate([rng.integers(vmin, vmax + 1, 5000), starts[(starts >= vmin) & (starts <= vmax)],
                            starts[(starts >= vmin) & (starts < vmax)] + 1, [vmin, vmax]]).astype(np.int64)
        want = K.activation(v, act, rule)
        if table is not None:
            assert np.array_equal(table(v.copy()), want)


# ---------------------------------------------------------------- pooling, every code at odd sizes
def _pool_loops(y, code):
    """docs/kpu.md#pooling written as plain loops."""
    p = hw.POOL[code]
    c, h, w = y.shape
    if p.kind == "bypass":
        return y
    if p.stride == 1:
        out = np.zeros_like(y)
        for ch in range(c):
            for i in range(h):
                for j in range(w):
                    if p.kind == "mean":
                        taps = [y[ch, min(i + dy, h - 1), min(j + dx, w - 1)] for dy in (0, 1) for dx in (0, 1)]
                        out[ch, i, j] = sum(int(t) for t in taps) // 4
                    else:
                        taps = [y[ch, i + dy, j + dx] if i + dy < h and j + dx < w else 0
                                for dy in (0, 1) for dx in (0, 1)]
                        out[ch, i, j] = max(taps)
        return out
    k = p.size
    oh, ow = h // k, w // k
    out = np.zeros((c, oh, ow), np.uint8)
    for ch in range(c):
        for i in range(oh):
            for j in range(ow):
                win = [int(y[ch, k * i + dy, k * j + dx]) for dy in range(k) for dx in range(k)]
                if p.kind == "max":
                    out[ch, i, j] = max(win)
                elif p.kind == "mean":
                    out[ch, i, j] = sum(win) // (k * k)
                else:
                    out[ch, i, j] = y[ch, k * i + p.pick[0], k * j + p.pick[1]]
    return out


@pytest.mark.parametrize("code", range(10))
@pytest.mark.parametrize("shape", [(2, 5, 7), (3, 9, 11), (1, 4, 4)])
def test_pool_codes(code, shape):
    y = np.random.default_rng(code).integers(0, 256, shape).astype(np.uint8)
    assert np.array_equal(K.pool(y, code), _pool_loops(y, code))


def test_mean_pool_floor_and_edge_replication():
    y = np.array([[[1, 2, 250], [3, 4, 255]]], np.uint8)
    assert K.pool(y, 2).tolist() == [[[2]]]                    # (1+2+3+4)//4
    assert K.pool(y, 8)[0, 1].tolist() == [3, 129, 255]        # bottom row replicated: (3+4+3+4)//4...
    assert K.pool(y, 9)[0, 1].tolist() == [4, 255, 255]        # beyond the edge counts as 0


# ---------------------------------------------------------------- convolution sums
def _args(**over):
    a = {f.name: 0 for f in hw.LAYER_FIELDS}
    a.update(hw.LAYER_DEFAULTS)
    a.update(over)
    return a


def test_conv_sum_with_pad_taps_by_hand():
    x = np.arange(1, 17, dtype=np.uint8).reshape(1, 4, 4)
    w = np.ones((1, 1, 3, 3), np.int64)
    a = _args(kernel_type=1, pad_value=7, arg_x=-2 << 3, shr_x=3, arg_w=-5, shr_w=0, arg_add=11)
    acc = K.conv_acc(x, w, a)
    # corner (0,0): taps = 5 pads of 7 + x[0,0],x[0,1],x[1,0],x[1,1] = 35 + 1+2+5+6 = 49
    # S = 49 (weights 1), Σx term = (-16*49) >> 3 = -98, Σw term = -5*9 = -45, arg_add*1 = 11
    assert acc[0, 0, 0] == 49 - 98 - 45 + 11
    # centre (1,1): taps 1,2,3,5,6,7,9,10,11 = 54
    assert acc[0, 1, 1] == 54 - 108 - 45 + 11


def test_sum_rules_differ_only_for_fractional_zero_points():
    # two input channels, one pixel each = 1, 1x1 conv, arg_x = 1 with shr_x = 1 (x-zero-point 0.5)
    x = np.ones((2, 4, 4), np.uint8)
    w = np.zeros((1, 2, 1, 1), np.int64)
    a = _args(kernel_type=0, arg_x=1, shr_x=1)
    # silicon: (1*1 >> 1) + (1*1 >> 1) = 0 ; simulator: (1 * 2) >> 1 = 1
    assert K.conv_acc(x, w, a, "silicon")[0, 0, 0] == 0
    assert K.conv_acc(x, w, a, "simulator")[0, 0, 0] == 1
    a2 = _args(kernel_type=0, arg_x=-4, shr_x=1)  # whole zero point: rules agree
    assert K.conv_acc(x, w, a2, "silicon")[0, 0, 0] == K.conv_acc(x, w, a2, "simulator")[0, 0, 0] == -4


def test_conv_acc_matches_plain_loops():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (3, 5, 6)).astype(np.uint8)
    w = rng.integers(0, 256, (4, 3, 3, 3))
    a = _args(kernel_type=1, pad_value=9, arg_x=-1234567, shr_x=7, arg_w=-765, shr_w=3, arg_add=-99999)
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1)), constant_values=9).astype(np.int64)
    want = np.zeros((4, 5, 6), np.int64)
    for o in range(4):
        for i in range(5):
            for j in range(6):
                s = tx = tw = 0
                for c in range(3):
                    win = xp[c, i:i + 3, j:j + 3]
                    s += int((win * w[o, c]).sum())
                    tx += (a["arg_x"] * int(win.sum())) >> a["shr_x"]
                    tw += (a["arg_w"] * int(w[o, c].sum())) >> a["shr_w"]
                want[o, i, j] = s + tx + tw + a["arg_add"] * 3
    assert np.array_equal(K.conv_acc(x, w, a, "silicon"), want)


# ---------------------------------------------------------------- prepared layer == reference
def _random_conv(rng, depthwise, k, pool, wide=False):
    ci = int(rng.integers(1, 40))
    co = ci if depthwise else int(rng.integers(1, 40))
    h, w = int(rng.integers(4, 20)), int(rng.integers(4, 70))
    oh, ow = hw.POOL[pool].out_size(h, w)
    a = _args(depth_wise_layer=int(depthwise), kernel_type=0 if k == 1 else 1, pool_type=pool,
              i_ch_num=ci - 1, o_ch_num=co - 1, i_row_wid=w - 1, i_col_high=h - 1,
              o_row_wid=ow - 1, o_col_high=oh - 1, pad_value=int(rng.integers(256)),
              arg_x=int(rng.integers(-(1 << 20), 1 << 20)), shr_x=int(rng.integers(8, 16)),
              arg_w=int(rng.integers(-(1 << 20), 1 << 20)), shr_w=int(rng.integers(8, 16)),
              arg_add=int(rng.integers(-(1 << 24), 1 << 24)))
    n = ci * k * k if depthwise else co * ci * k * k
    weights = rng.integers(0, 65536 if wide else 256, n).astype(np.uint16 if wide else np.uint8)
    # parameters keep V within the KPU's 36 bits (docs/kpu.md#batch-norm-stage), as real files do
    bn = {"norm_mul": rng.integers(-(1 << 10), 1 << 10, co), "norm_shift": rng.integers(8, 16, co),
          "norm_add": rng.integers(-(1 << 20), 1 << 20, co)}
    starts = np.sort(rng.integers(-(1 << 24), 1 << 24, 16))
    starts[0] = -(1 << 35)
    act = {"x_start": starts, "y_mul": rng.integers(-(1 << 15), 1 << 15, 16),
           "shift_number": rng.integers(0, 24, 16), "bias": rng.integers(0, 256, 16).astype(np.uint8)}
    return KpuConv(a, weights, bn, act)


@pytest.mark.parametrize("seed", range(8))
def test_prepared_conv_equals_reference(seed):
    rng = np.random.default_rng(100 + seed)
    for i in range(25):
        depthwise, k = bool(rng.integers(2)), int(rng.choice([1, 3]))
        pool = int(rng.integers(10)) if not depthwise else 0
        conv = _random_conv(rng, depthwise, k, pool, wide=(i % 7 == 0))
        x = rng.integers(0, 256, conv.in_shape).astype(np.uint8)
        wshape = (conv.in_shape[0], k, k) if depthwise else (conv.out_shape[0], conv.in_shape[0], k, k)
        for sum_rule in K.SUM_RULES:
            for act_rule in K.ACT_RULES:
                want = K.reference_layer(x, conv.weights.reshape(wshape), conv.args, conv.bn, conv.act,
                                         sum_rule, act_rule)
                for use_fast in (True, False):   # numba-fused path and the numpy path
                    got = K.PreparedConv(conv, sum_rule, act_rule, use_fast=use_fast)(x)
                    assert np.array_equal(got, want), (seed, i, sum_rule, act_rule, use_fast)
        for use_fast in (True, False):                # threads: same bytes
            banded = K.PreparedConv(conv, threads=3, use_fast=use_fast)(x)
            assert np.array_equal(banded, K.PreparedConv(conv, use_fast=False)(x))


def _whole_zero_point(rng, conv):
    """A K210 file's kind of layer: Σx term (arg_x >> shr_x)·ΣX with a zero point in 0..255, and
    an activation the fused path tabulates."""
    a = conv.args
    a["arg_x"] = -int(rng.integers(0, 256)) << a["shr_x"]
    conv.act = {"x_start": np.array([-(1 << 35)] + [(1 << 35) - 1] * 15),
                "y_mul": np.array([int(rng.integers(1, 2000))] + [0] * 15),
                "shift_number": np.array([int(rng.integers(8, 20))] + [0] * 15),
                "bias": np.zeros(16, np.uint8)}
    return conv


@pytest.mark.parametrize("seed", range(4))
def test_integer_conv_sums_equal_reference(seed):
    """Normal convs with a whole zero point take onnxruntime's exact int32 sums (intconv.py):
    the same bytes as the reference for both rules, every pool code, one or several bands."""
    pytest.importorskip("numba")
    pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(300 + seed)
    for i in range(10):
        k, pool = int(rng.choice([1, 3])), i          # every pool code
        conv = _whole_zero_point(rng, _random_conv(rng, False, k, pool))
        x = rng.integers(0, 256, conv.in_shape).astype(np.uint8)
        x[:, :2] = 255                                   # a saturating kernel would differ here
        wshape = (conv.out_shape[0], conv.in_shape[0], k, k)
        for sum_rule in K.SUM_RULES:
            want = K.reference_layer(x, conv.weights.reshape(wshape), conv.args, conv.bn, conv.act,
                                     sum_rule)
            for threads in (1, 3):
                p = K.PreparedConv(conv, sum_rule, threads=threads)
                assert p.int_sums is not None
                assert np.array_equal(p(x), want), (seed, i, sum_rule, threads)
            assert K.PreparedConv(conv, sum_rule, int_sums=False).int_sums is None


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("stride", [1, 2])
def test_u8s8_sums_at_the_extremes(monkeypatch, stride, k):
    """Convs sum as uint8 weights x (x − 128) int8 windows plus a row of ones (intconv.py): at
    the corners of both ranges (maps and weights of 0 and 255, zero points 0, 128 and 255, where
    a saturating kernel's pair sums overflow) the int32 sums are the true ones, with and without
    numba, and the same as ConvInteger's."""
    pytest.importorskip("onnxruntime")
    from tl2k210.k210.emulator import intconv
    rng = np.random.default_rng(11)
    h, wd = (7 - k) // stride + 1, (9 - k) // stride + 1
    for z in (0, 128, 255):
        for ci in (1, 7, 300):
            w = rng.choice(np.array([0, 255], np.uint8), (5, ci, k, k))
            w[0] = 255
            x = rng.choice(np.array([0, 255], np.uint8), (ci, 7, 9))
            x[:, :2] = 255
            win = sliding_window_view(x, (k, k), axis=(1, 2))[:, ::stride, ::stride][:, :h, :wd]
            want = np.einsum("oikl,ihwkl->ohw", w.astype(np.int64) - z,
                             win.astype(np.int64)).reshape(5, -1)
            got = intconv.ConvSums(w, z, stride)
            assert got.box == intconv.u8s8_exact()
            assert np.array_equal(got(x, h, wd), want), (z, ci)
            with monkeypatch.context() as m:                    # without numba
                m.setattr(intconv.fast, "available", lambda: False)
                assert np.array_equal(got(x, h, wd), want), (z, ci)
            monkeypatch.setattr(intconv, "_EXACT", [False])     # the ConvInteger path
            plain = intconv.ConvSums(w, z, stride)
            assert not plain.box and np.array_equal(plain(x, h, wd), want), (z, ci)
            monkeypatch.setattr(intconv, "_EXACT", [])


@pytest.mark.parametrize("fold", [-255, 0, 1 << 14])
def test_depthwise_fused_taps_are_exact(fold):
    """fast.dw3_bn_lut sums in float32 when 9·255·max|w + fold| < 2^24 (every 8-bit file), else
    in float64; both give the reference's bytes, in one band or several (a band's first and
    last rows read the pad value from the kernel's own border)."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(7)
    for i in range(6):
        conv = _whole_zero_point(rng, _random_conv(rng, True, 3, 0))
        conv.args["arg_x"] = fold << conv.args["shr_x"]
        x = rng.integers(0, 256, conv.in_shape).astype(np.uint8)
        x[:, :2] = 255
        want = K.reference_layer(x, conv.weights.reshape(conv.in_shape[0], 3, 3), conv.args,
                                 conv.bn, conv.act)
        p = K.PreparedConv(conv, threads=1 + 2 * (i % 2))
        p.bands = p.serial_bands = [(0, 1), (1, conv.in_shape[1])]
        assert p.use_fast and p.dw3 and p.wtap.dtype == (np.float64 if fold > 0 else np.float32)
        assert np.array_equal(p(x), want), (fold, i)


def test_integer_conv_sums_at_the_int32_edge():
    """intconv's bound 255·Σ|w − z| < 2^31, at its edge: Σ|w − z| = 8421504 fits, and the sums
    ±255·8421504 = ±2147483520 (just under int32's 2147483647) come back exact; one more is
    refused."""
    pytest.importorskip("onnxruntime")
    from tl2k210.k210.emulator import intconv
    k_taps = 33026                      # 33025 taps of |w − z| = 255, one of 129
    x = np.full((k_taps, 1, 1), 255, np.uint8)
    for z, far in ((0, 255), (255, 0)):
        w = np.full((1, k_taps, 1, 1), far, np.uint8)
        w[0, -1] = 129 if z == 0 else 255 - 129
        dev = int(np.abs(w.astype(np.int64) - z).sum())
        assert dev == 8421504 and intconv.fits(w, z)
        got = intconv.ConvSums(w, z)(x, 1, 1)
        assert got.dtype == np.int32 and int(got[0, 0]) == (1 if z == 0 else -1) * 255 * dev
        w[0, -1] = 130 if z == 0 else 125                 # one more
        assert not intconv.fits(w, z)
    assert not intconv.fits(np.zeros((1, 4), np.uint16) + 256, 0)   # 16-bit weights: BLAS
    assert not intconv.fits(np.zeros((1, 4), np.uint8), 256)        # zero point outside 0..255


# ---------------------------------------------------------------- KPU RAM layout
@pytest.mark.parametrize("c,h,w", [(5, 4, 10), (3, 6, 20), (2, 3, 100), (7, 5, 64)])
def test_kpu_ram_layout_bytes(c, h, w):
    ram = KpuRam()
    x = np.random.default_rng(c).integers(0, 256, (c, h, w)).astype(np.uint8)
    ram.write(10, x)
    off = hw.map_offsets(c, h, w, base_line=10)
    assert np.array_equal(ram.mem[off], x)                      # every byte where docs/kpu.md#kpu-ram-layout says
    untouched = np.ones(ram.mem.size, bool)
    untouched[off.reshape(-1)] = False
    assert not ram.mem[untouched].any()                          # and nowhere else
    assert np.array_equal(ram.read(10, c, h, w), x)


def test_fused_kernels_are_available_and_used():
    from tl2k210.k210.emulator import fast
    pytest.importorskip("numba")
    assert fast.available()
    rng = np.random.default_rng(9)
    conv = _random_conv(rng, True, 3, 0)
    conv.act = {"x_start": np.array([-(1 << 35)] + [0] + [(1 << 35) - 1] * 14), "y_mul": np.array([0, 1] + [0] * 14),
                "shift_number": np.array([0, 10] + [0] * 14), "bias": np.zeros(16, np.uint8)}
    assert K.PreparedConv(conv).use_fast
