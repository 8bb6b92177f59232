"""A frozen TensorFlow 1.x graph (`.pb` GraphDef with the weights as constants, what
`freeze_graph` and Maix_Toolbox wrote), through tf2onnx.from_graph_def. Its inputs are the
Placeholders, its outputs the nodes nothing else reads.

A graph that starts with a host front end (a wav or image decoder, a spectrogram, MFCCs: e.g.
ARM's ML-KWS-for-MCU models, `wav_data -> DecodeWav -> AudioSpectrogram -> Mfcc -> network`)
is converted from where that front end ends: the kmodel's input is the tensor the network reads
(there: the 49x10 MFCCs), which the board computes on its CPU, as the MCU deployments do; after
an image decoder, the resized image (TF for Poets' retrained graphs: DecodeJpeg -> Cast ->
ExpandDims -> ResizeBilinear), whose values are the pixels 0..255. The receipt says where it
was cut.

Weights stored 8-bit by TF's graph_transforms `quantize_weights` (a quint8 Const, its min and max,
and a Dequantize: OpenCV's res10 SSD face detector, opencv_face_detector_uint8.pb), which
tf2onnx cannot type, are folded into the float constants TensorFlow's own Dequantize computes
(`_dequantized_weights`)."""
import re

from . import INPUT_NOTE, INPUT_RANGE, ModelLoadError, check_against_source, tf_convert
from .tf_guard import refuse_side_effects

_NOT_OUTPUTS = {"Const", "Placeholder", "NoOp", "Assert", "SaveV2", "RestoreV2"}
#: ops that turn a file's bytes into the network's input: the host's work, not the network's
IMAGE_DECODERS = {"DecodeJpeg", "DecodePng", "DecodeBmp", "DecodeGif", "DecodeImage", "DecodeAndCropJpeg"}
HOST_FRONT_END = {"DecodeWav", "AudioSpectrogram", "Mfcc", "DecodeRaw", "DecodeBase64"} | IMAGE_DECODERS


def _front_end(gd):
    """(the nodes of a host front end fed by the Placeholders, the tensors the network reads from it).
    The front end: the decoders, and what is fed only by them and reads a tensor of no fixed
    shape (a decoded JPEG's Cast, ExpandDims and resize to the network's size)."""
    by_name = {n.name: n for n in gd.node}
    host = {n.name for n in gd.node if n.op == "Placeholder"}

    def fed_by_host(n):
        ins = [i.split(":")[0].lstrip("^") for i in n.input]
        return ins and all(i in host or by_name[i].op == "Const" for i in ins if i in by_name)
    _grow(gd, host, lambda n: n.op in HOST_FRONT_END and fed_by_host(n))
    if not any(by_name[h].op in HOST_FRONT_END for h in host):
        return set(), []
    static = _static_shapes(gd)
    _grow(gd, host, lambda n: n.op != "Const" and fed_by_host(n) and not all(
        static.get(i if ":" in i else i + ":0", False) for i in n.input if not i.startswith("^")
        and by_name[i.split(":")[0]].op != "Const"))
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


def _grow(gd, host, joins):
    grew = True
    while grew:
        grew = False
        for n in gd.node:
            if n.name not in host and joins(n):
                host.add(n.name)
                grew = True


def _static_shapes(gd):
    """{tensor name: whether TensorFlow's shape inference knows its whole shape}."""
    import tensorflow as tf
    with tf.Graph().as_default() as g:
        tf.import_graph_def(gd, name="")
    return {t.name: t.shape.is_fully_defined() for op in g.get_operations() for t in op.outputs}


