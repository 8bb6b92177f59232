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
"""
from __future__ import annotations

import os

import numpy as np

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
        helper, tp, ort = _modules()
        if not fits(w, z):
            raise ValueError("ConvSums: the weights break the int32 bound; use the float path")
        co, ci = w.shape[:2]
        node = helper.make_node("ConvInteger", ["x", "w", "", "z"], ["y"], strides=[stride, stride])
        graph = helper.make_graph(
            [node], "kpu_sums",
            [helper.make_tensor_value_info("x", tp.UINT8, [1, ci, "rows", "cols"])],
            [helper.make_tensor_value_info("y", tp.INT32, None)],
            [helper.make_tensor("w", tp.UINT8, w.shape, w.astype(np.uint8).tobytes(), raw=True),
             helper.make_tensor("z", tp.UINT8, [], [z])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1   # our row bands are the threads
        so.log_severity_level = 3
        self.co = co
        self.sess = ort.InferenceSession(model.SerializeToString(), so,
                                         providers=["CPUExecutionProvider"])

    def __call__(self, xp: np.ndarray, h: int, w: int) -> np.ndarray:
        y = self.sess.run(None, {"x": xp[None]})[0][0]
        if y.shape[1:] != (h, w):
            y = y[:, :h, :w]
        return y.reshape(self.co, h * w)
