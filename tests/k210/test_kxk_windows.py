"""A depthwise 5x5 conv whose shift stages overflow the KPU RAM (k210/passes/kxk_windows.py):
MediaPipe's palm detector's 32-channel 96x96 5x5 conv built a 2.65 MB shift map in main memory
(its model at 3.0x the live set); in channel windows each window's copies stay in KPU RAM."""
import numpy as np
from onnx import helper

from lower_helpers import calibrated, conv_node, make_model, pixels
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.lower import Options, lower
from tl2k210.k210.lower.concat_ranges import share_concat_ranges


def _palm_like():
    r = np.random.default_rng(7)
    return make_model([conv_node("a", "x", "wa", "ba", pads=[1, 1, 1, 1]),
                       helper.make_node("Relu", ["a"], ["r"]),
                       conv_node("d", "r", "wd", "bd", pads=[2, 2, 2, 2], group=32),
                       conv_node("y", "d", "wp", "bp")],
                      [("x", [1, 3, 96, 96])], [("y", [1, 4, 96, 96])],
                      {"wa": r.normal(0, 0.4, (32, 3, 3, 3)).astype(np.float32),
                       "ba": r.normal(0, 0.2, 32).astype(np.float32),
                       "wd": r.normal(0, 0.2, (32, 1, 5, 5)).astype(np.float32),
                       "bd": r.normal(0, 0.2, 32).astype(np.float32),
                       "wp": r.normal(0, 0.3, (4, 32, 1, 1)).astype(np.float32),
                       "bp": r.normal(0, 0.2, 4).astype(np.float32)})


def _build(model, px, windows):
    g, rng = calibrated(model, px, {"kxk_windows": windows, "kxk_bands": False})
    share_concat_ranges(g, rng)
    kmodel, rows, _, lw = lower(g, rng, Options(format="v4"))
    return kmodel, g


def test_depthwise_5x5_in_channel_windows_is_the_same_conv_in_less_main_memory():
    px = pixels(2, 3, 96, 96)
    m = _palm_like()
    whole, g_whole = _build(m, px, False)
    split, g_split = _build(m, px, True)
    assert [n.op for n in g_whole.nodes].count("Concat") == 0
    assert [n.op for n in g_split.nodes].count("Slice") >= 2 and [n.op for n in g_split.nodes].count("Concat") == 1
    print("main memory", whole.main_memory, "->", split.main_memory)
    assert split.main_memory < 32 * 96 * 96 * 4 < 9 * 32 * 96 * 96 < whole.main_memory     # no 2.65 MB shift map
    for p in px:
        np.testing.assert_array_equal(Emulator(split).run(p)[0], Emulator(whole).run(p)[0])
    from tl2k210.k210.ideal import ideal           # the windows are one op's: its layer bytes once
    assert ideal(g_split).weight_bytes == ideal(g_whole).weight_bytes


def test_no_windows_for_kmodel_v3_or_a_chain_that_fits():
    """kmodel v3 has no Slice: for a v3 target the map streams through main memory as before (the
    conv stays whole, so a v3-only runtime still takes the model); and a conv whose input, copies
    and output fit the KPU RAM together (BlazeFace's 5x5 convs at 64x64) is not split."""
    from lower_helpers import from_onnx
    from tl2k210.k210.flow import run_pipeline
    g, _ = run_pipeline(from_onnx(_palm_like()), target=Options(format="v3"))
    assert "Slice" not in [n.op for n in g.nodes]
    small = _palm_like()
    small.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 48
    small.graph.input[0].type.tensor_type.shape.dim[3].dim_value = 48
    for o in small.graph.output:
        o.type.tensor_type.shape.dim[2].dim_value = o.type.tensor_type.shape.dim[3].dim_value = 48
    g, _ = run_pipeline(from_onnx(small))
    assert "Slice" not in [n.op for n in g.nodes]


def test_a_dilated_temporal_conv_finds_its_shift_cover_at_once():
    """Kendryte's own K230 keyword spotter (WeNet MDTC, round 70's hunt): a depthwise Conv1d of
    kernel 8 at dilation 8 reads 8 offsets in a 57-wide window; the exact smallest cover searched
    every subset of 55 candidate copies (hours: `convert` hung in its passes). Past COVER_TRIES
    subsets the greedy cover answers: 8 copies, each of the taps reached."""
    from tl2k210.k210.lower.kxk import _cover, _parent
    need = [u * 8 - 28 for u in range(8)]
    cover = _cover(need, range(-27, 28), _parent)
    assert len(cover) == 8 and all(_parent(v, cover) is not None for v in need)
    assert _cover([-2, 2], range(-1, 2), _parent) == (-1, 1)        # small: still the exact search


def test_a_long_filterbank_kernel_finds_its_shift_chain_in_bounded_work(monkeypatch):
    """Spotify's basic-pitch (round 71's hunt) computes its CQT as 1x256 convs: 127 copy stages,
    each a cover searched through 20,000 subsets and then greedily, every subset and step asking
    each offset's parent again (`convert` ran past 600 s in its passes; a 1x128 took 16 s). Each
    candidate's reach is now worked out once per stage, a bit mask: the chain is the same (round
    71 checked 2,271 kernels, dilations and phase axes against the old search) in 1.5 M parent
    look-ups for 1x256 (1x128: 5.8 M before, 0.19 M now)."""
    from tl2k210.k210.lower import kxk
    calls = [0]
    parent = kxk._parent

    def counted(v, s):
        calls[0] += 1
        return parent(v, s)
    monkeypatch.setattr(kxk, "_parent", counted)
    need = tuple(range(-128, 128))
    axis = kxk._axis_stride1.__wrapped__(need, 128, True)
    assert len(axis.sets) == 127 and all(axis.taps[u] is not None for u in need)
    assert all(set(axis.parents[i]) == set(axis.sets[i]) for i in range(127))
    assert calls[0] < 3_000_000


def test_a_dilated_depthwise_conv1d_converts_exactly():
    """The same layer as a model (16 channels, 105 steps): it converts (a CPU conv) and matches
    onnxruntime."""
    from lower_helpers import run_both
    from tl2k210.quantize.metrics import sqnr_db
    r = np.random.default_rng(3)
    m = make_model([conv_node("y", "x", "w", "b", group=16, dilations=[1, 8], kernel_shape=[1, 8])],
                   [("x", [1, 16, 1, 105])], [("y", [1, 16, 1, 49])],
                   {"w": r.normal(0, 0.3, (16, 1, 1, 8)).astype(np.float32),
                    "b": r.normal(0, 0.1, 16).astype(np.float32)})
    px = pixels(3, 16, 1, 105)
    g, rng = calibrated(m, px)
    kmodel = lower(g, rng, Options(format="v4"))[0]
    ref, got = run_both(m, kmodel, px)
    assert sqnr_db(ref.reshape(-1).astype(np.float64), got.reshape(-1).astype(np.float64)) > 30
