"""Keras models (objects, `.keras`, `.h5`, or an architecture `.json` with a weights `.h5`) through
tf2onnx.from_keras, batch fixed to 1.

Files written by Keras 2 (most K210 projects: Keras 2.2-2.4, tf.keras 1.x/2.x) do not all load in
Keras 3. When `keras.models.load_model` refuses an .h5, its model config is patched for the known
differences and rebuilt with Keras' own legacy loader:
  * `SpatialDropout*D` with Keras 2 arguments (noise_shape, trainable) Keras 3 refuses: read as
    a plain `Dropout` (the same at inference: the identity);
  * a Sequential whose first layer carries `batch_input_shape`: Keras 3 adds a second batch dim
    ("kernel of shape (3, 3, 1, 6) and input of shape (None, None, 32, 32, 1)"; a first Dense
    even loads so, as (None, None, features), and is rebuilt the same way); an explicit
    InputLayer is put in front instead.
Files that even the patched config does not rebuild (Keras 2 layer arguments Keras 3 refuses, e.g.
`DepthwiseConv2D(groups=...)` of TF 2.5+ tf.keras), and `.keras` files tf-keras wrote (Keras 3
refuses their Keras 2 configs: `batch_input_shape`), are read by tf-keras, the Keras 2 package for
TF 2.16+ (`pip install tf-keras`, in the [convert] extra), when it is installed.

A model file is data: a `Lambda` layer whose function (or output shape) is stored as Python
bytecode is refused by name before any loader sees the file (`refuse_code`), since tf-keras and
Keras 2 configs would run that code to rebuild the layer.
"""
import contextlib
import json
from pathlib import Path

from . import ModelLoadError, check_against_source, tf_convert


def _code_layers(cfg):
    """[(layer name, what it stores)] of the layers in Keras config `cfg` that carry Python
    bytecode: a Lambda's function or output shape dumped as code (Keras 2: `function_type` /
    `output_shape_type` "lambda"; Keras 3: a `__lambda__` object)."""
    found = []

    def walk(c, layer):
        if isinstance(c, dict):
            if c.get("class_name") == "__lambda__":
                found.append((layer, "a Python lambda"))
                return
            conf = c.get("config")
            if c.get("class_name") == "Lambda" and isinstance(conf, dict):
                layer = conf.get("name", c.get("name", "?"))
                for key in ("function", "output_shape"):
                    if conf.get(f"{key}_type") == "lambda":
                        found.append((layer, f"its {key.replace('_', ' ')} as Python bytecode"))
            for v in c.values():
                walk(v, layer)
        elif isinstance(c, list):
            for v in c:
                walk(v, layer)
    walk(cfg, "?")
    return found


def refuse_code(cfg, where):
    """ModelLoadError naming the layers of Keras config `cfg` that carry Python code (module doc)."""
    found = list(dict.fromkeys(_code_layers(cfg)))
    if found:
        named = "; ".join(f"layer {n!r} (Lambda) stores {what}" for n, what in found[:5])
        raise ModelLoadError(f"{where}: {named}. Rebuilding it would run that code, and a model file "
                             "is data: tl2k210 never runs code from one. Replace the Lambda with built-in "
                             "Keras layers (most are a Multiply, Add, Rescaling, Activation or Reshape), "
                             "save again and convert that file")


#: QKeras's layers (quantization-aware training for hls4ml): no Keras loader builds them
QKERAS = ("QConv1D", "QConv2D", "QConv2DBatchnorm", "QDepthwiseConv2D", "QDepthwiseConv2DBatchnorm",
          "QSeparableConv1D", "QSeparableConv2D", "QConv2DTranspose", "QDense", "QDenseBatchnorm",
          "QActivation", "QAdaptiveActivation", "QBatchNormalization", "QAveragePooling2D",
          "QGlobalAveragePooling2D", "QSimpleRNN", "QLSTM", "QGRU", "QBidirectional")


def _dicts(c):
    """Every dict of a parsed JSON config, each before the dicts inside it (a caller may change
    one's entries before its children are reached)."""
    if isinstance(c, dict):
        yield c
        for v in c.values():
            yield from _dicts(v)
    elif isinstance(c, list):
        for v in c:
            yield from _dicts(v)


