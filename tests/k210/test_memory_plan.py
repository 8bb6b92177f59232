"""The main-memory planner (tl2k210/k210/lower/memory.py): buffers re-placed offline from their
lifetimes, greedy by size; the plan is checked (two live buffers never overlap) and the kmodel's
outputs are bit for bit those of the online first-fit allocation."""
import numpy as np
import pytest

from tl2k210.k210.lower.memory import Block, KpuAllocator, MainAllocator, check, plan

pytest.importorskip("onnxruntime")


def test_greedy_by_size_beats_first_fit_where_a_small_buffer_splits_memory():
    """First fit puts a long-lived small buffer after a short-lived big one, so the next big
    buffer cannot reuse the gap; placing the big ones first keeps them together."""
    t = [0]
    m = MainAllocator(lambda: t[0])
    m.alloc("big1", 1000)
    m.alloc("small", 8)          # lives to the end
    t[0] = 1
    m.free("big1")
    m.alloc("big2", 1600)
    t[0] = 2
    m.free("big2")
    assert m.high == 1008 + 1600
    at, peak = plan(m.history, 2)
    assert peak == 1600 + 8 and peak < m.high
    check(m.history, at, 2)


def test_an_overlap_of_two_live_buffers_is_an_error():
    blocks = [Block("a", 0, 64, 0, 3), Block("b", 0, 64, 2, 5), Block("c", 0, 64, 3, 5)]
    check(blocks, {0: 0, 2: 0}, 5)                 # a and c: one after the other
    with pytest.raises(AssertionError, match="a .* and b .* are live together"):
        check(blocks, {0: 0, 1: 32}, 5)


@pytest.mark.parametrize("fmt", ["v3", "v4"])
def test_planned_kmodel_gives_the_same_outputs_in_less_memory(fmt, monkeypatch):
    """A tiled chain (row bands, channel chunks, CPU picks and pools): the planned kmodel's outputs
    equal the first-fit one's bit for bit, in no more main memory."""
    from lower_helpers import compile_model, pixels
    from test_lower import _chain
    from tl2k210.k210.emulator import Emulator
    from tl2k210.k210.lower import state
    m = _chain(40, 48)
    px = pixels(3, 3, 40, 48)
    planned = compile_model(m, px, format=fmt, kpu_ram_lines=500)[0]
    monkeypatch.setattr(state, "plan", lambda *a: ({}, float("inf")))
    online = compile_model(m, px, format=fmt, kpu_ram_lines=500)[0]
    mem = (lambda k: k.main_mem) if fmt == "v4" else (lambda k: k.main_mem_usage)
    assert mem(planned) <= mem(online)
    for p in px:
        for a, b in zip(Emulator(planned).run(p), Emulator(online).run(p)):
            np.testing.assert_array_equal(a, b)


def _residual(op="Add"):
    """A conv, a conv of it, their sum (each addend read there last), a conv of the sum."""
    from onnx import helper
    from lower_helpers import conv_node, make_model
    rng = np.random.default_rng(3)
    r = lambda *s: (rng.normal(size=s) * 0.4).astype(np.float32)   # noqa: E731
    inits = {"w0": r(8, 3, 3, 3), "b0": r(8), "w1": r(8, 8, 1, 1), "b1": r(8), "w3": r(1, 8, 1, 1)}
    nodes = [conv_node("c0", "x", "w0", "b0", pads=[1, 1, 1, 1]), conv_node("c1", "c0", "w1", "b1"),
             helper.make_node(op, ["c0", "c1"], ["s"], name="sum"), conv_node("y", "s", "w3")]
    return make_model(nodes, [("x", [1, 3, 16, 16])], [("y", None)], inits)


@pytest.mark.parametrize("fmt, add", [("v3", "QUANTIZED_ADD"), ("v4", "quantized_binary")])
def test_elementwise_add_writes_over_the_input_it_reads_last(fmt, add, monkeypatch):
    """The add's output takes the buffer of an addend that dies there (the SDK's and nncase's
    loops read each element before writing it: kmodel.v3/v4 IN_PLACE); the outputs are bit for
    bit those of a fresh output buffer, in less main memory."""
    from lower_helpers import compile_model, pixels
    from tl2k210.k210.emulator import Emulator
    from tl2k210.k210.lower import state
    m, px = _residual(), pixels(3, 3, 16, 16)
    model = compile_model(m, px, format=fmt)[0]
    L = next(L for L in model.items if L.name == add)
    if fmt == "v3":
        f = L.fields
        assert f["main_mem_out_address"] in (f["main_mem_in_a_address"], f["main_mem_in_b_address"])
    else:
        assert L.fields["output"] in (L.fields["input_a"], L.fields["input_b"])
    monkeypatch.setattr(state.Lowering, "in_place", lambda *a, **k: None)
    fresh = compile_model(m, px, format=fmt)[0]
    assert model.main_memory < fresh.main_memory
    for p in px:
        for a, b in zip(Emulator(model).run(p), Emulator(fresh).run(p)):
            np.testing.assert_array_equal(a, b)


def test_a_wrong_alias_is_caught_by_the_writer(monkeypatch):
    """Without the SDK fact for QUANTIZED_ADD the same plan is refused, naming the layer."""
    from lower_helpers import compile_model, pixels
    from tl2k210.k210.kmodel import v3
    monkeypatch.setattr(v3, "IN_PLACE", {})
    with pytest.raises(AssertionError, match=r"layer \d+ \(QUANTIZED_ADD\): main_mem_out_address .* overlaps"):
        compile_model(_residual(), pixels(3, 3, 16, 16), format="v3")


