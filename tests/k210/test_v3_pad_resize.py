"""kmodel v3 has no pad and no bilinear layer. A constant pad of the channel axis is a QUANTIZED_ADD
fill (multipliers 0: every output is out_offset, the value's code) joined to the input by a
QUANTIZED_CONCAT (cpu.py channel_pad); a half_pixel bilinear 2x resize is a gather repeating the
last row and column, the SDK's nearest resize to 2n + 3 and a depthwise 3x3 [1,2,1]x[1,2,1] KPU
conv whose table rounds ACC / 16, cropped (v3resize.py). Both are exact, so `--format auto` takes
them too (kmodel v3 loads on every MaixPy build, and its layers run faster than v4's float
resize). TF-free, hand-made graphs."""
import numpy as np
import pytest
from onnx import helper

from lower_helpers import compile_model, conv_node, make_model, ort_run, pixels, sqnr
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.emulator.kpu import activation, batchnorm
from tl2k210.k210.lower.v3resize import doubled, repeat_last_ranges
from tl2k210.k210.lower.v4resize import v4_nearest


def _head(relu, c, rng):
    """conv3x3 (+ ReLU) on the pixels: a uint8 map whose zero point is code 0 (ReLU) or not."""
    n = helper.make_node
    nodes = [conv_node("c0", "x", "w0", "b0", pads=[1, 1, 1, 1])]
    nodes += [n("Relu", ["c0"], ["r0"])] if relu else [n("Identity", ["c0"], ["r0"])]
    return nodes, {"w0": (rng.normal(size=(c, 3, 3, 3)) * 0.3).astype(np.float32),
                   "b0": (rng.normal(size=c) * 0.2).astype(np.float32)}


def _codes(out, quant):
    s, z = quant
    return np.rint(np.asarray(out, np.float64) / s + z).astype(np.int64)


# ------------------------------------------------------------------ channel pad
def _channel_pad_model(relu, before, after, value=None, c=4, seed=1):
    rng = np.random.default_rng(seed)
    nodes, inits = _head(relu, c, rng)
    ins = ["r0", "p"] + (["v"] if value is not None else [])
    nodes += [helper.make_node("Pad", ins, ["pd"], name="pad"), helper.make_node("Identity", ["pd"], ["y"])]
    inits["p"] = np.array([0, before, 0, 0, 0, after, 0, 0], np.int64)
    if value is not None:
        inits["v"] = np.array(value, np.float32)
    return make_model(nodes, [("x", [1, 3, 12, 12])], [("y", None)], inits)


@pytest.mark.parametrize("relu,before,after,value", [(True, 0, 3, None), (False, 2, 5, None),
                                                     (False, 3, 0, None), (True, 2, 2, 0.5)])
def test_channel_pad_is_a_fill_and_a_concat_bit_for_bit(relu, before, after, value):
    """The output bytes are the input's with channels of the value's code before / after them
    (np.pad), whatever the input's zero point (a map that may be negative pads with its zero
    point, not code 0): a QUANTIZED_ADD with multipliers 0 writes out_offset; close to float."""
    m = _channel_pad_model(relu, before, after, value)
    px = pixels(3, 3, 12, 12)
    model, rows, lw, g = compile_model(m, px, format="v3")
    node = next(n for n in g.nodes if n.op == "Pad")
    assert lw.lowered_by(node) == "channel_pad"
    row = next(r for r in rows if r.node == node.name)
    (fill,) = [model.layers[i] for i in row.layers if model.layers[i].name == "QUANTIZED_ADD"]
    f = fill.fields
    s, z = lw.locs[node.inputs[0]].quant
    code = z + round((value or 0.0) / s)
    assert f["in_a_mul"] == f["in_b_mul"] == 0 and f["out_offset"] == code
    assert (z == 0) == relu and lw.locs[node.outputs[0]].quant == (s, z)
    src, _ = lw.trace_map[node.inputs[0]]
    emu = Emulator(model)
    for p in px:
        out, trace = emu.run(p, trace=True)
        q = np.asarray(trace[src][1]).reshape(4, 12, 12)
        want = np.pad(q.astype(np.int64), ((before, after), (0, 0), (0, 0)), constant_values=code)
        assert np.array_equal(_codes(out[0], (s, z)).reshape(want.shape), want)
    assert sqnr(m, model, px) > 30
    assert compile_model(m, px, format="auto")[0].version == 3


