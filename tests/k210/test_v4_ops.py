"""Every v4 opcode of docs/kmodel-format.md#v4-opcodes against values computed by hand from its definition (nncase v0.2
runtime kernels), each run as a one-node kmodel written by our writer, read back and emulated.

Float kernels are also compared bit for bit with the C loops written out literally in float32."""
import struct

import numpy as np
import pytest

from tl2k210.errors import EmulatorError
from tl2k210.k210 import kmodel
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.emulator import neutral as N
from tl2k210.k210.kmodel import v4
import v4_reference

f32 = np.float32
F, U8 = v4.DT_FLOAT32, v4.DT_UINT8
FULL = (-3.4028234663852886e38, 3.4028234663852886e38)


def rng_(dt, start, count, mem=v4.MEM_MAIN):
    return (mem, dt, start, count * (4 if dt == F else 1))


def run_node(name, fields, x, out_dt, out_count, data=None, extra=(), const=b"", in_dt=None,
             shape=None):
    """One node reading main[0:] and writing main[4096:]; returns the output array."""
    in_dt = (F if np.asarray(x).dtype == np.float32 else U8) if in_dt is None else in_dt
    x = np.asarray(x)
    inp = rng_(in_dt, 0, x.size)
    out = rng_(out_dt, 4096, out_count)
    f = {"input": inp, "output": out}
    f.update(fields)
    nodes = [v4.Node(v4.OPCODE_BY_NAME[name].code, f, data or {})] + list(extra)
    m = v4.KModelV4(nodes, [inp], [shape or (1, 1, 1, x.size)], [out], 8192, const)
    back = kmodel.loads(kmodel.dumps(m))          # through the shared layout, both ways
    assert kmodel.dumps(back) == kmodel.dumps(m)
    return Emulator(back).run(x)[0]


def win(fh=1, fw=1, sh=1, sw=1, ph=(0, 0), pw=(0, 0), dh=1, dw=1):
    return dict(padding_h=ph, padding_w=pw, filter_h=fh, filter_w=fw, stride_h=sh, stride_w=sw,
                dilation_h=dh, dilation_w=dw)


# ---------------------------------------------------------------------------------------------
def test_binary_broadcasts_and_clamps():
    # a: (1,1,2,1) = [[1],[2]], b: (1,1,1,3) = [10,20,30] (at main[8]); out (1,1,2,3) = a + b
    x = np.array([1, 2, 10, 20, 30], f32)
    f = dict(input_a=rng_(F, 0, 2), input_b=rng_(F, 8, 3), binary_op=0, in_a_shape=(1, 1, 2, 1),
             in_b_shape=(1, 1, 1, 3), out_shape=(1, 1, 2, 3), fused_activation=(0.0, 31.0))
    out = run_node("binary", f, x, F, 6)
    assert out.tolist() == [11, 21, 31, 12, 22, 31]    # 32 clamped to 31
    f.update(binary_op=3, fused_activation=FULL)       # div
    assert np.allclose(run_node("binary", f, x, F, 6), [0.1, 0.05, 1 / 30, 0.2, 0.1, 2 / 30])


def test_quantized_binary_field_order_and_div_rounds():
    # a = [10, 200], b = [3] at main[2]; a' = mcs(a + 5, 3, 1) = (15*3+1)>>1 = 23, (205*3+1)>>1 = 308
    # b' = mcs(3 - 1, 1, 0) = 2.  add: mcs(25, 2, 2) = (50+2)>>2 = 13 + 100 = 113;
    # 310 -> (620+2)>>2 = 155 + 100 = 255 (clamped from 255).
    x = np.array([10, 200, 3], np.uint8)
    f = dict(input_a=rng_(U8, 0, 2), input_b=rng_(U8, 2, 1), binary_op=0, in_a_shape=(1, 1, 1, 2),
             in_b_shape=(1, 1, 1, 1), out_shape=(1, 1, 1, 2), input_a_offset=5, input_a_mul=3,
             input_a_shift=1, input_b_offset=-1, input_b_mul=1, input_b_shift=0,
             output_offset=100, output_mul=2, output_shift=2)
    assert run_node("quantized_binary", f, x, U8, 2).tolist() == [113, 255]
    # the body stores output_offset, output_mul, output_shift in that order (docs/kmodel-format.md#v4-opcodes)
    body = kmodel.dumps(v4.KModelV4([v4.Node(0x11, dict(f, output=rng_(U8, 9, 2)))], [], [], [], 0))
    assert struct.unpack_from("<3i", body, len(body) - 12) == (100, 2, 2)
    # div is binary_div of neutral_ops.cpp: (a + b / 2) / b in C int32 (docs/kmodel-format.md#v4-interpreter), both
    # divisions truncating toward zero. b' = 3 - 10 = -7, b'/2 = -3:
    # (23 - 3) / -7 = 20 / -7 = -2 -> +10 = 8 (plain 23 / -7 would be -3 -> 7);
    # (308 - 3) / -7 = 305 / -7 = -43 -> clamp 0
    f.update(binary_op=3, input_b_offset=-10, output_mul=1, output_shift=0, output_offset=10)
    assert run_node("quantized_binary", f, x, U8, 2).tolist() == [8, 0]
    # b' = 3 + 1 = 4, b'/2 = 2: 23 -> (23 + 2) / 4 = 6 (25/4 = 6.25; plain 23/4 = 5);
    # 308 -> 310 / 4 = 77 (77.5 truncated: ties are not rounded up by the sum, they fall to zero)
    f.update(input_b_offset=1, output_offset=0)
    assert run_node("quantized_binary", f, x, U8, 2).tolist() == [6, 77]


