"""ConvTranspose -> Conv + DepthToSpace (+ Slice): a transposed conv of stride s as s*s phase
convs on the input map, their outputs interleaved by a pixel shuffle. Exact in float (the same
products, summed in the same groups), and then an ordinary conv — the KPU's, or the uint8
`quantized_conv2d` — instead of the float `conv2d_transpose`, and its weights once, a byte each.

Per axis (kernel k = m s, pads p_b / p_e, output length L): the output row Y reads, with
Y + p_b = q s + a (phase a < s), y[Y] = sum_j x[q - j] W[a + j s] (j < m). So phase a is a
correlation of x with the m taps K_a[t] = W[a + (m - 1 - t) s], padded m - 1 - q0 before, and
its output q lands at Y = q s + a - p_b. The conv computes every phase of the rows
q0 = floor(p_b / s) .. q1 - 1 as s*s output channels per channel o (channel o s^2 + a s + b: the
CRD order, which keeps a grouped conv's channels within its group); DepthToSpace (CRD) interleaves
them; a Slice drops the p_b - q0 s rows before and what lies past L.

Where the phases have 2 taps an axis (k = 3 or 4 on stride 2: Keras' Conv2DTranspose(3, 2, 'same'),
PyTorch's x2 upsampling) and the output is exactly s times the input, each output phase r is
instead placed in a 3x3 kernel of its own (`kpu_plan`): output Y = s u + r reads
x[u + c_r - j] (c_r = (r + p_b) div s), i.e. taps at 3x3 offsets tau = t + c_r - m + 2, which lie
in 0..2 when m - 2 <= c_r <= 1. One 3x3 conv with 1-pixel padding (the KPU's native form) then
computes every phase of every output row, and DepthToSpace alone places them: no Slice, and
k need not be a multiple of s (the missing taps are zeros; a KPU kernel stores 3x3 taps anyway).

Left as it is (float conv2d_transpose) where neither applies: a kernel that is no multiple of s
whose phases do not fit a 3x3 window, dilations, an `output_shape` that implies padding, unequal strides,
auto_pad SAME with output_padding, or padding the phases cannot reach."""
import numpy as np

from tl2k210.graph import Node


