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
    made = {o: n for n in g.node for o in n.output if o}
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
    keep, reads, stack = set(), set(), [o.name for o in g.output]
    while stack:
        t = stack.pop()
        reads.add(t)
        n = made.get(t) if t != name else None
        if n is not None and id(n) not in keep:
            keep.add(id(n))
            stack.extend(i for i in n.input if i)
    if name not in reads:
        raise ModelLoadError(f"{where}: --inputs {name!r}: no output of the model depends on it; name a tensor "
                             f"on the way from the input to the outputs ({', '.join(o.name for o in g.output)})")
    shapes = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model, strict_mode=False).graph.value_info}
    vi = shapes.get(name) or onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
    old = [i for i in g.input if i.name != name and (i.name in reads or i.name in consts)]
    nodes = [n for n in g.node if id(n) in keep]
    del g.node[:]
    g.node.extend(nodes)
    del g.input[:]
    g.input.extend([vi] + old)
    return model