@pytest.mark.parametrize("a,b,want", [
    (7, 2, 4),      # (7 + 1) / 2 = 4: 3.5 rounds up
    (5, 2, 3),      # (5 + 1) / 2 = 3: 2.5 rounds up (not to even)
    (6, 4, 2),      # (6 + 2) / 4 = 2: a tie 1.5 -> 2
    (2, 4, 1),      # (2 + 2) / 4 = 1: 0.5 -> 1
    (1, 4, 0),      # (1 + 2) / 4 = 0
    (-7, 2, -3),    # (-7 + 1) / 2 = -3: -3.5 goes to -3 (the sum moves it toward +inf)
    (-5, 2, -2),    # (-4) / 2 = -2: -2.5 -> -2
    (-6, 4, -1),    # (-6 + 2) / 4 = -1: -1.5 -> -1
    (-7, 4, -1),    # (-7 + 2) / 4 = -5 / 4 = -1 (truncation; -1.75 would round to -2)
    (7, -2, -3),    # -2 / 2 = -1: (7 - 1) / -2 = -3: -3.5 -> -3
    (-7, -2, 4),    # (-7 - 1) / -2 = 4: 3.5 -> 4
    (7, -4, -1),    # -4 / 2 = -2: (7 - 2) / -4 = -1 (-1.75 -> -1)
    (3, -3, 0),     # -3 / 2 = -1 (truncated): (3 - 1) / -3 = 0
    (0, 5, 0), (4, 1, 4), (-4, 1, -4),
    (5, 0, -1),     # division by zero: RV64 divw gives -1 (C leaves it undefined)
    (-2147483648, -1, -2147483648),   # (INT32_MIN + 0) / -1: divw gives INT32_MIN
    (2147483647, 2, -1073741824),     # 2147483647 + 1 wraps to INT32_MIN; / 2
])
def test_quantized_div_is_nncase_binary_div(a, b, want):
    assert N._int_op("div", np.array([a]), np.array([b])).tolist() == [want]


def test_mul_and_carry_shift():
    assert N.mul_and_carry_shift(np.array([5, -5, 7]), 1, 1).tolist() == [3, -2, 4]  # +1, >>1
    assert N.mul_and_carry_shift(np.array([-6, -7]), 1, 2).tolist() == [-1, -2]      # (-6+2)>>2, (-7+2)>>2
    assert N.mul_and_carry_shift(np.array([1 << 30]), 4, 0).tolist() == [0]          # int32 wrap
    # the shift is a uint8_t (runtime_op_utility.h:115; docs/kmodel-format.md#v4-interpreter): a stored -2 is 254,
    # a right shift; the 64-bit shifter takes 254 & 63 = 62 with rounding bit 1 << (253 & 63 = 61):
    # (3*2 + 2^61) >> 62 = 0, never the left shift 3*2 << 2 = 24
    assert N.mul_and_carry_shift(np.array([3]), 2, -2).tolist() == [0]
    # stored -32 = 224: shift 224 & 63 = 32, rounding 1 << 31: (v + 2^31) >> 32
    v = np.array([3 << 28, (5 << 28) + (1 << 27), -(1 << 27)])     # x 16: 3.0, 5.5, -0.5 x 2^32
    assert N.mul_and_carry_shift(v, 16, -32).tolist() == [3, 6, 0]
    # 256 + 1 is 1: the body's upper bits are dropped
    assert N.mul_and_carry_shift(np.array([5]), 1, 257).tolist() == [3]
    # 64 (or -192): shift 0 with rounding bit 1 << 63 (INT64_MIN): the low 32 bits are unchanged
    assert N.mul_and_carry_shift(np.array([12345, -7]), 3, 64).tolist() == [37035, -21]


