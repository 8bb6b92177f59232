"""TensorLayer 2.x `Model.save(path, save_weights=True)` .h5 files (architecture and weights in one
file) -> ONNX, no --network needed.

The architecture is read without eval (tl_config), each layer is built by the installed TensorLayer
from those literals, wired as `prev_layer` says (TensorLayer's own static_graph2net, without its
eval), given the arrays of its weight group in TensorLayer's save order, and converted as any
TensorLayer model (tensorlayer.from_tensorlayer). Constructor arguments TensorLayer does not save
(initializers, and None values) are taken from the weights present: a Conv2d/Dense group without
`biases` was built with b_init=None; a BatchNorm without `beta`/`gamma` gets a zero offset / unit scale.
SeparableConv2d (which the installed TensorLayer cannot build on numpy >= 1.24) is rebuilt as what
it computes: DepthwiseConv2d (no bias) then a 1x1 Conv2d with its bias and activation.
"""
import numpy as np

from . import ModelLoadError
from .tensorlayer import fast_layer_init, from_tensorlayer
from .tl_config import read_config

# the layers rebuilt (besides the input) -> {weight short name: the constructor argument that is
# None when the layer's group lacks that weight}
LAYERS = {"Conv2d": {"biases": "b_init"}, "DepthwiseConv2d": {"biases": "b_init"}, "Dense": {"biases": "b_init"},
          "SeparableConv2d": {"bias": "b_init"}, "BatchNorm": {},
          "MaxPool2d": {}, "MeanPool2d": {}, "Flatten": {}, "Reshape": {}, "Dropout": {}, "Concat": {},
          "Elementwise": {}, "UpSampling2d": {}, "ZeroPad2d": {}, "GlobalMeanPool2d": {}, "PRelu": {},
          "LocalResponseNorm": {}}
# a BatchNorm saved without beta / gamma (beta_init/gamma_init=None, which the installed TensorLayer
# cannot build): the same layer with a zero offset / unit scale
NEUTRAL = {"beta": 0.0, "gamma": 1.0}


def _function(value):
    import tensorflow as tf
    name, alpha = value
    if name == "leaky_relu" and alpha is not None:
        def leaky_relu(x):          # TensorLayer's own act='lrelu0.1' (a named function: TL logs act.__name__)
            return tf.nn.leaky_relu(x, alpha=alpha)
        return leaky_relu
    return {"relu": tf.nn.relu, "relu6": tf.nn.relu6, "leaky_relu": tf.nn.leaky_relu, "identity": tf.identity,
            "sigmoid": tf.nn.sigmoid, "tanh": tf.nn.tanh, "softmax": tf.nn.softmax, "softplus": tf.nn.softplus,
            "add": tf.add, "multiply": tf.multiply, "maximum": tf.maximum, "minimum": tf.minimum,
            "subtract": tf.subtract}[name]


def _why(e):
    msg = str(e).strip()
    return f"{type(e).__name__}: {msg.splitlines()[0] if msg else ''}"


def _inputs(prev):
    """A `prev_layer` entry: one tensor name, or a list of them (a layer reading several)."""
    return prev if isinstance(prev, list) else [prev]


def _call(cls, args):
    return f"{cls}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def _short_name(w):
    return str(w).split("/")[-1].split(":")[0]


def _separable(tl, args):
    """Keras/TensorLayer SeparableConv2d = depthwise (strides, dilation, multiplier) then 1x1."""
    pad = str(args.get("padding", "valid")).upper()
    dw = tl.layers.DepthwiseConv2d(args.get("filter_size", (3, 3)), args.get("strides", (1, 1)), padding=pad,
                                   dilation_rate=args.get("dilation_rate", (1, 1)),
                                   depth_multiplier=args.get("depth_multiplier", 1), b_init=None,
                                   name=f"{args['name']}_depthwise")
    bias = {"b_init": None} if "b_init" in args else {}
    pw = tl.layers.Conv2d(args.get("n_filter", 100), (1, 1), (1, 1), act=args.get("act"), padding="SAME",
                          name=args["name"], **bias)
    return (lambda x: pw(dw(x))), [dw, pw]


def _layer(tl, entry, weight_names, where):
    """(callable on the inputs, [TensorLayer layers holding the weights, in save order])."""
    cls, args = entry["class"], dict(entry["args"])
    kind = args.pop("layer_type", "normal")
    if kind != "normal" or cls not in LAYERS:
        raise ModelLoadError(f"{where}: {_call(cls, args)} is a layer tl2k210 does not rebuild"
                             + (f" (layer_type {kind!r}: nested models and layer lists)" if cls in LAYERS else "")
                             + f"; it rebuilds Input, {', '.join(sorted(LAYERS))}. For other layers give the "
                             "network in Python: tl2k210 convert FILE.h5 OUT.kmodel --network net.py")
    for k in ("act", "combine_fn"):
        if args.get(k) is not None:
            args[k] = _function(args[k])
    shorts = {_short_name(w) for w in weight_names}
    for w, arg in LAYERS[cls].items():
        if w not in shorts:
            args[arg] = None
    try:
        if cls == "SeparableConv2d":
            return _separable(tl, args)
        layer = getattr(tl.layers, cls)(**args)
    except Exception as e:
        raise ModelLoadError(f"{where}: TensorLayer cannot build {_call(cls, args)}: {_why(e)}; the file is "
                             "damaged or from another TensorLayer: save it again") from e
    return layer, [layer]


