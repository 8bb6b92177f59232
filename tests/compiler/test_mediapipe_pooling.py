"""MediaPipe's MaxPoolingWithArgmax2D / MaxUnpooling2D custom ops (SegNet-style decoders of its
segmentation models): the front-end's ONNX form, against a numpy transcription of MediaPipe's
kernels, ties included; and the K210 flow's max_unpool pass (MaxUnpool of MaxPool's indices
without a scatter), against onnxruntime. TF-free except the one test that writes a TFLite file."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from devcorpus import PHOTOS
from front_helpers import make_model, ort_run
from tl2k210.errors import ModelLoadError
from tl2k210.frontends import mediapipe_ops

SAME, VALID = 1, 2


# ------------------------------------------------------------------ MediaPipe's kernels in numpy
def _pads(stride, in_size, filt, out_size):
    return max(((out_size - 1) * stride + filt - in_size) // 2, 0)


def mp_pool_argmax(x, padding, stride, filt, activation=0):
    """max_pool_argmax.cc's MaxPoolArgmax, loop for loop (NHWC, float indices)."""
    (sh, sw), (fh, fw) = stride, filt
    n, h, w, c = x.shape
    oh, ow = ((-(-h // sh), -(-w // sw)) if padding == SAME else ((h - fh + sh) // sh, (w - fw + sw) // sw))
    pt, pl = _pads(sh, h, fh, oh), _pads(sw, w, fw, ow)
    lo, hi = {1: (0, np.inf), 2: (-1, 1), 3: (0, 6)}.get(activation, (-np.inf, np.inf))
    out, idx = np.zeros((n, oh, ow, c), np.float32), np.zeros((n, oh, ow, c), np.float32)
    for b in range(n):
        for oy in range(oh):
            for ox in range(ow):
                for ch in range(c):
                    y0, x0 = oy * sh - pt, ox * sw - pl
                    best, by, bx = np.finfo(np.float32).min, 0, 0
                    for fy in range(max(0, -y0), min(fh, h - y0)):
                        for fx in range(max(0, -x0), min(fw, w - x0)):
                            if x[b, y0 + fy, x0 + fx, ch] > best:
                                best, by, bx = x[b, y0 + fy, x0 + fx, ch], fy, fx
                    out[b, oy, ox, ch] = min(max(best, lo), hi)
                    idx[b, oy, ox, ch] = by * fw + bx + np.float32(0.1)
    return out, idx


def mp_unpool(v, idx, stride, filt):
    """max_unpooling.cc's MaxUnpooling (output H*filter_h x W*filter_w)."""
    (sh, sw), (fh, fw) = stride, filt
    n, h, w, c = v.shape
    H, W = h * fh, w * fw
    pt, pl = _pads(sh, H, fh, h), _pads(sw, W, fw, w)
    out = np.zeros((n, H, W, c), np.float32)
    for b in range(n):
        for iy in range(h):
            for ix in range(w):
                for ch in range(c):
                    k = int(idx[b, iy, ix, ch])
                    out[b, iy * sh - pt + k // fw, ix * sw - pl + k % fw, ch] = v[b, iy, ix, ch]
    return out


def ties(shape, seed, levels=4):
    """Values on a coarse grid with many zeros (ReLU'd features): most windows hold a tie."""
    r = np.random.default_rng(seed)
    return np.maximum(r.integers(-levels, levels, shape), 0).astype(np.float32) * 0.5


def photos(folder, names):
    """scikit-image photos as RGB PNGs in a new `folder` (a --dataset)."""
    from PIL import Image
    from skimage import data
    folder.mkdir()
    for n in names:
        Image.fromarray(getattr(data, n)()).convert("RGB").save(folder / f"{n}.png")
    return folder


# ------------------------------------------------------------------ front-end: custom nodes -> ONNX
def _custom(op, inputs, outputs, padding, stride, filt, activation=0):
    return helper.make_node("TFL_" + op, inputs, outputs, name=outputs[0], domain=mediapipe_ops.DOMAIN,
                            padding=padding, stride_h=stride[0], stride_w=stride[1], filter_h=filt[0],
                            filter_w=filt[1], activation=activation)


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def mediapipe_graph(xshape, padding, stride, filt, activation=0, unpool_opts=None, outputs=("y",)):
    """What tf2onnx leaves of x -> MaxPoolingWithArgmax2D -> (p, idx) -> Relu(p) ->
    MaxUnpooling2D(., idx) -> y (NHWC; options as node attributes; shapes as value_info)."""
    p, _ = mp_pool_argmax(np.zeros(xshape, np.float32), padding, stride, filt)
    ustride, ufilt = unpool_opts or (stride, filt)
    yshape = (p.shape[0], p.shape[1] * ufilt[0], p.shape[2] * ufilt[1], p.shape[3])
    nodes = [_custom(mediapipe_ops.POOL, ["x"], ["p", "idx"], padding, stride, filt, activation),
             helper.make_node("Relu", ["p"], ["v"], name="v"),
             _custom(mediapipe_ops.UNPOOL, ["v", "idx"], ["y"], padding, ustride, ufilt)]
    shapes = {"p": p.shape, "idx": p.shape, "v": p.shape, "y": yshape}
    g = helper.make_graph(nodes, "t", [_vi("x", xshape)], [_vi(o, shapes[o]) for o in outputs],
                          value_info=[_vi(k, s) for k, s in shapes.items() if k not in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def mediapipe_reference(x, padding, stride, filt, activation=0, unpool_opts=None):
    p, idx = mp_pool_argmax(x, padding, stride, filt, activation)
    ustride, ufilt = unpool_opts or (stride, filt)
    return p, mp_unpool(np.maximum(p, 0), idx, ustride, ufilt)


@pytest.mark.parametrize("xshape,padding,stride,filt,activation", [
    ((1, 8, 6, 3), VALID, (2, 2), (2, 2), 0),
    ((2, 8, 6, 3), SAME, (2, 2), (2, 2), 3),         # batch 2; Relu6 on the pooled values
    ((1, 9, 12, 2), VALID, (3, 3), (3, 3), 2),       # 3x3 windows; ReluN1To1
    ((1, 6, 9, 2), VALID, (2, 3), (2, 3), 1)])       # non-square window
def test_mediapipe_pooling_is_maxpool_and_maxunpool(xshape, padding, stride, filt, activation):
    """The ONNX form equals MediaPipe's kernels bit for bit, on data full of ties (zeros after a
    ReLU, a coarse grid): the first maximum of a window wins in both."""
    m = mediapipe_ops.to_standard_ops(mediapipe_graph(xshape, padding, stride, filt, activation, outputs=("y", "p")),
                                      "t.tflite")
    assert {n.op_type for n in m.graph.node} >= {"MaxPool", "MaxUnpool"}
    assert not any(n.domain for n in m.graph.node)
    for seed in range(3):
        x = ties(xshape, seed) - (0.5 if seed == 2 else 0)     # seed 2: negative maxima too
        y, p = ort_run(m, x)
        ref_p, ref_y = mediapipe_reference(x, padding, stride, filt, activation)
        np.testing.assert_array_equal(p, ref_p)
        np.testing.assert_array_equal(y, ref_y)
        assert (y != 0).any()


def test_unpooling_otherwise_than_the_pool_is_refused():
    """A SAME 2x2 pool of an odd map: MediaPipe's unpooling writes into a map one larger than the
    pooled one, where the flat indices of ONNX mean other positions: refused, naming both ops."""
    with pytest.raises(ModelLoadError, match=r"MaxUnpooling2D 'y' decodes the indices of "
                                             r"MaxPoolingWithArgmax2D 'p' .*output 8x6 vs the pooled map's 7x5"):
        mediapipe_ops.to_standard_ops(mediapipe_graph((1, 7, 5, 2), SAME, (2, 2), (2, 2)), "t.tflite")
    with pytest.raises(ModelLoadError, match=r"\(filter_w, stride_h, stride_w, pad_top, pad_left\) \(3, 2, 2"):
        mediapipe_ops.to_standard_ops(
            mediapipe_graph((1, 8, 6, 2), VALID, (2, 2), (2, 2), unpool_opts=((2, 2), (3, 3))), "t.tflite")


def test_indices_read_by_another_op_are_refused():
    m = mediapipe_graph((1, 8, 6, 2), VALID, (2, 2), (2, 2), outputs=("y", "idx"))
    with pytest.raises(ModelLoadError, match=r"indices 'idx' of MaxPoolingWithArgmax2D 'p' are read by a graph "
                                             r"output; only MaxUnpooling2D reads them"):
        mediapipe_ops.to_standard_ops(m, "t.tflite")


def _tflite_file(path, xshape, padding, stride, filt, options=None, relu=None):
    """A hand-made TFLite file as MediaPipe's converter writes one: x -> RELU ->
    MaxPoolingWithArgmax2D -> (p, idx); RELU(p) -> MaxUnpooling2D(., idx) -> y; outputs y and p.
    The custom ops' options are the raw C struct TfLitePoolParams (padding, stride_w, stride_h,
    filter_w, filter_h, activation, then the computed padding: 40 bytes). `relu`: another custom
    op's name in place of the RELUs."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils as fu
    B = schema.BuiltinOperator
    p, _ = mp_pool_argmax(np.zeros(xshape, np.float32), padding, stride, filt)
    m = schema.ModelT()
    m.version, m.buffers, m.operatorCodes = 3, [schema.BufferT()], []
    for builtin, custom in ((B.CUSTOM, b"MaxPoolingWithArgmax2D"), (B.CUSTOM, b"MaxUnpooling2D"),
                            (B.CUSTOM, relu.encode()) if relu else (B.RELU, None)):
        c = schema.OperatorCodeT()
        c.builtinCode = c.deprecatedBuiltinCode = builtin
        c.customCode, c.version = custom, 1
        m.operatorCodes.append(c)
    sg = schema.SubGraphT()
    shapes = {"x": xshape, "xr": xshape, "p": p.shape, "idx": p.shape, "v": p.shape,
              "y": (p.shape[0], p.shape[1] * filt[0], p.shape[2] * filt[1], p.shape[3])}
    sg.tensors = []
    for name, shape in shapes.items():
        t = schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name.encode(), list(shape), schema.TensorType.FLOAT32, 0
        sg.tensors.append(t)
    ids = {k: i for i, k in enumerate(shapes)}
    raw = options if options is not None else list(
        np.array([padding, stride[1], stride[0], filt[1], filt[0], 0, 0, 0, 0, 0], "<i4").tobytes())

    def op(code, ins, outs, opts=None):
        o = schema.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs, o.customOptions = code, [ids[i] for i in ins], [ids[i] for i in outs], opts
        return o
    sg.operators = [op(2, ["x"], ["xr"]), op(0, ["xr"], ["p", "idx"], raw), op(2, ["p"], ["v"]),
                    op(1, ["v", "idx"], ["y"], raw)]
    sg.inputs, sg.outputs = [ids["x"]], [ids["y"], ids["p"]]
    m.subgraphs = [sg]
    fu.write_model(m, str(path))
    return path


@pytest.mark.slow
def test_mediapipe_tflite_file_loads_exactly(tmp_path):
    """A TFLite file with the two custom ops (options as MediaPipe writes them) loads into
    standard ops that compute MediaPipe's output bit for bit, and converts (kmodel v4, close to
    float on the emulator); malformed options are refused."""
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.frontends import load_graph
    from tl2k210.graph import run
    xshape = (1, 32, 24, 3)
    g = load_graph(_tflite_file(tmp_path / "segnet_pool.tflite", xshape, VALID, (2, 2), (2, 2)))
    assert {"MaxPool", "MaxUnpool"} <= set(g.op_counts())
    for seed in range(3):
        x = ties(xshape, seed) - 0.25 * seed
        got = run(g, {g.inputs[0]: x})
        ref_p, ref_y = mediapipe_reference(np.maximum(x, 0), VALID, (2, 2), (2, 2))
        np.testing.assert_array_equal(got[g.outputs[0]], ref_y)
        np.testing.assert_array_equal(got[g.outputs[1]], ref_p)
    receipt = convert(tmp_path / "segnet_pool.tflite", tmp_path / "m.kmodel",
                      ConvertOptions(dataset=str(photos(tmp_path / "calib", PHOTOS[:4])), progress=False))
    assert receipt.totals["format"] == "v4" and receipt.totals["output_sqnr_db"] >= 40
    bad = _tflite_file(tmp_path / "bad.tflite", xshape, VALID, (2, 2), (2, 2), options=[1, 0, 0, 0])
    with pytest.raises(ModelLoadError, match=r"operator 1 is MediaPipe's MaxPoolingWithArgmax2D with 4 bytes of "
                                             r"options; its TfLitePoolParams .* take 24"):
        load_graph(bad)
    other = _tflite_file(tmp_path / "other.tflite", xshape, VALID, (2, 2), (2, 2), relu="Landmarks2TransformMatrix")
    with pytest.raises(ModelLoadError, match=r"operator 0 is the custom op 'Landmarks2TransformMatrix' of MediaPipe's "
                                             r"custom op set \(the affine matrix .*Refused"):
        load_graph(other)


# ------------------------------------------------------------------ K210 flow: the max_unpool pass
def segnet_block(c=4, h=8, w=12, k=2, pool_attrs=None, unpool_shape=None, extra_out=None):
    """x -> MaxPool(k) -> (p, i); v = Relu(p * s - 1); y = MaxUnpool(v, i) (+ x): SegNet's pair."""
    pool_attrs = pool_attrs or dict(kernel_shape=[k, k], strides=[k, k])
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], name="pool", **pool_attrs),
             helper.make_node("Mul", ["p", "s"], ["ps"], name="scale"),
             helper.make_node("Sub", ["ps", "one"], ["pm"], name="shift"),
             helper.make_node("Relu", ["pm"], ["v"], name="relu"),
             helper.make_node("MaxUnpool", ["v", "i", "shape"], ["u"], name="unpool", kernel_shape=[k, k],
                              strides=[k, k]),
             helper.make_node("Add", ["u", "x"], ["y"], name="skip")]
    inits = {"s": np.linspace(0.5, 2, c, dtype=np.float32).reshape(1, c, 1, 1), "one": np.float32(1),
             "shape": np.array(unpool_shape or (1, c, h, w), np.int64)}
    outs = [("y", None)] + ([(extra_out, None)] if extra_out else [])
    return make_model(nodes, [("x", [1, c, h, w])], outs, inits)


@pytest.mark.parametrize("c,h,w,k", [(4, 8, 12, 2), (3, 9, 6, 3)])
def test_max_unpool_pass_is_exact_on_ties(c, h, w, k):
    """The phase form equals onnxruntime's MaxPool + MaxUnpool bit for bit, windows full of ties
    (all-zero windows, equal maxima) and negative maxima included."""
    from tl2k210.graph import from_onnx, run
    from tl2k210.k210.flow import run_pass
    m = segnet_block(c, h, w, k)
    g, changes = run_pass("max_unpool", from_onnx(m))
    assert "MaxUnpool" not in g.op_counts() and len(changes) == 1
    assert {"SpaceToDepth", "Sign", "Conv", "Mul", "DepthToSpace"} <= set(g.op_counts())
    assert all(len(n.outputs) == 1 for n in g.nodes if n.op == "MaxPool")
    for seed in range(4):
        x = ties((1, c, h, w), seed) - (1.0 if seed % 2 else 0.0)
        np.testing.assert_array_equal(run(g, {"x": x})["y"], ort_run(m, x)[0])
    x = np.random.default_rng(9).standard_normal((1, c, h, w)).astype(np.float32)   # no ties
    np.testing.assert_array_equal(run(g, {"x": x})["y"], ort_run(m, x)[0])


@pytest.mark.parametrize("kw,why", [
    (dict(pool_attrs=dict(kernel_shape=[3, 3], strides=[2, 2]), h=9, w=9, unpool_shape=(1, 4, 9, 9)),
     r"\[3, 3\] window with strides \[2, 2\] is not square and as long as its stride"),
    (dict(pool_attrs=dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1]), h=7, w=7,
          unpool_shape=(1, 4, 7, 7)), "the pool pads"),
    (dict(h=9, w=8, unpool_shape=(1, 4, 9, 8)), r"pooled map \(1, 4, 9, 8\) is not a multiple of the 2x2"),
    (dict(unpool_shape=(1, 4, 10, 12)), r"unpools into \(1, 4, 10, 12\), not the pooled map's"),
    (dict(extra_out="i"), "also read by a graph output")])
