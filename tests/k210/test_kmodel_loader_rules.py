"""The reader accepts what the SDK/MaixPy loaders accept (docs/kmodel-format.md#reader-rules): v3 bodies at unaligned
offsets (Maix-EMC), conv blocks at any gap, fractional zero points, layer type 21; it notes every
deviation from nncase's writer habits; header claims are checked against the file length first."""
import dataclasses
import struct

import numpy as np
import pytest

from conftest import TESTDATA, data_path
from tl2k210.errors import KmodelFormatError
from tl2k210.k210 import kmodel
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.emulator import kpu as K
from tl2k210.k210.inspect import describe, render
from tl2k210.k210.kmodel import v3

CORPUS = TESTDATA / "corpus" / "kmodels"


def relay_unaligned(data: bytes, extra) -> bytes:
    """Re-lay a v3 file by hand (independent of our reader/writer): after body i insert
    extra[i] zero bytes (growing its body_size), and move the four absolute offsets inside every
    K210_CONV body by the bytes inserted before it. The SDK walks body_size, so this is a file
    the SDK loads exactly like the original."""
    n_layers, = struct.unpack_from("<I", data, 12)
    n_out, = struct.unpack_from("<I", data, 24)
    table = 28 + 8 * n_out
    head = bytearray(data[:table + 8 * n_layers])
    pos, shift, bodies = table + 8 * n_layers, 0, []
    for i in range(n_layers):
        typ, size = struct.unpack_from("<II", data, table + 8 * i)
        body = bytearray(data[pos:pos + size])
        body += bytes(size - len(body))  # nncase v0.1 files may end short of the last padding
        if typ == 10240:
            offs = struct.unpack_from("<4I", body, 8)
            struct.pack_into("<4I", body, 8, *(o + shift for o in offs))
        k = extra[i % len(extra)]
        body += bytes(k)
        struct.pack_into("<II", head, table + 8 * i, typ, size + k)
        bodies.append(bytes(body))
        pos += size
        shift += k
    return bytes(head) + b"".join(bodies)


UNALIGNED_FILES = ["kmodels/mnist_v3.kmodel", "corpus/kmodels/canmv_examples__ld5.kmodel",
                   "kmodels/facedetect_320x240_v3.kmodel"]


@pytest.mark.parametrize("rel", UNALIGNED_FILES, ids=lambda r: r.split("/")[-1])
def test_unaligned_v3_file_loads_runs_and_round_trips(rel):
    data = data_path(*rel.split("/")).read_bytes()
    orig = kmodel.loads(data)
    moved = relay_unaligned(data, [3, 5, 1, 7, 2])
    m = kmodel.loads(moved)
    starts = np.cumsum([0] + [L.body_size or 0 for L in m.layers])
    assert any(L.body_size for L in m.layers)
    note = [n for n in m.notes if "unaligned offset" in n]
    assert note and "Maix-EMC layout; the SDK loads it" in note[0]
    assert "Maix-EMC layout; the SDK loads it" in render(describe(m))
    assert kmodel.dumps(m) == moved                     # byte-exact rewrite of the new layout
    x = np.random.default_rng(0).integers(0, 256, Emulator(orig).input_spec()[0]).astype(np.uint8)
    for a, b in zip(Emulator(orig).run(x), Emulator(m).run(x)):
        assert np.array_equal(a, b)
    assert starts.size == len(m.layers) + 1


def test_conv_blocks_at_arbitrary_gaps_and_alignment_one():
    """Writer-made variants: blocks packed with no alignment, or at odd gaps, read back equal."""
    data = data_path("kmodels", "mnist_v3.kmodel").read_bytes()
    m = kmodel.loads(data)
    convs = [L for L in m.layers if L.conv is not None]
    convs[0].align = {b: 1 for b in v3.CONV_BLOCKS}
    convs[1].gaps = {"weights": 3, "bn": 1, "act": 5}
    out = kmodel.dumps(m)
    back = kmodel.loads(out)
    assert kmodel.dumps(back) == out
    bc = [L for L in back.layers if L.conv is not None]
    f0, f1 = bc[0].fields, bc[1].fields
    assert f0["weights_offset"] == f0["layer_offset"] + 96
    assert f1["weights_offset"] == f1["layer_offset"] + 96 + 3
    assert any("below nncase's alignment" in n for n in back.notes)
    x = np.random.default_rng(1).integers(0, 256, (1, 28, 28)).astype(np.uint8)
    assert np.array_equal(Emulator(m).run(x)[0], Emulator(back).run(x)[0])


