"""Bit-exact host emulator of K210 kmodels (v3 and v4).

    emu = Emulator.load("face.kmodel")
    outputs = emu.run(image_chw_uint8)                 # list of numpy arrays
    outputs, layers = emu.run(x, trace=True)           # + every layer's output [(name, array)]
    outputs_each = emu.run_frames(frames)              # [emu.run(x) for x in frames], frames at once

Options (named rules, see ``kpu.py``): ``sum_rule`` "silicon" (default) | "simulator",
``act_rule`` "nncase02" (default) | "nncase01"; ``threads`` (default: up to 4 cores) only
changes speed, never results (each big layer keeps its threads only where its first calls
measured them faster than one thread). Over many frames, ``run_frames`` runs whole frames at once
on threads instead (onnxruntime and the numba kernels release the GIL): on 2 cores about 1.5x
one frame at a time, where a frame's band threads give about 1.0x (``bench/emulator.py``).
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import chain, islice

import numpy as np

from tl2k210.errors import EmulatorError
from tl2k210.k210 import kmodel
from tl2k210.k210.board_facts import SRAM_BYTES
from tl2k210.k210.emulator import v3 as run_v3
from tl2k210.k210.emulator import v4 as run_v4
from tl2k210.k210.emulator.kpu import ACT_RULES, SUM_RULES, PreparedConv
from tl2k210.k210.emulator.memory import guarded

MAX_MAIN_MEM = 2 * SRAM_BYTES  # twice the K210's SRAM: refuse absurd claims before allocating


class Emulator:
    def __init__(self, model, sum_rule: str = "silicon", act_rule: str = "nncase02",
                 threads: int | None = None):
        if sum_rule not in SUM_RULES:
            raise ValueError(f"sum_rule must be one of {SUM_RULES}")
        if act_rule not in ACT_RULES:
            raise ValueError(f"act_rule must be one of {ACT_RULES}")
        self.model = model
        self.sum_rule, self.act_rule = sum_rule, act_rule
        main = model.main_memory
        if main > MAX_MAIN_MEM:
            raise EmulatorError(f"model claims {main} bytes of main memory; a K210 has 8 MiB "
                                "(corrupt header?)")
        items = model.items
        kind = model.item_kind
        threads = threads or min(4, os.cpu_count() or 1)
        self.prepared = {id(it): guarded(PreparedConv, f"{kind} {i}", it.conv, sum_rule, act_rule,
                                         f"{kind} {i}", threads)
                         for i, it in enumerate(items) if it.conv is not None}
        self._clones = []   # idle 1-thread copies for run_frames (one per frame running at once)

    @classmethod
    def load(cls, path, **options) -> "Emulator":
        return cls(kmodel.load(path), **options)

    @property
    def version(self) -> int:
        return self.model.version

    def input_spec(self):
        """(shape, dtype) the model takes: CHW uint8 for image models, float32 vectors else."""
        m = self.model
        if m.version == 3:
            first = m.layers[0]
            if first.conv is not None:
                return first.conv.in_shape, np.uint8
            return (first.fields.get("in_channels", 0),), np.float32
        from tl2k210.k210.kmodel import v4 as fmt
        if not m.inputs:
            raise EmulatorError("the model declares no input")
        rng, shape = m.inputs[0], m.input_shapes[0]
        if any(d <= 0 for d in shape):
            raise EmulatorError(f"input shape {tuple(shape)} has a non-positive dimension")
        if rng[0] != fmt.MEM_KPU and rng[1] not in fmt.DTYPES:
            raise EmulatorError(f"input datatype {rng[1]} is neither float32 (0) nor uint8 (1)")
        return tuple(shape), (np.uint8 if rng[0] == fmt.MEM_KPU else fmt.DTYPES[rng[1]])

    def run(self, x, trace: bool = False):
        runner = run_v3 if self.model.version == 3 else run_v4
        outs, inter = guarded(runner.run, "model input/outputs", self.model, self.prepared, x, trace)
        return (outs, inter) if trace else outs

    def iter_frames(self, xs, threads: int | None = None):
        """``run(x)`` of each x of xs (any iterable, read as frames are handed out: at most 2 a
        thread waiting), yielded in order, with up to ``threads`` (default: up to 4 cores)
        frames running at once. Each running frame has its own 1-thread copy of this emulator
        (no layer state is shared between threads), made on first need and kept for later
        calls; the outputs are the same bytes as ``run``'s."""
        n = threads or min(4, os.cpu_count() or 1)
        xs = iter(xs)
        first = list(islice(xs, 2 * n))
        if n < 2 or len(first) < 2:
            yield from map(self.run, chain(first, xs))
            return
        pool = ThreadPoolExecutor(n, thread_name_prefix="frames")
        ahead = deque(pool.submit(self._run_on_clone, x) for x in first)
        try:
            while ahead:
                out = ahead.popleft().result()
                ahead.extend(pool.submit(self._run_on_clone, x) for x in islice(xs, 1))
                yield out
        finally:
            pool.shutdown(cancel_futures=True)

    def run_frames(self, xs, threads: int | None = None) -> list:
        """[run(x) for x in xs], frames at once on threads: see iter_frames."""
        return list(self.iter_frames(xs, threads))

    def _run_on_clone(self, x):
        try:
            emu = self._clones.pop()   # list.pop/append are atomic: each copy runs on one thread
        except IndexError:
            emu = Emulator(self.model, self.sum_rule, self.act_rule, threads=1)
        try:
            return emu.run(x)
        finally:
            self._clones.append(emu)