def test_only_the_exact_alias_of_a_full_shape_input_is_safe():
    """v3: an add's output at its input's address is safe; shifted by 8 bytes, or a dequantize
    over its input, it is not. v4: binary / quantized_binary over an input of the output's shape
    is safe; over a broadcast input, shifted, or any other op's output over its input, it is not."""
    from tl2k210.k210.kmodel import v3, v4
    T = v3.TYPE_BY_NAME

    def layer(name, **f):
        full = {k: 0 for k in T[name].struct.names}
        full.update(f)
        return v3.Layer(T[name].id, full)
    add = dict(main_mem_in_a_address=0, main_mem_in_b_address=64, count=64)
    ok = v3.KModelV3([layer("QUANTIZED_ADD", main_mem_out_address=64, **add)], [], 128)
    assert v3.overlapping_io(ok) == []
    bad = v3.KModelV3([layer("QUANTIZED_ADD", main_mem_out_address=8, **add),
                       layer("DEQUANTIZE", main_mem_in_address=0, mem_out_address=8, count=16)], [], 128)
    assert [g.split(":")[0] for g in v3.overlapping_io(bad)] == ["layer 0 (QUANTIZED_ADD)"] * 2 + ["layer 1 (DEQUANTIZE)"]

    op = v4.OPCODE_BY_NAME
    M = lambda a, n: (v4.MEM_MAIN, v4.DT_UINT8, a, n)    # noqa: E731
    full, bc = (1, 4, 4, 4), (1, 4, 1, 1)

    def qbin(a, b, o, sb=full):
        f = {k: 0 for k, _, _ in op["quantized_binary"].struct.fields}
        f.update(input_a=M(*a), input_b=M(*b), output=M(*o), in_a_shape=full, in_b_shape=sb, out_shape=full)
        return v4.Node(op["quantized_binary"].code, f)

    def model(*nodes):
        return v4.KModelV4(list(nodes), [], [], [], 256, b"")
    assert v4.overlapping_io(model(qbin((0, 64), (64, 64), (64, 64)), qbin((0, 64), (64, 4), (0, 64), bc))) == []
    wrong = model(qbin((0, 64), (64, 4), (64, 64), bc), qbin((0, 64), (64, 64), (8, 64)),
                  v4.Node(op["unary"].code, {**{k: 0 for k, _, _ in op["unary"].struct.fields},
                                             "input": (v4.MEM_MAIN, 0, 0, 64), "output": (v4.MEM_MAIN, 0, 0, 64)}))
    got = v4.overlapping_io(wrong)
    assert [g.split(":")[0] for g in got] == ["node 0 (quantized_binary)", "node 1 (quantized_binary)",
                                              "node 1 (quantized_binary)", "node 2 (unary)"]


def _pooled(pool):
    from onnx import helper
    from lower_helpers import conv_node, make_model
    rng = np.random.default_rng(4)
    r = lambda *s: (rng.normal(size=s) * 0.4).astype(np.float32)   # noqa: E731
    nodes = [conv_node("c0", "x", "w0", "b0", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("AveragePool", ["r0"], ["p"], name="pool", **pool), conv_node("y", "p", "w1")]
    return make_model(nodes, [("x", [1, 3, 18, 18])], [("y", None)],
                      {"w0": r(6, 3, 3, 3), "b0": r(6), "w1": r(4, 6, 1, 1)})


ROWS, CHANNELS = dict(kernel_shape=[3, 3], strides=[3, 3]), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])


@pytest.mark.parametrize("fmt, pool, unit", [("v3", ROWS, "output rows"), ("v3", CHANNELS, "channels"),
                                             ("v4", CHANNELS, "channels")])
def test_float_pool_a_slice_at_a_time_gives_the_whole_pools_values(fmt, pool, unit, monkeypatch):
    """With little room (float_room) the SDK's float AVERAGE_POOL2D runs a slice at a time into the
    uint8 output the next KPU conv reads: output rows of the (C*H, W) map where no window crosses
    a channel, else channels. Bit for bit the whole layer's outputs. (A v4 plan pools a 3x3/3
    window on uint8 with quantized_conv2d: no float at all.)"""
    from lower_helpers import compile_model, pixels
    from tl2k210.k210.emulator import Emulator
    from tl2k210.k210.lower import state
    m, px = _pooled(pool), pixels(3, 3, 18, 18)
    monkeypatch.setattr(state.Lowering, "float_room", lambda self, *n: None)    # no bound: one layer
    whole = compile_model(m, px, format=fmt)[0]
    monkeypatch.setattr(state.Lowering, "float_room", lambda self, *n: 200)
    model, rows = compile_model(m, px, format=fmt)[:2]
    note = " ".join(next(r for r in rows if r.node == "pool").notes)
    assert f"{unit} at a time" in note and "quantized into the uint8 output" in note
    assert len(model.items) > len(whole.items) + 4
    for p in px:
        for a, b in zip(Emulator(model).run(p), Emulator(whole).run(p)):
            np.testing.assert_array_equal(a, b)