def test_reduce_ops():
    x = np.arange(1, 7, dtype=f32)  # (1,1,2,3) = [[1,2,3],[4,5,6]]
    base = dict(in_shape=(1, 1, 2, 3), out_shape=(1, 1, 2, 1), init_value=0.0)
    assert run_node("reduce", dict(base, reduce_op=3), x, F, 2, shape=(1, 1, 2, 3)).tolist() == [6, 15]
    assert run_node("reduce", dict(base, reduce_op=0), x, F, 2).tolist() == [2, 5]   # x 2/6
    assert run_node("reduce", dict(base, reduce_op=2, init_value=4.5), x, F, 2).tolist() == [4.5, 6]
    assert run_node("reduce", dict(base, reduce_op=1, init_value=10.0, out_shape=(1, 1, 1, 3)), x, F,
                    3).tolist() == [1, 2, 3]
    # mean multiplies the sum by (float)out_size / in_size, not divides
    y = N.reduce(np.full((1, 1, 1, 3), 0.1, f32), "mean", (1, 1, 1, 1), 0.0)
    s = f32(0) + f32(0.1) + f32(0.1) + f32(0.1)
    assert y.item() == f32(s * (f32(1) / f32(3)))


def test_reduce_window2d_mean_counts_in_range_taps_only():
    x = np.array([1, 2, 3, 4], f32)  # (1,1,2,2)
    f = dict(reduce_op=0, in_shape=(1, 1, 2, 2), init_value=0.0, fused_activation=FULL,
             **win(2, 2, 1, 1, (0, 1), (0, 1)))
    # windows: (1+2+3+4)/4, (2+4)/2, (3+4)/2, 4/1
    assert run_node("reduce_window2d", f, x, F, 4).tolist() == [2.5, 3, 3.5, 4]
    f.update(reduce_op=2, init_value=-1e30, fused_activation=(0.0, 3.5))
    assert run_node("reduce_window2d", f, x, F, 4).tolist() == [3.5, 3.5, 3.5, 3.5]


def test_resize_image_nearest_and_bilinear():
    x = np.array([0, 10, 20, 30], f32)  # (1,1,2,2)
    f = dict(in_shape=(1, 1, 2, 2), out_h=3, out_w=3, mode=1, align_corners=False)
    # nearest: scale 2/3: src = floor(o * 0.667) = 0, 0, 1
    assert run_node("resize_image", f, x, F, 9).tolist() == [0, 0, 10, 0, 0, 10, 20, 20, 30]
    # bilinear align_corners: scale (2-1)/(3-1) = 0.5: rows 0, 0.5, 1
    f.update(mode=0, align_corners=True)
    assert run_node("resize_image", f, x, F, 9).tolist() == [0, 5, 10, 10, 15, 20, 20, 25, 30]
    # bilinear without align_corners on uint8: positions 0, 2/3, 4/3 (clamped to pixel 1): truncation
    f.update(align_corners=False)
    u = run_node("resize_image", f, x.astype(np.uint8), U8, 9)
    assert u.tolist() == [0, 6, 10, 13, 20, 23, 20, 26, 30]


def test_pad_value_is_f32_and_negative_pad_crops():
    x = np.arange(6, dtype=np.uint8)  # (1,1,2,3)
    f = dict(in_shape=(1, 1, 2, 3), paddings=(0, 0, 0, 0, 1, 0, -1, 1),
             pad_value=(U8, struct.pack("<f", 7.0)))
    # rows: pad 1 before; cols: crop 1 before, pad 1 after -> (1,1,3,3)
    assert run_node("pad", f, x, U8, 9).tolist() == [7, 7, 7, 1, 2, 7, 4, 5, 7]


def test_transpose_and_strided_slice_and_memory_copy():
    x = np.arange(6, dtype=f32)  # (1,1,2,3)
    assert run_node("transpose", dict(in_shape=(1, 1, 2, 3), perm=(0, 1, 3, 2)), x, F, 6).tolist() == \
        [0, 3, 1, 4, 2, 5]
    f = dict(in_shape=(1, 1, 2, 3), begin=(0, 0, 1, 2), end=(1, 1, -1, -1), strides=(1, 1, -1, -2),
             begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0)
    # rows 1, 0 (down to > -1); cols 2, 0
    assert run_node("strided_slice", f, x, F, 4).tolist() == [5, 3, 2, 0]
    assert run_node("memory_copy", {}, x, F, 6).tolist() == x.tolist()


