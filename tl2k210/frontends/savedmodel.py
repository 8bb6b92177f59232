"""A TensorFlow SavedModel directory (its serving signature), through tf2onnx.from_function."""
from pathlib import Path

from . import ModelLoadError, tf_convert


def from_savedmodel(path, signature="serving_default", opset=None, batch=1):
    if not (Path(path) / "saved_model.pb").exists():
        raise ModelLoadError(f"{path}: directory has no saved_model.pb (not a SavedModel); pass a SavedModel folder or a "
                             "model file (.onnx, .tflite, .h5, .pb)")
    import tensorflow as tf
    import tf2onnx
    try:
        loaded = tf.saved_model.load(str(path))
        fn = loaded.signatures[signature]
    except KeyError:
        raise ModelLoadError(f"{path}: no signature {signature!r}; has {list(loaded.signatures)}") from None
    except Exception as e:
        raise ModelLoadError(f"{path}: TensorFlow could not load it: {type(e).__name__}: "
                             f"{str(e).strip().splitlines()[0]}") from e
    specs = fn.structured_input_signature[1]
    names = sorted(specs)
    spec = [tf.TensorSpec((batch, *specs[k].shape[1:]), specs[k].dtype, name=k) for k in names]
    wrapped = tf.function(lambda *xs: fn(**dict(zip(names, xs))), input_signature=spec)
    kw = {"opset": opset} if opset else {}
    return tf_convert(str(path), tf2onnx.convert.from_function, wrapped, input_signature=spec, **kw)
