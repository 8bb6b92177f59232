"""A .tflite flatbuffer, through tf2onnx.from_tflite.

Production TFLite files store weights in forms tf2onnx does not all read:
  * float16 weights (DEQUANTIZE fp16 -> fp32): tf2onnx folds them;
  * int8 weights (dynamic-range and full-integer quantization): arrive as DequantizeLinear of
    constants (folded by passes.fold_constants) and QuantizeLinear/DequantizeLinear pairs on
    activations (removed by passes.dequantize);
  * sparse weights (DENSIFY of a sparse constant): tf2onnx reads the sparse buffer as if it were
    dense and fails, so they are densified here first -- by the TFLite interpreter itself, which
    computes each DENSIFY output -- and written to a temporary dense copy of the file;
  * quantization parameters with empty min/max vectors, which tf2onnx cannot copy into node
    attributes: dropped in the same copy (`drop_empty_quantization`).
  * a FULLY_CONNECTED with a bias on a map of rank > 2 (TF1-era files), whose bias tf2onnx's
    flattening drops: a RESHAPE to 2-D before it, in the same copy (`flatten_fc_inputs`).

Custom ops (CUSTOM opcodes: a vendor's kernels the TFLite runtime links in) have no ONNX form:
  * MediaPipe's Convolution2DTransposeBias (input, OHWI weights, bias; its options the C struct
    TfLiteTransposeConvParams {padding, stride_w, stride_h}) is written as the builtin
    TRANSPOSE_CONV followed by an ADD of the bias, in the same temporary copy;
  * MediaPipe's MaxPoolingWithArgmax2D / MaxUnpooling2D (options: the C struct TfLitePoolParams)
    have no builtin form: their options are rewritten as the FlexBuffer map tf2onnx reads, in the
    same copy, tf2onnx keeps them as custom-domain nodes and `mediapipe_ops` makes them ONNX
    MaxPool (with Indices) and MaxUnpool, exactly;
  * any other is refused by name before tf2onnx runs, with its vendor set, what it computes,
    and its inputs and outputs. TF ops (Flex*) pass. The SSD post-processing op
    (TFLite_Detection_PostProcess) is refused too: tf2onnx maps it, but to NonMaxSuppression and
    loops that no K210 runtime has, which the lowering then refused under those names.

A builtin op tf2onnx has no conversion for: GELU (Keras' gelu activation) is kept by tf2onnx as
a custom-domain node and `tflite_ops` writes the ONNX ops it computes; any other (the recurrent
ones: UNIDIRECTIONAL_SEQUENCE_LSTM...) is only logged by it, which then fails on what the op left out or keeps it: refused by name first.
So is an FFT (RFFT2D and its complex parts: a spectrogram the model computes from raw samples),
which tf2onnx converts only in part and no K210 runtime has.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tl2k210 import quiet
from tl2k210.errors import UnknownOutputError, nearest

from . import (FILE_TENSORS, FLOAT_AGREE_DB, OPSET, ModelLoadError, mediapipe_ops, source_agreement, tf_convert,
               tflite_ops)
from .cut import needed


def _check_header(path):
    data = open(path, "rb").read(8)
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelLoadError(f"{path}: not a TFLite flatbuffer (missing 'TFL3' identifier at byte 4)")


# custom op -> (vendor set, what it computes)
CUSTOM_OPS = {
    "Convolution2DTransposeBias": ("MediaPipe", "a transposed convolution with bias (segmentation decoders)"),
    "Landmarks2TransformMatrix": ("MediaPipe", "the affine matrix that aligns a set of landmarks "
                                  "(face/hand pose) to a canonical one"),
    "TransformTensorBilinear": ("MediaPipe", "bilinear resampling of a tensor through an affine matrix"),
    "TransformLandmarks": ("MediaPipe", "an affine matrix applied to landmark coordinates"),
    "TFLite_Detection_PostProcess": ("TensorFlow Object Detection API", "an SSD's box decoding against its "
                                     "anchors, then non-maximum suppression; export the detector without it "
                                     "(export_tflite_ssd_graph.py --add_postprocessing_op=false) so the kmodel "
                                     "ends at the raw box encodings and class scores"),
    "ethos-u": ("Arm Vela", "a command stream for the Ethos-U NPU: Vela compiled the network's "
                "layers into NPU machine code, so they are no longer TFLite ops"),
    "edgetpu-custom-op": ("Google's Edge TPU compiler", "the Edge TPU's machine code: edgetpu_compiler "
                          "compiled the network's layers for the Coral accelerator, so they are no longer "
                          "TFLite ops"),
    "PosenetDecoderOp": ("Coral's PoseNet", "PoseNet's keypoint decoding from its heatmaps and offsets"),
}
#: TensorFlow Lite Micro's signal library: SignalWindow, SignalRfft, SignalFilterBank, ...
SIGNAL_OPS = ("TensorFlow Lite Micro's signal library", "a step of an audio front end (framing, window, "
              "FFT, filter bank) that computes features from raw samples")
#: custom op -> what to do instead of cutting the model before it
REMEDIES = {
    "ethos-u": "convert the .tflite that Vela read (the int8 model before `vela`), not Vela's output",
    "edgetpu-custom-op": "convert the .tflite that edgetpu_compiler read (the model without `_edgetpu` "
                         "in its name), not the compiler's output",
    "Signal": "compute the features in the application and convert the network that reads them "
              "(--inputs TENSOR: the model from the tensor that holds them, as netron shows it)",
}


def check_custom_ops(model, path):
    """Refuse the first custom op (see the module docstring); `model` from flatbuffer_utils."""
    for sg in model.subgraphs:
        for i, op in enumerate(sg.operators):
            code = model.operatorCodes[op.opcodeIndex]
            if max(code.builtinCode, code.deprecatedBuiltinCode) != 32 or not code.customCode:   # CUSTOM
                continue
            name = code.customCode.decode(errors="replace")
            if name.startswith("Flex") or name in mediapipe_ops.OPS:
                continue
            signal = name.startswith("Signal")
            vendor, what = CUSTOM_OPS.get(name, SIGNAL_OPS if signal else (None, None))
            raise ModelLoadError(
                f"{path}: operator {i} is the custom op {name!r}"
                + (f" of {vendor}'s custom op set ({what})" if vendor else " (no vendor set this converter knows)")
                + f"; {_tensors(sg, op)}. Refused: a custom op is "
                "code linked into the TFLite runtime, with no ONNX or K210 form; "
                + REMEDIES.get("Signal" if signal else name,
                               "convert with --outputs naming its inputs (above) and compute that step "
                               "in the application"))


def _tensors(sg, op):
    def names(ids):
        return ", ".join(f"{sg.tensors[t].name.decode(errors='replace')} "
                         f"{tuple(int(d) for d in sg.tensors[t].shape)}" for t in ids if t >= 0) or "none"
    return f"inputs: {names(op.inputs)}; outputs: {names(op.outputs)}"


# builtin ops tf2onnx has no conversion for, and what they compute (the K210 has no recurrent layer)
RECURRENT = {"UNIDIRECTIONAL_SEQUENCE_LSTM": "an LSTM layer over a sequence",
             "BIDIRECTIONAL_SEQUENCE_LSTM": "a bidirectional LSTM layer over a sequence",
             "LSTM": "one LSTM step", "UNIDIRECTIONAL_SEQUENCE_RNN": "a recurrent layer over a sequence",
             "BIDIRECTIONAL_SEQUENCE_RNN": "a bidirectional recurrent layer over a sequence",
             "RNN": "one recurrent step", "SVDF": "a singular value decomposition filter (a recurrent layer)"}


# builtin ops of an audio front end inside the model (Kapre's or tf.signal's STFT: raw samples in,
# a spectrogram out), which tf2onnx converts only in part and no K210 runtime computes
FFT_OPS = {"RFFT2D": "a real FFT", "COMPLEX_ABS": "the magnitude of an FFT's complex output",
           "REAL": "the real part of an FFT's complex output", "IMAG": "the imaginary part of an FFT's complex output"}


# ops of a model that keeps state between invocations (TFLite resource variables)
STATE_OPS = {"CALL_ONCE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"}


def _builtin_op(i, name):
    """'operator 3 is the builtin op SVDF (what it computes; the K210 has no recurrent layer)'."""
    what = f" ({RECURRENT[name]}; the K210 has no recurrent layer)" if name in RECURRENT else ""
    return f"operator {i} is the builtin op {name}{what}"


def check_builtin_ops(model, path):
    """Refuse the first builtin op tf2onnx has no conversion for (it would only log it and fail
    later, or leave it in the graph), by name; `model` from flatbuffer_utils."""
    import tf2onnx.convert  # noqa: F401  (registers the handlers)
    from tensorflow.lite.tools import flatbuffer_utils as fu
    from tf2onnx import handler
    known = set(handler.tfl_op.create_tfl_to_tf_mapping()) | set(handler.tf_op.create_mapping(OPSET, []))
    for sg in model.subgraphs:
        for i, op in enumerate(sg.operators):
            name = fu.opcode_to_name(model, op.opcodeIndex)
            if name in FFT_OPS:
                raise ModelLoadError(
                    f"{path}: operator {i} is the builtin op {name} ({FFT_OPS[name]}: the model computes its "
                    f"own spectrogram from raw samples, e.g. an STFT layer); {_tensors(sg, op)}. Refused: no "
                    "K210 runtime has an FFT op; compute the spectrogram in the application (MaixPy: Maix.FFT) "
                    "and convert the network that reads it: --inputs TENSOR starts the model at the "
                    "tensor that holds the spectrogram (as netron shows it)")
            if name in ("CUSTOM", "DENSIFY") or name in tflite_ops.OPS or f"TFL_{name}" in known:
                continue
            stateful = sorted(STATE_OPS & {fu.opcode_to_name(model, o.opcodeIndex) for s in model.subgraphs
                                           for o in s.operators})
            if stateful:       # CALL_ONCE is operator 0: nothing comes before it to cut at
                raise ModelLoadError(
                    f"{path}: a streaming model: it keeps state between calls in variables ({', '.join(stateful)}; "
                    f"{_builtin_op(i, name)}, {_tensors(sg, op)}). A kmodel holds no state from one run to the "
                    "next: convert the model's non-streaming form (the whole input window at once), or keep "
                    "the state in the application")
            raise ModelLoadError(
                f"{path}: {_builtin_op(i, name)}; {_tensors(sg, op)}. Refused: tf2onnx, "
                "the TFLite reader, has no conversion for it; export the model without it, or cut the model "
                "before it and compute that step in the application")


#: lists a .tflite file's ops with TFLite's interpreter, as JSON on the last line of stdout
_LIST_OPS = ("import json, os, sys; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'; import tensorflow as tf; "
             "print(json.dumps([d['op_name'] for d in tf.lite.Interpreter(model_path=sys.argv[1])._get_ops_details()]))")


def interpreter_ops(path, timeout=300) -> list | None:
    """The op names TFLite's interpreter lists for the file, or None where it cannot. In a child
    process: the interpreter trusts the flatbuffer (it does not verify it), and a truncated or
    corrupt file can crash it with a segmentation fault, which must not take `convert` down."""
    try:
        r = subprocess.run([sys.executable, "-c", _LIST_OPS, str(path)], capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _refuse_recurrent(path):
    """Where the flatbuffer reader fails (TFLite Micro's keyword_scrambled: its names stripped),
    the interpreter may still list the ops: refuse a recurrent one by name."""
    ops = interpreter_ops(path)
    for i, name in enumerate(ops or ()):
        if name in RECURRENT:
            raise ModelLoadError(f"{path}: {_builtin_op(i, name)}. Refused: export the model without it, or "
                                 "cut the model before it and compute that step in the application")


def _opcode(model, builtin):
    """Index of builtin operator `builtin` in the model's opcode table (added if missing)."""
    from tensorflow.lite.python import schema_py_generated as schema
    for i, c in enumerate(model.operatorCodes):
        if max(c.builtinCode, c.deprecatedBuiltinCode) == builtin and not c.customCode:
            return i
    c = schema.OperatorCodeT()
    c.builtinCode, c.deprecatedBuiltinCode, c.version = builtin, min(builtin, 127), 1
    model.operatorCodes.append(c)
    return len(model.operatorCodes) - 1


def map_transpose_conv_bias(model):
    """MediaPipe's Convolution2DTransposeBias -> TRANSPOSE_CONV + ADD, in place; returns how many."""
    import numpy as np
    from tensorflow.lite.python import schema_py_generated as schema
    B, n = schema.BuiltinOperator, 0
    for sg in model.subgraphs:
        for op in list(sg.operators):
            code = model.operatorCodes[op.opcodeIndex]
            if code.customCode != b"Convolution2DTransposeBias" or op.customOptions is None \
                    or len(op.inputs) != 3 or len(op.customOptions) < 12:
                continue
            padding, stride_w, stride_h = np.frombuffer(bytes(bytearray(op.customOptions))[:12], "<i4")
            x, w, bias = op.inputs
            out = sg.tensors[op.outputs[0]]
            shape_buf = schema.BufferT()
            shape_buf.data = np.frombuffer(np.asarray(out.shape, "<i4").tobytes(), np.uint8)
            model.buffers.append(shape_buf)
            shape_t, conv_t = schema.TensorT(), schema.TensorT()
            shape_t.name, shape_t.shape, shape_t.type = out.name + b"/output_shape", [4], schema.TensorType.INT32
            shape_t.buffer = len(model.buffers) - 1
            conv_t.name, conv_t.shape, conv_t.type = out.name + b"/no_bias", list(out.shape), out.type
            conv_t.buffer = 0
            sg.tensors += [shape_t, conv_t]
            opts = schema.TransposeConvOptionsT()
            opts.padding = schema.Padding.SAME if padding == 1 else schema.Padding.VALID
            opts.strideW, opts.strideH = int(stride_w), int(stride_h)
            op.opcodeIndex, op.inputs = _opcode(model, B.TRANSPOSE_CONV), [len(sg.tensors) - 2, w, x]
            out_id, op.outputs = op.outputs[0], [len(sg.tensors) - 1]
            op.builtinOptionsType, op.builtinOptions = schema.BuiltinOptions.TransposeConvOptions, opts
            op.customOptions = None
            add = schema.OperatorT()
            add.opcodeIndex, add.inputs, add.outputs = _opcode(model, B.ADD), [len(sg.tensors) - 1, bias], [out_id]
            add.builtinOptionsType, add.builtinOptions = schema.BuiltinOptions.AddOptions, schema.AddOptionsT()
            sg.operators.insert(sg.operators.index(op) + 1, add)
            n += 1
    return n


def flatten_fc_inputs(model) -> int:
    """A FULLY_CONNECTED with a bias reading a map of rank > 2 (keep_num_dims off: TFLite flattens
    it to (-1, K); TF1-era MTCNN's R-Net and O-Net) gets a RESHAPE to (-1, K) before it, in place:
    tf2onnx's own reshape for that case drops the bias input (TflFullyConnectedOp), a model that
    its float reference and the kmodel both agreed with and the file did not (13.9 dB against
    the interpreter, the face decision flipped). Returns how many."""
    import numpy as np
    from tensorflow.lite.python import schema_py_generated as schema
    B, n = schema.BuiltinOperator, 0
    for sg in model.subgraphs:
        for op in list(sg.operators):
            if max(model.operatorCodes[op.opcodeIndex].builtinCode,
                   model.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode) != B.FULLY_CONNECTED \
                    or op.inputs is None or len(op.inputs) < 3 or op.inputs[2] < 0:
                continue
            x, w = sg.tensors[op.inputs[0]], sg.tensors[op.inputs[1]]
            opts = op.builtinOptions
            if getattr(opts, "keepNumDims", False) or x.shape is None or len(x.shape) <= 2 \
                    or w.shape is None or len(w.shape) != 2:
                continue
            k = int(w.shape[1])
            shape_buf = schema.BufferT()
            shape_buf.data = np.frombuffer(np.asarray([-1, k], "<i4").tobytes(), np.uint8)
            model.buffers.append(shape_buf)
            shape_t, flat_t = schema.TensorT(), schema.TensorT()
            shape_t.name, shape_t.shape, shape_t.type = x.name + b"/fc_shape", [2], schema.TensorType.INT32
            shape_t.buffer = len(model.buffers) - 1
            flat_t.name, flat_t.shape, flat_t.type = x.name + b"/fc_flat", [int(np.prod(x.shape)) // k, k], x.type
            flat_t.buffer, flat_t.quantization = 0, x.quantization
            sg.tensors += [shape_t, flat_t]
            reshape = schema.OperatorT()
            reshape.opcodeIndex = _opcode(model, B.RESHAPE)
            reshape.inputs, reshape.outputs = [op.inputs[0], len(sg.tensors) - 2], [len(sg.tensors) - 1]
            ro = schema.ReshapeOptionsT()
            ro.newShape = [-1, k]
            reshape.builtinOptionsType, reshape.builtinOptions = schema.BuiltinOptions.ReshapeOptions, ro
            op.inputs = [len(sg.tensors) - 1] + list(op.inputs[1:])
            sg.operators.insert(sg.operators.index(op), reshape)
            n += 1
    return n


def map_pool_params(model, path):
    """The raw TfLitePoolParams of MediaPipe's pooling ops (mediapipe_ops.OPS) as FlexBuffer maps
    (what tf2onnx reads into node attributes), in place; returns how many."""
    import numpy as np
    from flatbuffers import flexbuffers
    n = 0
    for sg in model.subgraphs:
        for i, op in enumerate(sg.operators):
            name = (model.operatorCodes[op.opcodeIndex].customCode or b"").decode(errors="replace")
            if name not in mediapipe_ops.OPS:
                continue
            raw = bytes(bytearray(op.customOptions if op.customOptions is not None else []))
            size = 4 * len(mediapipe_ops.PARAMS)
            if len(raw) < size:
                raise ModelLoadError(f"{path}: operator {i} is MediaPipe's {name} with {len(raw)} bytes of "
                                     f"options; its TfLitePoolParams {mediapipe_ops.PARAMS} take {size}: the file "
                                     "is not as MediaPipe writes it")
            params = dict(zip(mediapipe_ops.PARAMS, (int(v) for v in np.frombuffer(raw[:size], "<i4"))))
            op.customOptions = list(flexbuffers.Dumps(params))
            n += 1
    return n


def drop_empty_quantization(model) -> int:
    """Quantization parameters with empty vectors (present, no values: what some writers other
    than TensorFlow's converter leave, e.g. OpenMV's int8 MediaPipe palm and hand models) without
    them, in place: tf2onnx copies a present vector into a node attribute, and ONNX cannot type an
    empty one ("Could not infer attribute `max` type from empty iterator"). An empty min or max
    (the ranges the quantizer saw) goes; an empty scale or zero point means the tensor is not
    quantized (as TFLite's interpreter reads it), so its parameters go. Returns how many tensors
    changed."""
    n = 0
    for sg in model.subgraphs:
        for t in sg.tensors:
            q = t.quantization
            if q is None:
                continue
            empty = [k for k in ("min", "max", "scale", "zeroPoint") if getattr(q, k) is not None and len(getattr(q, k)) == 0]
            for k in empty:
                setattr(q, k, None)
            if q.scale is None or q.zeroPoint is None:
                q.scale = q.zeroPoint = None
            n += bool(empty)
    return n


#: schema.fbs: an operator code over this keeps it in `builtin_code` alone
PLACEHOLDER_FOR_GREATER_OP_CODES = 127


def normalize_opcodes(model) -> int:
    """Each operator code's op in both of its fields, in place: the schema gives it as the larger
    of `builtin_code` and `deprecated_builtin_code` (up to 127), and Google's LiteRT quantizer
    (ai-edge-quantizer) writes DEQUANTIZE and QUANTIZE in `builtin_code` only (the old field 0,
    ADD), which tf2onnx reads: its weight-only and partly quantized models became Adds and a
    graph with cycles. Returns how many codes changed: only where the old field is wrong (a file
    older than the new field has it right and 0 in the new one, which no reader here needs)."""
    n = 0
    for c in model.operatorCodes:
        op = max(c.builtinCode, c.deprecatedBuiltinCode)
        old = min(op, PLACEHOLDER_FOR_GREATER_OP_CODES)
        if c.deprecatedBuiltinCode != old:
            c.builtinCode, c.deprecatedBuiltinCode = op, old
            n += 1
    return n


def fill_shapes(model, path) -> int:
    """The shapes an older converter left out of the file (an empty shape on an activation: the
    maps after a resize whose size SHAPE ops compute, as Magenta's dynamic-range style transfer
    at a fixed 384x384 has) from the interpreter, which resolves them as it runs (on zeros):
    tf2onnx reads the file's and had failed on the first conv after the resize. Only the main
    graph's tensors without data; returns how many were filled."""
    import numpy as np
    import tensorflow as tf
    sg = model.subgraphs[0]
    empty = [i for i, t in enumerate(sg.tensors)
             if (t.shape is None or len(t.shape) == 0) and not (model.buffers[t.buffer].data is not None
                                                                and len(model.buffers[t.buffer].data))]
    if not empty:
        return 0
    try:                        # dynamic tensors get their shapes as the interpreter runs
        it = tf.lite.Interpreter(model_path=str(path))
        it.allocate_tensors()
        for d in it.get_input_details():
            it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        it.invoke()
    except Exception:           # (the conversion says what is wrong with the file)
        return 0
    shapes = {d["index"]: [int(v) for v in d["shape"]] for d in it.get_tensor_details()}
    n = 0
    for i in empty:
        if shapes.get(i):
            sg.tensors[i].shape = shapes[i]
            n += 1
    return n


def retype_legacy_hybrid(model, path) -> int:
    """Weights of TOCO's old post_training_quantize files (float ops with "hybrid" kernels: CONV_2D,
    DEPTHWISE_CONV_2D, FULLY_CONNECTED on float activations) stored as UINT8 tensors holding int8
    values: TFLite's hybrid kernels read the bytes as int8 (scale x int8, the zero point 0), while
    tf2onnx read them as 0..255 -- a model of garbage that its own float reference agreed with.
    Retyped INT8 in place (the same bytes), as today's converter writes them and tf2onnx reads
    them. A DEQUANTIZE of uint8 (asymmetric, its zero point) is read right and left alone; a
    uint8 hybrid weight with another zero point is refused. Returns how many tensors changed."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils as fu
    n = 0
    for sg in model.subgraphs:
        for op in sg.operators:
            outs = op.outputs if op.outputs is not None else []
            if fu.opcode_to_name(model, op.opcodeIndex) in ("DEQUANTIZE", "QUANTIZE") or not len(outs) or \
                    sg.tensors[outs[0]].type != schema.TensorType.FLOAT32:
                continue
            for i in op.inputs if op.inputs is not None else []:
                t = sg.tensors[i] if i >= 0 else None
                q = t.quantization if t is not None else None
                if t is None or t.type != schema.TensorType.UINT8 or q is None or q.scale is None or \
                        model.buffers[t.buffer].data is None:
                    continue
                if any(z != 0 for z in q.zeroPoint):
                    raise ModelLoadError(
                        f"{path}: tensor {t.name.decode(errors='replace')!r}: uint8 weights with zero point "
                        f"{int(max(q.zeroPoint))} read by a float {fu.opcode_to_name(model, op.opcodeIndex)} (a "
                        "hybrid kernel, which reads them as int8): not a form TFLite writes; export the model "
                        "again (float, or with today's dynamic-range quantization)")
                t.type = schema.TensorType.INT8
                n += 1
    return n


def cut_ops(model, names, path, start=None) -> int:
    """--outputs / --inputs: subgraph 0 ends at the tensors `names` (else at its own outputs) and
    starts at the tensor `start` (else at its own inputs), the operators none of them needs dropped
    (before the custom-op check: an SSD's TFLite_Detection_PostProcess after its raw outputs, a
    keyword spotter's FFT before its spectrogram). Returns how many; a name the file has no
    tensor of is refused with the nearest ones."""
    if not names and start is None:
        return 0
    sg = model.subgraphs[0]
    index = {t.name.decode(errors="replace"): i for i, t in enumerate(sg.tensors)}
    for flag, n in [("--outputs", n) for n in names or ()] + ([("--inputs", start)] if start is not None else []):
        if n not in index:
            raise UnknownOutputError(f"{path}: {flag} {n!r}: the file has no such tensor{nearest(n, index)}"
                                     + " (give tensor names as the file has them: netron shows them)")
    wanted = [index[n] for n in dict.fromkeys(names)] if names else list(sg.outputs)
    stop = index[start] if start is not None else None
    if stop is not None and sg.tensors[stop].buffer and len(model.buffers[sg.tensors[stop].buffer].data or ()):
        raise ModelLoadError(f"{path}: --inputs {start!r} is a constant of the file (weights); name a tensor "
                             "its layers compute, the one the network that is to run reads")
    producer = {o: k for k, op in enumerate(sg.operators) for o in op.outputs}
    keep, reads = needed(producer, lambda k: [i for i in sg.operators[k].inputs if i >= 0], wanted, stop)
    dropped = len(sg.operators) - len(keep)
    sg.operators = [op for k, op in enumerate(sg.operators) if k in keep]
    sg.outputs = wanted
    if stop is not None:
        sg.inputs = [stop] + [i for i in sg.inputs if i in reads and i != stop]
    return dropped


def densify(path, out_path, outputs=None, start=None):
    """Write a copy of `path` with every DENSIFY op replaced by the dense constant it computes and
    the custom ops that have a builtin form mapped (check_custom_ops refuses the others), cut at
    `outputs` and `start` (cut_ops). Returns the number of ops changed (0: nothing written) and the
    names of subgraph 0's tensors (what --outputs and --inputs take)."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.lite.tools import flatbuffer_utils as fu
    model = fu.read_model(str(path))
    names = [t.name.decode(errors="replace") for t in model.subgraphs[0].tensors] if model.subgraphs else []
    mapped = (normalize_opcodes(model) + cut_ops(model, outputs, path, start) + map_transpose_conv_bias(model)
              + map_pool_params(model, path)
              + flatten_fc_inputs(model) + fill_shapes(model, path)
              + drop_empty_quantization(model) + retype_legacy_hybrid(model, path))
    check_custom_ops(model, path)
    check_builtin_ops(model, path)
    ops = [(sg, op) for sg in model.subgraphs for op in sg.operators
           if fu.opcode_to_name(model, op.opcodeIndex) == "DENSIFY"]
    if not ops:
        if mapped:
            fu.write_model(model, str(out_path))
        return mapped, names
    if len(model.subgraphs) > 1:
        raise ModelLoadError(f"{path}: sparse weights in a model with {len(model.subgraphs)} subgraphs; "
                             "only single-graph models are densified")
    interp = tf.lite.Interpreter(model_path=str(path), experimental_preserve_all_tensors=True,
                                 experimental_op_resolver_type=tf.lite.experimental.OpResolverType.
                                 BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    interp.invoke()
    from tensorflow.lite.python import schema_py_generated as schema
    for sg, op in ops:
        dense = np.ascontiguousarray(interp.get_tensor(op.outputs[0]))
        buf = schema.BufferT()
        buf.data = np.frombuffer(dense.astype(dense.dtype.newbyteorder("<")).tobytes(), np.uint8)
        model.buffers.append(buf)
        for t in (sg.tensors[op.inputs[0]], sg.tensors[op.outputs[0]]):
            t.buffer, t.sparsity = len(model.buffers) - 1, None
        sg.operators.remove(op)
    fu.write_model(model, str(out_path))
    return len(ops) + mapped, names


def _tf2onnx(src, where, **kw):
    """tf2onnx.convert.from_tflite keeping MediaPipe's pooling ops and the builtin ops of
    `tflite_ops`, then mapped to ONNX ops."""
    import tf2onnx
    custom = {**mediapipe_ops.tf2onnx_custom_ops(), **tflite_ops.tf2onnx_custom_ops()}
    model, external = tf2onnx.convert.from_tflite(src, custom_ops=custom, **kw)
    return tflite_ops.to_standard_ops(mediapipe_ops.to_standard_ops(model, where), where), external


def _scaled(t) -> bool:
    """Has interpreter tensor detail `t` a quantization scale? A per-channel one is only in
    `quantization_parameters` (the legacy `quantization` pair reads (0.0, 0) there: a TF2
    dynamic-range file's int8 weights)."""
    return bool(t["quantization"][0]) or len(t.get("quantization_parameters", {}).get("scales", ())) > 0


def _interpreter_db(run_path, model) -> tuple:
    """(SQNR (dB) of the ONNX model's outputs against the TFLite interpreter's on one seeded input
    (integer outputs dequantized by their own scales), or None where either side cannot run it
    alone (several inputs, custom ops the interpreter lacks, ...); whether the file is float: no
    tensor of it has a quantization scale, per tensor or per channel)."""
    import numpy as np
    import tensorflow as tf

    from tl2k210.quantize.metrics import sqnr_db
    ort = quiet.onnxruntime()
    it = tf.lite.Interpreter(model_path=str(run_path))
    it.allocate_tensors()
    floats = not any(_scaled(t) for t in it.get_tensor_details())
    (d,) = it.get_input_details()
    rng = np.random.default_rng(0)
    if np.issubdtype(d["dtype"], np.integer):
        info = np.iinfo(d["dtype"])
        x = rng.integers(info.min, int(info.max) + 1, d["shape"]).astype(d["dtype"])
    else:
        x = rng.uniform(0, 1, d["shape"]).astype(d["dtype"])
    it.set_tensor(d["index"], x)
    it.invoke()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (i,) = sess.get_inputs()
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {i.name: x.reshape(
        [v if isinstance(v, int) else 1 for v in i.shape] if len(i.shape) == x.ndim else x.shape)})))
    refs, tests = [], []
    for o in it.get_output_details():
        y = it.get_tensor(o["index"]).astype(np.float64)
        z = got.get(o["name"])
        if z is None or np.size(z) != y.size:
            return None, floats
        if o["dtype"] != np.float32 and o["quantization"][0]:
            s_, z_ = o["quantization"]
            y = (y - z_) * s_
            if np.issubdtype(np.asarray(z).dtype, np.integer):
                z = (np.asarray(z, np.float64) - z_) * s_
        refs.append(y.reshape(-1))
        tests.append(np.asarray(z, np.float64).reshape(-1))
    return (sqnr_db(np.concatenate(refs), np.concatenate(tests)) if refs else None), floats


def check_against_interpreter(path, run_path, model):
    """Refuse a conversion whose graph computes something else than the file does: on one seeded
    input, its outputs against the TFLite interpreter's below -1 dB SQNR (an unrelated output of
    the same size reads about -3 dB), or, for a float file (no integer kernel rounds anything),
    below FLOAT_AGREE_DB. Integer and hybrid kernels stay above -1 dB (7.9 dB for a TF1 uint8
    pose net's dequantized maps, 0.5 dB for a decision tree's routing flipped by rounding); a
    weight form tf2onnx misread (retype_legacy_hybrid's) gave -17 and -549 dB, and the kmodel,
    its receipt and `compare` all agreed with the misread graph. Says nothing where the check
    cannot run."""
    db, floats = source_agreement(_interpreter_db, run_path, model) or (None, False)
    if db is not None and db < (FLOAT_AGREE_DB if floats else -1):
        why = f"; a float file's two readings agree to over {FLOAT_AGREE_DB:.0f} dB" if floats else ""
        raise ModelLoadError(f"{path}: the graph read from the file disagrees with the TFLite interpreter on a "
                             f"test input (output SQNR {db:.1f} dB{why}): tf2onnx misread a form of this file, so no "
                             "kmodel of it would compute what the file does; nothing written. Please report it "
                             "with the file (or export the model again as float / with today's quantization)")


def from_tflite(path, opset=None, outputs=None, start=None):
    _check_header(path)
    kw = {"opset": opset} if opset else {}
    fd, dense = tempfile.mkstemp(suffix=".tflite", prefix="tl2k210-dense-")
    os.close(fd)
    try:
        try:
            n, names = densify(path, dense, outputs, start)
        except ModelLoadError:
            raise
        except Exception as e:
            _refuse_recurrent(path)
            raise ModelLoadError(f"{path}: TensorFlow Lite's flatbuffer reader could not read it (to check its "
                                 f"ops and densify sparse weights): {type(e).__name__}: "
                                 f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}; is the file "
                                 "truncated or damaged? Copy or export it again") from e
        src = dense if n else str(path)
        model = tf_convert(str(path), _tf2onnx, src, str(path), **kw)
        check_against_interpreter(path, src, model)
        model.metadata_props.add(key=FILE_TENSORS, value=json.dumps(names))
        return model
    finally:
        Path(dense).unlink(missing_ok=True)