def _shape_placeholders(gd, nchw, pinned=()):
    """Give the Placeholders whose shape TensorFlow does not know (or records as a scalar) `nchw`
    (--input-shape), as the NHWC a TF graph reads for 4 dims: tf2onnx fails on such an input's
    first conv (Saafke's FSRCNN, fannymonori's ESPCN: 'Shape must be rank 4 but is rank 0'). Not
    the `pinned` ones (--input-value: a dropout's keep_prob, a scalar)."""
    import tensorflow as tf
    want = (nchw[0], *nchw[2:], nchw[1]) if len(nchw) == 4 else tuple(nchw)
    for n in gd.node:
        if n.op != "Placeholder" or n.name in pinned:
            continue
        shape = tf.TensorShape(n.attr["shape"].shape)
        if shape.rank and shape.rank != len(want):       # (hey_snips' [?, 40] frames given 1,80,40)
            dims = ",".join("?" if d is None else str(d) for d in shape.as_list())
            raise ModelLoadError(
                f"--input-shape {','.join(map(str, nchw))} has {len(nchw)} dims; the Placeholder {n.name!r} has "
                f"{shape.rank} ([{dims}]): give {shape.rank}, e.g. --input-shape "
                f"{','.join(map(str, nchw[-shape.rank:]))} (a first dim above 1 is no batch: the kmodel gets one)")
        if _shapeless(n) or shape.rank != len(want):
            n.attr["shape"].shape.CopyFrom(tf.TensorShape(want).as_proto())


def _pinned(gd, input_values) -> dict:
    """{ONNX input name: values} of the Placeholders --input-value names (as `name` or `name:0`);
    a shapeless one given one value becomes a scalar (a dropout's keep_prob)."""
    import tensorflow as tf
    out = {}
    for n in gd.node:
        key = next((k for k in (n.name, n.name + ":0") if k in (input_values or {})), None)
        if n.op != "Placeholder" or key is None:
            continue
        out[n.name + ":0"] = input_values[key]
        if not tf.TensorShape(n.attr["shape"].shape).is_fully_defined() and len(input_values[key]) == 1:
            n.attr["shape"].shape.CopyFrom(tf.TensorShape([]).as_proto())
    return out


def _shapeless(n) -> bool:
    """Does Placeholder `n` record no whole shape (unknown dims, or a scalar's)?"""
    import tensorflow as tf
    shape = tf.TensorShape(n.attr["shape"].shape)
    return not shape.is_fully_defined() or shape.rank == 0


MATMULS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")


def _shape_hint(gd, placeholder: str) -> str:
    """The --input-shape hint for `placeholder`: the channels the first conv reading it takes (its
    frozen filter's third dim, through Identity nodes), or the inputs of a first MatMul (a dense
    model: '1,784'); "C" where neither tells."""
    nodes = {n.name: n for n in gd.node}
    for n in gd.node:
        if n.op in ("Conv2D", "DepthwiseConv2dNative") + MATMULS and n.input and \
                n.input[0].split(":")[0] == placeholder:
            f = nodes.get(n.input[1].split(":")[0])
            while f is not None and f.op == "Identity" and f.input:
                f = nodes.get(f.input[0].split(":")[0])
            dims = [d.size for d in f.attr["value"].tensor.tensor_shape.dim] if f is not None and f.op == "Const" else []
            ta, tb = (n.attr[k].b for k in (("transpose_a", "transpose_b") if n.op == "MatMul" else ("adj_x", "adj_y")))
            if n.op in MATMULS and len(dims) == 2 and not ta:
                return f"1,{dims[1] if tb else dims[0]} (a dense model's input)"
            if len(dims) == 4:
                return (f"1,{dims[2]},H,W (N,C,H,W whatever the graph's layout; e.g. 1,{dims[2]},240,320 for a "
                        "320x240 input)")
    return "1,C,H,W (N,C,H,W whatever the graph's layout; e.g. 1,C,240,320 for a 320x240 input)"


# ops of a whole detection pipeline around the networks: what each is, for the refusal
#: a while loop's ops: TF1 control flow's, and the functional While of TF2's graphs
LOOP_OPS = ("Enter", "LoopCond", "NextIteration", "While", "StatelessWhile")
PIPELINE_OPS = {
    ("Enter", "Exit", "LoopCond", "NextIteration"): "a TF1 while loop",
    ("NonMaxSuppression", "NonMaxSuppressionV2", "NonMaxSuppressionV3", "NonMaxSuppressionV4",
     "NonMaxSuppressionV5", "CombinedNonMaxSuppression"): "non-maximum suppression",
    ("CropAndResize",): "crop-and-resize of boxes",
    ("TensorArrayV3", "TensorArrayWriteV3", "TensorArrayReadV3", "TensorArrayGatherV3"): "TensorArrays",
}


