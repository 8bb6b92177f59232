"""Bias correction for weight rounding (Nagel et al. 2019): rounded weights W + dW shift a conv's
output by dW . E[x] on average, and the bias takes that back. One place for the back-end's convs
(k210/lower: kpu.quantize_layer, v4conv.quantized_conv) and the 8-bit ideal (fake_quant)."""
from __future__ import annotations

import numpy as np


def mean_shift(dW, e, groups: int) -> np.ndarray:
    """(co,): the mean the weight rounding dW (co, m, kh, kw) adds to each output channel, for the
    means `e` of all the conv's input channels (in the unit the weights act on)."""
    dW = np.asarray(dW, np.float64).sum(axis=(2, 3))                          # (co, m)
    co, m = dW.shape
    src = (np.arange(co) // (co // groups))[:, None] * m + np.arange(m)[None, :]   # input channel
    return (dW * np.asarray(e, np.float64)[src]).sum(axis=1)
