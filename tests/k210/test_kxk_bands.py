"""A K x K conv whose shift stages overflow the KPU RAM, in row bands (k210/passes/kxk_bands.py):
Fritz's style-transfer net at 320x240 ran its 9x9 convs on the CPU, 2.2 s each, because their
copies over the whole map (15 MB) fitted no runtime; in row bands each band's copies stay in KPU
RAM."""
import numpy as np
import pytest
from onnx import helper

from lower_helpers import calibrated, conv_node, make_model, pixels
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.lower import Options, lower
from tl2k210.k210.lower.concat_ranges import share_concat_ranges


def _style_like(size=192, ci=8, kernel=9, dilation=1):
    r = np.random.default_rng(9)
    pad = (kernel - 1) * dilation // 2
    return make_model([conv_node("a", "x", "wa", "ba", pads=[1, 1, 1, 1]),
                       helper.make_node("Relu", ["a"], ["r"]),
                       conv_node("y", "r", "wk", "bk", pads=[pad] * 4, dilations=[dilation] * 2)],
                      [("x", [1, 3, size, size])], [("y", [1, 3, size, size])],
                      {"wa": r.normal(0, 0.4, (ci, 3, 3, 3)).astype(np.float32),
                       "ba": r.normal(0, 0.2, ci).astype(np.float32),
                       "wk": r.normal(0, 0.05, (3, ci, kernel, kernel)).astype(np.float32),
                       "bk": r.normal(0, 0.2, 3).astype(np.float32)})


def _build(model, px, bands):
    g, rng = calibrated(model, px, {"kxk_bands": bands})
    share_concat_ranges(g, rng)
    kmodel, rows, _, lw = lower(g, rng, Options(format="v4"))
    return kmodel, g, rows


@pytest.mark.parametrize("ci,kernel,dilation", [(8, 9, 1), (16, 3, 3)])
def test_a_kxk_conv_in_row_bands_is_the_same_conv_in_kpu_ram(ci, kernel, dilation):
    """A 9x9 conv, and a 3x3 dilated by 3 whose two copy stages of 9 copies each are resident
    together (bands sized by the input and last stage alone found no room in KPU RAM)."""
    px = pixels(2, 3, 192, 192)
    m = _style_like(ci=ci, kernel=kernel, dilation=dilation)
    whole, g_whole, _ = _build(m, px, False)
    banded, g_banded, rows = _build(m, px, True)
    ops = [n.op for n in g_banded.nodes]
    assert "Concat" not in [n.op for n in g_whole.nodes] and ops.count("Slice") >= 2 and ops.count("Concat") == 1
    cat = next(n for n in g_banded.nodes if n.op == "Concat")
    assert cat.attrs["axis"] == 2 and sum(g_banded.shape(t)[2] for t in cat.inputs) == 192
    bands = [r for r in rows if "/band" in r.node]
    assert bands and all(r.unit == "KPU" for r in bands)
    print("main memory", whole.main_memory, "->", banded.main_memory)
    assert banded.main_memory < whole.main_memory / 4           # no whole-map copies in main memory
    for p in px:
        np.testing.assert_array_equal(Emulator(banded).run(p)[0], Emulator(whole).run(p)[0])
    from tl2k210.k210.ideal import ideal           # the bands are one op's: its weights once
    assert ideal(g_banded).weight_bytes == ideal(g_whole).weight_bytes


def test_no_bands_for_kmodel_v3_or_a_map_that_fits():
    """kmodel v3 has no Slice, and a conv whose input, copies and output fit the KPU RAM together
    needs no bands."""
    from lower_helpers import from_onnx
    from tl2k210.k210.flow import run_pipeline
    g, _ = run_pipeline(from_onnx(_style_like()), target=Options(format="v3"))
    assert "Slice" not in [n.op for n in g.nodes]
    g, _ = run_pipeline(from_onnx(_style_like(48)))
    assert "Slice" not in [n.op for n in g.nodes]
