"""--inputs: the model starts at one of its tensors; what computes that tensor (a spectrogram or
MFCC front end, an image decoder, a normalization the application does) is left out, and the
kmodel is fed what the tensor holds.

    model = start_at(model, "mfcc:0", where)

On an onnx.ModelProto, before the IR reads it (so a custom-domain op before the cut never
reaches it); a `.tflite` file is cut on its flatbuffer first (tflite.cut_ops), before TensorFlow
Lite's reader meets an FFT or a custom op there. A TF tensor may be named without its ':0'."""
from __future__ import annotations

from tl2k210.errors import ModelLoadError, UnknownOutputError, nearest


def start_at(model, name: str, where: str):
    """A copy of `model` (an onnx.ModelProto) that starts at tensor `name`: its inputs are `name`
    and those of its old inputs the nodes left still read (a kmodel has one: the IR refuses more,
    naming them)."""
    import onnx
    model, source = onnx.ModelProto(), model
    model.CopyFrom(source)
    g = model.graph
    made = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    consts = {i.name for i in g.initializer} | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    inputs = [i.name for i in g.input if i.name not in consts]
    if len(inputs) == 1 and inputs[0] in (name, name + ":0"):
        return model                              # it starts there already (a .tflite cut on its file)
    if name not in made and name + ":0" in made:
        name += ":0"
    if name in consts:
        raise ModelLoadError(f"{where}: --inputs {name!r} is a constant of the model (weights); name a tensor "
                             "its layers compute, the one the network that is to run reads")
    if name not in made and name not in inputs:
        raise UnknownOutputError(f"{where}: --inputs {name!r}: the model has no such tensor"
                                 f"{nearest(name, list(made) + inputs)} (its inputs: {', '.join(map(repr, inputs))}); "
                                 "give a tensor name as the model file has it (netron shows them)")
    keep, reads = needed(made, lambda k: [i for i in g.node[k].input if i], [o.name for o in g.output], name)
    if name not in reads:
        raise ModelLoadError(f"{where}: --inputs {name!r}: no output of the model depends on it; name a tensor "
                             f"on the way from the input to the outputs ({', '.join(o.name for o in g.output)})")
    old = [i for i in g.input if i.name != name and (i.name in reads or i.name in consts)]
    new = _value_infos(model, [name])           # while its producer is there to say
    _keep_nodes(g, keep)
    kept = [vi for vi in g.value_info if vi.name != name]
    del g.value_info[:]
    g.value_info.extend(kept)
    del g.input[:]
    g.input.extend(new + old)
    return model


def end_at(model, names):
    """A copy of `model` that ends at the tensors `names` (--outputs), before the IR reads it (an
    SSD's box decoding by constant anchors, which no other input size meets, never reaches its
    shape checks); `model` itself where a name is not a tensor its nodes compute (a Keras layer
    name; compiler.cut_outputs names the nearest ones)."""
    import onnx
    made = {o for n in model.graph.node for o in n.output if o}
    names = [x + ":0" if x not in made and x + ":0" in made else x for x in names or ()]
    if not names or any(x not in made for x in names) or [o.name for o in model.graph.output] == names:
        return model
    model, source = onnx.ModelProto(), model
    model.CopyFrom(source)
    g = model.graph
    vis = _value_infos(model, names)
    made = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    _keep_nodes(g, needed(made, lambda k: [i for i in g.node[k].input if i], names)[0])
    del g.output[:]
    g.output.extend(vis)
    return model


def needed(made, reads_of, outputs, stop=None):
    """(the indices of the nodes `outputs` need, stopping at tensor `stop`; the tensors they
    read), for an ONNX graph and a TFLite subgraph alike. `made`: {tensor: the index of the node
    that writes it}; `reads_of(k)`: the tensors node k reads."""
    keep, reads, stack = set(), set(), list(outputs)
    while stack:
        t = stack.pop()
        reads.add(t)
        k = made.get(t) if t != stop else None
        if k is not None and k not in keep:
            keep.add(k)
            stack.extend(reads_of(k))
    return keep, reads


def _keep_nodes(g, keep):
    nodes = [n for k, n in enumerate(g.node) if k in keep]
    del g.node[:]
    g.node.extend(nodes)


def _value_infos(model, names):
    """Each tensor's inferred type and shape (float, shapeless where inference cannot say)."""
    import onnx
    known = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model, strict_mode=False).graph.value_info}
    known.update({vi.name: vi for vi in model.graph.output})
    return [known.get(x) or onnx.helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None) for x in names]