def test_fractional_zero_point_runs_with_the_silicon_rule():
    """Maix-EMC uses arg_x that is not a multiple of 2^shr_x (docs/kpu.md#sum-rule): both Σ rules run and
    the default is the silicon rule, layer output = the stage-by-stage reference."""
    m = kmodel.load(data_path("kmodels", "mnist_v3.kmodel"))
    conv = m.layers[1].conv     # 16 input channels: the two rules can differ
    if conv.args["shr_x"] == 0:
        conv.args["shr_x"], conv.args["arg_x"] = 4, conv.args["arg_x"] * 16
    conv.args["arg_x"] += 5                               # a fractional zero point
    back = kmodel.loads(kmodel.dumps(m))
    assert any("fractional zero point" in n and "silicon" in n for n in back.notes)
    x = np.random.default_rng(2).integers(0, 256, (1, 28, 28)).astype(np.uint8)
    c = back.layers[1].conv
    w = c.weights.reshape(c.out_shape[0], c.in_shape[0], c.k, c.k)
    for rule in K.SUM_RULES:
        _, trace = Emulator(back, sum_rule=rule).run(x, trace=True)
        want = K.reference_layer(trace[0][1], w, c.args, c.bn, c.act, sum_rule=rule)
        assert np.array_equal(trace[1][1], want), rule
    a = Emulator(back, sum_rule="silicon").run(x, trace=True)[1][1][1]
    b = Emulator(back, sum_rule="simulator").run(x, trace=True)[1][1][1]
    assert not np.array_equal(a, b)   # the rules differ here, as docs/kpu.md#sum-rule says they can


def test_quantized_tensorflow_flatten_type_21_runs():
    """Layer type 21 (Maix-EMC): uint8 CHW -> HWC, appended after a conv that streams its map."""
    m = kmodel.load(data_path("kmodels", "mnist_v3.kmodel"))
    i = next(i for i, L in enumerate(m.layers) if L.conv is not None and L.fields["flags"] & 1)
    conv = m.layers[i]
    c, h, w = conv.conv.out_shape
    src, dst = conv.fields["main_mem_out_address"], m.main_mem_usage
    flat = v3.Layer(21, dict(flags=0, main_mem_in_address=src, main_mem_out_address=dst,
                             shape=(w, h, c)))
    m.layers.insert(i + 1, flat)
    m.main_mem_usage += c * h * w
    back = kmodel.loads(kmodel.dumps(m))
    x = np.random.default_rng(3).integers(0, 256, (1, 28, 28)).astype(np.uint8)
    _, trace = Emulator(back).run(x, trace=True)
    chw, hwc = trace[i][1], trace[i + 1][1]
    assert np.array_equal(hwc, chw.transpose(1, 2, 0).reshape(-1))
    assert "QUANTIZED_TENSORFLOW_FLATTEN" in render(describe(back))


# ---------------------------------------------------------------------------------------------
def _first_header(name):
    return data_path("kmodels", name).read_bytes()


@pytest.mark.parametrize("field_off,value,field", [
    (12, 26_000_000, "layers_length"), (24, 26_000_000, "output_count"),
    (12, 0xFFFFFFFF, "layers_length"), (20, 0x7FFFFFFF, "main_mem_usage"),
])
def test_v3_header_claims_fail_before_building_entries(field_off, value, field):
    d = bytearray(_first_header("mnist_v3.kmodel"))
    struct.pack_into("<I", d, field_off, value)
    with pytest.raises(KmodelFormatError) as e:
        kmodel.loads(bytes(d))
    assert e.value.field == field and e.value.offset == field_off


@pytest.mark.parametrize("field_off,value,field", [
    (24, 26_000_000, "nodes"), (16, 0xFFFFFFF0, "constants"), (28, 0x10000000, "inputs"),
    (32, 0x10000000, "outputs"),
])
def test_v4_header_claims_fail_before_building_entries(field_off, value, field):
    d = bytearray(_first_header("iris_v4.kmodel"))
    struct.pack_into("<I", d, field_off, value)
    with pytest.raises(KmodelFormatError) as e:
        kmodel.loads(bytes(d))
    assert e.value.field == field and e.value.offset == field_off


