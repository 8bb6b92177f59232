"""A grouped (depthwise) K x K conv whose shift stages do not fit the KPU RAM, in windows of groups.

lower/kxk.py runs a K x K conv (K > 3, or a dilated 3x3) as one-hot 3x3 copy stages that build a
map holding every input channel shifted by each offset of a set (a 5x5's shift grid: 9 copies a
channel), then one 3x3 conv over that map. A depthwise conv's stage map is (copies x channels)
maps: MediaPipe's palm detector's first 5x5 conv (32 channels at 96x96) needs 2.65 MB, more than
the 2 MiB KPU RAM, so the map went to main memory (3.0x the live set of the whole model). Each
group of a grouped conv reads only its own input channels (a depthwise conv: one; after
prelu_split's pair: two), so the conv is split into windows of groups -- Slice, the conv on the
window, Concat -- where the whole conv's input, stage map and output exceed the KPU RAM, each
window's within WINDOW_SHARE of it: one window's copies at a time. Exact: the same arithmetic per
channel. kmodel v4 only (v3 has no Slice: there the map streams through main memory as before).
"""
import numpy as np

from tl2k210.graph import Node
from tl2k210.k210 import hardware as hw
from tl2k210.k210.lower.kxk import forms

#: the share of the KPU RAM lines one window's input, stage map and output may take (the rest for
#: the maps that stay resident around it and the lowering's own tiling)
WINDOW_SHARE = 0.5


def chain_lines(groups, m, n, per, shape_in, shape_out):
    """KPU RAM lines of `groups` groups' input (m channels each), their `per` copies each and
    their output (n channels each)."""
    (h, w), (oh, ow) = shape_in, shape_out
    return hw.map_lines(groups * m, h, w) + hw.map_lines(groups * m * per, h, w) + hw.map_lines(groups * n, oh, ow)


def _windows(g, n):
    """([(first group, end group)] windows, channels a group reads, writes, the KPU RAM lines of
    the whole) of the grouped K x K conv `n`, or None where it needs none."""
    W = g.const(n.inputs[1])
    shape, out = g.shape(n.inputs[0]), g.shape(n.outputs[0])
    groups = n.attrs.get("group", 1)
    if W is None or len(n.inputs) < 3 or g.const(n.inputs[2]) is None or shape is None or out is None \
            or len(shape) != 4 or groups == 1 or shape[1] % groups or out[1] % groups \
            or W.shape[1] != shape[1] // groups or n.attrs.get("pool"):
        return None
    spans = [(k - 1) * d + 1 for k, d in zip(n.attrs["kernel"], n.attrs.get("dilations", (1, 1)))]
    if max(spans) <= 3:       # a 3x3's stride-2 phases are weighed against its stride-1 form (kpu_conv)
        return None
    fs = forms(g, n, "v4")
    if not fs:
        return None
    m, k_out = shape[1] // groups, out[1] // groups
    per, cap = fs[0].channels // shape[1], int(WINDOW_SHARE * hw.KPU_RAM_LINES)
    whole = chain_lines(groups, m, k_out, per, shape[2:], out[2:])
    if per <= 1 or whole <= hw.KPU_RAM_LINES:       # the whole chain fits: no window needed
        return None
    k = next((k for k in range(2, groups + 1)
              if chain_lines(-(-groups // k), m, k_out, per, shape[2:], out[2:]) <= cap), None)
    if k is None:
        return None
    edges = np.linspace(0, groups, k + 1).round().astype(int)
    return list(zip(edges[:-1], edges[1:])), m, k_out, whole


def split_conv(g, n, axis, parts, names):
    """Conv `n` as one conv per part on a Slice of its input along `axis`, the outputs concatenated
    on `axis` (one op's parts for ideal.py: g.meta["parts_of"]); parts = [(first input index, end,
    output extent, [weights, bias], attrs)], names = (the slices' tag, the parts' tag). Returns the
    Concat."""
    x, out = n.inputs[0], n.outputs[0]
    shape, oshape = g.shape(x), g.shape(out)
    new, outs = [], []
    for k, (a, b, size, consts, attrs) in enumerate(parts):
        xs = g.add_tensor(f"{x}/{names[1]}{k}", tuple(b - a if i == axis else d for i, d in enumerate(shape)))
        at = [g.add_const(np.array(v, np.int64), f"{n.name}/{names[1]}{k}_{what}")
              for what, v in (("starts", [a]), ("ends", [b]), ("axes", [axis]))]
        new.append(Node("Slice", [x, *at], [xs], {}, f"{n.name}/{names[0]}{k}", [n.name]))
        y = g.add_tensor(f"{out}/{names[1]}{k}", tuple(size if i == axis else d for i, d in enumerate(oshape)))
        new.append(Node("Conv", [xs, *consts], [y], attrs, f"{n.name}/{names[1]}{k}", list(n.fused)))
        outs.append(y)
        g.meta["parts_of"] = {**g.meta.get("parts_of", {}), new[-1].name: n.name}
    cat = Node("Concat", outs, [out], {"axis": axis}, n.name + "/concat", [n.name])
    i = g.nodes.index(n)
    g.nodes[i:i + 1] = new + [cat]
    return cat


def kxk_windows(g, log, v4=True):
    """`v4`: the plan may use kmodel v4 (k210/flow.py binds False for a v3 target or runtime)."""
    if not v4:
        return g
    for n in [n for n in g.nodes if n.op == "Conv"]:
        found = _windows(g, n)
        if found is None:
            continue
        wins, m, k_out, whole = found
        W, B = g.const(n.inputs[1]), g.const(n.inputs[2])
        split_conv(g, n, 1, [(lo * m, hi * m, (hi - lo) * k_out,
                              [g.add_const(W[lo * k_out:hi * k_out], f"{n.inputs[1]}/win{k}"),
                               g.add_const(B[lo * k_out:hi * k_out], f"{n.inputs[2]}/win{k}")],
                              {**n.attrs, "group": hi - lo}) for k, (lo, hi) in enumerate(wins)], ("slice", "win"))
        log(n.name, f"grouped {W.shape[2]}x{W.shape[3]} conv in {len(wins)} windows of <= "
                    f"{max(b - a for a, b in wins)} of its {n.attrs['group']} groups (Slice + conv + Concat): "
                    f"its shift stages whole would take {whole * hw.LINE_BYTES:,} B of KPU RAM")
    return g
