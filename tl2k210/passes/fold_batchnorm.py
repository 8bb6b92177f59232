"""Fold BatchNormalization, and the per-channel constant Mul/Add/Sub that Keras 3 leaves after
depthwise convs, into the preceding Conv's (or ConvTranspose's: a Keras Conv2DTranspose + BN
that stays a float conv2d_transpose) weights and bias (exact up to float rounding). A
DepthToSpace between them (a transposed conv's phases, passes/conv_transpose.py) is looked
through: output channel c of a CRD shuffle of block b is conv channels c b^2 .. c b^2 + b^2 - 1
(DCR: c, c + C, ...), so the affine's vector repeats (tiles) onto them."""
import numpy as np


def _per_channel(g, c_name, co, out_rank):
    """A constant that broadcasts as a per-output-channel vector on an NCHW tensor -> (Co,) or None."""
    c = g.const(c_name)
    if c is None or not np.issubdtype(c.dtype, np.floating) or c.ndim > out_rank:
        return None
    shape = (1,) * (out_rank - c.ndim) + c.shape
    if c.size == 1:
        return np.full(co, c.reshape(()), np.float32)
    if c.size == co and shape[1] == co:
        return c.reshape(co).astype(np.float32)
    return None


def _bn(g, n):
    s, b, m, v = (g.const(i) for i in n.inputs[1:5])
    if any(t is None for t in (s, b, m, v)):
        return None
    scale = s / np.sqrt(v + n.attrs.get("epsilon", 1e-5))
    return scale.astype(np.float32), (b - m * scale).astype(np.float32)


def fold_batchnorm(g, log):
    changed = True
    while changed:
        changed = False
        for conv in [n for n in g.nodes if n.op in ("Conv", "ConvTranspose") and not n.attrs.get("activation")
                     and not n.attrs.get("pool")]:
            nxt = g.single_consumer(conv.outputs[0])
            w = g.const(conv.inputs[1])
            groups = int(conv.attrs.get("group", 1))
            co = None if w is None else w.shape[0] if conv.op == "Conv" else w.shape[1] * groups
            b = g.const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else \
                None if conv.op == "Conv" or co is None else np.zeros(co, np.float32)
            if nxt is None or w is None or b is None:
                continue
            src, rep, crd = conv.outputs[0], 1, True
            if nxt.op == "DepthToSpace" and conv.op == "Conv":
                rep, crd = int(nxt.attrs["blocksize"]) ** 2, nxt.attrs.get("mode", "DCR") == "CRD"
                src, nxt = nxt.outputs[0], g.single_consumer(nxt.outputs[0])
                if nxt is None or src in g.outputs:
                    continue
            rank = len(g.shape(src))
            mul, add = np.ones(co // rep, np.float32), np.zeros(co // rep, np.float32)
            if nxt.op == "BatchNormalization" and nxt.inputs[0] == src and len(nxt.outputs) == 1:
                r = _bn(g, nxt)
                if r is None:
                    continue
                mul, add = r
            elif nxt.op in ("Mul", "Add", "Sub", "Div"):
                other = nxt.inputs[1] if nxt.inputs[0] == src else nxt.inputs[0]
                v = _per_channel(g, other, co // rep, rank)
                if v is None or (nxt.op in ("Sub", "Div") and other == nxt.inputs[0]):
                    continue
                if nxt.op == "Mul":
                    mul = v
                elif nxt.op == "Div":
                    mul = 1 / v
                else:
                    add = v if nxt.op == "Add" else -v
            else:
                continue
            if rep > 1:
                mul, add = ((np.repeat(v, rep) if crd else np.tile(v, rep)) for v in (mul, add))
            if conv.op == "Conv":
                w = w * mul.reshape(-1, 1, 1, 1)
            else:                   # (Ci, Co/group, kh, kw): output channel o is group o // (Co/group)
                ci, cog = w.shape[:2]
                w = (w.reshape(groups, ci // groups, cog, *w.shape[2:]) *
                     mul.reshape(groups, 1, cog, 1, 1)).reshape(w.shape)
            conv.inputs[1] = g.add_const(w.astype(np.float32), conv.name + "/W_bn")
            conv.inputs[2:3] = [g.add_const((b * mul + add).astype(np.float32), conv.name + "/B_bn")]
            g.nodes.remove(nxt)
            g.replace_uses(nxt.outputs[0], src)
            conv.fused.append(nxt.name)
            log(conv.name, f"folded {nxt.op} {nxt.name}")
            changed = True
    return g