def test_a_crop_after_the_kpu_writes_over_the_streamed_map(monkeypatch):
    """v3: a conv whose pads the KPU cannot give (pads 0 on a 3x3: the KPU pads every side) is
    cropped by QUANTIZED_MAX_POOL2D in place (kmodel.v3.pool_reads_ahead); bit for bit the
    outputs of a separate buffer."""
    from onnx import helper
    from lower_helpers import compile_model, conv_node, make_model, pixels
    from tl2k210.k210.emulator import Emulator
    from tl2k210.k210.lower import conv
    rng = np.random.default_rng(5)
    r = lambda *s: (rng.normal(size=s) * 0.4).astype(np.float32)   # noqa: E731
    nodes = [conv_node("c0", "x", "w0", "b0", pads=[0, 0, 0, 0]), helper.make_node("Relu", ["c0"], ["r0"]),
             conv_node("y", "r0", "w1")]
    m = make_model(nodes, [("x", [1, 3, 18, 18])], [("y", None)],
                   {"w0": r(6, 3, 3, 3), "b0": r(6), "w1": r(1, 6, 1, 1)})
    px = pixels(3, 3, 18, 18)
    model = compile_model(m, px, format="v3")[0]
    crop = next(L.fields for L in model.layers if L.name == "QUANTIZED_MAX_POOL2D")
    assert crop["main_mem_in_address"] == crop["main_mem_out_address"] and crop["padding_height"] < 0
    monkeypatch.setattr(conv, "_post_in_place", lambda geo: False)
    fresh = compile_model(m, px, format="v3")[0]
    assert model.main_memory < fresh.main_memory
    for p in px:
        for a, b in zip(Emulator(model).run(p), Emulator(fresh).run(p)):
            np.testing.assert_array_equal(a, b)


def test_a_pool_in_place_only_where_it_reads_ahead():
    from tl2k210.k210.kmodel import v3

    def f(shape, out, k, s, pad):
        return dict(in_shape=shape, out_shape=out, kernel_width=k, kernel_height=k, stride_width=s,
                    stride_height=s, padding_width=pad, padding_height=pad)
    assert v3.pool_reads_ahead(f((32, 32, 6), (30, 30, 6), 1, 1, -1))     # a crop
    assert v3.pool_reads_ahead(f((32, 32, 6), (16, 16, 6), 2, 2, 0))      # a 2x2 pool, a pick
    assert not v3.pool_reads_ahead(f((32, 32, 6), (32, 32, 6), 3, 1, 1))  # reads the row above
    assert not v3.pool_reads_ahead(f((8, 8, 6), (9, 9, 6), 2, 1, 1))      # a bigger output


def test_a_copy_no_later_reader_needs_is_freed_at_once(monkeypatch):
    """v4: a KPU map dequantized for a float transposed conv, whose float output a KPU conv reads
    quantized: the uint8 input dies at its DEQUANTIZE and the float output at its QUANTIZE, not
    at their last reader; the outputs are bit for bit those of keeping both copies."""
    from onnx import helper
    from lower_helpers import compile_model, conv_node, make_model, pixels
    from tl2k210.k210.emulator import Emulator
    from tl2k210.k210.lower import state
    rng = np.random.default_rng(6)
    r = lambda *s: (rng.normal(size=s) * 0.4).astype(np.float32)   # noqa: E731
    nodes = [conv_node("c0", "x", "w0", "b0", pads=[1, 1, 1, 1]),
             helper.make_node("ConvTranspose", ["c0", "wt", "bt"], ["ct"], strides=[2, 2], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),    # 3 taps on stride 2, output 2H - 1: no phase convs, float
             conv_node("y", "ct", "w1", pads=[1, 1, 1, 1])]
    m = make_model(nodes, [("x", [1, 3, 16, 16])], [("y", None)],
                   {"w0": r(8, 3, 3, 3), "b0": r(8), "wt": r(8, 8, 3, 3), "bt": r(8), "w1": r(2, 8, 3, 3)})
    px = pixels(3, 3, 16, 16)
    model, _, lw, _ = compile_model(m, px, format="v4")
    names = [L.name for L in lw.layers]
    life = {b.name.split(" ")[0]: (b.t0, b.t1) for b in lw.main.history}
    assert life["c0:u8"][1] == names.index("DEQUANTIZE") + 1 and life["ct:f32"][1] == names.index("QUANTIZE") + 1
    monkeypatch.setattr(state.Lowering, "drop_copy", lambda *a: None)
    kept = compile_model(m, px, format="v4")[0]
    assert model.main_memory < kept.main_memory
    for p in px:
        for a, b in zip(Emulator(model).run(p), Emulator(kept).run(p)):
            np.testing.assert_array_equal(a, b)


def test_v4_crop_reads_the_kpu_output_where_it_lies(monkeypatch):
    """v4: the crop after a KPU conv (pads the KPU cannot give) is a strided_slice reading the
    resident output straight from KPU RAM (nncase's interpreter maps mem_k210_kpu ranges), so the
    stride-1 map is never copied to main memory; bit for bit the outputs of that copy."""
    from onnx import helper
    from lower_helpers import compile_model, conv_node, make_model, pixels
    from tl2k210.k210.emulator import Emulator
    from tl2k210.k210.kmodel import v4
    from tl2k210.k210.lower import conv
    rng = np.random.default_rng(7)
    r = lambda *s: (rng.normal(size=s) * 0.4).astype(np.float32)   # noqa: E731
    nodes = [conv_node("c0", "x", "w0", "b0", pads=[0, 0, 0, 0]), helper.make_node("Relu", ["c0"], ["r0"]),
             conv_node("y", "r0", "w1", pads=[1, 1, 1, 1])]
    m = make_model(nodes, [("x", [1, 3, 40, 40])], [("y", None)],
                   {"w0": r(6, 3, 3, 3), "b0": r(6), "w1": r(2, 6, 3, 3)})
    px = pixels(3, 3, 40, 40)
    model = compile_model(m, px, format="v4")[0]
    sl = next(nd for nd in model.nodes if nd.name == "strided_slice")
    assert sl.fields["input"][0] == v4.MEM_KPU and sl.fields["in_shape"] == (1, 6, 40, 64)
    assert not any(nd.name == "kpu_conv2d" and nd.fields["main_mem_output"][3] for nd in model.nodes[:2])
    monkeypatch.setattr(conv, "_kpu_pick", lambda geo, *a, **k: None)
    copied = compile_model(m, px, format="v4")[0]
    assert model.main_memory < copied.main_memory
    for p in px:
        for a, b in zip(Emulator(model).run(p), Emulator(copied).run(p)):
            np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------------------------
