"""Evaluate nodes whose inputs are all constants (and Shape/Size of known shapes, so the shape
arithmetic TF graphs do at run time -- Shape, Gather, Concat, Slice... -- becomes constants); drop
Identity, inference-mode Dropout, Cast/CastLike to the type the tensor already has, a Pad of
nothing, a Resize or Reshape to the shape it has, x + 0 / x * 1 and the tiny eps of d * (d + eps)."""
import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tl2k210.errors import ModelLoadError
from tl2k210.graph import _onnx_attrs, infer_shapes, normalize_convs


def _quant_axis(g, n, attrs):
    """tf2onnx gives a per-axis quantized bias (1-D) the axis of its conv's weights (TFLite's
    quantized_dimension, 3 for a depthwise kernel): out of range for the bias. Its one axis is
    the one the scales run along."""
    if n.op in ("DequantizeLinear", "QuantizeLinear") and len(n.inputs) > 1:
        x, scale = g.const(n.inputs[0]), g.const(n.inputs[1])
        if x is not None and scale is not None and x.ndim == 1 and scale.size == x.size > 1 \
                and attrs.get("axis", 1) not in (0, -1):
            attrs["axis"] = 0
    return attrs


def _eval(g, n):
    if n.op == "DequantizeLinear":
        with np.errstate(invalid="ignore"):
            return _dead_channels(g, n, _evaluate(g, n))
    return _evaluate(g, n)