def refuse_qkeras(cfg, where):
    """ModelLoadError naming the QKeras layers of Keras config `cfg`, with what to do instead."""
    found = [f"{(c['config'] if isinstance(c.get('config'), dict) else {}).get('name', c.get('name', '?'))!r} "
             f"({c['class_name']})" for c in _dicts(cfg) if c.get("class_name") in QKERAS]
    if found:
        raise ModelLoadError(f"{where}: layers {', '.join(found[:5])}{' ...' if len(found) > 5 else ''} are "
                             "QKeras's (quantization-aware training for hls4ml), which no Keras loader builds; "
                             "tl2k210 quantizes for the K210 itself: rebuild the network with the plain Keras "
                             "layers (Conv2D, Dense, Activation, BatchNormalization), load the trained weights "
                             "into it, save it (or export it to ONNX / TFLite) and convert that file")


def _file_config(path):
    """The model config inside a Keras file (.h5/.hdf5 `model_config`, .keras `config.json`,
    architecture .json), parsed as JSON; None when there is none to read."""
    try:
        if path.suffix.lower() in (".h5", ".hdf5"):
            import h5py
            with h5py.File(path, "r") as f:
                raw = f.attrs.get("model_config")
        elif path.suffix.lower() == ".keras":
            import zipfile
            with zipfile.ZipFile(path) as z:
                raw = z.read("config.json") if "config.json" in z.namelist() else None
        else:
            raw = path.read_bytes()
        if raw is None:
            return None
        return json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except Exception:
        return None


def _first_line(e):
    msg = str(e).strip().splitlines()
    return msg[0] if msg else ""


def _patch_config(cfg):
    """Keras 2 model config -> one Keras 3's legacy loader builds (see the module docstring)."""
    for c in _dicts(cfg):
        if str(c.get("class_name", "")).startswith("SpatialDropout") and isinstance(c.get("config"), dict):
            c["class_name"] = "Dropout"
            c["config"].pop("noise_shape", None)
            c["config"].pop("data_format", None)
    if cfg.get("class_name") == "Sequential":
        conf = cfg["config"]
        layers = conf["layers"] if isinstance(conf, dict) else conf
        first = layers[0].get("config", {}) if layers else {}
        if layers and layers[0].get("class_name") != "InputLayer" and "batch_input_shape" in first:
            layers.insert(0, {"class_name": "InputLayer",
                              "config": {"batch_input_shape": first.pop("batch_input_shape"),
                                         "dtype": first.get("dtype", "float32"), "name": "input"}})
    return cfg


def _extra_batch_dim(cfg, model) -> bool:
    """Did Keras 3 load a Sequential whose first layer carries `batch_input_shape` with a second
    batch dim? It fails on a conv, but a Dense (any rank) loads, as (None, None, features)."""
    if not isinstance(cfg, dict) or cfg.get("class_name") != "Sequential":
        return False
    conf = cfg.get("config")
    layers = conf.get("layers", []) if isinstance(conf, dict) else conf or []
    first = layers[0].get("config", {}) if layers and isinstance(layers[0], dict) else {}
    shape = first.get("batch_input_shape") if isinstance(first, dict) else None
    return isinstance(shape, list) and layers[0].get("class_name") != "InputLayer" and \
        len(model.inputs[0].shape) == len(shape) + 1


def _from_config(cfg, where):
    from keras.src.legacy.saving import saving_utils
    try:
        return saving_utils.model_from_config(_patch_config(cfg))
    except Exception as e:
        raise ModelLoadError(f"{where}: Keras could not build the model from its config: "
                             f"{type(e).__name__}: {_first_line(e)}") from e


def _load_weights_h5(model, group, where):
    from keras.src.legacy.saving import legacy_h5_format
    try:
        legacy_h5_format.load_weights_from_hdf5_group_by_name(group, model)
    except Exception as e:
        raise ModelLoadError(f"{where}: its weights do not fit the architecture: {type(e).__name__}: "
                             f"{_first_line(e)}") from e


