"""Column bands (issue #23): a conv whose input is wider than the KPU's 512 columns runs on the
KPU in kmodel v4, its output columns split in bands whose input columns (halo, pool phase, CPU
post stages) fit the KPU, each band's pixels gathered, uploaded, convolved and its valid pixels
assembled. TF-free: hand-made ONNX graphs on the emulator, bit for bit against the same graph
lowered without column bands (the KPU's width limit lifted for the reference: the emulator runs
any width), and close to onnxruntime."""
import numpy as np
import pytest
from onnx import helper

from lower_helpers import compile_model, conv_node, make_model, pixels, run_both
from tl2k210.k210 import hardware as hw
from tl2k210.quantize.metrics import sqnr_db

pytest.importorskip("onnxruntime")
n = helper.make_node


def _model(c, h, w, layers):
    """A chain of convs on a 1 x c x h x w input: layers [(name, co, k, stride, group, pool)]."""
    rng = np.random.default_rng(7)
    nodes, inits, x = [], {}, "x"
    for name, co, k, s, group, pool in layers:
        inits[name + "w"] = (rng.normal(size=(co, c // group, k, k)) * 0.3).astype(np.float32)
        inits[name + "b"] = (rng.normal(size=co) * 0.1).astype(np.float32)
        nodes += [conv_node(name, x, name + "w", name + "b", pads=[k // 2] * 4, strides=[s, s], group=group),
                  n("Relu", [name], [name + "r"])]
        x, c = name + "r", co
        if pool:
            nodes.append(n("MaxPool", [x], [name + "p"], kernel_shape=[2, 2], strides=[2, 2]))
            x = name + "p"
    nodes.append(n("Identity", [x], ["y"]))
    return make_model(nodes, [("x", [1, 3, h, w])], [("y", None)], inits)


def _check(m, px, node, monkeypatch):
    """Compile with column bands and with the width limit lifted (no column bands): the node ran
    on the KPU in column bands, the kmodel's output is the reference's bit for bit, and close to
    the float model."""
    banded, rows, lw, _ = compile_model(m, px, format="v4")
    row = next(r for r in rows if r.node == node)
    assert row.unit == "KPU" and row.lowering == "kpu_conv", (row.unit, row.lowering, row.notes)
    assert any("column bands" in nt for nt in row.notes), row.notes
    assert len(lw.plans[node].cols) >= 2
    with monkeypatch.context() as mp:
        mp.setitem(hw.LIMITS, "in_w", (hw.LIMITS["in_w"][0], 4 * hw.LIMITS["in_w"][1]))
        whole, rows0, lw0, _ = compile_model(m, px, format="v4")
    assert not lw0.plans[node].cols and next(r for r in rows0 if r.node == node).unit == "KPU"
    ref, a = run_both(m, banded, px)
    _, b = run_both(m, whole, px)
    assert np.array_equal(a, b)
    assert sqnr_db(ref.reshape(-1).astype(float), a.reshape(-1).astype(float)) > 25
    return row


@pytest.mark.parametrize("stride,pool", [(1, False), (2, False), (1, True), (2, True)])
def test_first_layer_on_a_640x480_image(stride, pool, monkeypatch):
    """The image itself is 640 wide (and 480 tall: 2-D tiles with row bands), stride 1 and 2,
    with and without a 2x2 max pool (the KPU's, or the CPU's after a stride-2 pick)."""
    m = _model(3, 480, 640, [("c1", 4, 3, stride, 1, pool)])
    row = _check(m, pixels(2, 3, 480, 640), "c1", monkeypatch)
    assert "wider than 512" in " ".join(row.notes)


@pytest.mark.parametrize("c,h,w,layer", [
    (16, 64, 600, ("c2", 16, 3, 1, 1, False)),     # an inner 3x3 conv
    (8, 32, 1000, ("c2", 8, 1, 1, 1, False)),      # a 1x1 conv
    (8, 40, 700, ("c2", 8, 3, 1, 8, False)),       # a depthwise 3x3 conv
], ids=["conv3x3", "conv1x1", "depthwise3x3"])
def test_inner_layers_on_wide_maps(c, h, w, layer, monkeypatch):
    m = _model(3, h, w, [("c1", c, 1, 1, 1, False), layer])
    _check(m, pixels(2, 3, h, w), "c2", monkeypatch)


def test_wide640_runs_on_the_kpu_faster():
    """/tmp/p47/wide's model (three stride-2 3x3 convs on a 640x480 image): its first conv ran on
    the CPU (quantized_conv2d, about 250 ms of the 263 ms estimate); in column bands on the KPU
    the whole model is estimated several times faster. Its smaller form (the plan's choice to fit
    a runtime) is still the CPU conv, so the fit planner can compare both."""
    from tl2k210.k210 import cost
    m = _model(3, 480, 640, [("c1", 8, 3, 2, 1, False), ("c2", 16, 3, 2, 1, False), ("c3", 16, 3, 2, 1, False)])
    px = pixels(2, 3, 480, 640)
    banded, rows, _, _ = compile_model(m, px)
    cpu, rows_c, _, _ = compile_model(m, px, small=frozenset({"c1"}))
    assert banded.version == 4 and rows[0].lowering == "kpu_conv" and rows_c[0].lowering == "quantized_conv2d"
    assert any("2 column bands" in nt for nt in rows[0].notes)
    fast, slow = cost.estimate(banded), cost.estimate(cpu)
    assert fast.cycles * 4 < slow.cycles and not fast.unknown
    ref, got = run_both(m, banded, px)
    assert sqnr_db(ref.reshape(-1).astype(float), got.reshape(-1).astype(float)) > 25


@pytest.mark.parametrize("attrs,groups", [
    (dict(pads=[0, 0, 1, 1], strides=[2, 2]), 1),          # stride 2, uneven pads: the CPU's pick
    (dict(pads=[0, 1, 1, 0], strides=[2, 2]), 1),          # a column pad only on the left
    (dict(pads=[1, 1, 1, 1], strides=[2, 2]), 8),          # depthwise stride 2
    (dict(pads=[1, 1, 1, 1]), 2),                          # grouped: block-diagonal tiles
], ids=["s2-cpu-pick", "s2-left-pad", "depthwise-s2", "group2"])
def test_picks_pads_and_groups_keep_their_phase(attrs, groups, monkeypatch):
    """Column bands start on the pool stride and take the CPU post stages' column pads: strided
    convs with uneven pads, a depthwise stride-2 and a grouped conv on a 777-wide map, bit for bit."""
    rng = np.random.default_rng(1)
    r = lambda *s: (rng.normal(size=s) * 0.3).astype(np.float32)   # noqa: E731
    nodes = [conv_node("c1", "x", "w1", "b1", pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             conv_node("c2", "r1", "w2", "b2", group=groups, **attrs), n("Relu", ["c2"], ["y"])]
    m = make_model(nodes, [("x", [1, 3, 60, 777])], [("y", None)],
                   {"w1": r(8, 3, 3, 3), "b1": r(8), "w2": r(8, 8 // groups, 3, 3), "b2": r(8)})
    _check(m, pixels(2, 3, 60, 777), "c2", monkeypatch)


def test_kmodel_v3_still_refuses_wide_maps():
    """kmodel v3 has no strided_slice / concat along W: a map wider than 512 is refused there."""
    from tl2k210.errors import UnsupportedOpError
    m = _model(3, 32, 600, [("c1", 4, 3, 1, 1, False)])
    with pytest.raises(UnsupportedOpError, match="600x32.*column bands, kmodel v4 only"):
        compile_model(m, pixels(2, 3, 32, 600), format="v3")
