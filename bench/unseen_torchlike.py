"""Round 49's never-seen models (`bench/unseen_models.py --set 5`): ONNX files as PyTorch's
TorchScript exporter writes them (opsets 11, 13, 17, and 18 as the dynamo exporter's default),
written node by node with onnx.helper since the venv has no torch -- torchvision-style
MobileNetV3-small / ShuffleNetV2 / MnasNet / RegNet / EfficientNet-B0 nets, F.interpolate
bilinear with align_corners True and False, nn.Upsample nearest, PixelShuffle (DepthToSpace CRD)
and PixelUnshuffle (6-D reshape-permute-reshape), HardSigmoid / HardSwish, channel shuffle by
view / transpose, adaptive average pooling to 2x2, `x.view(x.size(0), -1)` (Shape-Gather-
Unsqueeze-Concat-Reshape) and torch.flatten + Linear heads, reflection padding, concats of four
branches, dynamic batch axes -- and onnxruntime.quantization's int8 files of some of them
(quantize_static QDQ and QOperator, per-channel and per-tensor, and quantize_dynamic).

Weights are seeded; every conv and linear layer is rescaled on the 12 photos as it is added (the
recalibration of a BatchNorm the exporter folded into the conv), so activations are realistic."""
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def _photos(h, w):
    import devcorpus
    return devcorpus.photos(h, w, 3, 0.0, 1.0).astype(np.float32).transpose(0, 3, 1, 2).copy()


