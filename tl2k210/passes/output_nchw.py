"""A graph output that is Transpose(0,2,3,1) of a 4-D map (TF's NHWC view of a region/feature
output) becomes the NCHW map itself, the layout the K210 produces; recorded in
graph.meta["output_layout"] so comparisons against the source model transpose back."""


def output_nchw(g, log):
    for i, out in enumerate(list(g.outputs)):
        t = g.producer(out)
        if t is None or t.op != "Transpose" or list(t.attrs.get("perm", [])) != [0, 2, 3, 1]:
            continue
        src = t.inputs[0]
        if src in g.inputs or src in g.outputs or g.consumers(out):
            continue
        g.nodes.remove(t)
        p = g.producer(src)
        for n in g.nodes:  # the producer now writes the public output name
            n.outputs = [out if o == src else o for o in n.outputs]
            n.inputs = [out if x == src else x for x in n.inputs]
        g.tensors[out].shape = g.tensors[src].shape
        g.meta.setdefault("output_layout", {})[out] = "NHWC->NCHW"
        log(p.name if p else out, f"output {out} is now NCHW {g.tensors[out].shape} (dropped the NHWC Transpose)")
    return g
