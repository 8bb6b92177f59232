"""A fully quantized model's layers round as TFLite rounds (issue 23): the KPU conv's BN stage and
rounding-shift activation table (kpu.exact_requantize, fx.clamp_table) and QUANTIZED_ADD's wide
multipliers (cpu.exact_add_params), checked against TFLite's integer formula
round(M·(acc + bias)) + z, clamped by the fused activation -- byte for byte except where the
exact value lies within the stated margin of a rounding tie. TF-free."""
import math

import numpy as np
import pytest

from tl2k210.k210 import fixed_point as fx
from tl2k210.k210.emulator.kpu import activation, batchnorm, carry_shift_nncase01
from tl2k210.k210.lower import kpu
from tl2k210.k210.lower.cpu import exact_add_params


class Row:
    def __init__(self):
        self.notes = []


def _tflite_round(v):
    """TFLite's rounding of a requantized value (half away from zero)."""
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def _near_tie(v, margin):
    return np.abs(np.abs(v - np.floor(v)) - 0.5) <= margin


def _quantize_multiplier(m):
    """TFLite's QuantizeMultiplier: (q, shift), m = q·2^(shift-31), 2^30 <= q < 2^31."""
    f, e = math.frexp(m)
    q = round(f * 2 ** 31)
    return (q // 2, e + 1) if q == 2 ** 31 else (q, e)


def _reference_requantize(x, m):
    """TFLite's reference kernels (and TFLite Micro's): MultiplyByQuantizedMultiplier without
    TFLITE_SINGLE_ROUNDING, i.e. gemmlowp's SaturatingRoundingDoublingHighMul then
    RoundingDivideByPOT, both half away from zero (written from tensorflow/lite/kernels/internal/
    common.cc, checked against tf.lite's BUILTIN_REF tensors in test_tflite_variants)."""
    q, shift = _quantize_multiplier(m)
    ab = np.asarray(x, np.int64) * (1 << max(shift, 0)) * q
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    hi = np.where(ab + nudge >= 0, (ab + nudge) >> 31, -((-(ab + nudge)) >> 31))   # C division
    r = max(-shift, 0)
    mask = (1 << r) - 1
    return (hi >> r) + ((hi & mask) > (mask >> 1) + (hi < 0))


def test_double_rounding_is_one_rounding_pushed_from_zero():
    """The reference kernels' two roundings = one rounding of acc·m + e·sign, e = 2^-(s+1)."""
    r = np.random.default_rng(5)
    for m in r.uniform(1e-4, 0.9, 40):
        acc = r.integers(-2 ** 20, 2 ** 20, 20000)
        q, shift = _quantize_multiplier(m)
        v = acc * (q * 2.0 ** (shift - 31))
        e = fx.double_rounding_offset(m)
        assert e == (2.0 ** (shift - 1) if shift < 0 else 0.0)
        assert np.array_equal(_reference_requantize(acc, m), _tflite_round(v + np.sign(v) * e))


@pytest.mark.parametrize("s_in,s_out,n", [(0.13837462663650513, 0.01453737448900938, 49), (0.05, 0.04, 64),
                                           (0.02, 0.1, 100)])
def test_reference_mean_rounds_up_by_its_offset(s_in, s_out, n):
    """TFLite's reference int8 MEAN (QuantizedMeanOrSum): its multiplier q·2^k // n at shift − k
    is a truncated m', and its two roundings put a non-negative sum S at floor(S·m' + 1/2 + e)
    (EMNIST's pool: the first case, e = 0.25 LSB at m = 0.19)."""
    q, shift = _quantize_multiplier(s_in / s_out)
    k = min(n.bit_length() - 1, 32, 31 + shift)
    q2, sh2 = (q << k) // n, shift - k
    S = np.arange(0, 255 * n + 1)
    ab = S * q2
    hi = (ab + (1 << 30)) >> 31
    r = -sh2
    want = (hi >> r) + ((hi & ((1 << r) - 1)) > ((1 << r) - 1) >> 1)
    e = fx.mean_rounding_offset(s_in, s_out, n)
    assert e == 2.0 ** (sh2 - 1)
    assert np.array_equal(want, np.floor(S * q2 * 2.0 ** (sh2 - 31) + 0.5 + e))


@pytest.mark.parametrize("weights", ["int8 per-axis", "uint8 per-tensor"])
@pytest.mark.parametrize("rounding", ["single", "reference"])
@pytest.mark.parametrize("act", [None, {"op": "Relu"}, {"op": "Clip", "min": 0.0, "max": 6.0}])
def test_kpu_layer_gives_tflites_bytes(act, rounding, weights):
    """int8 per-axis: TFLite's int8 spec (symmetric, each channel its scale); uint8 per-tensor:
    TOCO's (the Coral/TF1 uint8 models): one scale and a zero point anywhere in 0..255."""
    r = np.random.default_rng(7)
    co, ci, k = 24, 16, 3
    if weights == "int8 per-axis":
        q = r.integers(-127, 128, (co, ci, k, k))
        q[:, 0, 0, 0] = 127                                 # TFLite per-axis: each channel reaches 127
        s_w = r.uniform(0.002, 0.02, co)                    # per-channel weight scales
    else:
        q = r.integers(0, 256, (co, ci, k, k)) - 97         # uint8 q, zero point 97
        s_w = np.full(co, 0.0037)
    s_x, z_x = 0.05, 3                                      # the input's scale, zero point (uint8)
    bias_q = r.integers(-3000, 3000, co)                    # int32 bias, scale s_x·s_w
    W = q * s_w[:, None, None, None] * s_x                  # what the lowering gets (input scale folded)
    B = bias_q * s_w * s_x
    x = r.integers(0, 256, (4096, ci * k * k))                  # input windows (uint8)
    acc = (x - z_x) @ q.reshape(co, -1).T                      # ACC as the KPU sums it (arg_x, arg_w)
    y = (acc + bias_q) * (s_x * s_w)                           # the real conv output
    s_o = np.abs(y).max() / 200 if act is None else 6 / 255 if act["op"] == "Clip" else y.max() / 300
    z_o = 120 if act is None else 0
    z_range = ((0 - z_o) * s_o, (255 - z_o) * s_o)
    row = Row()
    lq = kpu.quantize_layer(W, B, None, z_x, 1, (float(y.min()), float(y.max())), z_range, act, 8, row,
                            exact_rounding=rounding)
    assert any(n.startswith("int8 exact") for n in row.notes), row.notes
    margin = float(row.notes[-1].split("within ")[1].split(" ")[0])
    assert margin < 1e-2
    assert np.array_equal(lq.Wq.astype(np.int64) - lq.zw, q)      # the model's own integers
    got = activation(batchnorm(acc.T, lq.bn), lq.act).astype(np.int64)
    m = s_x * s_w / s_o
    real = (acc + bias_q) * m
    if rounding == "reference":    # the tie it rounds at: acc·m ± e (test above)
        e = np.array([fx.double_rounding_offset(c) for c in m])
        real = real + np.sign(real) * e
        assert act is not None or weights != "int8 per-axis" or len(np.unique(e)) > 1   # channel groups
        ref = np.stack([_reference_requantize(acc[:, c] + bias_q[c], m[c]) for c in range(co)], axis=1)
        assert np.mean(ref != _tflite_round(real)) < 1e-3     # (the 31-bit multiplier's ties)
        assert np.any(_tflite_round(real) != _tflite_round((acc + bias_q) * m))   # not XNNPACK's bytes
    real = real + z_o
    want = _tflite_round(real)
    lo, hi = fx.clamp_of(act)
    c_lo = 0 if not math.isfinite(lo) else z_o + math.floor(lo / s_o + 0.5)
    c_hi = 255 if not math.isfinite(hi) else min(255, z_o + math.floor(hi / s_o + 0.5))
    want = np.clip(want, max(c_lo, 0), c_hi).T
    differ = got != want
    assert np.all(_near_tie(real.T[differ], margin + 1e-9)), real.T[differ][:5]
    assert differ.mean() < 1e-3


@pytest.mark.parametrize("sign", [1, -1])
def test_quantized_add_gives_tflites_bytes(sign):
    """Every (a, b) pair of uint8 inputs: the SDK's QUANTIZED_ADD arithmetic with the chosen
    parameters equals round(ta·(a − za) ± tb·(b − zb)) + zo, clamped, except within the margin
    of a tie."""
    sa, za, sb, zb, so, zo = 0.0394, 0, 0.1042, 132, 0.0509, 0 if sign > 0 else 128
    oa, ma, ob, mb, oo, sh, margin = exact_add_params(sa / so, sb / so, za, zb, zo, sign)
    assert margin < 1e-3
    a, b = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    v = (a + oa) * ma + (b + ob) * mb
    assert v.min() >= 0 and v.max() < 2 ** 31            # the SDK's carry shift rounds only these right
    got = np.clip(carry_shift_nncase01(v, sh) + oo, 0, 255)
    real = sa / so * (a - za) + sign * sb / so * (b - zb) + zo
    want = np.clip(_tflite_round(real), 0, 255)
    differ = got != want
    assert np.all(_near_tie(real[differ], margin + 1e-9))
    assert differ.mean() < 1e-3


def test_weights_off_any_grid_are_said_not_exact():
    r = np.random.default_rng(3)
    W = r.normal(0, 0.1, (8, 4, 3, 3))
    row = Row()
    kpu.quantize_layer(W, np.zeros(8), None, 0, 1, (-4.0, 4.0), (-4.0, 4.0), None, 8, row, exact_rounding="reference")
    assert any(n.startswith("not exact: weights re-rounded") for n in row.notes), row.notes


def test_per_tensor_weights_keep_their_grid():
    """A per-tensor quantized dense layer (one scale; most channels below 127) keeps its integers."""
    r = np.random.default_rng(4)
    q = r.integers(-60, 61, (10, 64, 1, 1))
    q[3, 5] = -127
    row = Row()
    lq = kpu.quantize_layer(q * 0.01, np.zeros(10), None, 0, 1, (-4.0, 4.0), (-4.0, 4.0), None, 8, row,
                            exact_rounding="reference")
    assert np.array_equal(lq.Wq.astype(np.int64) - lq.zw, q)
    assert any(n.startswith("int8 exact") for n in row.notes)


@pytest.mark.parametrize("per", ["channel", "tensor"])
def test_weights_reaching_minus_128_keep_their_grid(per):
    """A quantizer with the range [-128, 127] (PPQ's QDQ exports of the MLPerf Tiny nets): a
    channel whose extreme weight is -128 steps (and none +127) lies on max|W| / 128, not / 127.
    Its integers are kept, not re-rounded (the ResNet-8's first block was up to 4 LSB off
    onnxruntime, 13.7 % of its bytes)."""
    r = np.random.default_rng(5)
    q = r.integers(-100, 101, (8, 4, 3, 3))
    q[::2, 0, 0, 0] = -128                  # half the channels reach -128, the others 127
    q[1::2, 0, 0, 0] = 127
    s = r.uniform(0.001, 0.01, 8) if per == "channel" else np.full(8, 0.004)
    if per == "tensor":
        q[1::2, 0, 0, 0] = 90               # one scale: the tensor's extreme is -128
    row = Row()
    lq = kpu.quantize_layer(q * s[:, None, None, None], np.zeros(8), None, 0, 1, (-4.0, 4.0), (-4.0, 4.0), None, 8,
                            row, exact_rounding="reference")
    assert np.array_equal(lq.Wq.astype(np.int64) - lq.zw, q)
    assert any(n.startswith("int8 exact") for n in row.notes), row.notes


def test_a_channel_of_tiny_weights_is_still_exact():
    """A channel whose weights are tiny (its 24-bit multiplier held poorly) reaches little of the
    layer's output range: the tie margin is bounded by what each channel's weights reach, not by
    the layer's range (MobileNetV2's first conv read "not exact: multipliers 650 LSB off" where its
    bytes were TFLite's)."""
    r = np.random.default_rng(6)
    q = r.integers(-127, 128, (6, 3, 3, 3))
    q[:, 0, 0, 0] = 127
    s = np.array([0.01, 0.02, 0.015, 1e-9, 0.01, 0.03])
    row = Row()
    kpu.quantize_layer(q * s[:, None, None, None], np.zeros(6), None, 0, 1, (-30.0, 30.0), (-6.0, 6.0), None, 8,
                       row, exact_rounding="single")
    assert any(n.startswith("int8 exact") for n in row.notes), row.notes


def test_toco_uint8_weights_keep_their_grid():
    """TOCO's uint8 weights (one scale, zero point 161: no symmetric 8-bit grid holds them) keep
    their own integers q − zw, not a re-rounded symmetric grid."""
    r = np.random.default_rng(4)
    q = r.integers(0, 256, (6, 5, 3, 3))
    W = (q - 161) * 0.0042
    row = Row()
    lq = kpu.quantize_layer(W, np.zeros(6), None, 0, 1, (-4.0, 4.0), (-4.0, 4.0), None, 8, row,
                            exact_rounding="single")
    assert np.array_equal(lq.Wq.astype(np.int64) - lq.zw, q - 161)
    assert any(n.startswith("int8 exact") for n in row.notes), row.notes
