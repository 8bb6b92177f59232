"""TF front-ends give NHWC inputs followed by Transpose(0,3,1,2): make the graph input NCHW."""


def input_nchw(g, log):
    for x in g.inputs:
        t = g.tensors[x]
        cs = g.consumers(x)
        if len(t.shape or ()) != 4 or not cs or x in g.outputs:
            continue
        if not all(c.op == "Transpose" and list(c.attrs.get("perm", [])) == [0, 3, 1, 2] for c in cs):
            continue
        n, h, w, c = t.shape
        t.shape = (n, c, h, w)
        for tr in cs:
            g.nodes.remove(tr)
            g.replace_uses(tr.outputs[0], x)
        g.meta.setdefault("input_layout", {})[x] = "NHWC->NCHW"
        log(x, f"input {x} is now NCHW {t.shape} (was NHWC; removed {len(cs)} Transpose)")
    return g