@pytest.mark.parametrize("fmt", ["v3", "v4"])
@pytest.mark.parametrize("form", ["constantofshape", "initializer", "both-ends"])
def test_concat_with_a_constant_block_is_a_channel_pad(form, fmt):
    """Concat(x, zeros) on channels (tflite2onnx's and tf2onnx 1.7's form of TFLite's channel PAD
    in BlazeFace and FaceMesh; it was an internal KeyError) is the Pad it stands for: the same
    bytes as that Pad's model, close to onnxruntime; a non-uniform constant is refused by name."""
    rng = np.random.default_rng(3)
    nodes, inits = _head(True, 4, rng)
    n = helper.make_node
    if form == "constantofshape":
        nodes.append(n("ConstantOfShape", ["zshape"], ["z"]))
        inits["zshape"] = np.array([1, 3, 12, 12], np.int64)
        ins = ["r0", "z"]
    else:
        inits["z"] = np.zeros((1, 3, 12, 12), np.float32)
        ins = ["z", "r0", "z"] if form == "both-ends" else ["r0", "z"]
    nodes += [n("Concat", ins, ["cc"], axis=1, name="concat"), n("Identity", ["cc"], ["y"])]
    m = make_model(nodes, [("x", [1, 3, 12, 12])], [("y", None)], inits)
    px = pixels(3, 3, 12, 12)
    model, _, lw, g = compile_model(m, px, format=fmt)
    assert "Concat" not in {x.op for x in g.nodes} and "Pad" in {x.op for x in g.nodes}
    before = 3 if form == "both-ends" else 0
    padded, *_ = compile_model(_channel_pad_model(True, before, 3, c=4, seed=3), px, format=fmt)
    emu, ref = Emulator(model), Emulator(padded)
    for p in px:
        assert np.array_equal(emu.run(p)[0], ref.run(p)[0])
    assert sqnr(m, model, px) > 30
    inits["z"] = rng.normal(size=(1, 3, 12, 12)).astype(np.float32)
    if form != "constantofshape":
        m = make_model(nodes, [("x", [1, 3, 12, 12])], [("y", None)], inits)
        with pytest.raises(Exception, match="input 'z' .* is a constant map"):
            compile_model(m, px, format=fmt)


# ------------------------------------------------------------------ bilinear 2x
def _resize_model(h, w, mode="half_pixel"):
    return make_model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear",
                                        coordinate_transformation_mode=mode)],
                      [("x", [1, 2, h, w])], [("y", None)], {"s": np.array([1, 1, 2, 2], np.float32)})


def _gathered(x, ranges):
    flat = x.reshape(-1)
    return np.concatenate([flat[a:a + n] for a, n in ranges])


def _filtered(u):
    """[1,2,1] x [1,2,1] over the (C, 2H+3, 2W+3) map, centred on rows / columns 1 .. 2n: the
    K210_CONV's sums where the CPU crop keeps them (unscaled: 16 x the value)."""
    c, uh, uw = u.shape
    k = np.array([1, 2, 1])
    rows = sum(k[d] * u[:, d:uh - 3 + d] for d in range(3))
    return sum(k[d] * rows[:, :, d:uw - 3 + d] for d in range(3))


def _upsampled(q, h, w):
    """The SDK's nearest resize of the (C, H+1, W+1) map to (C, 2H+3, 2W+3), float32 indices."""
    return q[:, v4_nearest(h + 1, 2 * h + 3)][:, :, v4_nearest(w + 1, 2 * w + 3)]


@pytest.mark.parametrize("h,w", [(1, 1), (1, 5), (3, 2), (4, 4), (7, 7), (6, 11), (24, 24), (60, 254)])
@pytest.mark.parametrize("mode", ["half_pixel", "pytorch_half_pixel"])
def test_repeat_nearest_and_121_filter_are_onnx_bilinear(h, w, mode):
    """The identity the v3 form rests on, in float against onnxruntime: the gather's ranges
    (repeat_last_ranges: one a row) give x with its last row and column repeated, the SDK's
    float32 nearest resize to 2n + 3 repeats the first pixel thrice and doubles the rest
    (`doubled`), and [1,2,1]x[1,2,1]/16 around rows and columns 1 .. 2n is ONNX's bilinear 2x."""
    x = np.random.default_rng(h * 31 + w).normal(size=(2, h, w)).astype(np.float32)
    ranges = repeat_last_ranges(0, 2, h, w)
    q = _gathered(x, ranges).reshape(2, h + 1, w + 1)
    assert np.array_equal(q, np.pad(x, ((0, 0), (0, 1), (0, 1)), mode="edge"))
    assert len(ranges) <= 2 * (h + 2) + 1       # a row and its repeated last pixel: one run
    for n in (h, w):
        assert np.array_equal(v4_nearest(n + 1, 2 * n + 3), doubled(n))
    want = ort_run(_resize_model(h, w, mode), x[None])[0][0]
    assert np.abs(_filtered(_upsampled(q, h, w).astype(np.float64)) / 16 - want).max() < 1e-6