def refuse_pipeline(gd, path):
    """A frozen graph that runs a whole detection pipeline (MTCNN's: image pyramid loops, three
    networks, NMS between them, crops, four Placeholders) is refused by what makes it one, before
    tf2onnx fails on it with an error that names none of it. Suppression or crops mark one; a
    while loop alone is a recurrent layer's (TF1 dynamic_rnn), left to its own refusal."""
    found, post = [], False
    for ops, what in PIPELINE_OPS.items():
        names = [n.name for n in gd.node if n.op in ops]
        if names:
            found.append(f"{what} ({len(names)} nodes, e.g. {names[0]!r})")
            post |= what in ("non-maximum suppression", "crop-and-resize of boxes")
    if not post:        # a loop alone: a recurrent layer's, refused by name after tf2onnx (Scan, Loop)
        return
    inputs = [n.name for n in gd.node if n.op == "Placeholder"]
    if len(inputs) > 1:
        found.append(f"{len(inputs)} inputs ({', '.join(map(repr, inputs))})")
    raise ModelLoadError(f"{path}: a whole pipeline, not one network: {'; '.join(found)}. A K210 runs a fixed "
                         "sequence of layers on one input: export each network in it on its own (e.g. MTCNN's "
                         "P-Net, R-Net and O-Net as three models) and run the loops, crops and suppression in "
                         "the application")


def _dequantized_weights(gd) -> int:
    """Each Dequantize whose inputs are all Consts (quantize_weights' quint8 weights, their min
    and max) becomes a float Const of the values TensorFlow computes for it, in place; the quantized
    Consts then read by nothing go. Returns how many."""
    import numpy as np
    import tensorflow as tf
    consts = {n.name for n in gd.node if n.op == "Const"}
    deq = [n for n in gd.node if n.op == "Dequantize" and n.input
           and all(i.split(":")[0].lstrip("^") in consts for i in n.input)]
    if not deq:
        return 0
    keep = tf.compat.v1.GraphDef()
    keep.node.extend(n for n in gd.node if n.op == "Const" or n in deq)
    with tf.Graph().as_default() as g:
        tf.import_graph_def(keep, name="")
        with tf.compat.v1.Session(graph=g) as sess:
            values = sess.run([n.name + ":0" for n in deq])
    byname = {n.name: n for n in gd.node}
    for n, v in zip(deq, values):
        if not np.isfinite(v).all() and n.attr["T"].type == tf.quint8.as_datatype_enum:
            # a range of FLT_MIN (a constant tensor: res10's data_bn/beta, all 0) underflows TF's
            # float32 step to NaN; the formula min + q (max - min) / 255 in float64 gives it
            q, lo, hi = (tf.make_ndarray(byname[i.split(":")[0]].attr["value"].tensor) for i in n.input[:3])
            v = np.where(np.isfinite(v), v, float(lo) + q.astype(np.float64) * ((float(hi) - float(lo)) / 255))
        n.op = "Const"
        del n.input[:]
        n.attr.clear()
        n.attr["dtype"].type = tf.float32.as_datatype_enum
        n.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(v.astype("float32")))
    read = {i.split(":")[0].lstrip("^") for n in gd.node for i in n.input}
    f32 = tf.float32.as_datatype_enum
    for n in [n for n in gd.node if n.op == "Const" and n.name not in read and n.attr["dtype"].type != f32]:
        gd.node.remove(n)
    return len(deq)


def _run_graph(gd, feed, fetches):
    """{fetch: value} of GraphDef `gd` run by TensorFlow on `feed` ({tensor name: array})."""
    import tensorflow as tf
    with tf.Graph().as_default() as g:
        tf.import_graph_def(gd, name="")
        with tf.compat.v1.Session(graph=g) as sess:
            return dict(zip(fetches, sess.run(fetches, feed)))