def convt_pads(node, in_hw, out_hw, k):
    """ONNX ConvTranspose pads [top, left, bottom, right] for input (H, W) -> output (H', W')
    with kernel `k`; the SAME_* split is onnxruntime's (SAME_UPPER: the odd pixel first)."""
    a = node.attrs
    auto = a.get("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        return [0, 0, 0, 0] if auto == "VALID" else list(a.get("pads", (0, 0, 0, 0)))
    s, d = a.get("strides", (1, 1)), a.get("dilations", (1, 1))
    op = a.get("output_padding", (0, 0))
    tot = [max(0, (i - 1) * s_ + (kk - 1) * d_ + 1 + o_ - o) for i, s_, kk, d_, o_, o in
           zip(in_hw, s, k, d, op, out_hw)]
    lo = [t - t // 2 if auto == "SAME_UPPER" else t // 2 for t in tot]
    return [lo[0], lo[1], tot[0] - lo[0], tot[1] - lo[1]]


def _no_padding(a, xs, ys, k) -> bool:
    """Does an `output_shape` attribute ask for the plain s x in (+ k - s) output, no padding to
    compute from it (TFLite's TRANSPOSE_CONV through tf2onnx writes one on every such node)?"""
    s = a.get("strides", (1, 1))
    op = a.get("output_padding", (0, 0))
    return (list(a["output_shape"])[-2:] == list(ys[2:]) and not any(a.get("pads", ())) and
            all(s[i] * (xs[2 + i] - 1) + op[i] + k[i] == ys[2 + i] for i in range(2)))


def _geometry(g, n):
    """(kernel, stride, input shape, output shape, pads) or a reason to leave the node."""
    a = n.attrs
    w = g.const(n.inputs[1])
    xs, ys = g.shape(n.inputs[0]), g.shape(n.outputs[0])
    if w is None or xs is None or ys is None or len(xs) != 4 or np.ndim(w) != 4:
        return "not a 2-D transposed conv with constant weights"
    if tuple(a.get("dilations", (1, 1))) != (1, 1):
        return "dilations"
    if "output_shape" in a and not _no_padding(a, xs, ys, np.shape(w)[2:]):
        return "output_shape with padding (pads then computed from it)"
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", "VALID", b"VALID") and any(a.get("output_padding", ())):
        return "auto_pad SAME with output_padding (onnx and onnxruntime disagree on its shape)"
    s = tuple(int(v) for v in a.get("strides", (1, 1)))
    if s[0] != s[1]:
        return f"unequal strides {s}"
    k = tuple(int(v) for v in w.shape[2:])
    return k, s[0], xs, ys, convt_pads(n, xs[2:], ys[2:], k)


def kpu_plan(g, n):
    """Per axis, (a_r, c_r) of each output phase r (module doc), for phases of 2 taps (3 where
    every c_r is 1) in a 3x3 window; or None."""
    geo = _geometry(g, n)
    if isinstance(geo, str):
        return None
    k, s, xs, ys, pads = geo
    if s < 2:
        return None
    plan = []
    for ax in range(2):
        m, pb = -(-k[ax] // s), pads[ax]
        if m < 2 or m > 3 or ys[2 + ax] != s * xs[2 + ax]:
            return None
        taps = [((r + pb) % s, (r + pb) // s) for r in range(s)]
        if any(not m - 2 <= c <= 1 for _, c in taps):
            return None
        plan.append(taps)
    return plan


def kpu_phase_weights(W, groups, s, plan):
    """3x3 conv weights (Co s^2, Ci/g, 3, 3) of ConvTranspose weights W (Ci, Co/g, kh, kw) for
    `kpu_plan`'s phases, output channel o s^2 + r_h s + r_w the phase (r_h, r_w) of channel o."""
    ci, cog, kh, kw = W.shape
    mh, mw = -(-kh // s), -(-kw // s)
    cig = ci // groups
    Wp = np.zeros((ci, cog, mh * s, mw * s), W.dtype)
    Wp[:, :, :kh, :kw] = W
    Wg = Wp.reshape(groups, cig, cog, mh * s, mw * s)
    K = np.zeros((groups, cog, s, s, cig, 3, 3), W.dtype)
    for rh, (ah, ch) in enumerate(plan[0]):
        for rw, (aw, cw) in enumerate(plan[1]):
            for th in range(mh):
                for tw in range(mw):
                    K[:, :, rh, rw, :, th + ch - mh + 2, tw + cw - mw + 2] = \
                        Wg[:, :, :, ah + (mh - 1 - th) * s, aw + (mw - 1 - tw) * s].transpose(0, 2, 1)
    return K.reshape(groups * cog * s * s, cig, 3, 3)


def _plan(g, n):
    """(m (per axis), s, conv pads, slice (begin, length) per axis) or a reason to leave it."""
    geo = _geometry(g, n)
    if isinstance(geo, str):
        return geo
    k, s, xs, ys, pads = geo
    if any(kk % s for kk in k):
        return f"kernel {k} is not a multiple of stride {s}"
    conv_pads, crop = [0, 0, 0, 0], []
    for ax in range(2):
        m, pb, L, H = k[ax] // s, pads[ax], ys[2 + ax], xs[2 + ax]
        q0, q1 = pb // s, (pb + L - 1) // s + 1
        before = m - 1 - q0
        after = (q1 - q0) - H - before + m - 1
        if before < 0 or after < 0:
            return f"pads {pads} reach past the phases"
        conv_pads[ax], conv_pads[ax + 2] = before, after
        crop.append((pb - q0 * s, L))
    return tuple(kk // s for kk in k), s, conv_pads, crop


def phase_weights(W, groups, s):
    """Conv weights (Co s^2, Ci/g, mh, mw) of ConvTranspose weights W (Ci, Co/g, kh, kw), stride s,
    output channel o s^2 + a s + b the phase (a, b) of channel o (CRD)."""
    ci, cog, kh, kw = W.shape
    mh, mw = kh // s, kw // s
    cig = ci // groups
    # W[g*cig + i, o, a + jh s, b + jw s] -> K[g, o, a, b, i, mh-1-jh, mw-1-jw]
    K = W.reshape(groups, cig, cog, mh, s, mw, s)[:, :, :, ::-1, :, ::-1, :]
    K = K.transpose(0, 2, 4, 6, 1, 3, 5)            # g, o, a, b, i, th, tw
    return np.ascontiguousarray(K.reshape(groups * cog * s * s, cig, mh, mw))


def conv_transpose_3x3(g, log):
    """The transposed convs `kpu_plan` takes: one 3x3 conv of their phases + DepthToSpace (the
    fast form; off, `conv_transpose` gives them their exact phases: fewer weights, a CPU conv)."""
    return _rewrite(g, log, kpu=True)


def conv_transpose(g, log):
    """The other transposed convs whose kernel is a multiple of the stride: exact phases."""
    return _rewrite(g, log, kpu=False)


def _rewrite(g, log, kpu):
    for n in list(g.nodes):
        if n.op != "ConvTranspose":
            continue
        taps = kpu_plan(g, n) if kpu else None
        plan = None if kpu else _plan(g, n)
        if taps is None and not isinstance(plan, tuple):
            continue
        x, out = n.inputs[0], n.outputs[0]
        W = np.asarray(g.const(n.inputs[1]), np.float32)
        groups = int(n.attrs.get("group", 1))
        co = W.shape[1] * groups
        B = (np.asarray(g.const(n.inputs[2]), np.float32) if len(n.inputs) > 2 and n.inputs[2]
             else np.zeros(co, np.float32))
        if taps is not None:
            s = int(n.attrs["strides"][0])
            (mh, mw), pads, crop, need_crop = (3, 3), [1, 1, 1, 1], [], False
            wc = kpu_phase_weights(W, groups, s, taps)
        else:
            (mh, mw), s, pads, crop = plan
            need_crop = any(b or L != (g.shape(x)[2 + ax] + pads[ax] + pads[ax + 2] - (mh, mw)[ax] + 1) * s
                            for ax, (b, L) in enumerate(crop))
            wc = phase_weights(W, groups, s)
        i = g.nodes.index(n)
        g.nodes.remove(n)
        new = []
        y = out
        if need_crop:
            y = g.add_tensor(out + "/phases_shuffled")
        z = g.add_tensor(out + "/phases") if s > 1 else y
        new.append(Node("Conv", [x, g.add_const(wc, n.name + "/phase_weights"),
                                 g.add_const(np.repeat(B, s * s), n.name + "/phase_bias")], [z],
                        {"kernel": (mh, mw), "strides": (1, 1), "pads": pads, "group": groups,
                         "dilations": (1, 1)}, n.name + ("/phases" if s > 1 or need_crop else ""), [n.name]))
        if s > 1:
            new.append(Node("DepthToSpace", [z], [y], {"blocksize": s, "mode": "CRD"},
                            n.name + ("/shuffle" if need_crop else "")))
        if need_crop:
            starts = g.add_const(np.array([b for b, _ in crop], np.int64), n.name + "/crop_starts")
            ends = g.add_const(np.array([b + L for b, L in crop], np.int64), n.name + "/crop_ends")
            axes = g.add_const(np.array([2, 3], np.int64), n.name + "/crop_axes")
            new.append(Node("Slice", [y, starts, ends, axes], [out], {}, n.name))
        g.nodes[i:i] = new
        log(n.name, f"transposed conv {W.shape[2]}x{W.shape[3]} stride {s} -> {s * s} phase convs "
                    f"{mh}x{mw}" + (" (each phase's taps in a 3x3 window of its own)" if taps else "")
                    + f" as one Conv to {co * s * s} channels"
                    + (", DepthToSpace (CRD)" if s > 1 else "") + (", Slice" if need_crop else ""))
    return g