def _bilinear_model(h, w, relu=True, c=5, seed=2, mode="half_pixel"):
    """conv3x3 (+ ReLU) on (3, h, w) pixels -> bilinear 2x -> the output."""
    rng = np.random.default_rng(seed)
    nodes, inits = _head(relu, c, rng)
    nodes += [helper.make_node("Resize", ["r0", "", "s"], ["y"], name="up", mode="linear",
                               coordinate_transformation_mode=mode)]
    inits["s"] = np.array([1, 1, 2, 2], np.float32)
    return make_model(nodes, [("x", [1, 3, h, w])], [("y", None)], inits)


@pytest.mark.parametrize("hw_,relu", [((12, 16), True), ((9, 6), False), ((20, 20), False)])
def test_bilinear_2x_is_the_rounded_interpolation_bit_for_bit(hw_, relu):
    """The output bytes are the KPU arithmetic of the v3 layers on the input bytes (gather ->
    nearest -> [1,2,1]^2 integer conv -> activation table -> crop, as the emulator's reference
    functions compute it), which is the exact interpolation S / 16 of the input codes rounded
    once to the nearest byte (ties to even), on the input's own grid; the model is close to
    float (onnxruntime) and `auto` takes this form too."""
    h, w = hw_
    m = _bilinear_model(h, w, relu)
    px = pixels(3, 3, h, w)
    model, rows, lw, g = compile_model(m, px, format="v3")
    node = next(n for n in g.nodes if n.op == "Resize")
    assert lw.lowered_by(node) == "bilinear2x_kpu"
    row = next(r for r in rows if r.node == node.name)
    names = [model.layers[i].name for i in row.layers]
    assert names[0] == "QUANTIZED_CONCAT" and names[1] == "QUANTIZED_RESIZE_NEAREST_NEIGHBOR"
    assert names[-1] == "QUANTIZED_MAX_POOL2D" and names.count("K210_CONV") == 1
    (conv,) = [model.layers[i].conv for i in row.layers if model.layers[i].conv is not None]
    assert conv.args["arg_x"] == conv.args["arg_w"] == conv.args["arg_add"] == 0
    assert np.array_equal(conv.weights.reshape(-1, 3, 3), np.tile(np.outer([1, 2, 1], [1, 2, 1]), (5, 1, 1)))
    quant = lw.locs[node.inputs[0]].quant
    assert lw.locs[node.outputs[0]].quant == quant
    src, _ = lw.trace_map[node.inputs[0]]
    emu = Emulator(model)
    for p in px:
        out, trace = emu.run(p, trace=True)
        q = np.asarray(trace[src][1]).reshape(5, h, w).astype(np.int64)
        acc = _filtered(_upsampled(np.pad(q, ((0, 0), (0, 1), (0, 1)), mode="edge"), h, w))
        ref = activation(batchnorm(acc, conv.bn), conv.act).astype(np.int64)
        assert np.array_equal(_codes(out[0], quant).reshape(ref.shape), ref)
        frac = acc % 16
        assert np.array_equal(ref, np.where(frac == 8, (acc // 16 + 1) // 2 * 2, (acc + 8) // 16))
    assert sqnr(m, model, px) > 30
    assert compile_model(m, px, format="auto")[0].version == 3


def test_bilinear_other_than_half_pixel_2x_stays_refused_on_v3():
    from tl2k210.errors import UnsupportedOpError
    m = _bilinear_model(12, 16, mode="align_corners")
    with pytest.raises(UnsupportedOpError, match="samples half_pixel coordinates"):
        compile_model(m, pixels(3, 3, 12, 16), format="v3")


@pytest.mark.parametrize("h", [40, 63, 128, 129, 200])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_aligned_bands_are_nearest_resizes_of_q_rows(h, n):
    """Each band of the filter stage reads upsampled rows [f0, f1 + 2) (the last to row 2h + 2),
    which one nearest resize of q's rows gives: from row 0, m rows to 2m + 1 (x[0] thrice); from an
    odd row, m rows to 2m (each twice). The bands cover every final row once, none longer than
    the plan's longest."""
    from types import SimpleNamespace

    from tl2k210.k210.lower.v3resize import aligned_bands, band_resize, band_sources
    F = 2 * h
    cuts = [F * i // n for i in range(n + 1)]
    plan = SimpleNamespace(bands=[((a, b), (a, min(b + 2, F + 3))) for a, b in zip(cuts, cuts[1:])])
    bands = aligned_bands(plan, h, 4)
    assert bands is not None and len(bands) >= n
    assert [f for (f, _) in bands] == list(zip([0] + [f1 for (_, f1), _ in bands[:-1]], [f1 for (_, f1), _ in bands]))
    assert bands[-1][0][1] == F and bands[-1][1][1] == F + 3
    assert max(b - a for _, (a, b) in bands) <= max(b - a for _, (a, b) in plan.bands)
    whole = doubled(h)
    for (f0, f1), (a, b) in bands:
        assert a == f0 and (b == f1 + 2 or f1 == F)
        m, rows = band_resize(a, b)
        src = band_sources(a, b)
        assert rows == b - a and np.array_equal(src, whole[a:b])
        assert np.array_equal(v4_nearest(m, rows) + src[0], src)


def _resize_peak(lw, rows):
    """The most main memory live while the Resize's layers run."""
    idx = next(r for r in rows if r.op == "Resize").layers
    end = len(lw.layers)
    return max(sum(b.size for b in lw.main.history if b.t0 <= t < (end if b.t1 is None else b.t1))
               for t in range(min(idx), max(idx) + 1))


def test_bilinear_2x_of_a_map_over_the_kpu_stream_runs_in_bands_made_from_x():
    """A 2x2x128x128 map upsamples to 259x259 a channel, over the 65,536 pixels the KPU streams:
    each row band's upsampled rows are made from x as it runs (no whole upsampled map) and its
    crop writes its rows into the map a channel at a time (no band waits to be assembled). The
    bytes are the whole-map form's, in kmodel v3 and v4, in 0.77x its main memory (the whole
    upsampled map, whose bands upload straight from it)."""
    from tl2k210.k210.lower import v3resize
    h = w = 128
    m = _bilinear_model(h, w, relu=False, c=2)
    px = pixels(2, 3, h, w)
    banded, rows, lw, g = compile_model(m, px, format="v3")
    row = next(r for r in rows if r.op == "Resize")
    names = [banded.layers[i].name for i in row.layers]
    nb = names.count("QUANTIZED_RESIZE_NEAREST_NEIGHBOR")
    assert nb == names.count("K210_CONV") >= 2 and names.count("QUANTIZED_MAX_POOL2D") == 2 * nb, names
    assert "made from the input as it runs" in " ".join(row.notes)
    assert not any(b.name.endswith(":up:u8") or ":fin" in b.name for b in lw.main.history)
    v4, _, lw4, _ = compile_model(m, px, format="v4")
    assert lw4.lowered_by(next(n for n in g.nodes if n.op == "Resize")) == "bilinear2x_kpu"
    mp = pytest.MonkeyPatch()
    mp.setattr(v3resize, "aligned_bands", lambda *a: None)
    from tl2k210.k210.lower import conv
    mp.setattr(conv, "_map_first", lambda *a: False)
    try:
        whole, rows_whole, lw_whole, _ = compile_model(m, px, format="v3")
    finally:
        mp.undo()
    assert any(b.name.endswith(":up:u8") for b in lw_whole.main.history)
    peak, peak_whole = _resize_peak(lw, rows), _resize_peak(lw_whole, rows_whole)
    assert peak < 0.8 * peak_whole and peak <= 1.3 * 5 * 2 * h * w, (peak, peak_whole)   # x and its 4x output
    for p in px:
        want = Emulator(whole).run(p)[0]
        assert np.array_equal(Emulator(banded).run(p)[0], want)
        quant = lw.locs[next(n for n in g.nodes if n.op == "Resize").outputs[0]].quant
        assert np.array_equal(_codes(Emulator(v4).run(p)[0], quant), _codes(want, quant))   # v4 dequantizes in float32