def test_unary_ops():
    x = np.array([-1.5, 0.25, 4.0], f32)
    want = {"abs": [1.5, 0.25, 4], "ceil": [-1, 1, 4], "floor": [-2, 0, 4], "neg": [1.5, -0.25, -4],
            "square": [2.25, 0.0625, 16]}
    for name, w in want.items():
        assert run_node("unary", {"unary_op": v4.UNARY_OPS.index(name)}, x, F, 3).tolist() == w
    r = run_node("unary", {"unary_op": v4.UNARY_OPS.index("rsqrt")}, x[1:], F, 2)
    assert r.tolist() == [2.0, 0.5]
    e = run_node("unary", {"unary_op": v4.UNARY_OPS.index("exp")}, x, F, 3)
    assert e.tolist() == [f32(np.exp(-1.5)), f32(np.exp(0.25)), f32(np.exp(4.0))]


def test_nnil_stack_machine():
    # clamp(x * 2 + 1, 0, 6): lda_0, ldc_r4 2, mul, ldc_r4_1, add, ldc_r4_0, ldc_r4 6, clamp, ret
    code = bytes([0x03, 0x06]) + struct.pack("<f", 2.0) + bytes([0x42, 0x05, 0x40, 0x04, 0x06]) + \
        struct.pack("<f", 6.0) + bytes([0x80, 0xA0])
    x = np.array([-3, 0, 1, 2.25, 9], f32)
    assert run_node("nnil_unary_method", {}, x, F, 5, data={"code": code}).tolist() == [0, 1, 3, 5.5, 6]
    # sub order: a - b with b popped first: 1 - x; dup/pop; square
    code = bytes([0x05, 0x03, 0x41, 0x01, 0x02, 0x29, 0xA0])
    assert N.nnil(code, x).tolist() == [16, 1, 0, 1.5625, 64]
    with pytest.raises(N.NnilError, match="underflow"):
        N.nnil(bytes([0x40, 0xA0]), x)
    with pytest.raises(N.NnilError, match="invalid NNIL opcode 0x99"):
        N.nnil(bytes([0x99]), x)
    with pytest.raises(EmulatorError, match="node 0 .nnil_unary_method.: invalid NNIL opcode"):
        run_node("nnil_unary_method", {}, x, F, 5, data={"code": b"\x03\x77"})


def test_table_lookup1d():
    table = bytes((255 - i) for i in range(256))
    x = np.array([0, 1, 200], np.uint8)
    f = {"table": (v4.MEM_CONST, U8, 0, 256)}
    assert run_node("table_lookup1d", f, x, U8, 3, const=table).tolist() == [255, 254, 55]


def test_concat_inner_size_counts_bytes():
    x = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], np.uint8)
    # outer 2; input A rows of 2 bytes (x[0:4]), input B rows of 3 bytes (x[4:10]) -> 2 x 5
    f = dict(inner_size=1, outer_size=2, inputs_count=2)
    out = run_node("concat", f, x, U8, 10, data={"inputs": [rng_(U8, 0, 4), rng_(U8, 4, 6)],
                                                   "dims": [2, 3]})
    assert out.tolist() == [1, 2, 5, 6, 7, 3, 4, 8, 9, 10]


def test_softmax():
    x = np.array([1, 2, 3, 0, 0, 0], f32)
    out = run_node("softmax", dict(inner_size=3, outer_size=2, beta=1.0), x, F, 6)
    e = np.exp([-2.0, -1.0, 0.0])
    assert np.allclose(out[:3], e / e.sum(), rtol=1e-6) and np.allclose(out[3:], 1 / 3)


def _softmax_at(x, src, dst, outer, inner, beta=1.0):
    """One softmax node reading main[src:] and writing main[dst:] (ranges may overlap); the
    model's output is the whole 64-byte main memory as floats."""
    f = dict(input=rng_(F, src, outer * inner), output=rng_(F, dst, outer * inner),
             inner_size=inner, outer_size=outer, beta=beta)
    m = v4.KModelV4([v4.Node(v4.OPCODE_BY_NAME["softmax"].code, f, {})], [rng_(F, src, len(x))],
                    [(1, 1, 1, len(x))], [rng_(F, 0, 16)], 64, b"")
    return Emulator(kmodel.loads(kmodel.dumps(m))).run(np.asarray(x, f32))[0]


