"""A concat's inputs written at its scale (lower/concat_scale.py): the DAE-like U-Net block
conv -> MaxPool -> nearest Resize -> Concat(·, conv) lowers with no REQUANTIZE, agrees with
onnxruntime as well as the requantizing form, and keeps the REQUANTIZE of a branch that another
layer reads too (it keeps its own finer steps)."""
import numpy as np
import pytest
from onnx import helper as h

from lower_helpers import compile_model, conv_node, make_model, pixels, sqnr
from tl2k210.k210.kmodel import dumps
from tl2k210.k210.lower import state

R = np.random.default_rng(11)


def unet_block(a_read_elsewhere=False):
    """x (3x16x16) -> a: conv+ReLU -> MaxPool 2 -> Resize x2 ; b: conv+ReLU ; Concat(a', b) ->
    1x1 conv y. a_read_elsewhere: a' (narrower than b) also feeds a second output z (1x1 conv)."""
    w = lambda *s: R.normal(0, 0.5, s).astype(np.float32)  # noqa: E731
    inits = {"wa": w(4, 3, 3, 3) * 0.5, "ba": w(4) * 0.5, "wb": w(4, 3, 3, 3), "bb": w(4),
             "wc": w(4, 8, 1, 1), "bc": w(4), "wz": w(2, 4, 1, 1), "sc": np.array([1, 1, 2, 2], np.float32)}
    nodes = [conv_node("a0", "x", "wa", "ba", pads=[1, 1, 1, 1]), h.make_node("Relu", ["a0"], ["a1"]),
             h.make_node("MaxPool", ["a1"], ["a2"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Resize", ["a2", "", "sc"], ["a3"], mode="nearest"),
             conv_node("b0", "x", "wb", "bb", pads=[1, 1, 1, 1]), h.make_node("Relu", ["b0"], ["b1"]),
             h.make_node("Concat", ["a3", "b1"], ["cat"], axis=1, name="cat"),
             conv_node("y", "cat", "wc", "bc")]
    outs = [("y", (1, 4, 16, 16))]
    if a_read_elsewhere:
        nodes.append(conv_node("z", "a3", "wz"))
        outs.append(("z", (1, 2, 16, 16)))
    return make_model(nodes, [("x", (1, 3, 16, 16))], outs, inits)


def _requantizes(kmodel):
    return sum(layer.name == "REQUANTIZE" for layer in kmodel.layers)


@pytest.mark.parametrize("seed", [0, 1])
def test_concat_inputs_share_its_scale_and_lose_nothing(seed, monkeypatch):
    model = unet_block()
    px = pixels(8, 3, 16, 16, seed)
    shared, _, lw, g = compile_model(model, px)
    assert _requantizes(shared) == 0
    cat = next(n for n in g.nodes if n.op == "Concat")
    quants = {lw.locs[t].quant for t in (*cat.inputs, *cat.outputs)}
    assert len(quants) == 1, quants
    monkeypatch.setattr(state, "shared_concat_ranges", lambda g, r: dict(r))   # as before: requantize
    own, _, _, _ = compile_model(model, px)
    assert _requantizes(own) == 1
    ours, before = sqnr(model, shared, px), sqnr(model, own, px)
    assert ours > 25 and ours >= before - 0.3, (ours, before)
    assert len(dumps(shared)) < len(dumps(own))


def test_a_branch_read_elsewhere_keeps_its_own_steps():
    model = unet_block(a_read_elsewhere=True)
    kmodel, _, lw, g = compile_model(model, pixels(8, 3, 16, 16))
    assert _requantizes(kmodel) == 1
    cat = next(n for n in g.nodes if n.op == "Concat")
    assert len({lw.locs[t].quant for t in (*cat.inputs, *cat.outputs)}) == 2
