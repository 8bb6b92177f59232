"""A frozen TensorFlow 1.x graph (`.pb` GraphDef with the weights as constants, what
`freeze_graph` and Maix_Toolbox wrote), through tf2onnx.from_graph_def. Its inputs are the
Placeholders, its outputs the nodes nothing else reads.

A graph that starts with a host front end (a wav or image decoder, a spectrogram, MFCCs: e.g.
ARM's ML-KWS-for-MCU models, `wav_data -> DecodeWav -> AudioSpectrogram -> Mfcc -> network`)
is converted from where that front end ends: the kmodel's input is the tensor the network reads
(there: the 49x10 MFCCs), which the board computes on its CPU, as the MCU deployments do. The
receipt says where it was cut."""
from . import INPUT_NOTE, ModelLoadError, tf_convert
from .tf_guard import refuse_side_effects

_NOT_OUTPUTS = {"Const", "Placeholder", "NoOp", "Assert", "SaveV2", "RestoreV2"}
#: ops that turn a file's bytes into the network's input: the host's work, not the network's
HOST_FRONT_END = {"DecodeWav", "AudioSpectrogram", "Mfcc", "DecodeJpeg", "DecodePng", "DecodeBmp",
                  "DecodeGif", "DecodeImage", "DecodeAndCropJpeg", "DecodeRaw", "DecodeBase64"}


def _front_end(gd):
    """(the nodes of a host front end fed by the Placeholders, the tensors the network reads from it)."""
    by_name = {n.name: n for n in gd.node}
    host = {n.name for n in gd.node if n.op == "Placeholder"}
    grew = True
    while grew:       # a front-end op, or anything fed only by the front end that is not the network
        grew = False
        for n in gd.node:
            ins = [i.split(":")[0].lstrip("^") for i in n.input]
            if n.name not in host and n.op in HOST_FRONT_END and all(i in host or by_name[i].op == "Const"
                                                                      for i in ins if i in by_name):
                host.add(n.name)
                grew = True
    if not any(by_name[h].op in HOST_FRONT_END for h in host):
        return set(), []
    cut = []
    for n in gd.node:
        if n.name in host:
            continue
        for i in n.input:
            src = i.lstrip("^").split(":")[0]
            t = i if ":" in i else i + ":0"
            if src in host and not i.startswith("^") and t not in cut:
                cut.append(t)
    return host, cut


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
    host, cut = _front_end(gd)
    inputs = cut or [n.name + ":0" for n in gd.node if n.op == "Placeholder"]
    outputs = [n.name for n in gd.node if n.name not in read and n.op not in _NOT_OUTPUTS | HOST_FRONT_END]
    if not inputs or not outputs:
        raise ModelLoadError(f"{path}: found {len(inputs)} Placeholder input(s) and {len(outputs)} output node(s); "
                             "a frozen graph needs both (freeze it with its inputs as Placeholders)")
    kw = {"opset": opset} if opset else {}
    model = tf_convert(str(path), tf2onnx.convert.from_graph_def, gd, input_names=inputs,
                       output_names=[o + ":0" for o in outputs], **kw)
    if cut:
        chain = " -> ".join(n.op for n in gd.node if n.name in host and n.op != "Placeholder")
        note = (f"the graph's host front end ({chain}) is not converted: the kmodel's input is "
                f"{', '.join(repr(c) for c in cut)}, the tensor the network reads; compute it on the board's CPU "
                "and calibrate with such tensors (--dataset ARRAY.npy)")
        model.metadata_props.add(key=INPUT_NOTE, value=note)
    return model