def test_softmax_whose_output_overlaps_its_input_is_the_c_loop():
    """neutral_kernels.h softmax on live memory (docs/kmodel-format.md#v4-interpreter): per row, max, then
    dest[i] = expf((src[i] - max) * beta) before src[i + 1] is read, sum in order, dest /= sum."""
    # rows [0, 0] and [10, 0] at main[0:16]; output at main[8:24]: row 0's result overwrites
    # row 1's input before row 1 runs, so row 1 is softmax([0.5, 0.5]) = [0.5, 0.5]
    out = _softmax_at([0, 0, 10, 0], 0, 8, 2, 2)
    assert out[:6].tolist() == [0, 0, 0.5, 0.5, 0.5, 0.5]
    # one row of 3 at main[0:12], output one float later: v0 = expf(0) = 1 lands on src[1],
    # v1 = expf(1 - 0) = e on src[2], v2 = expf(e - 0); then each / (1 + e + e^e) in float32
    out = _softmax_at([0, 0, 0], 0, 4, 1, 3)
    v = [f32(1)]
    for _ in range(2):
        v.append(f32(np.exp(np.float64(v[-1]))))
    total = f32(f32(v[0] + v[1]) + v[2])
    assert out[0] == 0 and out[1:4].tolist() == [f32(t / total) for t in v]
    # output one float before the input: every value is read before anything lands on it,
    # so the result is the plain softmax, shifted
    x = np.array([0, 1, 2, 3, -1, 0.5], f32)
    plain = _softmax_at(x, 0, 32, 2, 3)[8:14]
    assert np.array_equal(_softmax_at(x, 4, 0, 2, 3)[:6], plain)
    # in place (same range): the same as the plain softmax, bit for bit
    assert np.array_equal(_softmax_at(x, 0, 0, 2, 3)[:6], plain)
    # any shift, byte-misaligned ones too (one float straddling two): the same as the scalar C
    # loop of the independent runner (tests/v4_reference.py), node by node
    x = np.random.default_rng(5).normal(scale=4, size=12).astype(f32)
    for src, dst in ((0, 2), (0, 6), (0, 9), (3, 0), (8, 20), (0, 40)):
        f = dict(input=rng_(F, src, 12), output=rng_(F, dst, 12), inner_size=4, outer_size=3, beta=0.5)
        m = v4.KModelV4([v4.Node(v4.OPCODE_BY_NAME["softmax"].code, f, {})], [rng_(F, src, 12)],
                        [(1, 1, 1, 12)], [rng_(U8, 0, 96)], 96, b"")
        assert v4_reference.mismatches(Emulator(kmodel.loads(kmodel.dumps(m))), x) == [], (src, dst)
    # max_element keeps a leading NaN and skips later ones
    assert N.row_max(np.array([[np.nan, 1], [1, np.nan], [2, 3]], f32)).ravel()[1:].tolist() == [1, 3]
    assert np.isnan(N.row_max(np.array([[np.nan, 1]], f32))).all()


def test_dequantize_is_the_device_kernel():
    """riscv_dequantize (kernels/riscv/neutral_kernels.h; docs/kmodel-format.md#v4-interpreter): inv = 1.f / scale,
    zero = -zp * inv, out = (float)q * inv + zero, each step rounded to float32."""
    # scale 3 (q = 3x + 7), q = 1: inv = f32(1/3) = 0x1.555556p-2; -7 * inv = -2.33333340...
    # -> 0x1.2aaaabp+1; 0.33333334 - 2.33333349 = -2.000000149 -> -0x1.000002p+1.
    # (-7 / 3 = -0x1.2aaaaap+1 would give -0x1.fffffep+0; the host's (1 - 7) * inv gives -2.0)
    x = np.array([1, 7, 255], np.uint8)
    out = run_node("dequantize", dict(quant_param=(7, 3.0)), x, F, 3)
    assert float(out[0]).hex() == "-0x1.0000020000000p+1"
    assert out[1] == 0 and out[2] == f32(f32(255 * f32(1 / 3)) + f32(-7 * f32(1 / 3)))
    # every q for a zero point far from 0 and an awkward scale, against the scalar C statements
    q = np.arange(256, dtype=np.uint8)
    out = run_node("dequantize", dict(quant_param=(-37, 12.345)), q, F, 256)
    inv = f32(1) / f32(12.345)
    zero = f32(f32(37) * inv)
    assert out.tolist() == [f32(f32(f32(v) * inv) + zero) for v in range(256)]


