"""Bilinear 2x upsampling (ONNX Resize linear / half_pixel, TFLite RESIZE_BILINEAR with
half_pixel_centers, Keras UpSampling2D(interpolation="bilinear")) on uint8 maps: kmodel v3 has
nearest-neighbour resizing only, and v4's bilinear resize_image runs on float maps (4 bytes a
pixel), so both formats take this form.

Output o of an axis samples input coordinate o/2 - 1/4, clamped to the map: out[2k] =
(x[k-1] + 3 x[k]) / 4 and out[2k+1] = (3 x[k] + x[k+1]) / 4, with x[-1] = x[0] and x[n] = x[n-1].
Let q be x with its last row and column repeated (n + 1 a side). The SDK's nearest resize of
n + 1 to 2n + 3 samples floor(o (n+1) / (2n+3)) = max(o - 1, 0) // 2 (checked on its float32
arithmetic), so u[j] = x[clamp((j - 1) // 2)]: x[0] three times, then every pixel twice, the last
four times. The filter [1, 2, 1] / 4 centred on u[o + 1] is then exactly out[o]: for o = 2k it
reads x[k-1], x[k], x[k]; for o = 2k + 1, x[k], x[k], x[k+1] (clamped). So:

  1. QUANTIZED_CONCAT gathers q, (C, H+1, W+1): one range a row (a row's repeated last pixel and
     the next row are contiguous);
  2. QUANTIZED_RESIZE_NEAREST_NEIGHBOR takes it to (C, 2H+3, 2W+3);
  3. a depthwise 3x3 K210_CONV with the integer weights [1,2,1] x [1,2,1] (zero points 0) sums
     S = 16 x the bilinear value in input codes, and its activation table rounds S / 16 with a
     4-bit shift: the output bytes are the exact interpolation of the input bytes, rounded once
     (ties to even), on the input's own grid (weights summing to 1 map the grid onto itself);
  4. the conv's CPU crop (a kernel-1 QUANTIZED_MAX_POOL2D) keeps rows and columns 1 .. 2n.
Where the upsampled map needs row bands (over the 65,536 pixels a channel the KPU streams, or
the KPU RAM), steps 1-2 run per band on the rows it reads (aligned_bands), so the whole
(C, 2H+3, 2W+3) map never exists, and each band's crop writes its rows into the output.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from tl2k210.graph import Node
from tl2k210.k210 import fixed_point as fx
from tl2k210.k210 import hardware as hw

from . import kpu
from .conv import emit_layer, geometry, plan_for
from .memory import MAIN_TARGET
from .registry import KPU, NA, lowering
from .state import Loc
from .v4resize import _scales, onnx_coords, v4_nearest

SCALE = 2                                      # the upsampling factor the 3x3 filter completes
TAPS = np.array([1, 2, 1], np.int64)           # the filter per axis: sum 4, so S / 16 is the value
SHIFT = 4                                      # log2 of the 2-D filter's sum (16)


def bilinear2x_refuses(g, node, opts):
    a = node.attrs
    if a.get("mode", "nearest") != "linear":
        return NA
    if len(g.shape(node.inputs[0]) or ()) != 4:
        return "kmodel v3's bilinear form resizes NCHW maps only"
    (_, c, h, w), (_, oc, oh, ow) = g.shape(node.inputs[0]), g.shape(node.outputs[0])
    mode = a.get("coordinate_transformation_mode", "half_pixel")
    if (oh, ow) != (SCALE * h, SCALE * w) or _scales(g, node) != [float(SCALE)] * 2:
        return f"{h}x{w} -> {oh}x{ow}: kmodel v3's bilinear form doubles both axes only"
    for n in (h, w):
        c_ = onnx_coords(mode, n, SCALE * n, float(SCALE))
        if c_ is None or not np.allclose(c_, (np.arange(SCALE * n) + 0.5) / SCALE - 0.5, rtol=0, atol=1e-9):
            return (f"coordinate_transformation_mode {mode}: kmodel v3's bilinear form samples half_pixel "
                    "coordinates (TF2 resize, Keras UpSampling2D)")
    for n in (h, w):
        if not np.array_equal(v4_nearest(n + 1, SCALE * n + 3), doubled(n)):
            return f"the SDK's float32 nearest resize of {n + 1} to {SCALE * n + 3} pixels misses a pixel"
    (wlo, whi), (hlo, _) = hw.LIMITS["in_w"], hw.LIMITS["in_h"]
    uh, uw = SCALE * h + 3, SCALE * w + 3
    if not wlo <= uw <= whi or uh < hlo or c > hw.LIMITS["channels"][1]:
        return f"the upsampled {c}x{uh}x{uw} map the KPU filters is outside its limits"
    return None


def repeat_last_ranges(src, c, h, w, rows=None):
    """[(address, bytes)] whose concatenation is the (C, H+1, W+1) map of the (C, H, W) uint8 map
    at `src` with its last row and column repeated (or its rows `rows` of q, indices up to H),
    adjacent runs merged."""
    runs = []
    for ch in range(c):
        for r in (range(h + 1) if rows is None else rows):
            at = src + (ch * h + min(r, h - 1)) * w
            for a, n in ((at, w), (at + w - 1, 1)):
                if runs and runs[-1][0] + runs[-1][1] == a:
                    runs[-1] = (runs[-1][0], runs[-1][1] + n)
                else:
                    runs.append((a, n))
    return runs


def doubled(n):
    """The source index of each of the 2n + 3 pixels the SDK's nearest resize of n + 1 writes:
    max(o - 1, 0) // 2 where its float32 floor(o (n+1) / (2n+3)) agrees (the check asks)."""
    return np.maximum(np.arange(SCALE * n + 3) - 1, 0) // SCALE


