"""A K x K conv whose shift stages do not fit the KPU RAM, in row bands.

lower/kxk.py runs a K x K conv (K > 3, or a dilated 3x3) as one-hot 3x3 copy stages that build a
map holding every input channel shifted by each offset of a set, then one 3x3 conv over that map.
Each stage runs over the whole map, so on a camera-size map the copies overflow the KPU RAM and
wait in main memory: a style-transfer net's 9x9 convs at 320x240 (Fritz's starry night: 8 -> 3
channels, 15 MB of copies) could then not fit any runtime, and the plan ran both on the CPU (2.2 s
each). A conv's output rows read only the input rows its kernel spans, so the conv is split into
row bands -- a Slice of the rows a band reads (its halo), the conv on them, a Concat of the bands'
rows -- each band's two largest maps in a row (input, stage maps, output), the second in one piece
of what the first leaves, within BAND_SHARE of the KPU RAM. Exact: the same arithmetic per output
pixel, the map's own zero padding at its top and bottom only.
A grouped conv goes in channel windows first (kxk_windows: no halo); this pass takes the dense ones
and any window still too big. kmodel v4 only (v3 has no Slice); each band stores its own weights
(a v4 layer cannot share another's): the plan may trade bands back one by one, and where the
whole model is faster without any (compiler.FAST_FORMS) it keeps the conv whole.
"""
import numpy as np

from tl2k210.k210 import hardware as hw
from tl2k210.k210.lower.kxk import forms

from .kxk_windows import chain_lines, split_conv

#: the share of the KPU RAM lines a band's peak (_peak_lines) may take (the rest for what stays
#: resident around it)
BAND_SHARE = 0.9


def _peak_lines(f, ci, co, rows_in, rows_out, w, ow):
    """KPU RAM lines a band's chain (kxk form `f`) needs at its fullest: two of its maps in a row
    (the input, each copy stage's map, the output) resident together, the second in one piece of
    what the first leaves wherever that lies (a + 2b: a dilated 3x3's two stages of 9 copies each,
    the first placed mid-RAM, left the second no piece where a + b fitted)."""
    maps = [hw.map_lines(ci * len(f.copies(i)), rows_in, w) for i in range(f.n + 1)] + [hw.map_lines(co, rows_out, ow)]
    return max(a + 2 * b for a, b in zip(maps, maps[1:]))


def _bands(g, n):
    """[(first output row, end row, first input row, end row, pad top, pad bottom)] of the stride-1
    K x K conv `n`, or None where it needs none (or no split fits)."""
    shape, out = g.shape(n.inputs[0]), g.shape(n.outputs[0])
    a = n.attrs
    if len(n.inputs) < 3 or g.const(n.inputs[1]) is None or g.const(n.inputs[2]) is None or shape is None \
            or out is None or len(shape) != 4 or tuple(a["strides"]) != (1, 1) or a.get("pool") or "pick" in a:
        return None
    spans = [(k - 1) * d + 1 for k, d in zip(a["kernel"], a.get("dilations", (1, 1)))]
    if max(spans) <= 3:
        return None
    fs = forms(g, n, "v4")
    if not fs:
        return None
    (_, ci, h, w), (_, co, oh, ow) = shape, out
    per, cap = fs[0].channels // ci, int(BAND_SHARE * hw.KPU_RAM_LINES)
    if per <= 1 or chain_lines(1, ci, co, per, (h, w), (oh, ow)) <= hw.KPU_RAM_LINES:
        return None
    top = a["pads"][0]
    for k in range(2, oh // hw.LIMITS["out_min"] + 1):
        edges = np.linspace(0, oh, k + 1).round().astype(int)
        bands = []
        for o0, o1 in zip(edges[:-1], edges[1:]):
            i0, i1 = o0 - top, o1 - 1 - top + spans[0]      # the input rows the band's kernels read
            bands.append((int(o0), int(o1), max(i0, 0), min(i1, h), max(-i0, 0), max(i1 - h, 0)))
        if max(_peak_lines(fs[0], ci, co, i1 - i0, o1 - o0, w, ow) for o0, o1, i0, i1, _, _ in bands) <= cap:
            return bands
    return None


def kxk_bands(g, log, v4=True):
    """`v4`: the plan may use kmodel v4 (k210/flow.py binds False for a v3 target or runtime)."""
    if not v4:
        return g
    for n in [n for n in g.nodes if n.op == "Conv"]:
        bands = _bands(g, n)
        if bands is None:
            continue
        left, right = n.attrs["pads"][1], n.attrs["pads"][3]
        cat = split_conv(g, n, 2, [(i0, i1, o1 - o0, n.inputs[1:], {**n.attrs, "pads": [pt, left, pb, right]})
                                   for o0, o1, i0, i1, pt, pb in bands], ("rows", "band"))
        g.meta["row_bands"] = [*g.meta.get("row_bands", ()), cat.name]    # one grid: share_concat_ranges
        log(n.name, f"{n.attrs['kernel'][0]}x{n.attrs['kernel'][1]} conv in {len(bands)} row bands of <= "
                    f"{max(o1 - o0 for o0, o1, *_ in bands)} output rows (Slice + conv + Concat): its shift "
                    f"stages over the whole map would overflow the KPU RAM")
    return g
