"""A channel concat and the maps it copies share one grid (tl2k210/k210/lower/concat_ranges.py):
no REQUANTIZE table before the copy, one rounding instead of two."""
import numpy as np
import onnx
import pytest
from onnx import helper
from PIL import Image

from front_helpers import make_model, rand
from lower_helpers import conv_node, pixels
from tl2k210.graph import Node, from_onnx
from tl2k210.k210.flow import run_pipeline
from tl2k210.k210.lower.concat_ranges import share_concat_ranges

pytest.importorskip("onnxruntime")
X = ("x", [1, 3, 32, 32])


def _model(head="conv"):
    """Two ReLU convs of different scales (one through a 2x2 max pool and a nearest 2x upsample)
    concatenated, then a conv (or the concat is the model output)."""
    n = helper.make_node
    nodes = [conv_node("a", "x", "wa", "ba", pads=[1, 1, 1, 1]), n("Relu", ["a"], ["ar"]),
             conv_node("b", "x", "wb", "bb", pads=[1, 1, 1, 1]), n("Relu", ["b"], ["br"]),
             n("MaxPool", ["br"], ["bp"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Resize", ["bp", "", "scales"], ["bu"], mode="nearest"),
             n("Concat", ["ar", "bu"], ["cat"], axis=1)]
    inits = {"wa": rand(8, 3, 3, 3, scale=0.3), "ba": rand(8, scale=0.1), "wb": rand(8, 3, 3, 3, scale=2.0),
             "bb": rand(8, scale=0.5), "scales": np.array([1, 1, 2, 2], np.float32)}
    if head == "conv":
        nodes += [conv_node("y", "cat", "wc", "bc", pads=[1, 1, 1, 1])]
        inits.update(wc=rand(4, 16, 3, 3, scale=0.2), bc=rand(4, scale=0.1))
        return make_model(nodes, [X], [("y", [1, 4, 32, 32])], inits)
    return make_model(nodes[:-1] + [n("Concat", ["ar", "bu"], ["y"], axis=1)], [X], [("y", None)], inits)


def test_inputs_take_the_concat_range_through_pools_and_resizes():
    g, _ = run_pipeline(from_onnx(_model()))
    cat = next(x for x in g.nodes if x.op == "Concat")
    a, b = cat.inputs                     # the ReLUs fused into the convs: conv, pool, resize outputs
    chain = [b, g.producer(b).inputs[0], g.producer(g.producer(b).inputs[0]).inputs[0]]
    ranges = {t: (0.0, 1.0) for t in g.tensors if not g.tensors[t].is_const}
    ranges.update({a: (0.0, 0.5), cat.outputs[0]: (0.0, 4.0)}, **{t: (0.0, 4.0) for t in chain})
    assert share_concat_ranges(g, ranges) == 1
    assert ranges[a] == (0.0, 4.0) and all(ranges[t] == (0.0, 4.0) for t in chain)


def test_a_shared_map_and_a_model_output_keep_their_ranges():
    g, _ = run_pipeline(from_onnx(_model("output")))
    ranges = {t: (0.0, 1.0 + i) for i, t in enumerate(g.tensors) if not g.tensors[t].is_const}
    before = dict(ranges)
    assert share_concat_ranges(g, ranges) == 0 and ranges == before    # float concat: own steps
    g, _ = run_pipeline(from_onnx(_model()))
    cat = next(x for x in g.nodes if x.op == "Concat")
    g.nodes.append(Node("Relu", [cat.inputs[0]], [g.add_tensor("second_reader")], {}, "second_reader"))
    ranges = {t: (0.0, 1.0 + i) for i, t in enumerate(g.tensors) if not g.tensors[t].is_const}
    ranges[cat.outputs[0]] = (0.0, 100.0)
    kept = ranges[cat.inputs[0]]
    share_concat_ranges(g, ranges)
    assert ranges[cat.inputs[0]] == kept                  # read twice: its other reader keeps its grid


def test_no_requantize_before_the_copy_and_the_kmodel_agrees(tmp_path, monkeypatch):
    from tl2k210 import compiler
    from tl2k210.compare import compare
    from tl2k210.k210 import kmodel
    src = tmp_path / "cat.onnx"
    onnx.save(_model(), src)
    for i, p in enumerate(pixels(12, 3, 32, 32, seed=3)):
        Image.fromarray(p.transpose(1, 2, 0)).save(tmp_path / f"{i}.png")
    opts = compiler.ConvertOptions(dataset=str(tmp_path), progress=False, input_range=(0.0, 1.0))

    def build(name):
        out = tmp_path / name
        compiler.convert(str(src), out, opts)
        return [x.name for x in kmodel.load(out).layers], compare(str(src), str(out), str(tmp_path))
    kinds, rep = build("shared.kmodel")
    assert "REQUANTIZE" not in kinds and kinds.count("QUANTIZED_CONCAT") <= 1
    monkeypatch.setattr(compiler, "share_concat_ranges", lambda g, r: 0)
    before, rep0 = build("own.kmodel")
    assert before.count("REQUANTIZE") == 1                # the narrower input rounded twice before
    sq, sq0 = (list(r["outputs"].values())[0]["sqnr_db"] for r in (rep, rep0))
    print(f"concat sharing its grid: {sq:.2f} dB, each input on its own: {sq0:.2f} dB")
    assert sq >= 30 and sq >= sq0 - 0.2
