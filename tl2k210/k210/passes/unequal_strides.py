"""A conv with unequal strides ((2, 1): the first conv of ARM's KWS CNN and DS-CNN keyword
spotters, on their MFCCs), which no KPU layer runs, becomes the conv at strides (m, m), m the
smaller stride, followed by a strided Slice keeping every (sy / m)-th row and (sx / m)-th column:
exact (a strided conv's outputs are the denser conv's at the strided positions). Only where the
conv at (m, m) has a KPU form: a CPU conv would compute the skipped rows for nothing. The Slice
is kmodel v4's strided_slice on the uint8 map; the 8-bit ideal counts the source's one map."""
import numpy as np

from tl2k210.graph import Node

from ..lower import Options
from ..lower.conv import kpu_conv_refuses
from ..lower.kxk import kxk_refuses


def _runs_on_kpu(g, node):
    return any(f(g, node, Options(format="v4")) is None for f in (kpu_conv_refuses, kxk_refuses))


def unequal_strides(g, log):
    for n in [n for n in g.nodes if n.op == "Conv"]:
        a = n.attrs
        sy, sx = (int(s) for s in a["strides"])
        m = min(sy, sx)
        out, ins = g.shape(n.outputs[0]), g.shape(n.inputs[0])
        if sy == sx or m not in (1, 2) or sy % m or sx % m or out is None or ins is None or len(out) != 4 \
                or a.get("pool") or "pick" in a:
            continue
        ky, kx = ((k - 1) * d + 1 for k, d in zip(a["kernel"], a.get("dilations", (1, 1))))
        p = a["pads"]
        dense = (out[0], out[1], (ins[2] + p[0] + p[2] - ky) // m + 1, (ins[3] + p[1] + p[3] - kx) // m + 1)
        tmp = g.add_tensor(n.outputs[0] + "/dense", dense, g.tensors[n.outputs[0]].dtype)
        trial = Node("Conv", list(n.inputs), [tmp], {**a, "strides": (m, m)}, n.name, list(n.fused))
        if not _runs_on_kpu(g, trial):
            del g.tensors[tmp]
            continue
        steps = [sy // m, sx // m]
        ends = [(o - 1) * s + 1 for o, s in zip(out[2:], steps)]
        consts = [g.add_const(np.asarray(v, np.int64), f"{n.name}/{k}")
                  for k, v in (("starts", [0, 0]), ("ends", ends), ("axes", [2, 3]), ("steps", steps))]
        i = g.nodes.index(n)
        g.nodes[i] = trial
        g.nodes.insert(i + 1, Node("Slice", [tmp, *consts], list(n.outputs), {}, n.name + "/stride"))
        g.meta.setdefault("strided_views", {})[tmp] = n.outputs[0]    # the 8-bit ideal: one map (ideal.py)
        log(n.name, f"strides ({sy}, {sx}) -> ({m}, {m}) on the KPU, then every {steps[0]} row(s) and "
                    f"{steps[1]} column(s) kept (strided_slice)")
    return g