# concat: producers write into the concat's buffer (MainAllocator.view, Lowering.concat_views)
def _branches(kind=""):
    """KPU convs h, a of h, b of a, the channel concat c of a and b (16 + 16 channels, 16x16) and
    a conv y of c. kind "dup": c = (a, b, a); "after": a is read after the concat too (s = a + d,
    d a conv of c; y a conv of s); "output": a is a model output too."""
    from onnx import helper
    from lower_helpers import conv_node, make_model
    rng = np.random.default_rng(8)
    r = lambda *s: (rng.normal(size=s) * 0.4).astype(np.float32)   # noqa: E731
    parts = ["a", "b", "a"] if kind == "dup" else ["a", "b"]
    inits = {"w0": r(16, 3, 3, 3), "wa": r(16, 16, 3, 3), "wb": r(16, 16, 3, 3), "wy": r(2, 16 * len(parts), 1, 1),
             "wd": r(16, 32, 1, 1)}
    nodes = [conv_node("h0", "x", "w0", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["h0"], ["h"]),
             conv_node("a", "h", "wa", pads=[1, 1, 1, 1]), conv_node("b", "a", "wb", pads=[1, 1, 1, 1]),
             helper.make_node("Concat", parts, ["c"], name="cat", axis=1)]
    if kind == "after":
        inits["wy"] = r(2, 48, 1, 1)
        nodes += [conv_node("d", "c", "wd"), helper.make_node("Add", ["a", "d"], ["s"], name="sum"),
                  helper.make_node("Concat", ["s", "c"], ["c2"], name="cat2", axis=1), conv_node("y", "c2", "wy")]
    else:
        nodes.append(conv_node("y", "c", "wy"))
    outs = [("y", None)] + ([("a", None)] if kind == "output" else [])
    return make_model(nodes, [("x", [1, 3, 16, 16])], outs, inits)


def _lower_with_ranges(m, px, fmt, same=()):
    """The lowering of `m`, calibrated on `px`, with the tensors `same` given one range (so no
    input of the concat needs requantizing)."""
    from lower_helpers import from_onnx, run_pipeline
    from tl2k210.k210.lower import Options, lower
    from tl2k210.quantize import calibrate
    g, _ = run_pipeline(from_onnx(m))
    rng = calibrate.ranges(calibrate.collect(g, [(p[None] / 255.0).astype(np.float32) for p in px],
                                             histograms=False), "minmax")
    if same:
        lo, hi = min(rng[t][0] for t in same), max(rng[t][1] for t in same)
        rng.update({t: (lo, hi) for t in same})
    model, _, _, lw = lower(g, rng, Options(format=fmt))
    return model, lw


def _same_outputs(a, b, px):
    from tl2k210.k210.emulator import Emulator
    for p in px:
        for x, y in zip(Emulator(a).run(p), Emulator(b).run(p)):
            np.testing.assert_array_equal(x, y)


def _copying(monkeypatch):
    """Lower every concat as a copy (no input a view), as before views existed."""
    from tl2k210.k210.lower import state
    monkeypatch.setattr(state.Lowering, "concat_views", lambda self, node, whole, parts: [False] * len(parts))


@pytest.mark.parametrize("fmt", ["v3", "v4"])
def test_concat_inputs_are_written_into_its_buffer(fmt, monkeypatch):
    """a and b are streamed by their KPU convs straight into the halves of c's buffer: no
    QUANTIZED_CONCAT (no v4 concat) is left, and the main-memory peak drops from a + b + c at the
    concat (4,096 + 4,096 + 8,192 B; h stays in KPU RAM) to c's 8,192 (its main copy is freed once
    uploaded for y's conv, whose 512 streamed bytes then take its place; before: 8,192 + 512). The
    outputs are bit for bit the copying plan's."""
    from lower_helpers import pixels
    px = pixels(3, 3, 16, 16)
    model, lw = _lower_with_ranges(_branches(), px, fmt, same=("a", "b", "c"))
    names = [L.name for L in model.items]
    assert not {"QUANTIZED_CONCAT", "concat", "REQUANTIZE", "table_lookup1d"} & set(names)
    b = lw.main.history
    assert {(b[i].name, b[j].name, o) for i, (j, o) in lw.main.views.items()} == {("a:u8", "c:u8", 0),
                                                                                    ("b:u8", "c:u8", 4096)}
    streamed = [L for L in model.items if L.name in ("K210_CONV", "kpu_conv2d") and
                (L.fields.get("flags", 0) & 1 or L.fields.get("main_mem_output", (0, 0, 0, 0))[3])]
    addr = [L.fields["main_mem_out_address"] if fmt == "v3" else L.fields["main_mem_output"][2] for L in streamed]
    assert addr == [addr[0], addr[0] + 4096, addr[2]]        # a's and b's convs, then y's: b right after a
    _copying(monkeypatch)
    copied = _lower_with_ranges(_branches(), px, fmt, same=("a", "b", "c"))[0]
    assert [L.name for L in copied.items].count("QUANTIZED_CONCAT" if fmt == "v3" else "concat") == 1
    assert (copied.main_memory, model.main_memory) == (4096 + 4096 + 8192, 8192)
    _same_outputs(model, copied, px)


