"""A detector's objectness map -- small convs whose output a Sigmoid model output reads -- runs as
float conv2d in kmodel v4 (quantize/fake_quant.float_head): uint8 would round the rare large
logits the sigmoid magnifies. Hand-made graphs against onnxruntime."""
import numpy as np
import pytest
from onnx import helper

import tl2k210.quantize.fake_quant as fq
from lower_helpers import compile_model, conv_node, make_model, ort_run, pixels
from tl2k210.graph import from_onnx
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.flow import run_pipeline
from tl2k210.quantize.metrics import sqnr_db

H = W = 16


def head_model(sigmoid_is_output=True, head_channels=1):
    """input -> 3x3 conv (8, ReLU) -> [1x1 conv (8->k) -> 3x3 conv (k->k, large weights, a
    background bias of -6) -> NHWC -> Sigmoid = obj] and [1x1 conv (8->4) = box]."""
    r = np.random.default_rng(3)
    k = head_channels
    inits = {"w0": r.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32), "b0": np.full(8, 0.1, np.float32),
             "w1": r.normal(0, 0.5, (k, 8, 1, 1)).astype(np.float32), "b1": np.zeros(k, np.float32),
             "w2": r.normal(0, 3.0, (k, k, 3, 3)).astype(np.float32), "b2": np.full(k, -6.0, np.float32),
             "wb": r.normal(0, 0.5, (4, 8, 1, 1)).astype(np.float32), "bb": np.zeros(4, np.float32),
             "shape": np.array([1, H * W * k, 1], np.int64)}
    nodes = [conv_node("f", "x", "w0", "b0", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["f"], ["fr"], name="relu"),
             conv_node("h1", "fr", "w1", "b1"), conv_node("h2", "h1", "w2", "b2", pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["h2"], ["t"], perm=[0, 2, 3, 1], name="nhwc"),
             helper.make_node("Reshape", ["t", "shape"], ["r"], name="flat"),
             conv_node("box", "fr", "wb", "bb")]
    outputs = [("box", (1, 4, H, W))]
    if sigmoid_is_output:
        nodes.append(helper.make_node("Sigmoid", ["r"], ["obj"], name="sig"))
        outputs.insert(0, ("obj", (1, H * W * k, 1)))
    else:
        inits["two"] = np.float32(2.0)
        nodes += [helper.make_node("Sigmoid", ["r"], ["s"], name="sig"), helper.make_node("Mul", ["s", "two"], ["obj"], name="mul")]
        outputs.insert(0, ("obj", (1, H * W * k, 1)))
    return make_model(nodes, [("x", (1, 3, H, W))], outputs, inits)


def heads(model):
    g, _ = run_pipeline(from_onnx(model))
    return sorted(n.name for n in g.nodes if fq.float_head(g, n))


def test_the_logit_head_and_only_it():
    assert heads(head_model()) == ["h1", "h2"]       # not the shared feature conv, not the box conv


def test_no_head_where_the_sigmoid_is_not_the_output():
    assert heads(head_model(sigmoid_is_output=False)) == []


def test_no_head_over_the_weight_limit(monkeypatch):
    monkeypatch.setattr(fq, "HEAD_WEIGHTS_MAX", 8)     # h1 has 8 weights, h2 9
    assert heads(head_model()) == []


def test_no_head_in_a_model_quantized_by_its_own_scales():
    g, _ = run_pipeline(from_onnx(head_model()))
    g.meta["quant_ranges"] = {"x": (0.0, 1.0)}
    assert not any(fq.float_head(g, n) for n in g.nodes)


def _obj_sqnr(model, kmodel, px):
    emu = Emulator(kmodel)
    ref = np.stack([ort_run(model, (p[None] / 255.0).astype(np.float32))[0].reshape(-1) for p in px])
    got = np.stack([np.asarray(emu.run(p)[0]).reshape(-1) for p in px])
    return sqnr_db(ref.astype(np.float64).ravel(), got.astype(np.float64).ravel())


def test_v4_runs_the_head_in_float_and_keeps_the_large_logits(monkeypatch):
    model, px = head_model(), pixels(8, 3, H, W)
    kmodel, rows, _, _ = compile_model(model, px, format="v4")
    why = {r.node: r.why for r in rows}
    assert all("a Sigmoid output's head: float conv2d" in why[h] for h in ("h1", "h2")), why
    assert "float conv2d" not in why["box"] and "float conv2d" not in why["f"]
    ours = _obj_sqnr(model, kmodel, px)
    monkeypatch.setattr(fq, "HEAD_WEIGHTS_MAX", 0)       # the uint8 head it replaces
    before, rows0, _, _ = compile_model(model, px, format="v4")
    assert "float conv2d" not in {r.node: r.why for r in rows0}["h2"]
    uint8 = _obj_sqnr(model, before, px)
    print(f"obj SQNR: float head {ours:.1f} dB, uint8 head {uint8:.1f} dB")
    assert ours >= uint8 + 6 and ours >= 30


def test_the_smaller_form_keeps_the_float_head():
    """--optimize size (every node's smaller form) trades KPU convs for quantized_conv2d, not the
    float head: a few weights, float for the output's accuracy (YuNet's obj_32 lost 1 dB there)."""
    model, px = head_model(), pixels(8, 3, H, W)
    kmodel, rows, _, _ = compile_model(model, px, format="v4", small=("*",))
    why = {r.node: r.why for r in rows}
    assert all("a Sigmoid output's head: float conv2d" in why[h] for h in ("h1", "h2")), why
    assert any("smaller form" in w for w in why.values()), why


@pytest.mark.parametrize("fmt", ["v3", "auto"])
def test_v3_is_unchanged(fmt, monkeypatch):
    """No float conv in kmodel v3: its plan (and bytes) are what they were without the rule."""
    from tl2k210.k210.kmodel import dumps
    model, px = head_model(), pixels(4, 3, H, W)
    a = compile_model(model, px, format=fmt)[0]
    monkeypatch.setattr(fq, "HEAD_WEIGHTS_MAX", 0)
    b = compile_model(model, px, format=fmt)[0]
    assert a.version == 3 and dumps(a) == dumps(b)


def test_the_ideal_keeps_the_v4_heads_float():
    """fake_quant_graph mirrors the back-end: a v4 plan's heads keep float weights and outputs,
    a v3 plan's are rounded like every KPU conv."""
    g, _ = run_pipeline(from_onnx(head_model()))
    ranges = {t: (-40.0, 40.0) for n in g.nodes for t in n.outputs}
    for fmt, floats in (("v4", {"h1", "h2"}), ("v3", set())):
        g.meta["plan"] = (fmt, None)
        f = fq.fake_quant_graph(g, ranges)
        convs = {n.name: n for n in f.nodes if n.op == "Conv"}
        rounded = {k for k, n in convs.items() if n.inputs[1].endswith("/fq")}
        quantized = {n.inputs[0].rsplit("/float", 1)[0] for n in f.nodes if n.op == "QuantizeLinear"}
        assert set(convs) - rounded == floats
        assert {c.outputs[0] for k, c in convs.items()} & {o + "/float" for o in quantized} == \
            {convs[k].outputs[0] for k in set(convs) - floats}
