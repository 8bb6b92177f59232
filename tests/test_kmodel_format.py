"""kmodel v3/v4 reader-writer: byte-exact round trips on real files, clear errors, fuzzing."""
import struct

import numpy as np
import pytest

from conftest import KMODEL_FILES, data_path
from tl2k210.errors import KmodelFormatError
from tl2k210.k210 import kmodel
from tl2k210.k210.inspect import describe, render

pytestmark = pytest.mark.skipif(not KMODEL_FILES, reason="../shared/testdata/kmodels missing")


@pytest.mark.parametrize("path", KMODEL_FILES, ids=lambda p: p.name)
def test_round_trip_is_byte_exact(path):
    data = path.read_bytes()
    model = kmodel.loads(data)
    out = kmodel.dumps(model)
    # The only allowed difference: nncase v0.1 (and some v4 writers) moved the stream position
    # instead of writing the final body padding (spec §3.1); we write those zero bytes.
    assert out[:len(data)] == data
    assert len(out) - len(data) == model.omitted_tail
    assert out[len(data):] == bytes(model.omitted_tail)
    assert kmodel.dumps(kmodel.loads(out)) == out


def test_nncase01_files_are_the_ones_missing_padding():
    short = {p.name: kmodel.load(p).omitted_tail for p in KMODEL_FILES}
    assert short["iris_v3.kmodel"] == 4 and short["yolo20_v3.kmodel"] == 4
    assert short["facedetect_320x240_v3.kmodel"] == 0


def test_v3_conv_block_alignment_matches_spec_example():
    m = kmodel.load(data_path("kmodels", "facedetect_320x240_v3.kmodel"))
    f = m.layers[0].fields   # spec §3.4: body@228, layer@256, weights@384, bn@896, act@1024
    assert (f["layer_offset"], f["weights_offset"], f["bn_offset"], f["act_offset"]) == (256, 384, 896, 1024)
    align = m.layers[0].align
    assert (align["weights"], align["bn"], align["act"]) == (128, 128, 256)


def test_v3_appendix_b_worked_example():
    m = kmodel.load(data_path("kmodels", "yolo20_v3.kmodel"))
    a = m.layers[1].conv.args
    assert a["depth_wise_layer"] == 1 and a["pad_value"] == 13
    assert (a["arg_x"], a["shr_x"], a["arg_w"], a["shr_w"], a["arg_add"]) == (-4259840, 15, -425984, 15, 15210)
    assert (a["channel_switch_addr"], a["row_switch_addr"], a["coef_group"]) == (360, 3, 1)
    act = m.layers[1].conv.act
    assert act["x_start"][0] == -(1 << 35) and act["x_start"][15] == 22528
    assert list(act["bias"][1:15]) == sorted(act["bias"][1:15]) and act["bias"][15] == 22


def test_v4_kpu_conv_skips_put_blocks_on_256():
    m = kmodel.load(data_path("kmodels", "yolo20_v4.kmodel"))
    a = m.nodes[0].conv.args  # spec §4.4 example: skips 168/128/112
    assert (a["bwsx_base_addr"], a["active_addr"], a["para_start_addr"]) == (168, 128, 112)


def test_new_model_gets_256_alignment():
    m = kmodel.load(data_path("kmodels", "facedetect_320x240_v3.kmodel"))
    for L in m.layers:
        L.align = None  # forget where nncase put the blocks: the writer's default applies
    m2 = kmodel.loads(kmodel.dumps(m))
    for L in m2.layers:
        if L.conv is not None:
            assert all(L.fields[b + "_offset"] % 256 == 0 for b in ("weights", "bn", "act"))
            assert np.array_equal(L.conv.weights, m.layers[m2.layers.index(L)].conv.weights)


# ---------------------------------------------------------------------------------------------
def _v3_header(**over):
    h = dict(version=3, flags=1, arch=0, layers=1, max_start=0, main=64, outputs=1)
    h.update(over)
    return struct.pack("<7I", h["version"], h["flags"], h["arch"], h["layers"], h["max_start"],
                       h["main"], h["outputs"])