class Net:
    """A graph being written: each layer is a method returning its output's name."""

    def __init__(self, h, w, opset=13, dynamic_batch=False, seed=0):
        self.h, self.w, self.opset = h, w, opset
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0
        self.batch = "batch_size" if dynamic_batch else 1
        self.inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, [self.batch, 3, h, w])
        self.x = _photos(h, w)
        self.cache = {}

    def name(self, p):
        self.n += 1
        return f"{p}_{self.n}"

    def const(self, a, p="c"):
        n = self.name(p)
        self.inits.append(numpy_helper.from_array(np.asarray(a), n))
        return n

    def node(self, op, ins, n_out=1, **attrs):
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, ins, outs, name=self.name(op), **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, outputs, shapes=None):
        shapes = shapes or [None] * len(outputs)
        g = helper.make_graph(self.nodes, "torch_jit", [self.inp],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, s) for o, s in zip(outputs, shapes)],
                              self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)],
                              producer_name="pytorch", producer_version="2.3.0")
        m.ir_version = 8
        return m

    def final(self, outputs):
        """The model with its outputs' shapes, as the exporter writes them."""
        return self.model(outputs, [[self.batch] + list(self.shape(o)) for o in outputs])

    def val(self, t):
        """t's value on the 12 photos (one at a time: reshapes may say batch 1)."""
        s = ort.InferenceSession(self.model([t]).SerializeToString(), providers=["CPUExecutionProvider"])
        return np.concatenate([s.run(None, {"input": self.x[i:i + 1]})[0] for i in range(len(self.x))])

    def shape(self, t):
        return self.val(t).shape[1:]

    # ------------------------------------------------------------ layers
    def _affine(self, op, ins, w, b, cout, axis, **attrs):
        """Adds op(ins, W, B), then rescales W and B so each output channel has a BN-like
        mean and spread on the photos."""
        wn, bn = self.const(w.astype(np.float32), "weight"), self.const(b.astype(np.float32), "bias")
        y = self.node(op, ins + [wn, bn], **attrs)
        v = self.val(y)
        red = tuple(i for i in range(v.ndim) if i != axis)
        m, s = v.mean(red), v.std(red) + 1e-5
        gam, beta = self.rng.uniform(0.6, 1.4, cout), self.rng.uniform(-0.2, 0.2, cout)
        k = gam / s
        wsh = (-1,) + (1,) * (w.ndim - 1) if op == "Conv" else (-1, 1)
        w2 = w * k.reshape(wsh)
        b2 = (b - m) * k + beta
        for t in self.inits:
            if t.name == wn:
                t.CopyFrom(numpy_helper.from_array(w2.astype(np.float32), wn))
            if t.name == bn:
                t.CopyFrom(numpy_helper.from_array(b2.astype(np.float32), bn))
        return y

    def conv(self, x, cout, k=3, s=1, g=1, d=1, p=None):
        cin = self.shape(x)[0]
        kh, kw = (k, k) if isinstance(k, int) else k
        p = [d * (kh - 1) // 2, d * (kw - 1) // 2] if p is None else p
        w = self.rng.normal(0, 1, (cout, cin // g, kh, kw))
        return self._affine("Conv", [x], w, np.zeros(cout), cout, 1, kernel_shape=[kh, kw], strides=[s, s],
                            pads=p + p, dilations=[d, d], group=g)

    def linear(self, x, cout):
        cin = self.shape(x)[-1]
        w = self.rng.normal(0, 1, (cout, cin))
        return self._affine("Gemm", [x], w, np.zeros(cout), cout, 1, alpha=1.0, beta=1.0, transB=1)

    def act(self, x, a):
        if a == "relu":
            return self.node("Relu", [x])
        if a == "relu6":
            if self.opset < 11:
                return self.node("Clip", [x], min=0.0, max=6.0)
            return self.node("Clip", [x, self.const(np.float32(0)), self.const(np.float32(6))])
        if a == "hsig":
            return self.node("HardSigmoid", [x], alpha=1 / 6, beta=0.5)
        if a == "hswish":
            if self.opset >= 14:
                return self.node("HardSwish", [x])
            return self.node("Mul", [x, self.node("HardSigmoid", [x], alpha=1 / 6, beta=0.5)])
        if a == "silu":
            return self.node("Mul", [x, self.node("Sigmoid", [x])])
        if a == "sigmoid":
            return self.node("Sigmoid", [x])
        assert a is None
        return x

    def cba(self, x, cout, k=3, s=1, g=1, a="relu", d=1, p=None):
        return self.act(self.conv(x, cout, k, s, g, d, p), a)

    def se(self, x, r, inner="relu", gate="hsig"):
        c = self.shape(x)[0]
        p = self.node("GlobalAveragePool", [x])
        q = self.act(self.conv(p, max(8, c // r), 1), inner)
        return self.node("Mul", [x, self.act(self.conv(q, c, 1), gate)])

    def split(self, x, parts, axis=1):
        if self.opset >= 13:
            return self.node("Split", [x, self.const(np.array(parts, np.int64))], n_out=len(parts), axis=axis)
        return self.node("Split", [x], n_out=len(parts), axis=axis, split=parts)

    def reshape(self, x, shape):
        return self.node("Reshape", [x, self.const(np.array(shape, np.int64))])

    def shuffle(self, x, g=2):
        c, h, w = self.shape(x)
        y = self.reshape(x, [1, g, c // g, h, w])
        y = self.node("Transpose", [y], perm=[0, 2, 1, 3, 4])
        return self.reshape(y, [1, c, h, w])

    def view_flat(self, x):
        """x.view(x.size(0), -1) as the TorchScript exporter writes it."""
        s = self.node("Shape", [x])
        n = self.node("Gather", [s, self.const(np.array(0, np.int64))], axis=0)
        if self.opset >= 13:
            u = self.node("Unsqueeze", [n, self.const(np.array([0], np.int64))])
        else:
            u = self.node("Unsqueeze", [n], axes=[0])
        cat = self.node("Concat", [u, self.const(np.array([-1], np.int64))], axis=0)
        return self.node("Reshape", [x, cat])

    def resize(self, x, scale=None, size=None, mode="linear", ct="pytorch_half_pixel"):
        roi = self.const(np.array([], np.float32))
        extra = {"nearest_mode": "floor"} if mode == "nearest" else {}
        if size is not None:
            c = self.shape(x)[0]
            return self.node("Resize", [x, roi, "", self.const(np.array([1, c] + list(size), np.int64))],
                             mode=mode, coordinate_transformation_mode=ct, cubic_coeff_a=-0.75, **extra)
        return self.node("Resize", [x, roi, self.const(np.array([1, 1, scale, scale], np.float32))],
                         mode=mode, coordinate_transformation_mode=ct, cubic_coeff_a=-0.75, **extra)

    def mean_hw(self, x):
        """x.mean([2, 3]): ReduceMean's axes an attribute before opset 18, an input from it."""
        if self.opset >= 18:
            return self.node("ReduceMean", [x, self.const(np.array([2, 3], np.int64))], keepdims=0)
        return self.node("ReduceMean", [x], axes=[2, 3], keepdims=0)


# ---------------------------------------------------------------- the nets
def mnv3_small_t():
    n = Net(112, 112, opset=13, dynamic_batch=True, seed=1)
    x = n.cba("input", 16, 3, 2, a="hswish")
    x = n.se(n.cba(x, 16, 3, 2, g=16), 4)
    x = n.conv(x, 16, 1)

    def ir(x, cexp, cout, k, s, a, se):
        y = n.cba(x, cexp, 1, a=a)
        y = n.cba(y, cexp, k, s, g=cexp, a=a)
        if se:
            y = n.se(y, 4)
        y = n.conv(y, cout, 1)
        return n.node("Add", [x, y]) if s == 1 and n.shape(x)[0] == cout else y
    x = ir(x, 72, 24, 3, 2, "relu", False)
    x = ir(x, 88, 24, 3, 1, "relu", False)
    x = ir(x, 96, 40, 5, 2, "hswish", True)
    x = ir(x, 240, 40, 5, 1, "hswish", True)
    x = ir(x, 120, 48, 5, 1, "hswish", True)
    x = ir(x, 288, 96, 5, 2, "hswish", True)
    x = n.cba(x, 576, 1, a="hswish")
    x = n.node("Flatten", [n.node("GlobalAveragePool", [x])], axis=1)
    x = n.act(n.linear(x, 256), "hswish")
    return n.final([n.linear(x, 100)])


def shufflenet_v2_t():
    n = Net(96, 96, opset=11, seed=2)
    x = n.cba("input", 24, 3, 2)
    x = n.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])

    def unit(x, c, s):
        if s == 1:
            a, b = n.split(x, [c // 2, c // 2])
        else:
            a = n.conv(n.conv(x, n.shape(x)[0], 3, 2, g=n.shape(x)[0]), c // 2, 1)
            a, b = n.act(a, "relu"), x
        b = n.cba(b, c // 2, 1)
        b = n.conv(b, c // 2, 3, s, g=c // 2)
        b = n.cba(b, c // 2, 1)
        return n.shuffle(n.node("Concat", [a, b], axis=1))
    for c, reps in ((48, 2), (96, 3), (192, 2)):
        x = unit(x, c, 2)
        for _ in range(reps):
            x = unit(x, c, 1)
    x = n.cba(x, 512, 1)
    x = n.node("GlobalAveragePool", [x])
    return n.final([n.linear(n.view_flat(x), 10)])


def mnasnet_t():
    n = Net(96, 96, opset=17, seed=3)
    x = n.cba("input", 16, 3, 2)
    x = n.cba(x, 16, 3, 1, g=16)
    x = n.conv(x, 8, 1)

    def ir(x, cout, k, s, t):
        c = n.shape(x)[0]
        y = n.cba(x, c * t, 1)
        y = n.cba(y, c * t, k, s, g=c * t)
        y = n.conv(y, cout, 1)
        return n.node("Add", [x, y]) if s == 1 and c == cout else y
    for cout, k, s, t in ((16, 3, 2, 3), (16, 3, 1, 3), (24, 5, 2, 3), (24, 5, 1, 3), (48, 5, 2, 6),
                          (48, 5, 1, 6), (64, 3, 1, 6), (96, 5, 2, 6)):
        x = ir(x, cout, k, s, t)
    x = n.cba(x, 640, 1)
    return n.final([n.linear(n.mean_hw(x), 20)])


def regnet_t():
    n = Net(128, 128, opset=13, seed=4)
    x = n.cba("input", 24, 3, 2)

    def block(x, c, s, gw=8):
        cin = n.shape(x)[0]
        y = n.cba(x, c, 1)
        y = n.cba(y, c, 3, s, g=c // gw)
        y = n.se(y, 4, "relu", "sigmoid")
        y = n.conv(y, c, 1)
        sc = n.conv(x, c, 1, s) if (s != 1 or cin != c) else x
        return n.act(n.node("Add", [sc, y]), "relu")
    for c, d in ((24, 1), (56, 2), (152, 2), (368, 1)):
        x = block(x, c, 2)
        for _ in range(d - 1):
            x = block(x, c, 1)
    x = n.node("Flatten", [n.node("GlobalAveragePool", [x])], axis=1)
    return n.final([n.linear(x, 10)])


def effnet_b0_t():
    n = Net(96, 96, opset=13, seed=5)
    x = n.cba("input", 32, 3, 2, a="silu")

    def mb(x, cout, k, s, t):
        c = n.shape(x)[0]
        y = n.cba(x, c * t, 1, a="silu") if t != 1 else x
        y = n.cba(y, c * t, k, s, g=c * t, a="silu")
        y = n.se(y, 4 * t, "silu", "sigmoid")
        y = n.conv(y, cout, 1)
        return n.node("Add", [x, y]) if s == 1 and c == cout else y
    for cout, k, s, t in ((16, 3, 1, 1), (24, 3, 2, 6), (24, 3, 1, 6), (40, 5, 2, 6), (40, 5, 1, 6),
                          (80, 3, 2, 6), (112, 5, 1, 6), (192, 5, 2, 6), (320, 3, 1, 6)):
        x = mb(x, cout, k, s, t)
    x = n.cba(x, 640, 1, a="silu")
    x = n.node("Flatten", [n.node("GlobalAveragePool", [x])], axis=1)
    return n.final([n.linear(x, 10)])


def unet_align_corners():
    """F.interpolate(scale_factor=2, mode='bilinear', align_corners=True) in a U-Net decoder."""
    n = Net(96, 96, opset=11, seed=6)
    e1 = n.cba(n.cba("input", 16), 16)
    e2 = n.cba(n.cba(n.node("MaxPool", [e1], kernel_shape=[2, 2], strides=[2, 2]), 32), 32)
    e3 = n.cba(n.cba(n.node("MaxPool", [e2], kernel_shape=[2, 2], strides=[2, 2]), 64), 64)
    d2 = n.resize(e3, 2.0, ct="align_corners")
    d2 = n.cba(n.cba(n.node("Concat", [d2, e2], axis=1), 32), 32)
    d1 = n.resize(d2, 2.0, ct="align_corners")
    d1 = n.cba(n.cba(n.node("Concat", [d1, e1], axis=1), 16), 16)
    return n.final([n.conv(d1, 2, 1)])


def fpn_half_pixel():
    """F.interpolate(size=..., mode='bilinear', align_corners=False) and nn.Upsample(nearest)."""
    n = Net(128, 128, opset=13, seed=7)
    c1 = n.cba("input", 16, 3, 2)
    c2 = n.cba(c1, 32, 3, 2)
    c3 = n.cba(c2, 64, 3, 2)
    c4 = n.cba(c3, 96, 3, 2)
    p4 = n.conv(c4, 32, 1)
    p3 = n.node("Add", [n.conv(c3, 32, 1), n.resize(p4, 2.0, mode="nearest", ct="asymmetric")])
    p2 = n.node("Add", [n.conv(c2, 32, 1), n.resize(p3, size=[32, 32])])
    p2 = n.cba(p2, 32, 3)
    return n.final([n.conv(p2, 4, 1), n.conv(p4, 4, 1)])


def espcn_pixelshuffle():
    """nn.PixelShuffle(2): DepthToSpace mode CRD."""
    n = Net(96, 96, opset=11, seed=8)
    x = n.cba("input", 32, 5, a="relu")
    x = n.cba(x, 16, 3, a="relu")
    x = n.conv(x, 3 * 4, 3)
    x = n.node("DepthToSpace", [x], blocksize=2, mode="CRD")
    return n.final([n.act(x, "sigmoid")])


def pixel_unshuffle_net():
    """nn.PixelUnshuffle(2) (6-D view-permute-reshape) at the input, reflection padding, a
    four-branch cat and adaptive_avg_pool2d(2) + torch.flatten + Linear."""
    n = Net(128, 128, opset=13, seed=9)
    x = n.reshape("input", [1, 3, 64, 2, 64, 2])
    x = n.node("Transpose", [x], perm=[0, 1, 3, 5, 2, 4])
    x = n.reshape(x, [1, 12, 64, 64])
    x = n.node("Pad", [x, n.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], mode="reflect")
    x = n.cba(x, 32, 3, 2, p=[0, 0])
    br = [n.cba(x, 16, 1), n.cba(x, 16, 3), n.cba(x, 16, 3, d=2), n.cba(x, 16, (1, 5), p=[0, 2])]
    x = n.node("Concat", br, axis=1)
    x = n.cba(x, 64, 3, 2)
    x = n.cba(x, 96, 3, 2)
    x = n.node("AveragePool", [x], kernel_shape=[4, 4], strides=[4, 4])   # adaptive 8x8 -> 2x2
    x = n.node("Flatten", [x], axis=1)
    return n.final([n.linear(n.act(n.linear(x, 128), "relu"), 5)])


def dynamo_like():
    """Opset 18 as torch.onnx.export(dynamo=True) writes by default: HardSwish, ReduceMean with
    axes as an input, Clip with min/max inputs, dynamic batch."""
    n = Net(96, 96, opset=18, dynamic_batch=True, seed=10)
    x = n.cba("input", 16, 3, 2, a="hswish")
    x = n.cba(x, 32, 3, 2, a="relu6")
    x = n.cba(x, 32, 3, 1, g=32, a="relu6")
    x = n.cba(x, 64, 1, a="hswish")
    x = n.cba(x, 64, 3, 2, g=64, a="hswish")
    x = n.se(x, 4)
    x = n.cba(x, 128, 1, a="hswish")
    return n.final([n.linear(n.mean_hw(x), 10)])


FLOAT5 = {"mnv3_small_t": mnv3_small_t, "shufflenet_v2_t": shufflenet_v2_t, "mnasnet_t": mnasnet_t,
          "regnet_t": regnet_t, "effnet_b0_t": effnet_b0_t, "unet_align_corners": unet_align_corners,
          "fpn_half_pixel": fpn_half_pixel, "espcn_pixelshuffle": espcn_pixelshuffle,
          "pixel_unshuffle_net": pixel_unshuffle_net, "dynamo_like": dynamo_like}
# onnxruntime.quantization of some: name: (float model, how)
QUANT5 = {"mnv3_small_t_qdq_pc": ("mnv3_small_t", "qdq_pc"),
          "regnet_t_qdq_pt_u8": ("regnet_t", "qdq_pt_u8"),
          "shufflenet_v2_t_qop_pc": ("shufflenet_v2_t", "qop_pc"),
          "effnet_b0_t_qop_pt": ("effnet_b0_t", "qop_pt"),
          "fpn_half_pixel_qdq_pc": ("fpn_half_pixel", "qdq_pc"),
          "mnasnet_t_dynamic": ("mnasnet_t", "dynamic")}


def quantize(src, dst, how):
    from onnxruntime import quantization as q

    class Reader(q.CalibrationDataReader):
        def __init__(self, x):
            self.it = iter([{"input": x[i:i + 1]} for i in range(len(x))])

        def get_next(self):
            return next(self.it, None)
    if how == "dynamic":
        return q.quantize_dynamic(src, dst, weight_type=q.QuantType.QInt8)
    m = onnx.load(src)
    h, w = (d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim[2:])
    fmt = q.QuantFormat.QDQ if how.startswith("qdq") else q.QuantFormat.QOperator
    act = q.QuantType.QUInt8 if how.endswith("u8") or how.startswith("qop") else q.QuantType.QInt8
    q.quantize_static(src, dst, Reader(_photos(h, w)), quant_format=fmt, per_channel=how.endswith("pc"),
                      activation_type=act, weight_type=q.QuantType.QInt8)


def build(out, only=()):
    import os
    os.makedirs(out, exist_ok=True)
    for name, f in FLOAT5.items():
        needed = not only or name in only or any(v[0] == name and k in only for k, v in QUANT5.items())
        if needed:
            onnx.save(f(), os.path.join(out, name + ".onnx"))
            print("wrote", name, flush=True)
    for name, (src, how) in QUANT5.items():
        if not only or name in only:
            quantize(os.path.join(out, src + ".onnx"), os.path.join(out, name + ".onnx"), how)
            print("wrote", name, flush=True)
