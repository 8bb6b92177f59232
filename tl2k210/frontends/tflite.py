"""A .tflite flatbuffer, through tf2onnx.from_tflite.

Production TFLite files store weights in forms tf2onnx does not all read:
  * float16 weights (DEQUANTIZE fp16 -> fp32): tf2onnx folds them;
  * int8 weights (dynamic-range and full-integer quantization): arrive as DequantizeLinear of
    constants (folded by passes.fold_constants) and QuantizeLinear/DequantizeLinear pairs on
    activations (removed by passes.dequantize);
  * sparse weights (DENSIFY of a sparse constant): tf2onnx reads the sparse buffer as if it were
    dense and fails, so they are densified here first -- by the TFLite interpreter itself, which
    computes each DENSIFY output -- and written to a temporary dense copy of the file.
"""
import os
import tempfile
from pathlib import Path

from . import ModelLoadError, tf_convert


def _check_header(path):
    data = open(path, "rb").read(8)
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelLoadError(f"{path}: not a TFLite flatbuffer (missing 'TFL3' identifier at byte 4)")


def densify(path, out_path):
    """Write a copy of `path` with every DENSIFY op replaced by the dense constant it computes.
    Returns the number of tensors densified (0: nothing written)."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.lite.tools import flatbuffer_utils as fu
    model = fu.read_model(str(path))
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