def test_max_unpool_without_an_exact_form_is_refused(kw, why):
    from tl2k210.errors import UnsupportedOpError
    from tl2k210.graph import from_onnx
    from tl2k210.k210.flow import run_pass
    with pytest.raises(UnsupportedOpError, match=r"node 'unpool' \(MaxUnpool.*" + why + ".*a K210 has no scatter"):
        run_pass("max_unpool", from_onnx(segnet_block(**kw)))


def segnet(deep, seed=0):
    """A small SegNet: conv-pool twice, unpool twice with the pools' indices, a 4-class map
    (`deep`); or one pool of the image itself, a conv pair, the unpool and a class map."""
    r = np.random.default_rng(seed)
    chans = [(3, 8, 3), (8, 16, 3), (16, 16, 3), (16, 8, 3), (8, 4, 3)] if deep else [(3, 8, 3), (8, 3, 1), (3, 4, 3)]
    inits = {f"w{i}": (r.standard_normal((co, ci, k, k)) / np.sqrt(k * k * ci)).astype(np.float32)
             for i, (ci, co, k) in enumerate(chans)}
    inits.update({f"b{i}": r.uniform(-0.1, 0.1, co).astype(np.float32) for i, (_, co, _) in enumerate(chans)})

    def conv(i, x, y, relu=True):
        out = [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [y + ("_c" if relu else "")], name=f"conv{i}",
                                pads=[chans[i][2] // 2] * 4)]
        return out + ([helper.make_node("Relu", [y + "_c"], [y], name=f"relu{i}")] if relu else [])

    def pool(x, p, i):
        return [helper.make_node("MaxPool", [x], [p, "i" + i], name="pool" + i, kernel_shape=[2, 2], strides=[2, 2])]

    def unpool(v, u, i):
        return [helper.make_node("MaxUnpool", [v, "i" + i], [u], name="unpool" + i, kernel_shape=[2, 2],
                                 strides=[2, 2])]
    if deep:
        nodes = (conv(0, "x", "e1") + pool("e1", "p1", "1") + conv(1, "p1", "e2") + pool("e2", "p2", "2")
                 + conv(2, "p2", "d2") + unpool("d2", "u2", "2") + conv(3, "u2", "d1") + unpool("d1", "u1", "1")
                 + conv(4, "u1", "y", relu=False))
    else:
        nodes = (pool("x", "p1", "1") + conv(0, "p1", "e1") + conv(1, "e1", "d1", relu=False)
                 + unpool("d1", "u1", "1") + conv(2, "u1", "y", relu=False))
    return make_model(nodes, [("x", [1, 3, 32, 32])], [("y", [1, 4, 32, 32])], inits)


@pytest.mark.slow
@pytest.mark.parametrize("deep", [False, True])
def test_segnet_with_max_unpool_converts_at_its_8bit_ideal(tmp_path, deep):
    """SegNet's decoder on a K210: each MaxUnpool becomes the phase form (kmodel v4: SpaceToDepth,
    the Mul of two maps) and the kmodel on the emulator is at least as close to the float model as
    the 8-bit ideal (the float graph with uint8 tensors). Pooling the image, whose pixels are the
    uint8 grid, each window's argmax is the float model's: the output is close to float on
    held-out photos (the ideal, which requantizes a max pool's output at its own range where the
    back-end keeps the input's, breaks the masks: 4.7 dB). Pooling a conv's uint8 output
    (`deep`), windows whose values lie within one step resolve to the first on the grid, not
    always in float: a value one pixel off, so the output SQNR is what the 8-bit ideal has, and
    the per-pixel class (argmax over the 4 channels) mostly agrees."""
    import onnx

    from tl2k210.compiler import ConvertOptions, convert, model_input_range, model_inputs
    from tl2k210.graph import from_onnx, run
    from tl2k210.k210 import kmodel
    from tl2k210.k210.emulator import Emulator
    from tl2k210.k210.flow import run_pipeline
    from tl2k210.quantize.metrics import sqnr_db
    src, out = tmp_path / "segnet.onnx", tmp_path / "segnet.kmodel"
    onnx.save(segnet(deep), src)
    receipt = convert(src, out, ConvertOptions(dataset=str(photos(tmp_path / "calib", PHOTOS[:8])), progress=False,
                                               min_sqnr=0))
    m = kmodel.load(out)
    names = [n.name for n in m.nodes]
    assert m.version == 4 and {"transpose", "quantized_binary", "table_lookup1d"} <= set(names), names
    o = receipt.totals["outputs"]["y"]
    g, _ = run_pipeline(from_onnx(segnet(deep)))
    opts, _ = model_input_range(g, ConvertOptions())
    floats, pixels = model_inputs(g, str(photos(tmp_path / "held", PHOTOS[8:])), 8, opts)
    emu = Emulator.load(out)
    ref = np.stack([run(g, {"x": f[None]})["y"][0] for f in floats])
    got = np.stack([np.asarray(emu.run(p)[0], np.float32).reshape(ref.shape[1:]) for p in pixels])
    sq, agree = sqnr_db(ref, got), np.mean(ref.argmax(1) == got.argmax(1))
    print(f"SegNet ({'deep' if deep else 'pooling the image'}): {len(m.nodes)} kmodel nodes, "
          f"{receipt.file_size:,} B; calibration SQNR {o['sqnr_db']:.1f} dB (8-bit ideal {o['ideal_db']:.1f} dB); "
          f"held-out SQNR {sq:.1f} dB, pixel classes agree {agree:.3f}")
    assert o["sqnr_db"] >= o["ideal_db"] - 1
    assert (sq >= 12 and agree >= 0.9) if deep else (sq >= 25 and agree >= 0.98)
