"""MediaPipe's pooling custom ops in standard ONNX: MaxPool with its Indices output, MaxUnpool.

The TFLite front-end (`tflite.py`) hands these ops to tf2onnx as nodes of domain "mediapipe"
(types TFL_MaxPoolingWithArgmax2D / TFL_MaxUnpooling2D, NHWC, their TfLitePoolParams as the
integer attributes PARAMS); `to_standard_ops` replaces them. No TensorFlow here.

MediaPipe's kernels (mediapipe/util/tflite/operations/max_pool_argmax.cc, max_unpooling.cc):
  * MaxPoolingWithArgmax2D(x) -> (values, indices): TFLite's max pool (output size and top/left
    padding as TFLite's SAME/VALID; taps outside the map skipped); the first maximum in the
    window's row-major order wins (strict >); values clamped by the fused activation (Relu,
    ReluN1To1, Relu6; the others clamp nothing); index = (y - y0) * filter_w + (x - x0) + 0.1
    as a float, (y0, x0) the window's origin.
  * MaxUnpooling2D(values, indices) -> a zero map of H*filter_h x W*filter_w; each value is
    written at (i*stride_h - pad_top + idx // filter_w, j*stride_w - pad_left + idx % filter_w),
    pad computed as TFLite's for that output size (whatever the padding option); windows in
    row-major order, a later write wins.
ONNX MaxPool's Indices are flat positions in the input map; the same first-maximum rule
(onnxruntime compares with >). MaxUnpool writes each value at its flat index (a later one wins,
in the same order). So MaxUnpooling2D of a MaxPoolingWithArgmax2D's indices is MaxUnpool of
MaxPool's Indices, exactly, when the unpooling decodes the indices with the pool's window
(filter_w, strides, top/left padding) into a map the pool's input size; the indices feed
nothing else (the local float indices themselves have no counterpart). Anything else is refused.
"""
import numpy as np
from onnx import helper, numpy_helper, shape_inference

from tl2k210.errors import ModelLoadError

DOMAIN = "mediapipe"
POOL, UNPOOL = "MaxPoolingWithArgmax2D", "MaxUnpooling2D"
OPS = (POOL, UNPOOL)
#: the leading int32 fields of TfLitePoolParams, in the struct's order
PARAMS = ("padding", "stride_w", "stride_h", "filter_w", "filter_h", "activation")
SAME, VALID = 1, 2                                  # TfLitePadding
CLIP = {2: (-1.0, 1.0), 3: (0.0, 6.0)}     # TfLiteFusedActivation ReluN1To1, Relu6 (1 is Relu)
NCHW, NHWC = [0, 3, 1, 2], [0, 2, 3, 1]


def tf2onnx_custom_ops():
    """tf2onnx's `custom_ops` argument that keeps the ops as nodes of DOMAIN."""
    return {"TFL_" + op: DOMAIN for op in OPS}


