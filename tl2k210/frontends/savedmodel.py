"""A TensorFlow SavedModel directory (its serving signature), through tf2onnx.from_function.

A Keras SavedModel written by TF 2.3-2.15 (tf.keras) that TF 2.21 cannot restore (its optimizer
slots: "'_UserObject' object has no attribute 'add_slot'") is read by tf-keras, the Keras 2
package, when it is installed, and converted as the Keras model it holds."""
import json
from pathlib import Path

from . import ModelLoadError, check_against_source, tf_convert
from .keras import TF_KERAS_INSTALL, refuse_code
from .tf_guard import refuse_side_effects


def _first_line(e):
    return str(e).strip().splitlines()[0] if str(e).strip() else ""


def _metadata_configs(path):
    """Each node's JSON metadata in a Keras SavedModel's keras_metadata.pb: the layer configs
    tf-keras rebuilds the layers from (an unreadable one counts as code)."""
    from tf_keras.protobuf import saved_metadata_pb2
    meta = saved_metadata_pb2.SavedMetadata()
    try:
        meta.ParseFromString((Path(path) / "keras_metadata.pb").read_bytes())
    except Exception:
        return [{"class_name": "__lambda__"}]
    out = []
    for node in meta.nodes:
        if not node.metadata:
            continue
        try:
            out.append(json.loads(node.metadata))
        except ValueError:
            out.append({"class_name": "__lambda__"})
    return out


def _through_tf_keras(path, refusal, opset, batch):
    """The Keras model in SavedModel `path` by tf-keras, converted; else ModelLoadError(refusal)."""
    try:
        import tf_keras
    except ImportError:
        raise ModelLoadError(f"{refusal}; a Keras SavedModel of TF <= 2.15 loads with tf-keras: "
                             f"{TF_KERAS_INSTALL}") from None
    for cfg in _metadata_configs(path):
        refuse_code(cfg, path)
    try:
        model = tf_keras.models.load_model(str(path), compile=False)
    except Exception as e:
        raise ModelLoadError(f"{refusal}; tf-keras could not either: {type(e).__name__}: {_first_line(e)}") from e
    from .keras import from_keras
    return from_keras(model, opset=opset, batch=batch)


def from_savedmodel(path, signature="serving_default", opset=None, batch=1):
    if not (Path(path) / "saved_model.pb").exists():
        raise ModelLoadError(f"{path}: directory has no saved_model.pb (not a SavedModel); pass a SavedModel folder or a "
                             "model file (.onnx, .tflite, .h5, .pb)")
    import tensorflow as tf
    import tf2onnx
    from tensorflow.core.protobuf import saved_model_pb2
    sm = saved_model_pb2.SavedModel()
    try:
        sm.ParseFromString((Path(path) / "saved_model.pb").read_bytes())
    except Exception as e:
        raise ModelLoadError(f"{path}: saved_model.pb is not a SavedModel protobuf ({type(e).__name__})") from e
    refuse_side_effects([mg.graph_def for mg in sm.meta_graphs], path)
    try:
        loaded = tf.saved_model.load(str(path))
        fn = loaded.signatures[signature]
    except KeyError:
        raise ModelLoadError(f"{path}: no signature {signature!r}; has {list(loaded.signatures)}") from None
    except Exception as e:
        refusal = f"{path}: TensorFlow could not load it: {type(e).__name__}: {_first_line(e)}"
        if (Path(path) / "keras_metadata.pb").exists():     # written by tf.keras' model.save
            return _through_tf_keras(path, refusal, opset, batch)
        raise ModelLoadError(refusal) from e
    specs = fn.structured_input_signature[1]
    names = sorted(specs)
    spec = [tf.TensorSpec((batch, *specs[k].shape[1:]), specs[k].dtype, name=k) for k in names]
    wrapped = tf.function(lambda *xs: fn(**dict(zip(names, xs))), input_signature=spec)
    kw = {"opset": opset} if opset else {}
    model = tf_convert(str(path), tf2onnx.convert.from_function, wrapped, input_signature=spec, **kw)
    check_against_source(str(path), model, lambda feed: {k: v.numpy() for k, v in fn(**feed).items()},
                         "TensorFlow", "convert the model to .tflite or ONNX")
    return model
