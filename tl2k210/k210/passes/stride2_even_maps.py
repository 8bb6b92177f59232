"""A VALID stride-2 conv on an even map gives one row fewer than half the map (a 3x3 conv: the
last window would read row H). When its only consumer is a stride-2 conv or a pool that has no
padding on that side and gives the same output from one more row (it never reads the last one:
a VALID 3x3 stride 2 on 119 or 120 rows both give 59), the conv pads that side by one more
pixel instead, per axis. Exact in float (the consumer computes the same numbers from the same
pixels); on the KPU the conv's output is then the half-size map 'stride-2 phases' gives without
a crop, and the consumer's input is even, so the phases apply to it too without the extra copy
stage an odd map needs (LFFD's 320x240 chain of VALID stride-2 convs, SqueezeNet's conv1 and
its 3x3 stride-2 max pool)."""


def _conv_window(n):
    a = n.attrs
    return list(a["kernel"]), list(a["strides"]), list(a["pads"]), list(a.get("dilations", (1, 1)))


def _pool_window(n):
    a = n.attrs
    if a.get("ceil_mode") or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or len(n.outputs) > 1:
        return None
    return (list(a["kernel_shape"]), list(a.get("strides", [1, 1])), list(a.get("pads", [0, 0, 0, 0])),
            list(a.get("dilations", [1, 1])))


def _outputs(n, k, s, lo, hi):
    return (n + lo + hi - k) // s + 1


def stride2_even_maps(g, log):
    for conv in [n for n in g.nodes if n.op == "Conv"]:
        user = g.single_consumer(conv.outputs[0])
        if user is None or not user.inputs or user.inputs[0] != conv.outputs[0] or conv.attrs.get("pool"):
            continue
        win = _conv_window(user) if user.op == "Conv" else _pool_window(user) if user.op in ("MaxPool", "AveragePool") \
            else None
        (k, s, pads, dil), shape = _conv_window(conv), g.shape(conv.outputs[0])
        ins = g.shape(conv.inputs[0])
        if win is None or shape is None or ins is None or len(shape) != 4 or tuple(s) != (2, 2) or dil != [1, 1]:
            continue
        uk, us, upads, udil = win
        grown = list(shape)
        for ax in (0, 1):
            n_in, n_out = ins[2 + ax], shape[2 + ax]
            hi = pads[2 + ax] + 1
            ke = (uk[ax] - 1) * udil[ax] + 1
            if (n_out + 1 == n_in // 2 and hi <= k[ax] // 2 and _outputs(n_in, k[ax], 2, pads[ax], hi) == n_out + 1
                    and upads[2 + ax] == 0
                    and _outputs(n_out + 1, ke, us[ax], upads[ax], 0) == _outputs(n_out, ke, us[ax], upads[ax], 0)):
                pads[2 + ax] = hi
                grown[2 + ax] += 1
        if grown != list(shape):
            old = list(conv.attrs["pads"])
            conv.attrs["pads"] = pads
            g.tensors[conv.outputs[0]].shape = tuple(grown)     # the next conv in a chain sees it
            log(conv.name, f"pads {old} -> {pads}: a {grown[2]}x{grown[3]} map (half the input) for "
                f"{user.op} {user.name!r}, which never reads the extra row/column (its output is unchanged)")
    return g
