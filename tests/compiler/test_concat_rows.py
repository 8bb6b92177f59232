"""A concat of rows: YOLO-FastestV2's head concatenates per-anchor boxes, objectness and class
scores, (484, 12) + (484, 3) + (484, 80) on axis 1. Each input is 484 ranges of the output, not
one: the SDK's QUANTIZED_CONCAT / CONCAT (one range per input) cannot do it; v4's concat with
outer_size 484 can."""
import numpy as np
import pytest
from onnx import helper

from lower_helpers import compile_model, make_model, pixels, sqnr

pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(3)


def _rows_model(after):
    """x -> two 1x1 convs + Sigmoid -> (64, C) rows each -> Concat axis 1 -> `after` -> y."""
    nodes, inits = [], {}
    for k, c in (("a", 4), ("b", 2)):
        inits[f"w{k}"] = RNG.normal(0, 0.5, (c, 3, 1, 1)).astype(np.float32)
        inits[f"s{k}"] = np.array([c, 64], np.int64)
        nodes += [helper.make_node("Conv", ["x", f"w{k}"], [f"c{k}"]),
                  helper.make_node("Sigmoid", [f"c{k}"], [f"g{k}"]),
                  helper.make_node("Reshape", [f"g{k}", f"s{k}"], [f"r{k}"]),
                  helper.make_node("Transpose", [f"r{k}"], [f"t{k}"], perm=[1, 0])]
    nodes.append(helper.make_node("Concat", ["ta", "tb"], ["cat" if after else "y"], axis=1))
    if after:
        nodes.append(helper.make_node(after, ["cat"], ["y"]))
    return make_model(nodes, [("x", [1, 3, 8, 8])], [("y", None)], inits)


@pytest.mark.parametrize("after", [None, "Relu"])
def test_concat_of_rows_keeps_each_row_together(after):
    """Before: lowered as one range per input (rows (64, 4) then (64, 2) one after the other),
    the output's rows scrambled (-2.2 dB on YOLO-FastestV2)."""
    m = _rows_model(after)
    px = pixels(6, 3, 8, 8)
    kmodel, rows, _, _ = compile_model(m, px)
    assert [r.lowering for r in rows if r.op == "Concat"] == ["concat"]     # v4's, with an outer size
    assert sqnr(m, kmodel, px) > 35