@pytest.mark.parametrize("fmt", ["v3", "v4"])
@pytest.mark.parametrize("kind", ["dup", "after", "output"])
def test_concat_views_keep_what_must_not_alias(fmt, kind, monkeypatch):
    """dup: a concatenated twice is written once into c, the second copy is a copy of the first
    (from c's buffer). after: a is read after the concat by an add that would write over it in
    place (kmodel IN_PLACE) -- it may not, a lies in c's buffer, which is read after the add (with
    that write the outputs differ). output: a model output keeps its
    own buffer (the header's range). Each bit for bit the copying plan's outputs."""
    from lower_helpers import pixels
    px = pixels(3, 3, 16, 16)
    m = _branches(kind)
    model, lw = _lower_with_ranges(m, px, fmt, same=("a", "b", "c"))
    b = lw.main.history
    views = {b[i].name: o for i, (j, o) in lw.main.views.items()}
    if kind == "dup":
        assert views == {"a:u8": 0, "b:u8": 4096}
        cat = [L for L in model.items if L.name in ("QUANTIZED_CONCAT", "concat")]
        assert len(cat) == 1 and len(cat[0].data.get("ranges", cat[0].data.get("inputs"))) == 1
    elif kind == "after":
        assert {"a:u8": 0, "b:u8": 4096}.items() <= views.items()
        add = next(L for L in model.items if L.name in ("QUANTIZED_ADD", "quantized_binary")).fields
        if fmt == "v3":
            assert add["main_mem_out_address"] != add["main_mem_in_a_address"]
        else:
            assert add["output"][2] != add["input_a"][2]
    else:
        assert views == {"b:u8": 4096}
    _copying(monkeypatch)
    copied = _lower_with_ranges(m, px, fmt, same=("a", "b", "c"))[0]
    assert model.main_memory <= copied.main_memory       # the output's float copy is the peak there
    _same_outputs(model, copied, px)
    if kind == "after":
        from tl2k210.k210.lower import state
        monkeypatch.undo()
        monkeypatch.setattr(state.MainAllocator, "viewed", lambda self, name: False)
        wrong = _lower_with_ranges(m, px, fmt, same=("a", "b", "c"))[0]
        with pytest.raises(AssertionError):
            _same_outputs(wrong, copied, px)


def test_the_checker_accepts_declared_views_only():
    """a and b are declared at 0 and 64 in c (MainAllocator.view); d lives beside them. The plan
    puts the group as one buffer; the checker accepts a and b at their offsets in c and refuses
    a part moved by 8 bytes, two parts on one another, and any other buffer over the group."""
    t = [0]
    m = MainAllocator(lambda: t[0])
    m.alloc("a", 64)
    t[0] = 1
    m.alloc("b", 60)
    t[0] = 2
    m.alloc("c", 124)
    m.view("a", "c", 0)
    m.view("b", "c", 64)
    for bad in (("b", "c", 64), ("d0", "c", 4), ("d0", "c", 128)):   # b twice; unaligned; past c's end
        m.alloc("d0", 8)
        with pytest.raises(AssertionError):
            m.view(*bad)
        m.free("d0")
    m.alloc("d", 32)
    t[0] = 3
    for name in "abcd":
        m.free(name)
    blocks, views = m.history, m.views
    at, peak = plan(blocks, 3, views)
    assert peak == 128 + 32 and at[1] == at[0] + 64 == at[2] + 64 and 3 not in at    # d0 held no data
    for wrong in ({**at, 1: at[1] - 8}, {**at, 1: at[0]}, {**at, 3: at[2] + 8}):
        with pytest.raises(AssertionError, match="are live together"):
            check(blocks, wrong, 3, views)
    with pytest.raises(AssertionError, match="a .* and c .* are live together"):
        check(blocks, at, 3)                                        # the same plan without the facts


def test_a_concat_plan_without_the_view_facts_is_refused(monkeypatch):
    """a lies in c's buffer and is read after the concat (by the add): checked without the facts
    that declare the views, a and c are two live buffers on one another, and the plan is refused."""
    from lower_helpers import pixels
    from tl2k210.k210.lower import memory
    monkeypatch.setattr(memory, "_inside", lambda *a: False)
    with pytest.raises(AssertionError, match=r"plan: (a:u8 .* and c:u8|c:u8 .* and a:u8) .* are live together"):
        _lower_with_ranges(_branches("after"), pixels(3, 3, 16, 16), "v3", same=("a", "b", "c"))


@pytest.mark.slow
@pytest.mark.parametrize("path", [("corpus", "models", "DAE_for_M5StickV__Model.tflite"),        # 18 concats, v3
                                  ("corpus", "fit", "ulfd_RFB-320_nopost.tflite")])               # RFB + heads, v3