def from_frozen_pb(path, opset=None, batch=1, input_shape=None, input_values=None, outputs=None):
    """input_shape (NCHW, --input-shape): for a Placeholder without a whole shape; input_values
    ({name: values}, --input-value): the Placeholders the kmodel is not fed; outputs (--outputs):
    where each names a tensor of the graph (`name` or `name:0`), the graph's outputs, so that
    tf2onnx keeps them (it fuses a MatMul and its Add into a Gemm named otherwise: uTensor's MNIST
    MLP's `OuputLayer/logits:0` had been refused as no tensor of the file)."""
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
    refuse_pipeline(gd, path)
    _dequantized_weights(gd)
    pins = _pinned(gd, input_values)
    read = {i.split(":")[0].lstrip("^") for n in gd.node for i in n.input}
    host, cut = _front_end(gd)
    fed = [n.name for n in gd.node if n.op == "Placeholder" and n.name in read and n.name + ":0" not in pins]
    if len(fed) > 1 and not cut:
        raise ModelLoadError(f"{path}: the graph has {len(fed)} Placeholder inputs ({', '.join(map(repr, fed))}); "
                             "a kmodel is fed one: pin the others to constants with --input-value NAME=VALUE "
                             "(a dropout's keep_prob: 1, an is_training flag: 0)")
    if input_shape:
        _shape_placeholders(gd, tuple(input_shape), {k[:-2] for k in pins})
    inputs = cut or [n.name + ":0" for n in gd.node if n.op == "Placeholder"]
    names = {n.name for n in gd.node}
    ends = [e[:-2] if e.endswith(":0") else e for e in outputs or ()]
    outputs = ends if ends and set(ends) <= names else \
        [n.name for n in gd.node if n.name not in read and n.op not in _NOT_OUTPUTS | HOST_FRONT_END]
    if not inputs or not outputs:
        raise ModelLoadError(f"{path}: found {len(inputs)} Placeholder input(s) and {len(outputs)} output node(s); "
                             "a frozen graph needs both (freeze it with its inputs as Placeholders)")
    kw = {"opset": opset} if opset else {}
    try:
        model = tf_convert(str(path), tf2onnx.convert.from_graph_def, gd, input_names=inputs,
                           output_names=[o + ":0" for o in outputs], **kw)
    except ModelLoadError as e:
        loop = next((n for n in gd.node if n.op in LOOP_OPS), None)
        if loop is not None:      # Mycroft Precise's Keras GRU: tf2onnx wrote an invalid graph (hunt 19)
            raise ModelLoadError(
                f"{path}: node {loop.name!r} is part of a TensorFlow while loop, a recurrent layer's (a Keras GRU "
                "or LSTM, dynamic_rnn), which tf2onnx could not convert; the K210 runs a fixed sequence of layers, "
                "no loops: use a model whose recurrent layers are convolutions over time (a TCN, a 1-D CNN) "
                "and export it again") from None
        ranks = re.search(r"Shape must be rank (\d+) but is rank (\d+)", str(e))
        extra = int(ranks.group(2)) - int(ranks.group(1)) if ranks else 0
        if input_shape and 0 < extra < len(input_shape):     # the graph adds the axes itself (ExpandDims)
            raise ModelLoadError(f"{e}: the graph reads the input with {extra} dim(s) fewer than --input-shape "
                                 f"{','.join(map(str, input_shape))} gives; try --input-shape "
                                 f"{','.join(map(str, input_shape[extra:]))} (a first dim above 1 is no batch: "
                                 "the kmodel gets one)") from None
        shapeless = [n.name for n in gd.node if n.op == "Placeholder" and not input_shape and _shapeless(n)
                     and n.name + ":0" not in pins]
        if not shapeless:
            raise
        why = str(e).split(": tf2onnx could not convert it: ", 1)[-1].split(" for '", 1)[0]
        raise ModelLoadError(f"{path}: the input Placeholder {shapeless[0]!r} has no shape in the graph, so "
                             f"tf2onnx cannot convert it ({why}): give it with --input-shape "
                             f"{_shape_hint(gd, shapeless[0])}") from e
    check_against_source(str(path), model, lambda feed: _run_graph(gd, feed, [o + ":0" for o in outputs]),
                         "TensorFlow", "convert the model to .tflite or ONNX", pins)
    if cut:
        chain = " -> ".join(n.op for n in gd.node if n.name in host and n.op != "Placeholder")
        image = any(n.op in IMAGE_DECODERS for n in gd.node if n.name in host)
        note = (f"the graph's host front end ({chain}) is not converted: the kmodel's input is "
                f"{', '.join(repr(c) for c in cut)}, the tensor the network reads; "
                + ("the camera's image at that size (calibrate with photos, --dataset FOLDER)" if image else
                   "compute it on the board's CPU and calibrate with such tensors (--dataset ARRAY.npy)"))
        model.metadata_props.add(key=INPUT_NOTE, value=note)
        if image:
            model.metadata_props.add(key=INPUT_RANGE, value="0,255")   # the decoder's uint8 pixels
    return model