@pytest.mark.parametrize("data,needle", [
    (struct.pack("<II", 0x4B4D444C, 5) + bytes(40),
     "kmodel v5 (nncase 1.x); MaixPy cannot load it; tl2k210 reads v3/v4 and writes v3"),
    (struct.pack("<II", 0x4B4D444C, 7) + bytes(40), "kmodel v7"),
    (struct.pack("<II", 1, 1) + bytes(40), "legacy kmodel v1"),
    (b"\x7fELF" + bytes(40), "not a kmodel"),
    (b"KM", "too short"),
    (_v3_header(layers=0xFFFFFFFF) + bytes(8), "layer headers"),
    (_v3_header(outputs=0x7FFFFFFF), "outputs table"),
    (_v3_header(arch=1) + bytes(16), "arch must be 0"),
])
def test_bad_headers_name_the_problem(data, needle):
    with pytest.raises(KmodelFormatError) as e:
        kmodel.loads(data)
    assert needle in str(e.value)


def test_truncation_names_offset_and_field():
    data = data_path("kmodels", "facedetect_320x240_v3.kmodel").read_bytes()
    with pytest.raises(KmodelFormatError) as e:
        kmodel.loads(data[:5000])
    assert e.value.offset is not None and e.value.field
    assert "offset" in str(e.value)


def test_huge_claims_do_not_allocate():
    # a v4 header claiming a 4 GiB constants blob and 2^32-1 nodes in a 60-byte file
    data = struct.pack("<10I", 0x4B4D444C, 4, 0, 1, 0xFFFFFFF0, 0xFFFFFFFF, 0xFFFFFFFF, 0, 0, 0) + bytes(20)
    with pytest.raises(KmodelFormatError) as e:
        kmodel.loads(data)
    assert e.value.field == "constants" and "constants blob" in str(e.value)


def test_fuzz_truncations_and_byte_flips():
    """10,000 mutated real files: every failure is a KmodelFormatError, nothing else."""
    rng = np.random.default_rng(2026)
    files = [p.read_bytes() for p in KMODEL_FILES]
    n_ok = n_err = 0
    for i in range(10_000):
        data = bytearray(files[i % len(files)])
        kind = rng.integers(3)
        if kind == 0:  # truncate
            data = data[:int(rng.integers(0, len(data)))]
        else:  # flip bytes, biased to the headers where structure lives
            for _ in range(int(rng.integers(1, 9))):
                hi = len(data) if rng.random() < 0.3 else min(len(data), 4096)
                data[int(rng.integers(0, hi))] = int(rng.integers(256))
            if kind == 2:
                data = data[:int(rng.integers(len(data) // 2, len(data) + 1))]
        try:
            m = kmodel.loads(bytes(data))
            render(describe(m))
            n_ok += 1
        except KmodelFormatError:
            n_err += 1
    assert n_ok + n_err == 10_000 and n_err > 1000


def test_undocumented_v3_layer_type_is_kept_raw_and_refused_by_the_emulator():
    from tl2k210.errors import EmulatorError
    from tl2k210.k210.emulator import Emulator
    from tl2k210.k210.kmodel import v3
    m = kmodel.load(data_path("kmodels", "iris_v3.kmodel"))
    m.layers.append(v3.Layer(19, {}, data={"raw": bytes(range(16))}))
    back = kmodel.loads(kmodel.dumps(m))
    assert back.layers[-1].name == "QUANTIZED_FULLY_CONNECTED" and back.layers[-1].data["raw"] == bytes(range(16))
    assert kmodel.dumps(back) == kmodel.dumps(m)
    render(describe(back))
    with pytest.raises(EmulatorError, match="layer 2 \\(QUANTIZED_FULLY_CONNECTED\\).*no source documents"):
        Emulator(back).run(np.zeros(4, np.float32))