def test_real_models_with_concats_need_less_main_memory_for_the_same_outputs(path, monkeypatch):
    """Real files: the concats' inputs written into their buffers take less main memory than
    copying them, with fewer concat copies (docs/results.md: bench/memory.py before and after),
    and the emulator's outputs are bit for bit those of the copying plan."""
    from conftest import data_path
    from lower_helpers import from_onnx, pixels, run_pipeline
    from tl2k210.frontends import load_model
    m = load_model(str(data_path(*path)))
    g, _ = run_pipeline(from_onnx(m))
    c, h, w = g.shape(g.inputs[0])[1:]
    px = pixels(2, c, h, w)
    copies = lambda k: sum(L.name in ("CONCAT", "QUANTIZED_CONCAT", "concat") for L in k.items)   # noqa: E731
    model, lw = _lower_with_ranges(m, px, "auto")
    _copying(monkeypatch)
    copied = _lower_with_ranges(m, px, "auto")[0]
    assert model.main_memory < copied.main_memory and copies(model) < copies(copied) and lw.main.views
    _same_outputs(model, copied, px)
    # a refusal's "buffers at the main-memory peak": those live at the layer where the most bytes
    # are (they had been those live where the topmost buffer starts: a PAN's 1 MB of its 8 MB)
    blocks = [b for i, b in enumerate(lw.main.history) if i not in lw.main.views]
    most = max(sum(b.size for b in blocks if b.live(t, len(lw.layers) + 1)) for t in range(len(lw.layers) + 1))
    assert sum(size for _, size in lw.main.at_high.values()) == most