def test_body_size_claims_name_the_layer():
    d = bytearray(_first_header("mnist_v3.kmodel"))
    n_out, = struct.unpack_from("<I", d, 24)
    at = 28 + 8 * n_out + 8 * 3 + 4            # layer 3's body_size
    struct.pack_into("<I", d, at, 0x7FFF0000)
    with pytest.raises(KmodelFormatError) as e:
        kmodel.loads(bytes(d))
    assert e.value.field == "layer 3 body_size" and e.value.offset == at
    struct.pack_into("<I", d, at, 0x80000000)   # negative as the loader's int
    with pytest.raises(KmodelFormatError, match="ERR_KMODEL_FORMAT"):
        kmodel.loads(bytes(d))


VERSION_MESSAGES = {
    "PaddlePi__facerec_detect_v1.kmodel": ("legacy kmodel v1", "model compiler", "no MaixPy"),
    "riscVaudioDenoising__weights_test_v5.kmodel": ("kmodel v5", "nncase 1.x", "standalone SDK"),
    "canmv_examples__face_detection_320_K230_v6.kmodel": ("kmodel v6", "nncase 2.x", "K230"),
}


@pytest.mark.parametrize("name", sorted(VERSION_MESSAGES))
def test_other_versions_say_what_they_are_and_what_reads_them(name):
    p = CORPUS / name
    if not p.exists():
        pytest.skip(f"corpus missing: {p}")
    with pytest.raises(KmodelFormatError) as e:
        kmodel.load(p)
    for needle in VERSION_MESSAGES[name]:
        assert needle in str(e.value), (needle, str(e.value))


def test_packed_v3_fills_the_gaps_and_stores_an_alike_block_once():
    """`v3._pack` on a hand-made model (docs/kmodel-format.md#v3-conv-parameter-placement): two
    K210_CONVs of nncase's mnist kmodel, the second with the first's activation table, and a
    DEQUANTIZE. Header 28 + 8 (one output) + 3 x 8 = 60. Conv 0's header at 60 (padded to 88),
    conv 1's at 88, the DEQUANTIZE at 112: both fit before 256, where the first waiting block
    goes. Before it, conv 0's layer argument (136..232); conv 1's (96 B) fits only before 512. Then
    conv 0's weights @256 (144 B), its BN @512 (128 B), its table @768 (shared by conv 1),
    conv 1's weights @1024 (4,608 B) and BN right after at 5,632 (a multiple of 256): 5,888 B,
    every block at its alignment, the table once (`_pack_stream`, 24 B shorter than
    `_pack_holes`: `_pack` keeps the shorter); nncase's in-body order of the same layers takes
    more. Read back: packed, the sharing recognised, written back byte for byte."""
    m = kmodel.loads(data_path("kmodels", "mnist_v3.kmodel").read_bytes())
    c0, c1 = m.layers[0], m.layers[1]
    c1.conv.act = {k: np.array(v) for k, v in c0.conv.act.items()}
    c1.conv.act_reserved = c0.conv.act_reserved
    c1.shared = {"act": 0}
    hand = v3.KModelV3([c0, c1, m.layers[2]], [(0, 40)], m.main_mem_usage, packed=True)
    data = kmodel.dumps(hand)
    assert len(data) == 5888
    blocks = v3._conv_blocks(hand)
    assert [sum(map(len, pack(hand, 60, blocks, v3.DEFAULT_ALIGN)[0]))
            for pack in (v3._pack_holes, v3._pack_stream)] == [5852, 5828]
    back = kmodel.loads(data)
    assert back.packed and not back.notes and kmodel.dumps(back) == data
    f0, f1 = back.layers[0].fields, back.layers[1].fields
    assert [f0[b + "_offset"] for b in v3.CONV_BLOCKS] == [136, 256, 512, 768]
    assert [f1[b + "_offset"] for b in v3.CONV_BLOCKS] == [400, 1024, 5632, 768]
    assert back.layers[1].shared == {"act": 0} and back.layers[0].shared is None
    assert len(kmodel.dumps(dataclasses.replace(hand, packed=False))) > len(data)
    # compact (--optimize size): weights and BN at 128, the table still at 256: conv 0's weights
    # @128, BN @384, table @512; conv 1's weights @768, BN @5376; the arguments where room is left
    compact = kmodel.dumps(dataclasses.replace(hand, compact=True))
    back = kmodel.loads(compact)
    assert len(compact) == 5728 and back.packed and back.compact and kmodel.dumps(back) == compact
    assert [[ly.fields[b + "_offset"] for b in v3.CONV_BLOCKS] for ly in back.layers[:2]] == \
        [[656, 128, 384, 512], [5632, 768, 5376, 512]]