def test_quantize_pairs_round_to_even_and_an_odd_last_value_away_from_zero():
    """riscv_quantize (docs/kmodel-format.md#v4-interpreter): fcvt.w.s rne for each pair, roundf for an odd last
    value."""
    f = dict(quant_param=(0, 1.0))
    assert run_node("quantize", f, np.array([0.5, 2.5, 0.5], f32), U8, 3).tolist() == [0, 2, 1]
    assert run_node("quantize", f, np.array([1.5, 2.5, 3.5, 2.5], f32), U8, 4).tolist() == [2, 2, 4, 2]
    assert run_node("quantize", f, np.array([0.49999997], f32), U8, 1).tolist() == [0]
    # zero point 3, scale 2: 0.25*2 + 3 = 3.5 -> 4 (even) in a pair, 4 alone; 1.25 -> 5.5 -> 6 / 6
    f = dict(quant_param=(3, 2.0))
    assert run_node("quantize", f, np.array([0.25, 1.25, 0.75], f32), U8, 3).tolist() == [4, 6, 5]
    # NaN: fcvt.w.s gives INT32_MAX -> 255; +-inf saturate
    x = np.array([np.nan, np.inf, -np.inf, 300, -5], f32)
    assert run_node("quantize", dict(quant_param=(0, 1.0)), x, U8, 5).tolist() == [255, 255, 0, 255, 0]


# ---------------------------------------------------------------------------------------------
# convolutions: hand values, then bit-exact against the literal C loops
def test_conv2d_groups_padding_by_hand():
    # 2 input channels, groups 2, 2x2 filter, pad (1,0): channel c sees only itself
    x = np.array([1, 2, 3, 4, 10, 20, 30, 40], f32)  # (1,2,2,2)
    w = np.array([1, 0, 0, 1, 0, 1, 1, 0], f32)      # ch0: [[1,0],[0,1]], ch1: [[0,1],[1,0]]
    f = dict(in_shape=(1, 2, 2, 2), groups=2, out_channels=2, fused_activation=FULL,
             **win(2, 2, 1, 1, (1, 0), (1, 0)))
    out = run_node("conv2d", f, x, F, 8, data={"weights": w, "bias": np.array([0.5, -1], f32)})
    # ch0 out(y,x) = x(y-1,x-1) + x(y,x) + .5 : [1.5, 2.5, 3.5, 5.5]
    # ch1 out(y,x) = x(y-1,x) + x(y,x-1) - 1: [-1, 9, 9, 49]
    assert out.tolist() == [1.5, 2.5, 3.5, 5.5, -1, 9, 9, 49]


def _conv_loops(x, w, b, f, oc, act):
    """neutral_kernels.h conv2d, literally (float32 scalars)."""
    n, ci, h, wd = x.shape
    g = f["groups"]
    gic, goc = ci // g, oc // g
    fh, fw = f["filter_h"], f["filter_w"]
    oh = N.windowed_size(h, fh, f["stride_h"], f["dilation_h"], f["padding_h"])
    ow = N.windowed_size(wd, fw, f["stride_w"], f["dilation_w"], f["padding_w"])
    w = w.reshape(oc, gic, fh, fw)
    out = np.zeros((n, oc, oh, ow), f32)
    for bt in range(n):
        for o in range(oc):
            gg = o // goc
            for oy in range(oh):
                for ox in range(ow):
                    v = f32(b[o])
                    for ic in range(gic):
                        for ky in range(fh):
                            for kx in range(fw):
                                iy = oy * f["stride_h"] - f["padding_h"][0] + ky * f["dilation_h"]
                                ix = ox * f["stride_w"] - f["padding_w"][0] + kx * f["dilation_w"]
                                if 0 <= iy < h and 0 <= ix < wd:
                                    v = f32(v + f32(x[bt, gg * gic + ic, iy, ix] * w[o, ic, ky, kx]))
                    out[bt, o, oy, ox] = min(max(v, f32(act[0])), f32(act[1]))
    return out


