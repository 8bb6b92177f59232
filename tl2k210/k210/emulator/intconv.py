"""Optional exact integer convolution sums by onnxruntime's ``ConvInteger`` (uint8 maps x uint8
weights, int32 accumulators): the KPU layer's ΣW·X in the integer GEMM kernels onnxruntime uses
for its own quantized models (about 3x numpy's float32 BLAS here, and no float bound to keep).

Exactness. ``ConvInteger`` computes, for one output channel o and pixel p,

    y[o, p] = Σ_i x_i · (w_oi − z)        x_i, w_oi, z in 0..255, int32 arithmetic

over the window's K = C_in·k·k taps (x_i from the caller's padded map, so no pad values enter
from onnxruntime). Integer addition and multiplication are exact modulo 2^32 whatever the order
or the split of the sum (Σx·w − z·Σx, blocked partial sums, 16-bit pairs widened by
``vpmaddwd``), so the int32 result is the true sum whenever the true sum lies in
[−2^31, 2^31). Every term is bounded by |x_i·(w_oi − z)| <= 255·|w_oi − z|, so

    255 · max_o Σ_i |w_oi − z| < 2^31                                              (*)

makes y exact; ``ConvSums`` refuses a layer that breaks (*) (``fits``). The one thing modular
arithmetic does not cover is a saturating instruction (x86's uint8 x int8 ``vpmaddubsw``
saturates its 16-bit pair sums); the operands here are uint8 x uint8, and the edge tests
(``tests/k210/test_kpu_stages.py``) run maps and weights at 0 and 255, where a saturating kernel
would differ, on whatever machine the tests run.

The KPU's Σx term with a whole zero point, (arg_x >> shr_x)·ΣX, is the weight zero point
z = −(arg_x >> shr_x) when that lies in 0..255 (every K210 file of testdata). Available when
onnx and onnxruntime import (the ``convert`` extra); ``TL2K210_NO_INTCONV=1`` turns it off.

Where the machine's uint8 x int8 product is exact (``u8s8_exact``), convs take ``MatMulInteger``
instead: uint8 weights A = [w; 1] (C_out x K, a row of ones below them) times the windows of the
map as int8 (K x h·w, one row per tap, im2col), s = x − 128 (x XOR 0x80), which CPUs with VNNI
(``vpdpbusd``, no saturation) sum about 3.5x faster than uint8 x uint8 (2.5x with the im2col
copy of a 3 x 3 conv). With y = A·s (int32),

    Σ_i x_i·(w_oi − z) = y[o] − z·y[ones] + 128·(Σ_i w_oi − z·K)

term by term (x_i = s_i + 128), so the same modular argument makes the result exact under (*),
every intermediate being an integer sum too. A saturating kernel (``vpmaddubsw``, x86 without
VNNI: its 16-bit pair sums of 255·(−128) overflow) would differ, so the product is used only
after ``u8s8_exact`` ran it at those extremes and got the true sums; else ConvInteger as above
(``TL2K210_NO_U8S8=1`` keeps ConvInteger everywhere).
"""
from __future__ import annotations

import os

import numpy as np

from tl2k210.k210.emulator import fast

_ORT: list = []   # [(onnx.helper, onnx.TensorProto, onnxruntime) or None], imported on first use


def _modules():
    if not _ORT:
        try:
            if os.environ.get("TL2K210_NO_INTCONV"):
                raise ImportError
            from onnx import TensorProto, helper
            from tl2k210 import quiet
            _ORT.append((helper, TensorProto, quiet.onnxruntime()))
        except ImportError:
            _ORT.append(None)
    return _ORT[0]


def available() -> bool:
    return _modules() is not None


