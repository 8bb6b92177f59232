"""Non-square kernels up to 3 (1x3, 3x1, 2x3, 3x2, 1x2, 2x1, 2x2: factorised and PyTorch
downsampling convs) -> 3x3 kernels with zero taps, the padding moved so every output reads the
same inputs: a 1-tap axis gets its tap in the middle and one more pixel of padding on both sides,
a 2-tap axis its taps first and one more pixel at the end, or, where that end already has one (a
TF/Keras 'same' 2-tap axis pads 0 before and 1 after), its taps last and one more pixel at the
start. Exact in float (the zero taps read the padding); the KPU runs 3x3 kernels only. Where the
padding would then exceed the KPU's 1-pixel border the conv is left as it is (a CPU conv in kmodel
v4). A 1x1 kernel's dilation, which moves
no tap (PyTorch exports of dilated backbones keep it), becomes 1."""
import numpy as np

#: kernel size: the placements of its taps in 3, (offset, pad before +, pad after +), in order of preference
TAPS = {1: ((1, 1, 1),), 2: ((0, 0, 1), (1, 1, 0)), 3: ((0, 0, 0),)}


def _place(k: int, before: int, after: int):
    """The first placement of a k-tap axis whose pads stay within the KPU's 1-pixel border:
    (offset, new pad before, new pad after), or None."""
    return next(((o, before + b, after + e) for o, b, e in TAPS[k] if max(before + b, after + e) <= 1), None)


def square_kernels(g, log):
    for n in g.nodes:
        if n.op != "Conv" or g.const(n.inputs[1]) is None:
            continue
        a = n.attrs
        k = tuple(a.get("kernel", ()))
        if k == (1, 1) and tuple(a.get("dilations", (1, 1))) != (1, 1):   # timm's dilated MobileNetV3
            log(n.name, f"dilations {tuple(a['dilations'])} of a 1x1 kernel dropped (they move no tap)")
            a["dilations"] = (1, 1)
        if len(k) != 2 or k in ((1, 1), (3, 3)) or max(k) > 3 or tuple(a.get("dilations", (1, 1))) != (1, 1):
            continue
        t, lft, b, r = a["pads"]
        rows, cols = _place(k[0], t, b), _place(k[1], lft, r)
        if rows is None or cols is None:
            continue
        (oh, t3, b3), (ow, l3, r3) = rows, cols
        pads = [t3, l3, b3, r3]
        w = np.asarray(g.const(n.inputs[1]))
        w3 = np.zeros(w.shape[:2] + (3, 3), w.dtype)
        w3[:, :, oh:oh + k[0], ow:ow + k[1]] = w
        n.inputs[1] = g.add_const(w3, n.name + "/weight_3x3")
        a["kernel"], a["pads"] = (3, 3), pads
        log(n.name, f"kernel {k[0]}x{k[1]} -> 3x3 with zero taps, pads {[t, lft, b, r]} -> {pads}")
    return g
