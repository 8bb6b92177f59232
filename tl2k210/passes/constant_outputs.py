"""Graph outputs that are constants (an SSD exports its anchor boxes as an output next to the
boxes and scores) are dropped from the outputs: a kmodel computes maps, and a constant needs no
computing. Each is kept in graph.meta["constant_outputs"] {name: value} and named in the log;
the application reads it from the source model once."""


def constant_outputs(g, log):
    for o in list(g.outputs):
        v = g.const(o)
        if v is None or len(g.outputs) == 1:
            continue
        g.outputs.remove(o)
        g.meta.setdefault("constant_outputs", {})[o] = v
        log(o, f"output {o} {tuple(v.shape)} is a constant (e.g. an SSD's anchors): the kmodel does not "
               "compute it; read it from the source model once")
    return g