# ---------------------------------------------------------------------------------------------
# tables in place, copies dropped at their last reader, float outputs alone at the end
def _pool_then(tail, shape=(1, 3, 16, 16), pool=None, outs=("y",)):
    """conv c0 (+ReLU) -> MaxPool (a CPU layer: its uint8 map in main memory) -> `tail` nodes -> y."""
    from onnx import helper
    from lower_helpers import conv_node, make_model
    rng = np.random.default_rng(9)
    r = lambda *s: (rng.normal(size=s) * 0.4).astype(np.float32)   # noqa: E731
    nodes = [conv_node("c0", "x", "w0", "b0", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("MaxPool", ["r0"], ["p"], name="pool", **(pool or dict(kernel_shape=[3, 3], strides=[1, 1],
                                                                                        pads=[1, 1, 1, 1])))]
    return make_model(nodes + tail, [("x", list(shape))], [(o, None) for o in outs],
                      {"w0": r(6, 3, 3, 3), "b0": r(6), "w1": r(2, 6, 3, 3), "w2": r(4, 6, 1, 1)})


@pytest.mark.parametrize("fmt, op", [("v3", "REQUANTIZE"), ("v4", "table_lookup1d")])
def test_a_table_writes_over_the_map_it_reads_last(fmt, op, monkeypatch):
    """A Tanh on the pool's uint8 map is a 256-entry table that writes over the map, which dies
    there (kpu_requantize and nncase's table_lookup1d read byte i only to write byte i:
    kmodel.v3/v4 IN_PLACE); the outputs are bit for bit those of a fresh buffer."""
    from onnx import helper
    from lower_helpers import compile_model, conv_node, pixels
    from tl2k210.k210.lower import state
    m = _pool_then([helper.make_node("Tanh", ["p"], ["t"], name="tanh"), conv_node("y", "t", "w1", pads=[1, 1, 1, 1])])
    px = pixels(3, 3, 16, 16)
    model = compile_model(m, px, format=fmt)[0]
    L = next(L for L in model.items if L.name == op)
    f = L.fields
    if fmt == "v3":
        assert f["main_mem_in_address"] == f["main_mem_out_address"]
    else:
        assert f["input"] == f["output"]
    monkeypatch.setattr(state.Lowering, "in_place", lambda *a, **k: None)
    fresh = compile_model(m, px, format=fmt)[0]
    assert model.main_memory <= fresh.main_memory
    _same_outputs(model, fresh, px)


def test_a_table_over_its_input_is_safe_only_in_place():
    """v3 REQUANTIZE and v4 table_lookup1d: output == input is safe; shifted by 8 bytes it is not."""
    from tl2k210.k210.kmodel import v3, v4
    T = v3.TYPE_BY_NAME

    def rq(out):
        full = {k: 0 for k in T["REQUANTIZE"].struct.names}
        full.update(main_mem_in_address=0, main_mem_out_address=out, count=64)
        return v3.Layer(T["REQUANTIZE"].id, full, data={"table": np.arange(256, dtype=np.uint8)})
    assert v3.overlapping_io(v3.KModelV3([rq(0)], [], 128)) == []
    assert [g.split(":")[0] for g in v3.overlapping_io(v3.KModelV3([rq(8)], [], 128))] == ["layer 0 (REQUANTIZE)"]
    op = v4.OPCODE_BY_NAME["table_lookup1d"]

    def lut(out):
        f = {k: 0 for k, _, _ in op.struct.fields}
        f.update(input=(v4.MEM_MAIN, v4.DT_UINT8, 0, 64), table=(v4.MEM_MAIN, v4.DT_UINT8, 64, 256),
                 output=(v4.MEM_MAIN, v4.DT_UINT8, out, 64))
        return v4.Node(op.code, f)
    model = lambda *n: v4.KModelV4(list(n), [], [], [], 512, b"")   # noqa: E731
    assert v4.overlapping_io(model(lut(0))) == []
    got = [g.split(":")[0] for g in v4.overlapping_io(model(lut(8), lut(64)))]   # over the input and the table;
    assert got == ["node 0 (table_lookup1d)"] * 2 + ["node 1 (table_lookup1d)"]  # over the table


def test_float_outputs_leave_no_uint8_copy_beside_them(monkeypatch):
    """v4, two outputs: each uint8 output map dies at the DEQUANTIZE that writes its float copy,
    the larger one first, so the end of the model holds the float outputs only."""
    from lower_helpers import compile_model, conv_node, pixels
    m = _pool_then([conv_node("y", "p", "w1", pads=[1, 1, 1, 1]), conv_node("z", "p", "w2")], outs=("y", "z"))
    model, _, lw, _ = compile_model(m, px := pixels(3, 3, 16, 16), format="v4")
    deq = [i for i, L in enumerate(lw.layers) if L.name == "DEQUANTIZE"]
    life = {b.name.split(" ")[0]: (b.t0, b.t1) for b in lw.main.history}
    assert life["z:u8"][1] == deq[0] + 1 and life["y:u8"][1] == deq[1] + 1      # z: 4 channels, y: 2
    assert lw.layers[deq[0]].fields["count"] == 4 * 16 * 16
    assert model.main_memory == max(lw.main.high, 4 * 6 * 16 * 16)
    from tl2k210.k210.emulator import Emulator
    got = [Emulator(model).run(p) for p in px]
    assert [a.size for a in got[0]] == [2 * 16 * 16, 4 * 16 * 16]


def test_a_float_copy_dies_at_its_last_float_reader(monkeypatch):
    """v4: the pool's map is read by a float bilinear Resize and, later, by a uint8 add: its float
    copy dies at the resize, not at the add; bit for bit the outputs of keeping it."""
    from onnx import helper
    from lower_helpers import compile_model, conv_node, make_model, pixels
    from tl2k210.k210.lower import state
    rng = np.random.default_rng(10)
    r = lambda *s: (rng.normal(size=s) * 0.4).astype(np.float32)   # noqa: E731
    nodes = [conv_node("c0", "x", "w0", "b0", pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c0", "", "sc"], ["up"], name="up", mode="linear",
                              coordinate_transformation_mode="align_corners"),
             conv_node("d", "up", "w1", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Add", ["c0", "d"], ["s"], name="sum"), conv_node("y", "s", "w2")]
    m = make_model(nodes, [("x", [1, 3, 16, 16])], [("y", None)],
                   {"w0": r(6, 3, 3, 3), "b0": r(6), "w1": r(6, 6, 3, 3), "w2": r(2, 6, 1, 1),
                    "sc": np.array([1, 1, 2, 2], np.float32)})
    px = pixels(3, 3, 16, 16)
    # the whole float map (no main-memory bound: else the resize runs a slice of channels at a
    # time into a uint8 output, and c0 has no float copy at all)
    monkeypatch.setattr(state.Lowering, "float_room", lambda self, *new: None)
    model, rows, lw, _ = compile_model(m, px, format="v4")
    assert next(r for r in rows if r.node == "up").lowering == "resize_bilinear"
    up = max(next(r for r in rows if r.node == "up").layers)
    life = {b.name: (b.t0, b.t1) for b in lw.main.history}
    assert life["c0:f32"][1] == up + 1 and life["s:u8 (in place of c0:u8)"][0] < up     # the add writes over c0
    monkeypatch.setattr(state.Lowering, "drop_copy", lambda *a: None)
    kept = compile_model(m, px, format="v4")[0]
    assert model.main_memory < kept.main_memory
    _same_outputs(model, kept, px)


def test_a_max_pool_in_float_a_channel_at_a_time_is_its_smaller_form(monkeypatch):
    """v4 pools in float: the 3x3/2 max pool's float temporaries are one slice of all channels in
    the fastest form (main memory unbounded here: no float_room), one channel at a time in its
    smaller form ("<node>/slices"), which the fit plan may take: the same output bytes in less
    main memory."""
    from lower_helpers import compile_model, conv_node, pixels
    from tl2k210.k210.lower import state
    from tl2k210.k210.lower.memory import SLICES
    monkeypatch.setattr(state.Lowering, "float_room", lambda self, *n: None)
    m = _pool_then([conv_node("y", "p", "w1", pads=[1, 1, 1, 1])], shape=(1, 3, 32, 32),
                   pool=dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    px = pixels(3, 3, 32, 32)
    fast, _, lw, _ = compile_model(m, px, format="v4")
    assert lw.smaller["pool" + SLICES] is True
    small, rows = compile_model(m, px, format="v4", small=frozenset({"pool" + SLICES}))[:2]
    assert next(r for r in rows if r.node == "pool").form.startswith("float temporaries a channel at a time")
    assert small.main_memory < fast.main_memory and len(small.nodes) == len(fast.nodes) + 3 * 5
    _same_outputs(small, fast, px)


def test_float_slices_are_never_smaller_than_the_nodes_they_add():
    """Where main memory has no room (float_room <= 0), a pool on small maps is not cut into a
    slice per channel: a slice that saves fewer float bytes than its own nodes add to the kmodel
    (SLICE_NODE_BYTES) is not split off. A pool of ten 1x4 rows (ONNX's MaxPool1d test): one slice
    (its 10-slice form was 2,264 B of kmodel for 200 B of float); a 160x160 map: one channel."""
    from tl2k210.k210.lower.memory import SLICE_NODE_BYTES, float_slices
    assert float_slices(10, 4, 4 * (4 + 1), room=-100) == [(0, 10)]
    assert float_slices(8, 16, 4 * (16 + 4), room=0) == [(0, 3), (3, 6), (6, 8)]     # 80 B a channel
    assert float_slices(64, 25600, 4 * (25600 + 6400), room=0) == [(c, c + 1) for c in range(64)]
    assert float_slices(64, 25600, 4 * (25600 + 6400), room=3 * 128000)[0] == (0, 3)
    assert -(-SLICE_NODE_BYTES // 80) == 3


@pytest.mark.parametrize("out", ["u8", "f32"])
def test_a_float_binary_on_uint8_maps_runs_a_slice_at_a_time(out, monkeypatch):
    """v4: Div (float only) of two uint8 maps no later op reads as float: dequantized and divided a
    few rows at a time, into the uint8 map the next conv reads ("u8") or into the float model
    output ("f32"), with no whole float copy of either input; bit for bit the whole-map form."""
    from onnx import helper
    from lower_helpers import compile_model, conv_node, make_model, pixels
    from tl2k210.k210.lower import v4elementwise
    rng = np.random.default_rng(11)
    r = lambda *s: (rng.normal(size=s) * 0.4).astype(np.float32)   # noqa: E731
    nodes = [conv_node("a", "x", "wa", "ba", pads=[1, 1, 1, 1]), conv_node("d0", "x", "wd", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["d0"], ["d"]), helper.make_node("Div", ["a", "d"], ["q"], name="div")]
    if out == "u8":
        nodes.append(conv_node("y", "q", "wy"))
    m = make_model(nodes, [("x", [1, 3, 64, 64])], [("y" if out == "u8" else "q", None)],
                   {"wa": r(4, 3, 3, 3), "ba": r(4) + 2.0, "wd": r(4, 3, 3, 3), "wy": r(2, 4, 1, 1)})
    px = pixels(3, 3, 64, 64)
    model, rows, lw, _ = compile_model(m, px, format="v4")
    note = " ".join(next(r for r in rows if r.node == "div").notes)
    assert "rows of 64 at a time" in note and ("quantized into the uint8 output" in note) == (out == "u8")
    names = {b.name.split(" ")[0] for b in lw.main.history}
    assert "a:f32" not in names and "d:f32" not in names and ("q:f32" in names) == (out == "f32")
    monkeypatch.setattr(v4elementwise, "_sliced_binary", lambda *a: False)
    whole = compile_model(m, px, format="v4")[0]
    assert model.main_memory < whole.main_memory
    _same_outputs(model, whole, px)


def test_an_instance_norm_divides_a_few_channels_at_a_time(monkeypatch):
    """v4: InstanceNormalization (style transfer, GAN generators) runs on uint8 maps up to its
    Div by the per-channel deviation, which only the float binary has: its float output was the
    main-memory peak, 4.0x the live set of the 8-bit ideal. Now the centred uint8 map is divided
    a few whole channels at a time (each slice reads its slice of the deviations) into the uint8
    map the conv after it reads: within 1.25x, bit for bit the whole-map form."""
    from onnx import helper
    from lower_helpers import compile_model, conv_node, make_model, pixels
    from tl2k210.k210.ideal import ideal
    from tl2k210.k210.lower import v4elementwise
    rng = np.random.default_rng(12)
    r = lambda *s: (rng.normal(size=s) * 0.4).astype(np.float32)   # noqa: E731
    c = 32
    nodes = [conv_node("a", "x", "wa", "ba", pads=[1, 1, 1, 1]),
             helper.make_node("InstanceNormalization", ["a", "s", "b"], ["n"], name="norm"),
             helper.make_node("Relu", ["n"], ["r"]), conv_node("y", "r", "wy")]
    m = make_model(nodes, [("x", [1, 3, 64, 64])], [("y", None)],
                   {"wa": r(c, 3, 3, 3), "ba": r(c), "s": r(c) + 1, "b": r(c), "wy": r(4, c, 1, 1)})
    px = pixels(3, 3, 64, 64)
    model, rows, lw, g = compile_model(m, px, format="v4")
    div = next(r for r in rows if r.node == "norm/normalize")
    assert div.lowering == "float_binary" and "channels of 64x64 at a time, quantized into the uint8 output" in \
        " ".join(div.notes)
    assert "norm/normalize:f32" not in {b.name.split(" ")[0] for b in lw.main.history}
    assert model.main_memory <= 1.25 * ideal(g).live_bytes
    monkeypatch.setattr(v4elementwise, "_sliced_binary", lambda *a: False)
    whole = compile_model(m, px, format="v4")[0]
    assert whole.main_memory > 3 * ideal(g).live_bytes
    _same_outputs(model, whole, px)


def test_a_kpu_ram_refusal_names_the_largest_free_piece():
    """Free lines split by a resident map: the refusal says the largest piece, and the total apart
    (it printed the total as the piece: "needs 130,560 B but only 138,752 B ... free in one
    piece", style_reflect128, round 45)."""
    from tl2k210.errors import KpuLimitError
    a = KpuAllocator(lines=100)
    a.alloc("low", 10, "x")
    a.alloc("mid", 30, "x")
    a.free("low")                       # free: lines 0-10 and 40-100
    with pytest.raises(KpuLimitError) as e:
        a.alloc("big", 65, "conv")
    msg = str(e.value)
    assert "needs 4,160 B" in msg and "only 3,840 B" in msg and "4,480 B free in all" in msg
    assert a.alloc("fits", 60, "conv") == 40
