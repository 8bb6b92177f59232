"""A .tflite flatbuffer, through tf2onnx.from_tflite."""
from . import ModelLoadError, tf_convert


def from_tflite(path, opset=None):
    data = open(path, "rb").read(8)
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelLoadError(f"{path}: not a TFLite flatbuffer (missing 'TFL3' identifier at byte 4)")
    import tf2onnx
    kw = {"opset": opset} if opset else {}
    return tf_convert(str(path), tf2onnx.convert.from_tflite, str(path), **kw)
