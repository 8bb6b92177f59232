"""ONNX's variadic Sum/Mean/Max/Min (Caffe2 exports, e.g. the model zoo's ResNet and ShuffleNet
residual `Sum`) -> chains of the binary Add/Max/Min the rest of the pipeline knows; Mean also
scales by 1/n. One input: the node is dropped. Exact up to float rounding."""
import numpy as np

from tl2k210.graph import Node

BINARY = {"Sum": "Add", "Mean": "Add", "Max": "Max", "Min": "Min"}


def nary_ops(g, log):
    for n in [n for n in g.nodes if n.op in BINARY]:
        ins = [i for i in n.inputs if i]
        if n.op in ("Max", "Min") and len(ins) == 2:
            continue   # already the binary form
        out, i = n.outputs[0], g.nodes.index(n)
        new, acc = [], ins[0]
        for k, x in enumerate(ins[1:]):
            last = k == len(ins) - 2 and n.op != "Mean"
            y = out if last else g.add_tensor(f"{out}/{BINARY[n.op].lower()}{k}")
            new.append(Node(BINARY[n.op], [acc, x], [y], {}, f"{n.name}/{k}" if not last else n.name, [n.name]))
            acc = y
        if n.op == "Mean" and len(ins) > 1:
            scale = g.add_const(np.array(1.0 / len(ins), np.float32), n.name + "/inv_n")
            new.append(Node("Mul", [acc, scale], [out], {}, n.name, [n.name]))
        if len(ins) == 1:
            g.nodes.remove(n)
            g.replace_uses(out, ins[0])
            log(n.name, f"{n.op} of one input removed")
            continue
        g.nodes[i:i + 1] = new
        log(n.name, f"{n.op} of {len(ins)} inputs -> {' + '.join(m.op for m in new)}")
    return g
