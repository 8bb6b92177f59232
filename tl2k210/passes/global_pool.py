"""ReduceMean/ReduceMax over the spatial axes of an NCHW tensor -> GlobalAveragePool/GlobalMaxPool
(+ Flatten when keepdims=0): Keras GlobalAveragePooling2D through tf2onnx."""
from tl2k210.graph import Node, axes_of

OPS = {"ReduceMean": "GlobalAveragePool", "ReduceMax": "GlobalMaxPool"}


def global_pool(g, log):
    for n in [n for n in g.nodes if n.op in OPS]:
        shape = g.shape(n.inputs[0])
        if shape is None or len(shape) != 4 or sorted(a % 4 for a in axes_of(g, n) or []) != [2, 3]:
            continue
        out, i = n.outputs[0], g.nodes.index(n)
        new = [Node(OPS[n.op], [n.inputs[0]], [out], {}, n.name, [n.name])]
        if not n.attrs.get("keepdims", 1):
            pooled = g.add_tensor(out + "/pooled", (shape[0], shape[1], 1, 1))
            new = [Node(OPS[n.op], [n.inputs[0]], [pooled], {}, n.name, [n.name]),
                   Node("Flatten", [pooled], [out], {"axis": 1}, n.name + "/flatten")]
        g.nodes[i:i + 1] = new
        log(n.name, f"{n.op} over H, W -> {OPS[n.op]}")
    return g
