"""A conv on a map under the KPU's minimum width / height runs on the map grown to it in main
memory (code 0 in the added pixels) and its output is cropped back (tl2k210/k210/lower/conv.py
small_map_refuses): kmodel v4 grows it with a pad layer; v3, which has no CPU conv and no pad
layer, with a kernel-1 QUANTIZED_MAX_POOL2D whose output is larger than its input (taps outside
skipped, max from 0). A zero Pad of a map >= 0 is such a pool in v3 (cpu.py zero_pad). TF-free,
hand-made graphs."""
import numpy as np
import pytest
from onnx import helper

from lower_helpers import compile_model, conv_node, make_model, pixels
from tl2k210.compiler import traced
from tl2k210.errors import UnsupportedOpError
from tl2k210.k210 import hardware as hw
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.emulator.kpu import activation, batchnorm
from tl2k210.k210.lower.conv import SMALL_MAP

POOL = 4        # the 4x4 max pool that shrinks the first conv's map to (h, w)


def _model(k, group, hw_, relu=True, c=8, co=6, seed=0):
    """conv3x3 (+ ReLU) on (3, 4h, 4w) pixels -> MaxPool 4x4 -> the conv under test on an h x w map."""
    rng = np.random.default_rng(seed)
    h, w = hw_
    g = c if group == "dw" else 1
    co = c if group == "dw" else co
    n = helper.make_node
    nodes = [conv_node("c0", "x", "w0", "b0", pads=[1, 1, 1, 1])]
    nodes += [n("Relu", ["c0"], ["r0"])] if relu else [n("Identity", ["c0"], ["r0"])]
    nodes += [n("MaxPool", ["r0"], ["p"], kernel_shape=[POOL, POOL], strides=[POOL, POOL]),
              conv_node("y", "p", "w", "b", pads=[k // 2] * 4, group=g, kernel_shape=[k, k])]
    return make_model(nodes, [("x", [1, 3, POOL * h, POOL * w])], [("y", None)],
                      {"w0": (rng.normal(size=(c, 3, 3, 3)) * 0.3).astype(np.float32),
                       "b0": (rng.normal(size=c) * 0.2).astype(np.float32),
                       "w": (rng.normal(size=(co, c // g, k, k)) * 0.3).astype(np.float32),
                       "b": (rng.normal(size=co) * 0.3).astype(np.float32)})


def _direct(q, z_x, wq, zw, k, depthwise):
    """The conv's KPU accumulator on the h x w map itself: sum of (q - z_x)(w - zw), off-map taps
    reading the pad value z_x (0 after subtracting it)."""
    c, h, w = q.shape
    r = k // 2
    xp = np.pad(q.astype(np.int64) - z_x, ((0, 0), (r, r), (r, r)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(1, 2))     # (C, h, w, k, k)
    wt = wq.astype(np.int64) - zw
    if depthwise:
        return np.einsum("chwyx,cyx->chw", win, wt.reshape(c, k, k))
    return np.einsum("chwyx,ocyx->ohw", win, wt.reshape(-1, c, k, k))


@pytest.mark.parametrize("fmt", ["v3", "v4"])
@pytest.mark.parametrize("k,group,hw_", [(1, "dense", (3, 3)), (1, "dw", (3, 6)), (3, "dw", (3, 3)),
                                         (3, "dense", (2, 5)), (3, "dense", (1, 1))])
def test_small_map_conv_is_the_direct_conv_bit_for_bit(k, group, hw_, fmt):
    """The K210_CONV on the grown map, cropped, gives exactly the bytes of a direct integer conv of
    the h x w map with the layer's own quantized weights, zero points, BN and activation table."""
    m = _model(k, group, hw_)
    h, w = hw_
    px = pixels(3, 3, POOL * h, POOL * w)
    model, rows, lw, g = compile_model(m, px, format=fmt)
    assert lw.lowered_by(next(n for n in g.nodes if n.outputs[0] == "y")) == SMALL_MAP
    row = next(r for r in rows if r.node == "y")
    names = [model.items[i].name for i in row.layers]
    grow = model.items[row.layers[0]].fields
    lo_h, lo_w = hw.LIMITS["in_h"][0], hw.LIMITS["in_w"][0]
    if fmt == "v3":
        assert names[0] == "QUANTIZED_MAX_POOL2D" and "K210_UPLOAD" in names and names[-1] == "QUANTIZED_MAX_POOL2D"
        assert grow["out_shape"][:2] == (max(w, lo_w), max(h, lo_h)) and grow["kernel_width"] == 1
    else:
        assert names[0] == "pad" and "kpu_upload" in names and names[-1] == "strided_slice"
        assert grow["paddings"] == (0, 0, 0, 0, 0, max(h, lo_h) - h, 0, max(w, lo_w) - w)
    assert any("grown to" in nt for nt in row.notes)
    (conv,) = [model.items[i].conv for i in row.layers if model.items[i].conv is not None]
    z_x, zw = -conv.args["arg_w"], -conv.args["arg_x"]
    assert conv.args["pad_value"] == z_x and (k == 1 or z_x == 0)
    src, _ = lw.trace_map["p"]
    s_y, z_y = lw.locs["y"].quant
    emu = Emulator(model)
    for p in px:
        out, trace = emu.run(p, trace=True)
        q = traced(trace, src, "raw", None).astype(np.int64).reshape(-1, h, w)
        ref = activation(batchnorm(_direct(q, z_x, conv.weights, zw, k, group == "dw"), conv.bn), conv.act)
        got = np.rint(out[0].reshape(ref.shape) / s_y + z_y).astype(np.int64)
        assert np.array_equal(got, ref)


@pytest.mark.parametrize("fmt", ["v4", "auto"])
def test_a_first_layer_on_an_image_under_the_minimum_grows_it_in_v4(fmt):
    """42io's int8 keyword spotter reads (13, 47, 1) MFCC maps (hunt 21): its first 1x1 conv, on
    the model's input, went to v4's quantized_conv2d, one weight scale per node, which re-rounded
    its per-channel int8 weights (7 % of its bytes 1 LSB off TFLite's; the later layers, grown,
    exact). In v4 the image is in main memory, so the first conv grows it too and runs on the KPU,
    close to the float model; v3, whose runtime puts the image in KPU RAM as it is, cannot (auto:
    v4)."""
    from lower_helpers import sqnr
    rng = np.random.default_rng(3)
    m = make_model([conv_node("y", "x", "w", "b")], [("x", [1, 13, 47, 1])], [("y", None)],
                   {"w": (rng.normal(size=(16, 13, 1, 1)) * 0.3).astype(np.float32),
                    "b": (rng.normal(size=16) * 0.2).astype(np.float32)})
    px = pixels(4, 13, 47, 1)
    model, rows, lw, g = compile_model(m, px, format=fmt)
    row = next(r for r in rows if r.lowering == SMALL_MAP)
    assert model.version == 4 and row.node == "y" and "grown to 4x47 in main memory (pad," in row.notes[1]
    names = [model.items[i].name for i in row.layers]
    assert names[0] == "pad" and "kpu_conv2d" in names and names[-1] == "strided_slice"
    assert sqnr(m, model, px) > 35


def test_auto_takes_v3_with_the_grown_map():
    """Both formats run the conv on the grown map on the KPU (its weights per channel through the
    batch norm, where v4's quantized_conv2d has one scale per layer; st_mobilenet_v1_0.25_96's
    3x3 maps: 19.1 -> 1.3 ms, 550 -> 248 KB), so `--format auto` keeps kmodel v3, which every
    MaixPy build loads."""
    m = _model(1, "dense", (3, 3))
    px = pixels(3, 3, POOL * 3, POOL * 3)
    for fmt, version in (("auto", 3), ("v4", 4)):
        model, rows, lw, g = compile_model(m, px, format=fmt)
        assert model.version == version
        assert lw.lowered_by(next(n for n in g.nodes if n.outputs[0] == "y")) == SMALL_MAP


def test_v4_3x3_conv_on_a_map_that_may_be_negative_stays_on_the_cpu():
    m = _model(3, "dw", (3, 3), relu=False)
    model, rows, lw, g = compile_model(m, pixels(3, 3, POOL * 3, POOL * 3), format="v4")
    assert lw.lowered_by(next(n for n in g.nodes if n.outputs[0] == "y")) == "quantized_conv2d"


def test_3x3_conv_on_a_map_that_may_be_negative_is_refused():
    """Without a ReLU before it the input's zero point is not code 0, the added pixels' value:
    the refusal says so (and that v4 runs it)."""
    m = _model(3, "dw", (3, 3), relu=False)
    px = pixels(3, 3, POOL * 3, POOL * 3)
    with pytest.raises(UnsupportedOpError, match="zero point only after a ReLU"):
        compile_model(m, px, format="v3")


def _pad_model(relu=True, pads=(0, 0, 1, 2, 0, 0, 2, 1), seed=1):
    """conv3x3 (+ ReLU) -> Pad -> the output (a Pad no conv absorbs)."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    nodes = [conv_node("c0", "x", "w0", "b0", pads=[1, 1, 1, 1])]
    nodes += [n("Relu", ["c0"], ["r0"])] if relu else [n("Identity", ["c0"], ["r0"])]
    nodes += [n("Pad", ["r0", "p"], ["pd"]), n("Identity", ["pd"], ["y"])]
    return make_model(nodes, [("x", [1, 3, 12, 12])], [("y", None)],
                      {"w0": (rng.normal(size=(4, 3, 3, 3)) * 0.3).astype(np.float32),
                       "b0": (rng.normal(size=4) * 0.2).astype(np.float32), "p": np.array(pads, np.int64)})


def test_zero_pad_is_a_kernel_1_max_pool_bit_for_bit():
    """The pad's output bytes are the input's with code 0 around them, exactly (np.pad), and the
    model stays close to float; --format auto keeps v4's pad layer."""
    from lower_helpers import sqnr
    m = _pad_model()
    px = pixels(3, 3, 12, 12)
    model, rows, lw, g = compile_model(m, px, format="v3")
    node = next(n for n in g.nodes if n.op == "Pad")
    row = next(r for r in rows if r.node == node.name)
    (L,) = [model.layers[i] for i in row.layers]
    f = L.fields
    assert L.name == "QUANTIZED_MAX_POOL2D" and f["kernel_width"] == f["kernel_height"] == 1
    assert f["out_shape"] == (15, 15, 4) and (f["padding_height"], f["padding_width"]) == (1, 2)
    emu = Emulator(model)
    src, _ = lw.trace_map[node.inputs[0]]
    dst = row.layers[0]
    for p in px:
        _, trace = emu.run(p, trace=True)
        q = np.asarray(trace[src][1]).reshape(4, 12, 12)
        got = np.asarray(trace[dst][1]).reshape(4, 15, 15)
        assert np.array_equal(got, np.pad(q, ((0, 0), (1, 2), (2, 1))))
    assert sqnr(m, model, px) > 30
    model, rows, lw, g = compile_model(m, px, format="auto")
    assert model.version == 4


def test_pad_of_a_map_that_may_be_negative_is_refused_on_v3():
    m = _pad_model(relu=False)
    with pytest.raises(UnsupportedOpError, match="pad value 0: the kernel-1 QUANTIZED_MAX_POOL2D pads with code 0"):
        compile_model(m, pixels(3, 3, 12, 12), format="v3")