def _h5_kind(path):
    """'model' (Keras model file), 'keras-weights', 'tensorlayer-weights' or None."""
    try:
        import h5py
        with h5py.File(path, "r") as f:
            if "model_config" in f.attrs:
                return "model"
            if "layer_names" in f.attrs:
                return "keras-weights" if "keras_version" in f.attrs or "backend" in f.attrs else "tensorlayer-weights"
    except Exception:
        return None
    return None


def _keras_version(path) -> str:
    """The `keras_version` a .h5/.hdf5 file was saved by ("" when it says none)."""
    if path.suffix.lower() not in (".h5", ".hdf5"):
        return ""
    try:
        import h5py
        with h5py.File(path, "r") as f:
            v = f.attrs.get("keras_version", b"")
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return ""


def refuse_keras1(path, cfg):
    """A Keras 1 file (hunt 21: 2016-17 PilotNet steering nets): its layer configs (nb_filter,
    border_mode, subsample, output_dim) are no form Keras 2 or 3 builds; said as such, not as the
    TypeError a loader raises on them."""
    v = _keras_version(path)
    if v.startswith("1."):
        code = _code_layers(cfg) if cfg is not None else []
        raise ModelLoadError(
            f"{path}: saved by Keras {v}, whose layer configs (nb_filter, border_mode, subsample, output_dim) "
            "no Keras since 2.0 reads: load it in Keras 2.0-2.3 (they convert Keras 1 files), save it again "
            "and convert that" + (f" (its Lambda layer {code[0][0]!r} stores Python bytecode: replace it with "
                                  "built-in layers, e.g. Rescaling, first)" if code else ""))


def load_keras(path, weights=None):
    """A Keras model from a .keras/.h5 file, or from an architecture .json (+ weights .h5)."""
    path = Path(path)
    cfg = _file_config(path)
    refuse_keras1(path, cfg)
    if cfg is not None:
        refuse_code(cfg, path)
        refuse_qkeras(cfg, path)
    if path.suffix.lower() == ".json":
        return _load_json(path, weights)
    try:
        return _load_file(path, cfg)
    except ModelLoadError as e:
        custom = _custom_layers(cfg) if cfg is not None else []
        if not custom:
            raise
        raise ModelLoadError(
            f"{path}: layer(s) {', '.join(custom[:5])}{' ...' if len(custom) > 5 else ''} are the author's own "
            "classes, whose Python code a model file does not hold (and tl2k210 runs no code from a file): "
            "where that code is, export the model as a SavedModel (Keras 3: model.export(DIR); Keras 2: "
            "model.save(DIR)), ONNX or TFLite, and convert that") from e


def _custom_layers(cfg) -> list:
    """'name' (class) of each layer of Keras config `cfg` that no Keras package defines."""
    import keras
    known = set(dir(keras.layers)) | {"Functional", "Sequential", "Model"}
    try:
        import tf_keras
        known |= set(dir(tf_keras.layers))
    except ImportError:
        pass
    return [f"{(c.get('config') or {}).get('name', '?')!r} ({c.get('registered_name') or c['class_name']})"
            for d in _dicts(cfg) if isinstance(d.get("layers"), list)
            for c in d["layers"] if isinstance(c, dict) and c.get("class_name") not in known]