def smoothing_layer(c, quant, bits):
    """The depthwise 3x3 KPU layer of [1,2,1] x [1,2,1] on raw input codes (zero points 0, BN x1)
    whose activation table is round(ACC / 16): the bilinear value, on the input's own grid."""
    wq = np.tile(np.outer(TAPS, TAPS), (c, 1, 1, 1)).astype(np.uint8 if bits == 8 else np.uint16)
    bn = {"norm_mul": np.ones(c, np.int64), "norm_shift": np.zeros(c, np.int64), "norm_add": np.zeros(c, np.int64)}
    act = fx.clamp_table(-np.inf, np.inf, SHIFT, quant[0], 0)
    return kpu.LayerQuant(wq, 0, 0, bn, act, tuple(quant), c, bits)


def aligned_bands(plan, h, w):
    """Row bands of the filter stage (final rows [f0, f1) from upsampled rows [a, b)) as `plan`'s
    band count or more, none longer than its longest, whose inputs are each one nearest resize of
    rows of q: the first band's rows 0 .. 2m are q's rows 0 .. m-1 sampled x[0] three times, then
    every row twice (m -> 2m + 1, as the whole map), and every other band starts at an odd row
    (a row's first copy) and reads an even number, each q row twice (m -> 2m); the last reads to
    row 2n + 2. So cuts lie on odd final rows. Enough bands that one band's input and output
    (2 x its rows x 2w+3 a channel) stay within MAIN_TARGET - 1 of the input and output maps
    (5 x 4hw / 4 a channel): the main-memory target beside the map. None where no split fits."""
    worst, n, F = max(b - a for _, (a, b) in plan.bands), len(plan.bands), SCALE * h
    rows = max(4, int((MAIN_TARGET - 1) * 5 * h * w / (2 * (SCALE * w + 3))))
    for nb in range(max(n, -(-(F + 3) // rows)), F // 4):
        cuts = [0] + [(F * i // nb) | 1 for i in range(1, nb)] + [F]
        if all(a < b for a, b in zip(cuts, cuts[1:])):
            bands = [((f0, f1), (f0, f1 + 2 if f1 < F else F + 3)) for f0, f1 in zip(cuts, cuts[1:])]
            if max(b - a for _, (a, b) in bands) <= worst and all(
                    np.array_equal(v4_nearest(*band_resize(a, b)), band_sources(a, b) - band_sources(a, b)[0])
                    for _, (a, b) in bands):
                return bands
    return None


def band_resize(a, b):
    """(q rows in, rows out) of the nearest resize giving upsampled rows [a, b) (aligned_bands):
    2m + 1 rows from m for the first band, 2m from m for the others."""
    return (b - a) // 2, b - a


def band_sources(a, b):
    """The q row each upsampled row of [a, b) samples."""
    return doubled(b)[a:b]


@lowering("Resize", unit=KPU, check=bilinear2x_refuses, formats=("v3", "v4"), name="bilinear2x_kpu")
def bilinear2x_kpu(lw, node):
    x, out = node.inputs[0], node.outputs[0]
    c, h, w = lw.shape(x)
    row = lw.row(node, "bilinear 2x: last row/column repeated (QUANTIZED_CONCAT), QUANTIZED_RESIZE_NEAREST_NEIGHBOR "
                       "to 2n+3, depthwise 3x3 [1,2,1]x[1,2,1]/16 on the KPU, CPU crop (kmodel v3 has no bilinear "
                       "resize)",
                 in_shape=(c, h, w), out_shape=lw.shape(out))
    src = lw.need_u8(x, row)
    quant = lw.locs[x].quant
    uh, uw = SCALE * h + 3, SCALE * w + 3
    up = f"{out}:up"
    lw.virtual_shapes[up] = (c, uh, uw)
    lw.locs[up] = Loc((c, uh, uw), quant=quant)
    stage = Node("Conv", [up], [out], dict(kernel=(3, 3), strides=(1, 1), pads=[1, 1, 1, 1], dilations=(1, 1),
                                          group=c, pick=(1, 1, 1)), f"{node.name}/smooth")
    geo, plan = geometry(lw, stage), plan_for(lw, stage)
    bands = aligned_bands(plan, h, w) if len(plan.bands) > 1 and not plan.in_resident else None
    gathers = []

    def upsample(a, b, dst, last=False):
        """Rows [a, b) of the upsampled map into dst: q's rows gathered, resized nearest."""
        qa = int(band_sources(a, b)[0])
        (m, n_out) = band_resize(a, b) if bands else (h + 1, uh)
        ranges = repeat_last_ranges(src, c, h, w, range(qa, qa + m))
        gathers.append(len(ranges))
        pad = lw.alloc(f"{out}:repeat", "u8", c * m * (w + 1))
        lw.emit("QUANTIZED_CONCAT", dict(flags=1, main_mem_out_address=pad, input_count=len(ranges)), row,
                data={"ranges": ranges})
        if last:
            lw.release_read(x)          # the repeated rows are all the rest reads
        lw.emit("QUANTIZED_RESIZE_NEAREST_NEIGHBOR", dict(
            flags=1, main_mem_in_address=pad, main_mem_out_address=dst, in_shape=(w + 1, m, c),
            out_width=uw, out_height=n_out, align_corners=0), row)
        lw.main.free(f"{out}:repeat:u8")

    if bands:                           # each band's rows made from x when it runs: no whole map
        longest = max(b - a for _, (a, b) in bands)
        plan = lw.plans[stage.name] = dataclasses.replace(plan, bands=bands, why=(
            f"{plan.why.split(':')[0]}: {len(bands)} row bands of <= {longest} upsampled rows, each made "
            "from the input as it runs"))
        lw.band_sources[up] = upsample
    else:
        lw.locs[up].u8 = lw.alloc(up, "u8", c * uh * uw)
        upsample(0, uh, lw.locs[up].u8, last=True)
        lw.uses[up] = 1                 # the stage is its one reader: row bands free it once gathered
    emit_layer(lw, stage, geo, plan, smoothing_layer(c, quant, lw.opts.weight_bits), row)
    lw.uses.pop(up, None)
    lw.band_sources.pop(up, None)
    lw.kpu_free(lw.locs[up])
    lw.main.free(f"{up}:u8")
    row.notes.append(f"exact: the interpolation of the input bytes rounded once ({sum(gathers):,} gather ranges, "
                     f"{8 * sum(gathers):,} B)" + (f"; {plan.why}" if plan.why else ""))
