"""The single table of K210 facts: consistent, and encoding/decoding round-trips."""
import numpy as np
import pytest

from tl2k210.k210 import hardware as hw


@pytest.mark.parametrize("fields,n_words", [(hw.LAYER_FIELDS, 12), (hw.BN_FIELDS, 1),
                                            (hw.ACT_SEGMENT_FIELDS, 1)])
def test_fields_do_not_overlap_and_fit(fields, n_words):
    used = [0] * n_words
    for f in fields:
        assert 0 <= f.word < n_words and f.lo + f.width <= 64, f
        assert used[f.word] & f.mask == 0, f"{f.name} overlaps"
        used[f.word] |= f.mask


def test_spec_positions():
    F = hw.LAYER_FIELD  # a few fields checked against docs/kpu.md#layer-argument
    assert (F["image_dst_addr"].word, F["image_dst_addr"].lo, F["image_dst_addr"].width) == (1, 32, 15)
    assert (F["arg_x"].word, F["arg_x"].lo, F["arg_x"].signed) == (9, 32, True)
    assert (F["arg_add"].width, F["pad_value"].lo, F["para_size"].lo) == (40, 24, 15)
    assert hw.LAYER_ARG_BYTES == 96 and hw.ACT_TABLE_BYTES == 144


def test_pack_unpack_round_trip_with_signed_and_reserved():
    rng = np.random.default_rng(0)
    for _ in range(200):
        vals = {}
        for f in hw.LAYER_FIELDS:
            lo, hi = (-(1 << (f.width - 1)), (1 << (f.width - 1)) - 1) if f.signed else (0, (1 << f.width) - 1)
            vals[f.name] = int(rng.integers(lo, hi, endpoint=True))
        reserved = tuple(int(v) & ~sum(f.mask for f in hw.LAYER_FIELDS if f.word == i)
                         for i, v in enumerate(rng.integers(0, 2**63, 12)))
        words = hw.pack_fields(vals, hw.LAYER_FIELDS, 12, reserved)
        assert hw.unpack_fields(words, hw.LAYER_FIELDS) == vals
        assert hw.reserved_bits(words, hw.LAYER_FIELDS) == reserved


def test_out_of_range_value_is_refused():
    with pytest.raises(ValueError, match="arg_x"):
        hw.pack_fields({"arg_x": 1 << 23}, hw.LAYER_FIELDS, 12)
    with pytest.raises(ValueError, match="norm_shift"):
        hw.pack_array({"norm_mul": [0], "norm_add": [0], "norm_shift": [16]}, hw.BN_FIELDS, 1)


def test_bn_and_act_arrays():
    v = {"norm_mul": np.array([-1, 5]), "norm_add": np.array([-(1 << 31), 7]), "norm_shift": np.array([15, 0])}
    back = hw.unpack_array(hw.pack_array(v, hw.BN_FIELDS, 2), hw.BN_FIELDS)
    assert all(np.array_equal(back[k], v[k]) for k in v)
    w = hw.pack_array({"shift_number": [20], "y_mul": [-3], "x_start": [-(1 << 35)]}, hw.ACT_SEGMENT_FIELDS, 1)
    assert int(w[0]) == 20 | ((-3 & 0xFFFF) << 8) | (0x8_0000_0000 << 24)


@pytest.mark.parametrize("w,expect", [(4, (4, 16, 1)), (16, (4, 16, 1)), (17, (2, 32, 1)),
                                      (32, (2, 32, 1)), (33, (1, 64, 1)), (160, (1, 64, 3)),
                                      (320, (1, 64, 5))])
def test_row_layout(w, expect):
    assert hw.row_layout(w) == expect


def test_map_lines_and_offsets():
    assert hw.map_lines(16, 120, 160) == 3 * 120 * 16           # appendix B: L·H = 360 per channel
    assert hw.map_lines(5, 4, 4) == 4 * 2 and hw.map_lines(3, 4, 4) == 4
    off = hw.map_offsets(5, 4, 10, base_line=2)
    assert off[0, 0, 0] == 128 and off[1, 0, 0] == 128 + 16 and off[4, 0, 0] == 64 * (2 + 4)
    assert off[2, 3, 9] == 64 * (2 + 3) + 2 * 16 + 9
    assert len(np.unique(off)) == off.size


def test_pool_table():
    assert [p.code for p in hw.POOLS] == list(range(10))
    assert hw.POOL[6].pick == (0, 1) and hw.POOL[8].stride == 1 and hw.POOL[4].size == 4


# board facts (tl2k210/k210/board_facts.py) and the literals that would be a second copy of one
BOARD_FACTS = {0x300000: "MAIXPY_MODEL_AREA or SPIFFS_SIZE", 0x200000: "FIRMWARE_REGION_END",
               0xD00000: "SPIFFS_START", 115200: "ROM_BAUD, REPL_BAUD or UART_DEFAULT_BAUD",
               16 << 20: "FLASH_BYTES", 8 << 20: "SRAM_BYTES", 6 << 20: "GENERAL_SRAM_BYTES"}
# the same numbers meaning something else
OTHER_MEANING = {("k210/emulator/kpu.py", 1 << 24),       # float32 integers are exact below 2^24
                 ("k210/hardware.py", 2 << 20),           # KPU_RAM_BYTES, the KPU's 2 MiB
                 ("k210/fixed_point.py", 1 << 23)}        # norm_mul, a 24-bit signed register


def _int_value(node):
    """An int literal, or a constant expression of them (16 * 1024 * 1024, 16 << 20)."""
    import ast
    import operator
    ops = {ast.Mult: operator.mul, ast.LShift: operator.lshift, ast.Add: operator.add}
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
        a, b = _int_value(node.left), _int_value(node.right)
        return None if a is None or b is None else ops[type(node.op)](a, b)
    return None


def test_board_facts_are_written_once():
    """The flash map, flash size, SRAM sizes and serial rates are written in board_facts.py only:
    nowhere else in the package as a literal (help texts and docstrings may still name them)."""
    import ast

    from tl2k210 import paths
    from tl2k210.k210 import board_facts as bf
    assert (bf.MAIXPY_MODEL_AREA, bf.FLASH_BYTES, bf.SRAM_BYTES, bf.REPL_BAUD) == (0x300000, 16 << 20, 8 << 20, 115200)
    found = []
    for f in sorted(paths.PACKAGE.rglob("*.py")):
        rel = f.relative_to(paths.PACKAGE).as_posix()
        if rel == "k210/board_facts.py":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            v = _int_value(node)
            if v in BOARD_FACTS and (rel, v) not in OTHER_MEANING:
                found.append(f"{rel}:{node.lineno}: {v:#x} is {BOARD_FACTS[v]}")
    assert found == [], "\n".join(found)
    # the check finds what it is for
    assert _int_value(ast.parse("16 * 1024 * 1024", mode="eval").body) == bf.FLASH_BYTES