def _load_file(path, cfg):
    import keras
    try:
        model = keras.models.load_model(str(path), compile=False)
    except Exception as e:
        first = e
    else:
        if not _extra_batch_dim(cfg, model):
            return model
        first = ModelLoadError(f"{path}: Keras 3 loaded it with an input of rank {len(model.inputs[0].shape)}")
    if path.suffix.lower() == ".keras":     # tf-keras (Keras 2) writes this format too
        return _tf_keras(ModelLoadError(f"{path}: Keras could not load it: {type(first).__name__}: "
                                        f"{_first_line(first)}"),
                         lambda tk: tk.models.load_model(str(path), compile=False))
    kind = _h5_kind(path) if path.suffix.lower() in (".h5", ".hdf5") else None
    if kind == "model":
        import h5py
        try:
            with h5py.File(path, "r") as f:
                cfg = json.loads(f.attrs["model_config"])
                model = _from_config(cfg, path)
                _load_weights_h5(model, f["model_weights"] if "model_weights" in f else f, path)
        except ModelLoadError as e:
            return _tf_keras(e, lambda tk: tk.models.load_model(str(path), compile=False))
        return model
    if kind == "keras-weights":
        jsons = sorted(p.name for p in path.parent.glob("*.json"))
        hint = (f" (in this folder: {', '.join(jsons[:3])})" if jsons else "")
        raise ModelLoadError(f"{path}: a Keras weights-only file (no model config inside); give the "
                             f"architecture too: tl2k210 convert ARCHITECTURE.json OUT.kmodel --weights {path.name}"
                             f"{hint}") from first
    hint = ("; it holds TensorLayer weights: load_model(path, network=your_tl_model) or "
            "`tl2k210 convert --network net.py`" if kind == "tensorlayer-weights" else "")
    raise ModelLoadError(f"{path}: Keras could not load it: {type(first).__name__}: {_first_line(first)}"
                         f"{hint}") from first


def _load_json(path, weights):
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not a Keras architecture JSON ({type(e).__name__}: {_first_line(e)})") from e
    if not isinstance(cfg, dict) or "class_name" not in cfg or "config" not in cfg:
        raise ModelLoadError(f"{path}: not a Keras architecture JSON (no class_name/config; write one "
                             "with model.to_json())")
    if weights is None:
        raise ModelLoadError(f"{path}: a Keras architecture without weights; add --weights WEIGHTS.h5 "
                             "(from model.save_weights)")
    try:
        model = _from_config(cfg, path)
    except ModelLoadError as e:
        def build(tk):
            m = tk.models.model_from_json(path.read_text())
            m.load_weights(str(weights))
            return m
        return _tf_keras(e, build)
    import h5py
    try:
        f = h5py.File(weights, "r")
    except Exception as e:
        raise ModelLoadError(f"{weights}: cannot open as HDF5 weights ({type(e).__name__})") from e
    with f:
        _load_weights_h5(model, f["model_weights"] if "model_weights" in f else f, weights)
    return model


# tf-keras names `tensorflow` as a dependency; with tensorflow-cpu installed, a plain
# `pip install tf-keras` would add the full 572 MB wheel over it (../docs/usage.md)
TF_KERAS_INSTALL = "pip install --no-deps tf-keras==2.21.0"


def _tf_keras(refusal, build):
    """build(tf_keras) -> a model, for Keras 2 files Keras 3 refused with `refusal`; its failure
    (or tf-keras missing) re-raises that refusal, with what tf-keras said."""
    try:
        import tf_keras
    except ImportError:
        raise ModelLoadError(f"{refusal}; tf-keras (the Keras 2 package) reads most Keras 2 files: "
                             f"{TF_KERAS_INSTALL}") from None
    try:
        return build(tf_keras)
    except Exception as e:
        raise ModelLoadError(f"{refusal}; tf-keras could not either: {type(e).__name__}: "
                             f"{_first_line(e)}") from e