def _session(node, inputs, inits):
    """A 1-thread onnxruntime session of the one node (our row bands are the threads)."""
    helper, tp, ort = _modules()
    graph = helper.make_graph([node], "kpu_sums", inputs,
                              [helper.make_tensor_value_info("y", tp.INT32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _u8s8(a: np.ndarray):
    """``f(b) = a @ b`` (int32) for uint8 a (M, K), int8 b (K, N), by onnxruntime's MatMulInteger."""
    helper, tp, _ = _modules()
    sess = _session(helper.make_node("MatMulInteger", ["a", "b"], ["y"]),
                    [helper.make_tensor_value_info("b", tp.INT8, [a.shape[1], "n"])],
                    [helper.make_tensor("a", tp.UINT8, a.shape, a.tobytes(), raw=True)])
    return lambda b: sess.run(None, {"b": b})[0]


_EXACT: list = []   # [bool]: u8s8_exact's answer, found once per process


def u8s8_exact() -> bool:
    """Whether this machine's uint8 x int8 MatMulInteger returns true sums at the extremes
    (255 x −128 and 255 x 127 everywhere, and random values), where a kernel that saturates its
    pair sums cannot; tried once per process, on two shapes."""
    if not _EXACT:
        ok = available() and not os.environ.get("TL2K210_NO_U8S8")
        rng = np.random.default_rng(0)
        for m, k, n in ((17, 72, 40), (64, 300, 96)) if ok else ():
            a = np.full((m, k), 255, np.uint8)
            a[-1] = rng.integers(0, 256, k)
            product = _u8s8(a)
            for b in (np.full((k, n), -128, np.int8), np.full((k, n), 127, np.int8),
                      rng.integers(-128, 128, (k, n)).astype(np.int8)):
                ok = ok and np.array_equal(product(b), a.astype(np.int64) @ b.astype(np.int64))
        _EXACT.append(bool(ok))
    return _EXACT[0]


def fits(w: np.ndarray, z: int) -> bool:
    """Bound (*) of the module docstring for weights w (C_out, ...) and zero point z."""
    if not 0 <= z <= 255 or w.size == 0 or w.min() < 0 or w.max() > 255:
        return False
    dev = np.abs(w.reshape(w.shape[0], -1).astype(np.int64) - z).sum(axis=1)
    return 255 * int(dev.max()) < 1 << 31


class ConvSums:
    """``self(xp, h, w)`` -> int32 (C_out, h·w): Σ_i x_i·(w_oi − z) for the k x k windows of the
    padded uint8 rows xp (C_in, rows, cols) that start every ``stride`` rows and columns (the
    first h x w of them), for weights w (C_out, C_in, k, k)."""

    def __init__(self, w: np.ndarray, z: int, stride: int = 1):
        helper, tp, _ = _modules()
        if not fits(w, z):
            raise ValueError("ConvSums: the weights break the int32 bound; use the float path")
        co, ci, k = w.shape[:3]
        self.co, self.ci, self.k, self.stride = co, ci, k, stride
        self.box = u8s8_exact()     # MatMulInteger, see the module docstring
        if self.box:
            w2 = w.reshape(co, ci * k * k).astype(np.uint8)
            self._mm = _u8s8(np.concatenate([w2, np.ones((1, w2.shape[1]), np.uint8)]))
            self.z = np.int32(z)
            self.offset = (128 * (w2.astype(np.int64).sum(axis=1) - z * w2.shape[1])).astype(np.int32)
            return
        node = helper.make_node("ConvInteger", ["x", "w", "", "z"], ["y"], strides=[stride, stride])
        self.sess = _session(node, [helper.make_tensor_value_info("x", tp.UINT8, [1, ci, "rows", "cols"])],
                             [helper.make_tensor("w", tp.UINT8, w.shape, w.astype(np.uint8).tobytes(), raw=True),
                              helper.make_tensor("z", tp.UINT8, [], [z])])

    def __call__(self, xp: np.ndarray, h: int, w: int) -> np.ndarray:
        if self.box:
            y = self._mm(windows_s8(xp, h, w, self.stride, self.k))
            return fold_box(y, self.z, self.offset)
        y = self.sess.run(None, {"x": xp[None]})[0][0]
        if y.shape[1:] != (h, w):
            y = y[:, :h, :w]
        return y.reshape(self.co, h * w)


def windows_s8(xp: np.ndarray, h: int, w: int, s: int, k: int) -> np.ndarray:
    """int8 (C·k·k, h·w): x − 128 over the h x w windows of xp (C, rows, cols) starting every
    s rows and columns, one row per tap (c, ky, kx)."""
    ci = xp.shape[0]
    out = np.empty((ci * k * k, h * w), np.uint8)
    if fast.available() and k > 1:     # numpy's xor runs a 1 x 1 conv's rows in one pass
        fast.im2col_s8(xp, h, w, s, k, out)
    else:
        taps = out.reshape(ci, k, k, h, w)
        for ky in range(k):
            for kx in range(k):
                np.bitwise_xor(xp[:, ky:ky + s * h:s, kx:kx + s * w:s], np.uint8(0x80),
                               out=taps[:, ky, kx])
    return out.view(np.int8)


def fold_box(y: np.ndarray, z, offset: np.ndarray) -> np.ndarray:
    """y[:-1] with y[o] − z·y[-1] + offset[o] added in place (int32, modulo 2^32: exact whenever
    the true result fits, see the module docstring)."""
    if fast.available():
        fast.fold_box(y, z, offset)
        return y[:-1]
    out = y[:-1]
    out -= z * y[-1]
    out += offset[:, None]
    return out
