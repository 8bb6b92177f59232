"""A .tflite flatbuffer, through tf2onnx.from_tflite.

Production TFLite files store weights in forms tf2onnx does not all read:
  * float16 weights (DEQUANTIZE fp16 -> fp32): tf2onnx folds them;
  * int8 weights (dynamic-range and full-integer quantization): arrive as DequantizeLinear of
    constants (folded by passes.fold_constants) and QuantizeLinear/DequantizeLinear pairs on
    activations (removed by passes.dequantize);
  * sparse weights (DENSIFY of a sparse constant): tf2onnx reads the sparse buffer as if it were
    dense and fails, so they are densified here first -- by the TFLite interpreter itself, which
    computes each DENSIFY output -- and written to a temporary dense copy of the file.

Custom ops (CUSTOM opcodes: a vendor's kernels the TFLite runtime links in) have no ONNX form;
each one is refused by name before tf2onnx runs, with its vendor set, what it computes, and its
inputs and outputs. TF ops (Flex*) and the SSD post-processing op tf2onnx maps itself pass.
"""
import os
import tempfile
from pathlib import Path

from . import ModelLoadError, tf_convert


def _check_header(path):
    data = open(path, "rb").read(8)
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelLoadError(f"{path}: not a TFLite flatbuffer (missing 'TFL3' identifier at byte 4)")


# custom op -> (vendor set, what it computes)
CUSTOM_OPS = {
    "Convolution2DTransposeBias": ("MediaPipe", "a transposed convolution with bias (segmentation decoders)"),
    "MaxPoolingWithArgmax2D": ("MediaPipe", "max pooling that also outputs the position of each maximum"),
    "MaxUnpooling2D": ("MediaPipe", "unpooling that writes each value at the position MaxPoolingWithArgmax2D "
                       "recorded"),
    "Landmarks2TransformMatrix": ("MediaPipe", "the affine matrix that aligns a set of landmarks "
                                  "(face/hand pose) to a canonical one"),
    "TransformTensorBilinear": ("MediaPipe", "bilinear resampling of a tensor through an affine matrix"),
    "TransformLandmarks": ("MediaPipe", "an affine matrix applied to landmark coordinates"),
}
MAPPED_BY_TF2ONNX = ("TFLite_Detection_PostProcess",)


def check_custom_ops(model, path):
    """Refuse the first custom op (see the module docstring); `model` from flatbuffer_utils."""
    for sg in model.subgraphs:
        for i, op in enumerate(sg.operators):
            code = model.operatorCodes[op.opcodeIndex]
            if max(code.builtinCode, code.deprecatedBuiltinCode) != 32 or not code.customCode:   # CUSTOM
                continue
            name = code.customCode.decode(errors="replace")
            if name.startswith("Flex") or name in MAPPED_BY_TF2ONNX:
                continue
            vendor, what = CUSTOM_OPS.get(name, (None, None))

            def tensors(ids):
                return ", ".join(f"{sg.tensors[t].name.decode(errors='replace')} "
                                 f"{tuple(int(d) for d in sg.tensors[t].shape)}" for t in ids if t >= 0) or "none"
            raise ModelLoadError(
                f"{path}: operator {i} is the custom op {name!r}"
                + (f" of {vendor}'s custom op set ({what})" if vendor else " (no vendor set this converter knows)")
                + f"; inputs: {tensors(op.inputs)}; outputs: {tensors(op.outputs)}. Refused: a custom op is "
                "code linked into the TFLite runtime, with no ONNX or K210 form; cut the model before it "
                "and compute that step in the application")


def densify(path, out_path):
    """Write a copy of `path` with every DENSIFY op replaced by the dense constant it computes.
    Returns the number of tensors densified (0: nothing written)."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.lite.tools import flatbuffer_utils as fu
    model = fu.read_model(str(path))
    check_custom_ops(model, path)
    ops = [(sg, op) for sg in model.subgraphs for op in sg.operators
           if fu.opcode_to_name(model, op.opcodeIndex) == "DENSIFY"]
    if not ops:
        return 0
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
    return len(ops)


def from_tflite(path, opset=None):
    _check_header(path)
    import tf2onnx
    kw = {"opset": opset} if opset else {}
    fd, dense = tempfile.mkstemp(suffix=".tflite", prefix="tl2k210-dense-")
    os.close(fd)
    try:
        try:
            n = densify(path, dense)
        except ModelLoadError:
            raise
        except Exception as e:
            raise ModelLoadError(f"{path}: TensorFlow Lite could not read it to densify its sparse weights: "
                                 f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                                 ) from e
        return tf_convert(str(path), tf2onnx.convert.from_tflite, dense if n else str(path), **kw)
    finally:
        Path(dense).unlink(missing_ok=True)