@contextlib.contextmanager
def _grouped_convs_traced(model):
    """Keras runs a Conv2D with groups > 1 as an XLA-compiled function (TF's grouped convolution
    has no CPU kernel), which tf2onnx leaves as a PartitionedCall without its body. While the
    model is converted, the plain tf.nn.convolution is traced instead (tf2onnx writes an ONNX
    Conv with `group`): Keras 3's backend conv, and tf_keras' per-layer jit-compiled op."""
    import tensorflow as tf
    undo = []
    for layer in getattr(model, "_flatten_layers", lambda: [])():
        if getattr(layer, "groups", 1) > 1 and hasattr(layer, "_jit_compiled_convolution_op") \
                and hasattr(layer, "convolution_op"):
            layer._jit_compiled_convolution_op = layer.convolution_op
            undo.append(lambda layer=layer: layer.__dict__.pop("_jit_compiled_convolution_op", None))
    try:
        from keras.src import backend as k3_backend
        from keras.src.backend.tensorflow import nn as k3_nn
    except ImportError:
        k3_nn = None
    if k3_nn is not None and hasattr(k3_nn, "conv") and hasattr(k3_nn, "_convert_data_format"):
        xla_conv = k3_nn.conv

        def conv(inputs, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
            fmt = k3_backend.standardize_data_format(data_format)
            return tf.nn.convolution(inputs, kernel, strides, padding.upper(), dilations=dilation_rate,
                                     data_format=k3_nn._convert_data_format(fmt, len(inputs.shape)))
        k3_nn.conv = conv
        undo.append(lambda: setattr(k3_nn, "conv", xla_conv))
    try:
        yield
    finally:
        for u in undo:
            u()


def from_keras(model, opset=None, batch=1, weights=None, outputs=None):
    """`outputs` (--outputs): where every name is a layer of the model, the model is cut at those
    layers' outputs before tf2onnx reads it, and the ONNX outputs take their names (tf2onnx's
    tensors are named by op scopes Keras makes unique, 'sequential_1/dense_1_2/...': a user's
    `--outputs dense` had matched none); other names are tensors, for compiler.cut_outputs."""
    if not hasattr(model, "inputs"):
        model = load_keras(model, weights), str(model)
    else:
        model = model, getattr(model, "name", "keras model")
    cut = _layer_outputs(model[0], outputs)
    if cut is not None:
        model = cut, model[1]
    with _grouped_convs_traced(model[0]):
        onnx_model = _from_keras(*model, opset=opset, batch=batch)
    check_against_keras(*model, onnx_model)
    if cut is not None:
        _rename_outputs(onnx_model, outputs)
    return onnx_model


def _layer_outputs(model, names):
    """The Keras model ending at the outputs of its layers `names`, or None (no names, or one that
    is not a layer of it)."""
    import importlib
    layers = {layer.name: layer for layer in getattr(model, "layers", ())}
    if not names or any(n not in layers for n in names):
        return None
    keras = importlib.import_module(type(model).__module__.split(".")[0])     # keras, or tf_keras's Keras 2
    return keras.Model(model.inputs, [layers[n].output for n in names])


def _rename_outputs(onnx_model, names):
    """Give the ONNX graph's outputs, in order, the names `names`."""
    g = onnx_model.graph
    rename = {o.name: n for o, n in zip(g.output, names)}
    for node in g.node:
        node.output[:] = [rename.get(t, t) for t in node.output]
        node.input[:] = [rename.get(t, t) for t in node.input]
    for o in g.output:
        o.name = rename.get(o.name, o.name)


def check_against_keras(model, where, onnx_model):
    """check_against_source for tf2onnx's Keras path: the model's outputs on the seeded input."""
    def keras_outputs(feed):
        xs = list(feed.values())
        refs = model(xs if len(xs) > 1 else xs[0], training=False)
        return refs if isinstance(refs, (list, tuple)) else [refs]
    check_against_source(where, onnx_model, keras_outputs, "Keras", "export the model to .tflite or ONNX")


def _from_keras(model, where, opset=None, batch=1):
    import tensorflow as tf
    spec = tuple(tf.TensorSpec((batch, *t.shape[1:]), t.dtype, name=t.name.split(":")[0]) for t in model.inputs)
    import tf2onnx
    kw = {"opset": opset} if opset else {}
    try:
        return tf_convert(where, tf2onnx.convert.from_keras, model, input_signature=spec, **kw)
    except ModelLoadError as e:
        # tf2onnx's Keras path trips over some rebuilt Keras 2 models (KeyError on a keras_tensor
        # name); tracing the model as a plain function gives the same graph
        spec = [tf.TensorSpec(s.shape, s.dtype, name=f"input_{i}") for i, s in enumerate(spec)]
        fn = tf.function(lambda *xs: model(list(xs) if len(xs) > 1 else xs[0], training=False),
                         input_signature=spec)
        try:
            return tf_convert(where, tf2onnx.convert.from_function, fn, input_signature=spec, **kw)
        except ModelLoadError:
            raise e from None