@pytest.mark.parametrize("groups,stride,dil", [(1, 1, 1), (2, 2, 1), (1, 1, 2), (4, 2, 2)])
def test_conv2d_bit_exact_with_c_loops(groups, stride, dil):
    r = np.random.default_rng(groups * 10 + stride + dil)
    x = r.normal(size=(1, 4, 7, 6)).astype(f32)
    oc = 4
    f = dict(groups=groups, **win(3, 2, stride, stride, (1, 2), (0, 1), dil, dil))
    w = r.normal(size=(oc * 4 // groups * 6,)).astype(f32)
    b = r.normal(size=oc).astype(f32)
    got = N.conv2d(x, w, b, f, oc, (-0.5, 2.0))
    assert np.array_equal(got, _conv_loops(x, w, b, f, oc, (-0.5, 2.0)))


def test_quantized_conv2d_by_hand():
    # 1x1x2x2 input, 2x2 filter, no padding: one output
    x = np.array([10, 20, 30, 40], np.uint8)
    f = dict(in_shape=(1, 1, 2, 2), groups=1, out_channels=1, input_offset=-10, filter_offset=-1,
             output_mul=3, output_shift=2, output_offset=7, **win(2, 2))
    # (0)(1) + (10)(2) + (20)(0) + (30)(3) = 110, + bias 2 = 112; (112*3 + 2) >> 2 = 84; + 7 = 91
    data = {"bias": np.array([2], np.int32), "weights": np.array([2, 3, 1, 4], np.uint8)}
    assert run_node("quantized_conv2d", f, x, U8, 1, data=data).tolist() == [91]


def test_quantized_conv2d_batches_are_a_uint8_mean_pool():
    """in_shape (N, 1, H, W), one 2x2 filter of 1s, no filter offset: each batch (a channel of the
    map) pooled by the sum of (q + input_offset), then output_mul / 2^shift = 1/4 (the mean) +
    output_offset: lowering's quantized_conv2d_mean."""
    x = np.array([10, 20, 30, 44, 0, 0, 1, 2], np.uint8)        # two 2x2 channels
    f = dict(in_shape=(2, 1, 2, 2), groups=1, out_channels=1, input_offset=-10, filter_offset=0,
             output_mul=1, output_shift=2, output_offset=5, **win(2, 2))
    # channel 0: (0 + 10 + 20 + 34) = 64; (64 + 2) >> 2 = 16; + 5 = 21
    # channel 1: (-10 - 10 - 9 - 8) = -37; (-37 + 2) >> 2 = -9 (arithmetic shift); + 5 = -4 -> clamp 0
    data = {"bias": np.array([0], np.int32), "weights": np.ones(4, np.uint8)}
    assert run_node("quantized_conv2d", f, x, U8, 2, data=data).tolist() == [21, 0]


def test_conv2d_transpose_by_hand_and_c_order():
    # 1x1x2x2 input [1,2,3,4], 2x2 kernel [1,10,100,1000], stride 2 -> 4x4 tiles; the bias (5) is
    # read but never added: neutral_kernels.h sets `value = bias[...]` and never uses it
    # (docs/kmodel-format.md#v4-interpreter)
    x = np.array([1, 2, 3, 4], f32)
    f = dict(in_shape=(1, 1, 2, 2), out_shape=(1, 1, 4, 4), groups=1, fused_activation=FULL,
             **win(2, 2, 2, 2))
    out = run_node("conv2d_transpose", f, x, F, 16,
                   data={"weights": np.array([1, 10, 100, 1000], f32), "bias": np.array([5], f32)})
    assert out.reshape(4, 4).tolist() == [[1, 10, 2, 20], [100, 1000, 200, 2000],
                                          [3, 30, 4, 40], [300, 3000, 400, 4000]]
    # overlapping windows (stride 1, 3x3, pad 1): float32 sums in the C scatter order
    r = np.random.default_rng(3)
    xi = r.normal(size=(1, 2, 4, 5)).astype(f32)
    wt = r.normal(size=(3, 2, 3, 3)).astype(f32)
    ff = dict(groups=1, **win(3, 3, 1, 1, (1, 1), (1, 1)))
    want = np.zeros((1, 3, 4, 5), f32)
    for ic in range(2):
        for iy in range(4):
            for ix in range(5):
                for o in range(3):
                    for ky in range(3):
                        for kx in range(3):
                            oy, ox = iy - 1 + ky, ix - 1 + kx
                            if 0 <= oy < 4 and 0 <= ox < 5:
                                want[0, o, oy, ox] = f32(want[0, o, oy, ox] + f32(xi[0, ic, iy, ix] * wt[o, ic, ky, kx]))
    assert np.array_equal(N.conv2d_transpose(xi, wt, ff, (1, 3, 4, 5), FULL), want)


def test_matmul_and_quantized_matmul():
    x = np.array([1, 2, 3, 4, 5, 6, 1, 0, 0, 1, 1, 1], f32)  # a (2x3) then b (3x2) at main[24]
    f = dict(input_a=rng_(F, 0, 6), input_b=rng_(F, 24, 6), a_rows=2, a_cols=3, b_cols=2,
             fused_activation=(0.0, 14.0))
    # a @ b = [[4, 5], [10, 11]]; + bias [1, -1] = [[5, 4], [11, 10]]; clamp 14
    assert run_node("matmul", f, x, F, 4, data={"bias": np.array([1, -1], f32)}).tolist() == [5, 4, 11, 10]
    q = np.array([1, 2, 3, 1], np.uint8)  # a (1x2) = [1,2], b (2x1) at main[2] = [3,1]
    f = dict(input_a=rng_(U8, 0, 2), input_b=rng_(U8, 2, 2), a_rows=1, a_cols=2, b_cols=1,
             input_a_offset=1, input_b_offset=-1, output_mul=1, output_shift=1, output_offset=3)
    # (2)(2) + (3)(0) = 4 + bias 5 = 9; (9 + 1) >> 1 = 5; + 3 = 8
    assert run_node("quantized_matmul", f, q, U8, 1, data={"bias": np.array([5], np.int32)}).tolist() == [8]


# ---------------------------------------------------------------------------------------------
# NHWC cpu_* variants (0x1001-0x1005): same arithmetic as NCHW with channels last
def test_cpu_nhwc_variants_by_hand():
    x = np.array([1, 10, 2, 20, 3, 30, 4, 40], f32)  # NHWC (1,2,2,2)
    w = win(2, 2)
    # cpu_conv2d: OHWI weights, one output channel summing channel 0 of every pixel
    f = dict(in_shape=(1, 2, 2, 2), out_channels=1, fused_activation=FULL, **w)
    out = run_node("cpu_conv2d", f, x, F, 1,
                   data={"weights": np.array([1, 0] * 4, f32), "bias": np.array([0.5], f32)})
    assert out.tolist() == [10.5]
    # cpu_depthwise_conv2d: weights [C][fh][fw]
    f = dict(in_shape=(1, 2, 2, 2), fused_activation=FULL, **w)
    out = run_node("cpu_depthwise_conv2d", f, x, F, 2,
                   data={"weights": np.array([1, 0, 0, 0, 0, 0, 0, 1], f32), "bias": np.zeros(2, f32)})
    assert out.tolist() == [1, 40]
    f = dict(reduce_op=2, in_shape=(1, 2, 2, 2), init_value=-1e30, fused_activation=FULL, **w)
    assert run_node("cpu_reduce_window2d", f, x, F, 2).tolist() == [4, 40]
    q = x.astype(np.uint8)
    qf = dict(input_offset=0, filter_offset=0, output_mul=1, output_shift=0, output_offset=0, **w)
    out = run_node("cpu_quantized_conv2d", dict(qf, in_shape=(1, 2, 2, 2), out_channels=1), q, U8, 1,
                   data={"bias": np.array([1], np.int32), "weights": np.array([0, 1] * 4, np.uint8)})
    assert out.tolist() == [101]   # 10 + 20 + 30 + 40 + 1
    out = run_node("cpu_quantized_depthwise_conv2d", dict(qf, in_shape=(1, 2, 2, 2)), q, U8, 2,
                   data={"bias": np.array([0, 5], np.int32),
                         "weights": np.array([1, 1, 1, 1, 0, 0, 0, 1], np.uint8)})
    assert out.tolist() == [10, 45]


def test_nhwc_conv_equals_nchw_conv():
    r = np.random.default_rng(11)
    x = r.normal(size=(1, 5, 6, 3)).astype(f32)
    w_ohwi = r.normal(size=(4, 3, 3, 3)).astype(f32)
    b = r.normal(size=4).astype(f32)
    f = dict(groups=1, **win(3, 3, 1, 1, (1, 1), (1, 1)))
    nhwc = N.conv2d_nhwc(x, w_ohwi, b, f, 4, FULL)
    # same products, different summation order (ky, kx, ic vs ic, ky, kx): equal to rounding
    nchw = N.conv2d(x.transpose(0, 3, 1, 2), w_ohwi.transpose(0, 3, 1, 2), b, f, 4, FULL)
    assert np.allclose(nhwc, nchw.transpose(0, 2, 3, 1), atol=1e-5)


def test_every_opcode_has_an_emulator_function():
    from tl2k210.k210.emulator import v4 as run4
    assert sorted(o.name for o in v4.OPCODES.values()) == sorted(run4.OPS)
