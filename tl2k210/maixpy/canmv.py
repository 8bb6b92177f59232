"""The CanMV `maix` module's object KPU API (Canaan's kendryte/canmv fork of MaixPy), which
two corpus scripts use: `from maix import KPU, utils`.

This is NOT MaixPy v1's API (docs/maixpy-firmware.md#kpu) and no source of it is in our references; it is
reconstructed from the scripts that use it (canmv_examples 98-KPU_NEW), on top of the same
loader, emulator, memory budget and clock as `KPU`:

    kpu = KPU(); kpu.load("/sd/m.kmodel")      # path or flash address, v3/v4
    kpu.run(img)                               # the image's AI buffer, MaixPy's checks
    out = kpu.get_outputs()                    # output 0 as a list of floats
    yolo = kpu.Yolo2(); yolo.init(anchor, threshold, nms)   # len(anchor)/2 anchors
    for x, y, w, h, classid, prob in yolo.run(): ...        # boxes of the last run ([] if none)
    KPU.Act.sigmoid(v); kpu.deinit()

`Lpr` (the licence-plate post-processing over lp_weight.bin) is closed CPU code whose weight
layout nobody documents: the run stops there (a host limit, BoardStop kind "host") instead of
inventing numbers.
"""
from __future__ import annotations

import math

import numpy as np

from tl2k210.maixpy import KPU as _K
from tl2k210.maixpy import args as A
from tl2k210.maixpy import board as _board


class _Act:
    @staticmethod
    def sigmoid(x):
        x = A.get_float(x)
        return 1.0 / (1.0 + math.exp(-x)) if x > -80 else 0.0

    @staticmethod
    def relu(x):
        return max(0.0, A.get_float(x))

    @staticmethod
    def tanh(x):
        return math.tanh(A.get_float(x))

    @staticmethod
    def softmax(v):
        v = np.asarray([A.get_float(x) for x in A.seq(v)], np.float64)
        e = np.exp(v - v.max())
        return (e / e.sum()).tolist()


class KPU:
    Act = _Act

    def __init__(self, *args, **kwargs):
        self._net = None
        self._outs = None

    def load(self, *args, **kwargs):
        if not args:
            raise TypeError("function missing 1 required positional arguments")
        self._net = _K.load(args[0])
        return None

    load_kmodel = load

    def _need(self):
        if self._net is None:
            raise OSError("[CANMV]kpu: load a model first")
        return self._net

    def run(self, img, *args, **kwargs):
        net = self._need()
        x = _K._input(net, img)
        self._outs, _ = _K._run(net, x)
        self._img = (img.width(), img.height())
        return True

    run_with_output = run

    def get_outputs(self, idx=0):
        if self._outs is None:
            raise OSError("[CANMV]kpu: run the model first")
        return np.asarray(self._outs[A.get_int(idx)], np.float32).reshape(-1).tolist()

    def deinit(self):
        if self._net is not None:
            _K.release(_board.current(), self._net)
        self._net = None
        return True

    def Yolo2(self):
        return _Yolo2(self)

    def Lpr(self):
        return _Lpr(self)


class _Yolo2:
    def __init__(self, kpu: KPU):
        self._kpu, self._args = kpu, None

    def init(self, anchor, threshold=0.5, nms=0.3, *args, **kwargs):
        anchor = [A.get_float(v) for v in A.seq(anchor)]
        if len(anchor) % 2 or not anchor:
            raise ValueError("[CANMV]kpu: anchor must hold (w, h) pairs")
        self._args = (anchor, A.get_float(threshold), A.get_float(nms))
        return True

    def run(self, *args, **kwargs):
        from tl2k210.k210 import yolo
        if self._args is None:
            raise OSError("[CANMV]kpu: yolo.init() first")
        kpu = self._kpu
        if kpu._outs is None:
            raise OSError("[CANMV]kpu: run the model first")
        anchor, thr, nms = self._args
        out = np.asarray(kpu._outs[0], np.float32).reshape(-1)
        net = kpu._need()
        gw, gh = yolo.region_grid(net.model, out.size)
        na = len(anchor) // 2
        per = out.size // (gw * gh * na)
        if per < 5 or na * per * gw * gh != out.size:
            raise OSError(f"[CANMV]kpu: output of {out.size} values is not a {na}-anchor region map")
        m = out.reshape(na, per, gh, gw)
        if per == 5:        # objectness only: one class whose probability is the objectness
            m = np.concatenate([m, np.zeros((na, 1, gh, gw), np.float32)], 1)
        iw, ih = kpu._img
        boxes = yolo.decode(m, anchor, gw, gh, iw, ih, thr, nms)
        _board.current().clock.advance(gw * gh * na * per * 0.15)
        boxes.sort(key=lambda b: b.index)
        return [[max(0, int(b.x)), max(0, int(b.y)), max(0, int(b.w)), max(0, int(b.h)),
                 b.classid, b.value] for b in boxes]


class _Lpr:
    def __init__(self, kpu):
        self._kpu = kpu

    def load(self, *args, **kwargs):
        _board.current().stop(
            "host limit: maix.KPU.Lpr (CanMV licence-plate post-processing) is closed CPU code; "
            "lpr.load(weights)/lpr.run() have no documented layout (lp_weight.bin is 374625 "
            "float32 values), so the host cannot emulate it - a CanMV board would go on", "host")

    run = load


def make_module(s):
    from tl2k210.maixpy.modules import module
    b = s.board
    utils = module("maix.utils", "", gc_heap_size=lambda *n: b.runtime.gc_heap,
                   heap_free=lambda: b.sys_free)
    return module("maix", "CanMV maix (object KPU API) on the host", KPU=KPU, utils=utils)
