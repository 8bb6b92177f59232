"""OPT-IN, CHANGES THE MATH: TF 'SAME' stride-2 convs pad asymmetrically (0 before, 1 after);
rewrite them to symmetric padding (p, p) so the KPU runs them with a pick-pool. Output shapes are
unchanged; values at the borders differ from the float model (the report must measure it)."""


def kpu_padding(g, log):
    for conv in [n for n in g.nodes if n.op == "Conv"]:
        a = conv.attrs
        t, l, b, r = a["pads"]
        kh, kw = a["kernel"]
        if tuple(a["strides"]) != (2, 2) or (t, l) == (b, r) or kh != kw or kh % 2 == 0:
            continue
        p = kh // 2
        _, _, h, w = g.shape(conv.inputs[0])
        same_shape = all((n + 2 * p - kh) // 2 == (n + lo + hi - kh) // 2 for n, lo, hi in ((h, t, b), (w, l, r)))
        if not same_shape or max(t, l, b, r) > p:
            continue
        a["pads"] = [p, p, p, p]
        log(conv.name, f"CHANGES MATH: stride-2 pads {[t, l, b, r]} -> {a['pads']} (symmetric for the KPU)")
    return g
