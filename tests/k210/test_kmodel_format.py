"""kmodel v3/v4 reader-writer: byte-exact round trips on real files, clear errors, fuzzing."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import KMODEL_FILES, REPO, data_path
from tl2k210.errors import KmodelFormatError
from tl2k210.k210 import kmodel
from tl2k210.k210.inspect import describe, render

pytestmark = pytest.mark.skipif(not KMODEL_FILES, reason="../shared/testdata/kmodels missing")


@pytest.mark.parametrize("path", KMODEL_FILES, ids=lambda p: p.name)
def test_round_trip_is_byte_exact(path):
    data = path.read_bytes()
    model = kmodel.loads(data)
    out = kmodel.dumps(model)
    assert out == data
    # nncase v0.1 (and some v4 writers) moved the stream position instead of writing the final
    # body padding (docs/kmodel-format.md#reader-rules): the parsed form remembers it; a model made
    # here pads every body.
    tail, model.omitted_tail = model.omitted_tail, 0
    padded = kmodel.dumps(model)
    assert padded == data + bytes(tail) and len(padded) % 8 == 0
    assert kmodel.dumps(kmodel.loads(padded)) == padded


def test_nncase01_files_are_the_ones_missing_padding():
    short = {p.name: kmodel.load(p).omitted_tail for p in KMODEL_FILES}
    assert short["iris_v3.kmodel"] == 4 and short["yolo20_v3.kmodel"] == 4
    assert short["facedetect_320x240_v3.kmodel"] == 0


def test_v3_conv_block_alignment_matches_spec_example():
    m = kmodel.load(data_path("kmodels", "facedetect_320x240_v3.kmodel"))
    # docs/kmodel-format.md#v3-conv-parameter-placement: body@228, layer@256, weights@384, bn@896, act@1024
    f = m.layers[0].fields
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
    a = m.nodes[0].conv.args  # docs/kmodel-format.md#v4-kpu-conv-body example: skips 168/128/112
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
     "kmodel v5 (nncase 1.x): only the Kendryte standalone SDK"),
    (struct.pack("<II", 0x4B4D444C, 7) + bytes(40), "kmodel v7 (nncase 2.x, for the Kendryte K230"),
    (struct.pack("<II", 0x4B4D444C, 9) + bytes(40), "kmodel v9"),
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


@pytest.mark.slow
def test_fuzz_under_a_memory_limit():
    """10,000 mutated real files (truncations, byte flips, header claims: huge counts, sizes,
    offsets) in a subprocess limited to 3 GiB of address space: every case parses (and renders;
    small models also run) or ends in KmodelFormatError / EmulatorError."""
    files = [str(p) for p in KMODEL_FILES]
    r = subprocess.run([sys.executable, str(REPO / "tests" / "kmodel_fuzz.py"), "--cases", "10000",
                        "--limit-mb", "3072", *files], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    print(counts)
    assert counts["cases"] == 10_000 and counts["format_error"] > 1000 and counts["parsed"] > 1000
    assert counts["emulated"] + counts["emulator_error"] > 50
    assert counts["max_rss_mb"] < 2048


BIG = """
import json, resource, struct, sys, time
def peak_rss_mb():
    return next(int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
from tl2k210.errors import KmodelFormatError
from tl2k210.k210 import kmodel
src, size_mb, at, fill = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
head = open(src, "rb").read()[:64]
d = bytearray(size_mb << 20)
if fill == "dequantize":   # a table of valid-looking entries: type 12, 24-byte bodies
    import numpy as np
    w = np.frombuffer(d, "<u4")
    w[0::2], w[1::2] = 12, 24
d[:64] = head
struct.pack_into("<I", d, at, 26_000_000)
t = time.perf_counter()
try:
    kmodel.loads(d)
    out = {"parsed": True}
except KmodelFormatError as e:
    out = {"message": str(e), "offset": e.offset, "field": e.field}
out.update(seconds=time.perf_counter() - t,
           max_rss_mb=peak_rss_mb())
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("src,size_mb,at,fill,field", [
    ("mnist_v3.kmodel", 190, 12, "zeros", "layers_length"),      # table larger than the file
    ("mnist_v3.kmodel", 250, 12, "zeros", "layer "),              # fits: entries checked first
    ("mnist_v3.kmodel", 250, 12, "dequantize", "body_size"),     # valid entries, bodies too big
    ("mnist_v3.kmodel", 190, 24, "zeros", "output_count"),
    ("iris_v4.kmodel", 190, 24, "zeros", "nodes"),
    ("iris_v4.kmodel", 250, 24, "zeros", "node "),
])
def test_huge_file_with_huge_claims_fails_fast_in_bounded_memory(src, size_mb, at, fill, field):
    r = subprocess.run([sys.executable, "-c", BIG, str(data_path("kmodels", src)), str(size_mb),
                        str(at), fill], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(out)
    assert "message" in out and field in out["field"] and out["offset"] is not None
    assert out["seconds"] < 5 and out["max_rss_mb"] < size_mb + 400


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
