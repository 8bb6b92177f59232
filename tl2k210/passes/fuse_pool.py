"""MaxPool/AveragePool 2x2 s2, 4x4 s4 (no padding) and MaxPool 2x2 s1 padded (0,0,1,1) right
after a stride-1, non-depthwise, 'same'-size Conv -> the Conv's `pool` attr (KPU pool codes 1-4, 9).
Semantics stay ONNX's (the pool follows the activation); the backend checks exactness.
A pool whose output would be smaller than `min_out` x `min_out` (the KPU writes maps of at least
4x4: a 4x4 pool of MobileNet's last 4x4 map) stays a pool of its own, which the back-end places
on the CPU."""

ALLOWED = {("max", 2, 2, (0, 0, 0, 0)), ("avg", 2, 2, (0, 0, 0, 0)), ("max", 4, 4, (0, 0, 0, 0)),
           ("avg", 4, 4, (0, 0, 0, 0)), ("max", 2, 1, (0, 0, 1, 1))}


def pool_of(p):
    a = p.attrs
    k, s = list(a.get("kernel_shape", [])), list(a.get("strides", [1, 1]))
    if p.op not in ("MaxPool", "AveragePool") or len(k) != 2 or k[0] != k[1] or s[0] != s[1]:
        return None
    if a.get("ceil_mode") or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or \
            any(d != 1 for d in a.get("dilations", [1, 1])) or len(p.outputs) > 1:
        return None
    kind = "max" if p.op == "MaxPool" else "avg"
    pads = tuple(a.get("pads", (0, 0, 0, 0)))
    if (kind, k[0], s[0], pads) not in ALLOWED:
        return None
    return {"kind": kind, "size": k[0], "stride": s[0], "pads": list(pads)}


def fuse_pool(g, log, min_out=1):
    for conv in [n for n in g.nodes if n.op == "Conv"]:
        if conv.attrs.get("pool") or conv.attrs["group"] != 1 or tuple(conv.attrs["strides"]) != (1, 1):
            continue
        (kh, kw), (dh, dw) = conv.attrs["kernel"], conv.attrs.get("dilations", (1, 1))
        rh, rw = (kh - 1) * dh // 2, (kw - 1) * dw // 2
        if list(conv.attrs["pads"]) != [rh, rw, rh, rw]:
            continue     # the KPU pools its padded-every-side map: only 'same'-size convs
        p = g.single_consumer(conv.outputs[0])
        pool = pool_of(p) if p is not None else None
        if pool is None:
            continue
        h, w = (g.shape(p.outputs[0]) or (0, 0, 0, 0))[2:]
        if min(h, w) < min_out:
            log(p.name, f"pool not fused into {conv.name}: its {w}x{h} output is under the "
                        f"{min_out}x{min_out} a KPU layer writes; it runs on its own")
            continue
        g.nodes.remove(p)
        g.replace_uses(p.outputs[0], conv.outputs[0])
        conv.attrs["pool"] = pool
        conv.fused.append(p.name)
        log(conv.name, f"fused pool {pool}")
    return g
