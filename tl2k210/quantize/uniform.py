"""Uniform 8/16-bit quantization: the affine (scale, zero point) of a calibrated range and
per-output-channel symmetric weights -- the scheme the K210's fixed-point parameters
(`tl2k210.k210.fixed_point`) and the 8-bit fake-quant ideal (`fake_quant`) share."""
from __future__ import annotations

import numpy as np


def qparams(lo: float, hi: float, bits: int = 8) -> tuple[float, int]:
    """(scale, zero_point) for a range; the range is widened to contain 0 (exact zero padding)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if hi - lo < 1e-8:
        hi = lo + 1e-8
    levels = (1 << bits) - 1
    scale = (hi - lo) / levels
    zp = int(np.clip(round(-lo / scale), 0, levels))
    return scale, zp


def uint8_grid(w) -> tuple[float, int] | None:
    """(step s, lowest integer lo) of the asymmetric 8-bit grid `w` lies on, or None: every w/s an
    integer in lo..lo + 255, lo <= 0 (TOCO's uint8 weights, s (q - z) for q in 0..255 and any z:
    z = -lo). The step is the smallest gap between distinct weights, refined over their span."""
    w = np.asarray(w, np.float64).ravel()
    if len(np.unique(w[:1024])) > 256:           # float weights: no 8-bit grid holds them
        return None
    u = np.unique(w)
    if len(u) < 2:
        return None
    step = float(np.diff(u).min())
    lo, hi = int(np.rint(u[0] / step)), int(np.rint(u[-1] / step))
    if not (lo <= 0 <= hi and hi - lo <= 255):
        return None
    return (u[-1] - u[0]) / (hi - lo) if hi > lo else step, lo


def quantize_weights(w: np.ndarray, bits: int = 8):
    """Per-output-channel symmetric weights: (Wq uint8/uint16, zw, sw[o])."""
    zw = 1 << (bits - 1)
    qmax = zw - 1
    flat = w.reshape(w.shape[0], -1).astype(np.float64)
    amax = np.abs(flat).max(axis=1)
    sw = np.where(amax > 0, amax / qmax, 1.0)
    q = np.clip(np.rint(flat / sw[:, None]), -qmax, qmax) + zw
    return q.astype(np.uint8 if bits == 8 else np.uint16).reshape(w.shape), zw, sw