def _input(tl, entry, where):
    import tensorflow as tf
    args = entry["args"]
    if str(args.get("dtype", "float32")).removeprefix("tf.") != "float32":
        raise ModelLoadError(f"{where}: input dtype {args['dtype']!r}; tl2k210 converts float32 image inputs")
    shape = args.get("shape")
    if not isinstance(shape, (list, tuple)) or not all(s is None or isinstance(s, int) for s in shape):
        raise ModelLoadError(f"{where}: input shape {shape!r} is not a list of sizes")
    return tl.layers.Input(list(shape), dtype=tf.float32, name=args.get("name"))


def _assign(layers, group, where):
    """The group's arrays into the layers' weights: by name (filling NEUTRAL ones the group lacks)
    when the names match, else in order (SeparableConv2d: Keras names)."""
    weights = [w for layer in layers for w in layer.all_weights]
    names = [n.decode("utf8") if isinstance(n, bytes) else str(n) for n in group.attrs.get("weight_names", [])]
    by_name = {_short_name(n): n for n in names}
    shorts = [_short_name(w.name) for w in weights]
    if set(by_name) <= set(shorts) and all(s in by_name or s in NEUTRAL for s in shorts):
        arrays = [(by_name[s], group[by_name[s]][()]) if s in by_name else (s, np.full(w.shape, NEUTRAL[s]))
                  for s, w in zip(shorts, weights)]
    elif len(names) == len(weights):
        arrays = [(n, group[n][()]) for n in names]
    else:
        raise ModelLoadError(f"{where}: its weight group holds {len(names)} arrays ({', '.join(names) or 'none'}), "
                             f"the layer has {len(weights)} weights ({', '.join(shorts)}); the file is damaged "
                             "or from another network: save it again")
    for w, (n, a) in zip(weights, arrays):
        a = np.asarray(a, np.float32)
        if a.shape != tuple(w.shape):
            if a.squeeze().shape != tuple(s for s in w.shape if s != 1):    # TL 2.0/2.1 BatchNorm (1,1,1,C)
                raise ModelLoadError(f"{where}: array {n!r} has shape {a.shape}, weight {w.name} expects "
                                     f"{tuple(w.shape)}; the file is damaged or from another network")
            a = a.reshape(tuple(w.shape))
        w.assign(a)


def _wire(calls, tensors):
    """Call each layer on its inputs, node after node (`prev_layer`: one entry per call), as soon as
    they exist: a layer shared by two calls is listed once, before what its second call reads."""
    while calls:
        progress = False
        for call in calls:
            fn, prevs, where = call
            while prevs and all(p in tensors for p in _inputs(prevs[0])):
                prev = prevs.pop(0)
                try:
                    out = fn([tensors[p] for p in prev] if isinstance(prev, list) else tensors[prev])
                except Exception as e:
                    raise ModelLoadError(f"{where}: does not fit its inputs: {_why(e)}; the file is damaged or "
                                         "from another TensorLayer: save it again") from e
                tensors[out._info[0].name] = out
                progress = True
        if not progress:
            fn, prevs, where = calls[0]
            missing = [p for p in _inputs(prevs[0]) if p not in tensors]
            raise ModelLoadError(f"{where}: reads {missing[0]!r}, which no layer makes; the file is damaged: "
                                 "save it again")
        calls = [c for c in calls if c[1]]


def build(path, text):
    """A TensorLayer `Model.save` file and its model_config text -> the TensorLayer model."""
    cfg = read_config(text, f"{path}: model_config")       # refusals before TensorFlow loads
    import h5py
    import tensorlayer as tl
    fast_layer_init()
    with h5py.File(path, "r") as f:
        if "layer_names" not in f.attrs:
            raise ModelLoadError(f"{path}: a TensorLayer architecture without weights (saved with "
                                 "save_weights=False); save it with Model.save(path, save_weights=True)")
        tensors, calls, weighted = {}, [], []
        for i, entry in enumerate(cfg["model_architecture"]):
            name = entry["args"].get("name")
            where = f"{path}: model_architecture[{i}] (layer {name!r}, {entry['class']})"
            if entry["class"] == "_InputLayer":
                t = _input(tl, entry, where)
                tensors[t._info[0].name] = t
                continue
            if name not in f:
                raise ModelLoadError(f"{where}: no weight group {name!r} in the file; save it again with "
                                     "Model.save(path, save_weights=True)")
            fn, layers = _layer(tl, entry, f[name].attrs.get("weight_names", []), where)
            calls.append((fn, list(entry.get("prev_layer") or []), where))
            weighted.append((layers, f[name], where))
        _wire(calls, tensors)
        for layers, group, where in weighted:
            _assign(layers, group, where)
    ends = []
    for key in ("inputs", "outputs"):
        names = cfg.get(key)
        names = names if isinstance(names, list) else [names]
        bad = [n for n in names if n not in tensors]
        if bad:
            raise ModelLoadError(f"{path}: model_config {key} names {bad[0]!r}, which no layer makes; the file "
                                 "is damaged: save it again")
        ends.append([tensors[n] for n in names] if len(names) > 1 else tensors[names[0]])
    return tl.models.Model(inputs=ends[0], outputs=ends[1])


def from_tensorlayer_h5(path, text, opset=None, batch=1, input_shape=None, weights=None):
    if weights is not None:
        raise ModelLoadError(f"{path}: a TensorLayer Model.save file holds its own weights; drop --weights")
    return from_tensorlayer(build(path, text), input_shape=input_shape, opset=opset, batch=batch)