def _pad(stride, in_size, filt, out_size):
    """tflite::ComputePadding (dilation 1): the top/left padding."""
    return max(((out_size - 1) * stride + filt - in_size) // 2, 0)


def _params(node, where):
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    missing = [k for k in PARAMS if not isinstance(a.get(k), int)]
    if missing:
        raise ModelLoadError(f"{where}: {node.op_type[4:]} {node.output[0]!r} has no {', '.join(missing)} in its "
                             "options (MediaPipe's TfLitePoolParams); the file is not as MediaPipe writes it")
    return {k: a[k] for k in PARAMS}


class _Mapper:
    def __init__(self, model, where):
        self.g, self.where = model.graph, where
        if DOMAIN not in {o.domain for o in model.opset_import}:
            model.opset_import.append(helper.make_opsetid(DOMAIN, 1))     # dropped again at the end
        known = shape_inference.infer_shapes(model).graph      # tf2onnx states only some shapes
        self.shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                       for v in (*known.input, *known.value_info, *known.output)}
        self.pools = {}             # indices tensor -> what the unpooling needs to know
        self.inits = []

    def shape(self, node, t):
        s = self.shapes.get(t)
        if not s or len(s) != 4 or min(s) <= 0:
            raise ModelLoadError(f"{self.where}: {node.op_type[4:]} {node.output[0]!r}: tensor {t!r} has no "
                                 f"static 4-D NHWC shape ({s}); give the model a fixed input size")
        return s

    def const(self, value, name):
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def pool(self, n):
        p, (x,), (values, indices) = _params(n, self.where), n.input, n.output
        N, H, W, C = self.shape(n, x)
        fh, fw, sh, sw = p["filter_h"], p["filter_w"], p["stride_h"], p["stride_w"]
        if p["padding"] not in (SAME, VALID) or min(fh, fw, sh, sw) < 1:
            raise ModelLoadError(f"{self.where}: {POOL} {values!r}: options {p} are not a pool MediaPipe runs "
                                 "(padding 1 SAME or 2 VALID, filter and strides >= 1)")
        if p["padding"] == SAME:
            oh, ow = -(-H // sh), -(-W // sw)
        else:
            oh, ow = (H - fh + sh) // sh, (W - fw + sw) // sw
        if min(oh, ow) < 1:
            raise ModelLoadError(f"{self.where}: {POOL} {values!r}: a {fh}x{fw} VALID window does not fit the "
                                 f"{H}x{W} map")
        top, left = _pad(sh, H, fh, oh), _pad(sw, W, fw, ow)
        pads = [top, left, max((oh - 1) * sh + fh - H - top, 0), max((ow - 1) * sw + fw - W - left, 0)]
        xt, vt, it = values + "/nchw_input", values + "/nchw", indices + "/onnx"
        out = [helper.make_node("Transpose", [x], [xt], name=xt, perm=NCHW),
               helper.make_node("MaxPool", [xt], [vt, it], name=n.name or values, kernel_shape=[fh, fw],
                                strides=[sh, sw], pads=pads)]
        act = p["activation"]
        if act == 1:
            out.append(helper.make_node("Relu", [vt], [vt + "/relu"], name=values + "/activation"))
            vt += "/relu"
        elif act in CLIP:
            lo, hi = (self.const(np.float32(b), f"{values}/{k}") for b, k in zip(CLIP[act], ("min", "max")))
            out.append(helper.make_node("Clip", [vt, lo, hi], [vt + "/clip"], name=values + "/activation"))
            vt += "/clip"
        out.append(helper.make_node("Transpose", [vt], [values], name=values + "/nhwc", perm=NHWC))
        self.pools[indices] = dict(node=values, onnx=it, window=(fw, sh, sw, top, left), input_hw=(H, W),
                                   out=(N, oh, ow, C), kernel=[fh, fw], strides=[sh, sw], pads=pads)
        return out

    def unpool(self, n):
        p, (v, indices), (y,) = _params(n, self.where), n.input, n.output
        pool = self.pools.get(indices)
        if pool is None:
            raise ModelLoadError(f"{self.where}: {UNPOOL} {y!r} reads indices {indices!r} that no "
                                 f"{POOL} wrote (directly); only that pairing has an ONNX form: refused")
        N, h, w, C = self.shape(n, v)
        fh, fw, sh, sw = p["filter_h"], p["filter_w"], p["stride_h"], p["stride_w"]
        H, W = h * fh, w * fw
        window = (fw, sh, sw, _pad(sh, H, fh, h), _pad(sw, W, fw, w))
        if [N, h, w, C] != list(pool["out"]) or window != pool["window"] or (H, W) != pool["input_hw"]:
            raise ModelLoadError(
                f"{self.where}: {UNPOOL} {y!r} decodes the indices of {POOL} {pool['node']!r} otherwise than "
                f"they were made: values {[N, h, w, C]} vs {list(pool['out'])}, (filter_w, stride_h, stride_w, "
                f"pad_top, pad_left) {window} vs {pool['window']}, output {H}x{W} vs the pooled map's "
                f"{pool['input_hw'][0]}x{pool['input_hw'][1]}; MediaPipe then writes values at positions no "
                "ONNX MaxUnpool reproduces: refused")
        vt, yt = y + "/nchw_input", y + "/nchw"
        (fh, fw), (sh, sw), (pt, pl, pb, pr) = pool["kernel"], pool["strides"], pool["pads"]
        ins = [vt, pool["onnx"]]
        if ((h - 1) * sh + fh - pt - pb, (w - 1) * sw + fw - pl - pr) != (H, W):    # not MaxUnpool's default
            ins.append(self.const(np.array([N, C, H, W], np.int64), y + "/output_shape"))
        return [helper.make_node("Transpose", [v], [vt], name=vt, perm=NCHW),
                helper.make_node("MaxUnpool", ins, [yt], name=n.name or y, kernel_shape=pool["kernel"],
                                 strides=pool["strides"], pads=pool["pads"]),
                helper.make_node("Transpose", [yt], [y], name=y + "/nhwc", perm=NHWC)]

    def check_indices_use(self, nodes):
        for n in nodes:
            for i in n.input:
                if i in self.pools and not (n.domain == DOMAIN and n.op_type == "TFL_" + UNPOOL):
                    self._refuse_use(i, f"node {n.name or n.output[0]!r} ({n.op_type})")
        for o in self.g.output:
            if o.name in self.pools:
                self._refuse_use(o.name, "a graph output")

    def _refuse_use(self, indices, who):
        raise ModelLoadError(f"{self.where}: the indices {indices!r} of {POOL} {self.pools[indices]['node']!r} "
                             f"are read by {who}; only {UNPOOL} reads them in ONNX form (MediaPipe's window-local "
                             "float indices are not kept): refused")


def to_standard_ops(model, where):
    """`model` (an onnx.ModelProto from tf2onnx) with its DOMAIN nodes in standard ONNX ops (in
    place; returned). Raises ModelLoadError naming the node for what has no exact ONNX form."""
    g = model.graph
    if not any(n.domain == DOMAIN for n in g.node):
        return model
    m = _Mapper(model, where)
    ours = [n for n in g.node if n.domain == DOMAIN]
    for n in ours:
        if n.op_type not in ("TFL_" + POOL, "TFL_" + UNPOOL):
            raise ModelLoadError(f"{where}: {n.op_type} {n.output[0]!r} of domain {DOMAIN} has no ONNX form")
    new = {id(n): m.pool(n) for n in ours if n.op_type == "TFL_" + POOL}      # pools first: the
    new.update({id(n): m.unpool(n) for n in ours if n.op_type == "TFL_" + UNPOOL})   # unpoolings read them
    m.check_indices_use(g.node)
    new = [x for n in g.node for x in new.get(id(n), [n])]
    del g.node[:]
    g.node.extend(new)
    g.initializer.extend(m.inits)
    kept = [v for v in g.value_info if v.name not in m.pools]
    del g.value_info[:]
    g.value_info.extend(kept)
    imports = [o for o in model.opset_import if o.domain != DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(imports)
    return model