def _dead_channels(g, n, values):
    """A constant DequantizeLinear whose scale is not finite where every code is the zero point
    (tf2onnx's portrait_video: two layers of all-zero int8 weights, scale inf): the value 0 they
    stand for, not inf * 0 = NaN. Another code on such a scale is a broken file."""
    y = values[0]
    if np.all(np.isfinite(y)):
        return values
    q = np.asarray(g.const(n.inputs[0]))
    z = np.asarray(g.const(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else 0)
    if z.ndim == 1 and q.ndim > 1:          # per axis
        z = z.reshape([-1 if i == int(n.attrs.get("axis", 1)) % q.ndim else 1 for i in range(q.ndim)])
    dead = ~np.isfinite(y) & (q.astype(np.int64) == z.astype(np.int64))
    y = np.where(dead, np.float32(0), y)
    if not np.all(np.isfinite(y)):
        raise ModelLoadError(f"node {n.name!r} (DequantizeLinear): the file's scale for {n.inputs[0]!r} is not finite "
                             "where its codes are not the zero point: the quantized model is broken; export it again")
    return [y] + list(values[1:])


def _evaluate(g, n):
    inits = [numpy_helper.from_array(np.asarray(g.const(i)), i) for i in n.inputs if i]
    node = helper.make_node(n.op, n.inputs, n.outputs, **_quant_axis(g, n, _onnx_attrs(n)))
    outs = [helper.make_tensor_value_info(o, 0, None) for o in n.outputs]
    opset = g.meta.get("opset", 13)
    while True:
        model = helper.make_model(helper.make_graph([node], "fold", [], outs, inits),
                                  opset_imports=[helper.make_opsetid("", opset)])
        try:
            return ReferenceEvaluator(model).run(None, {})
        except RuntimeError as e:
            # the reference evaluator lacks some (op, version) pairs (e.g. DequantizeLinear-18);
            # the next version of such an op computes the same for these inputs
            if "No implementation" not in str(e) or opset >= onnx.defs.onnx_opset_version():
                raise
            opset += 1


def _shape_value(g, n):
    """Shape (opset-15 start/end included) or Size of a tensor whose shape is known, else None."""
    shape = g.shape(n.inputs[0])
    if shape is None or None in shape:
        return None
    if n.op == "Size":
        return np.array(int(np.prod(shape)), np.int64)
    r = len(shape)
    start, end = n.attrs.get("start", 0), n.attrs.get("end", r)
    return np.array(shape[max(-r, min(start, r)) if start >= 0 else max(0, r + start):
                          min(end, r) if end >= 0 else max(0, r + end)], np.int64)


def _same_type_cast(g, n):
    if n.op not in ("Cast", "CastLike") or not n.inputs or g.tensors.get(n.inputs[0]) is None:
        return False
    src = g.tensors[n.inputs[0]].dtype
    if n.op == "Cast":
        from tl2k210.graph import _DT
        to = _DT.get(n.attrs.get("to"))
        return to is not None and np.dtype(to) == src and g.tensors[n.inputs[0]].shape is not None
    other = g.tensors.get(n.inputs[1])
    return other is not None and other.dtype == src and g.tensors[n.inputs[0]].shape is not None


def _no_pad(g, n) -> bool:
    """A Pad of zero on every side (PyTorch's AvgPool export writes one before each pool): the
    tensor itself."""
    if n.op != "Pad" or g.tensors[n.inputs[0]].shape is None:
        return False
    p = n.attrs.get("pads") if len(n.inputs) < 2 or not n.inputs[1] else g.const(n.inputs[1])
    return p is not None and not np.any(np.asarray(p)) and (len(n.inputs) < 4 or not n.inputs[3])


def _same_shape_reshape(g, n) -> bool:
    """A Reshape to the shape its input has, a target a TF graph computes from Shape ops (Magenta's
    instance norms, once folded): between the layout changes push_transposes would cancel, it had
    kept a region of the map NHWC, and a reflect pad there had no form."""
    return n.op == "Reshape" and len(n.inputs) > 1 and g.const(n.inputs[1]) is not None and _keeps_shape(g, n)


def _same_size_resize(g, n) -> bool:
    """A Resize whose output has its input's shape (Keras' Resizing(256, 256) on a 256x256 input,
    the TF tutorials' resize_and_rescale): every coordinate mode but tf_crop_and_resize maps each
    output pixel onto its own input pixel, so it is the tensor itself."""
    return n.op == "Resize" and n.attrs.get("coordinate_transformation_mode") != "tf_crop_and_resize" and \
        _keeps_shape(g, n)


def _keeps_shape(g, n) -> bool:
    """Has `n`'s output the known shape of its input?"""
    shape_in, shape_out = g.tensors[n.inputs[0]].shape, g.tensors[n.outputs[0]].shape
    return shape_in is not None and None not in shape_in and tuple(shape_in) == tuple(shape_out or ())


def _float_scalar(g, n):
    """The value of two-input node `n`'s second input where that is a float scalar constant and
    its first is not a constant, else None."""
    if len(n.inputs) != 2 or g.const(n.inputs[0]) is not None:
        return None
    k = g.const(n.inputs[1])
    if k is None or np.size(k) != 1 or not np.issubdtype(np.asarray(k).dtype, np.floating):
        return None
    return float(np.asarray(k).reshape(()))


def _no_arithmetic(g, n) -> bool:
    """x + 0, x - 0, x * 1, x / 1 of a scalar constant (onnx.js's exports add 0.0 after each
    upsampling) whose broadcast leaves x's shape: x itself."""
    k = _float_scalar(g, n) if n.op in ("Add", "Sub", "Mul", "Div") else None
    if k is None:
        return False
    x, y = g.tensors[n.inputs[0]], g.tensors[n.outputs[0]]
    if x.shape is None or y.shape is None or tuple(x.shape) != tuple(y.shape):
        return False
    return k == (0.0 if n.op in ("Add", "Sub") else 1.0)


#: the largest eps `_guarded_square` drops: it moves each product by eps * |d|, and a mean of the
#: products of a centred d by eps * mean(d) = 0
SQUARE_GUARD_MAX = 1e-6


def _guarded_square(g, n) -> bool:
    """d + eps read only by d * (d + eps) (onnx.js's instance norm squares its centred map so, eps
    1e-9): d * d within float32 rounding, and the square the normalization patterns expect."""
    k = _float_scalar(g, n) if n.op == "Add" else None
    users = g.consumers(n.outputs[0])
    if k is None or abs(k) > SQUARE_GUARD_MAX or len(users) != 1:
        return False
    m = users[0]
    return m.op == "Mul" and sorted(m.inputs) == sorted([n.inputs[0], n.outputs[0]]) and \
        g.shape(n.inputs[0]) == g.shape(n.outputs[0])


def fold_constants(g, log):
    """Repeat: fold everything foldable, re-infer shapes (a folded Reshape target makes the next
    Shape foldable: TF graphs with a dynamic batch compute their shapes at run time)."""
    changed = True
    while changed:
        changed = _fold_round(g, log)
        if changed:
            g.prune()
            infer_shapes(g)
    normalize_convs(g)      # a 'SAME' conv whose input's shape was computed at run time
    return g


def _fold_round(g, log):
    changed = True
    any_change = False
    while changed:
        changed = False
        for n in list(g.nodes):
            src = n.inputs[0] if n.inputs else ""
            keeps_name = n.outputs[0] in g.outputs and (src in g.inputs or src in g.outputs or g.const(src) is not None)
            passthrough = n.op in ("Identity", "Dropout") or _same_type_cast(g, n) or _no_pad(g, n) or \
                _same_size_resize(g, n) or _same_shape_reshape(g, n) or _no_arithmetic(g, n) or \
                _guarded_square(g, n)
            if passthrough and not keeps_name and \
                    not any(g.consumers(o) for o in n.outputs[1:]):
                g.nodes.remove(n)
                g.replace_uses(n.outputs[0], n.inputs[0])
                log(n.name, f"removed {n.op}" + (" to the same type" if n.op.startswith("Cast") else ""))
                changed = any_change = True
                continue
            if n.op in ("Shape", "Size") and (value := _shape_value(g, n)) is not None:
                values = [value]
            elif n.inputs and all(i == "" or g.const(i) is not None for i in n.inputs) and n.op not in (
                    "RandomNormal", "RandomUniform"):
                values = _eval(g, n)
            else:
                continue
            g.nodes.remove(n)
            for o, v in zip(n.outputs, values):
                v = np.asarray(v)
                g.tensors[o].value, g.tensors[o].shape, g.tensors[o].dtype = v, tuple(v.shape), v.dtype
            log(n.name, f"folded constant {n.op}")
            changed = any_change = True
    return any_change
