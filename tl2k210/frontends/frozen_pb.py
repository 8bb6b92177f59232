"""A frozen TensorFlow 1.x graph (`.pb` GraphDef with the weights as constants, what
`freeze_graph` and Maix_Toolbox wrote), through tf2onnx.from_graph_def. Its inputs are the
Placeholders, its outputs the nodes nothing else reads."""
from . import ModelLoadError, tf_convert
from .tf_guard import refuse_side_effects

_NOT_OUTPUTS = {"Const", "Placeholder", "NoOp", "Assert", "SaveV2", "RestoreV2"}


def from_frozen_pb(path, opset=None, batch=1):
    import tensorflow as tf
    import tf2onnx
    gd = tf.compat.v1.GraphDef()
    try:
        gd.ParseFromString(open(path, "rb").read())
    except Exception as e:
        raise ModelLoadError(f"{path}: not a TensorFlow GraphDef ({type(e).__name__}); a SavedModel's "
                             "saved_model.pb is read from its folder: pass the folder") from e
    if not gd.node:
        raise ModelLoadError(f"{path}: the GraphDef has no nodes")
    refuse_side_effects([gd], path)
    read = {i.split(":")[0].lstrip("^") for n in gd.node for i in n.input}
    inputs = [n.name for n in gd.node if n.op == "Placeholder"]
    outputs = [n.name for n in gd.node if n.name not in read and n.op not in _NOT_OUTPUTS]
    if not inputs or not outputs:
        raise ModelLoadError(f"{path}: found {len(inputs)} Placeholder input(s) and {len(outputs)} output node(s); "
                             "a frozen graph needs both (freeze it with its inputs as Placeholders)")
    kw = {"opset": opset} if opset else {}
    return tf_convert(str(path), tf2onnx.convert.from_graph_def, gd, input_names=[i + ":0" for i in inputs],
                      output_names=[o + ":0" for o in outputs], **kw)
