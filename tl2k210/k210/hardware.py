"""THE single source of Kendryte K210 KPU facts.

Register field table (word, bit, width, signedness), batch-norm and activation-table layouts,
KPU RAM geometry, limits and pool codes. The kmodel reader/writer, the inspector and the
emulator all read these tables; no bit position is written anywhere else.

Described in docs/kpu.md (from the SDK's kpu.h, nncase v0.1/v0.2).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tl2k210.k210.board_facts import GENERAL_SRAM_BYTES

# ---------------------------------------------------------------------------------------------
# Clocks and memories
KPU_FREQ_HZ = 400_000_000
CPU_FREQ_HZ = 400_000_000
KPU_RAM_BYTES = 2 * 1024 * 1024
LINE_BYTES = 64
KPU_RAM_LINES = KPU_RAM_BYTES // LINE_BYTES  # 32768
UNCACHED_OFFSET = 0x4000_0000  # drivers pass (cached address - this) to the KPU
MAIN_SRAM_BYTES = GENERAL_SRAM_BYTES

# Parameter block alignment in a file (docs/kpu.md#parameter-alignment): nncase v0.1 used 128 for weights/BN,
# 256 for the activation table; new files use 256 for all three.
ACT_TABLE_ALIGN = 256
PARAM_ALIGN = 256
WEIGHT_LOAD_BUDGET = {8: 30 * 1024, 16: 60 * 1024}  # bytes per weight load (docs/kpu.md#weight-loading)

# Safe envelope (docs/kpu.md#limits)
LIMITS = {
    "in_w": (4, 512),
    "in_h": (4, 256),
    "channels": (1, 1024),
    "out_min": 4,
    "load_time_max": 63,
    "para_size_max": (1 << 17) - 1,
}


# ---------------------------------------------------------------------------------------------
# Bit-field tables
@dataclass(frozen=True)
class Field:
    name: str
    word: int
    lo: int
    width: int
    signed: bool = False

    @property
    def mask(self) -> int:
        return ((1 << self.width) - 1) << self.lo


#: The 12 u64 words of a KPU layer argument, in push order (docs/kpu.md#layer-argument).
LAYER_WORDS = (
    "interrupt_enabe", "image_addr", "image_channel_num", "image_size", "kernel_pool_type_cfg",
    "kernel_load_cfg", "kernel_offset", "kernel_calc_type_cfg", "write_back_cfg", "conv_value",
    "conv_value2", "dma_parameter",
)
LAYER_ARG_BYTES = 8 * len(LAYER_WORDS)  # 96

_F = Field
LAYER_FIELDS = (
    _F("int_en", 0, 0, 1), _F("ram_flag", 0, 1, 1), _F("full_add", 0, 2, 1),
    _F("depth_wise_layer", 0, 3, 1),
    _F("image_src_addr", 1, 0, 15), _F("image_dst_addr", 1, 32, 15),
    _F("i_ch_num", 2, 0, 10), _F("o_ch_num", 2, 32, 10), _F("o_ch_num_coef", 2, 48, 10),
    _F("i_row_wid", 3, 0, 10), _F("i_col_high", 3, 10, 9),
    _F("o_row_wid", 3, 32, 10), _F("o_col_high", 3, 42, 9),
    _F("kernel_type", 4, 0, 3), _F("pad_type", 4, 3, 1), _F("pool_type", 4, 4, 4),
    _F("first_stride", 4, 8, 1), _F("bypass_conv", 4, 9, 1), _F("load_para", 4, 10, 1),
    _F("dma_burst_size", 4, 16, 8), _F("pad_value", 4, 24, 8), _F("bwsx_base_addr", 4, 32, 32),
    _F("load_coor", 5, 0, 1), _F("load_time", 5, 1, 6), _F("para_size", 5, 15, 17),
    _F("para_start_addr", 5, 32, 32),
    _F("coef_column_offset", 6, 0, 4), _F("coef_row_offset", 6, 4, 12),
    _F("channel_switch_addr", 7, 0, 15), _F("row_switch_addr", 7, 16, 4),
    _F("coef_size", 7, 20, 8), _F("coef_group", 7, 28, 3), _F("load_act", 7, 31, 1),
    _F("active_addr", 7, 32, 32),
    _F("wb_channel_switch_addr", 8, 0, 15), _F("wb_row_switch_addr", 8, 16, 4),
    _F("wb_group", 8, 20, 3),
    _F("shr_w", 9, 0, 4), _F("shr_x", 9, 4, 4), _F("arg_w", 9, 8, 24, True),
    _F("arg_x", 9, 32, 24, True),
    _F("arg_add", 10, 0, 40, True),
    _F("send_data_out", 11, 0, 1), _F("channel_byte_num", 11, 16, 16),
    _F("dma_total_byte", 11, 32, 32),
)
LAYER_FIELD = {f.name: f for f in LAYER_FIELDS}

#: Values nncase always writes (docs/kpu.md#nncase-register-values); the writer starts from these.
LAYER_DEFAULTS = {
    "int_en": 0, "ram_flag": 0, "full_add": 0, "pad_type": 0, "first_stride": 0,
    "bypass_conv": 0, "load_para": 1, "dma_burst_size": 15, "load_coor": 1,
    "coef_column_offset": 0, "coef_row_offset": 0, "coef_size": 0, "load_act": 1,
    "send_data_out": 0,
}

#: One u64 per output channel (docs/kpu.md#batch-norm-stage).
BN_FIELDS = (_F("norm_mul", 0, 0, 24, True), _F("norm_add", 0, 24, 32, True),
             _F("norm_shift", 0, 56, 4))
BN_ENTRY_BYTES = 8

#: Activation table: 16 segment words, then 16 result_bias bytes (docs/kpu.md#activation).
ACT_SEGMENTS = 16
ACT_SEGMENT_FIELDS = (_F("shift_number", 0, 0, 8), _F("y_mul", 0, 8, 16, True),
                      _F("x_start", 0, 24, 36, True))
ACT_TABLE_BYTES = 8 * ACT_SEGMENTS + ACT_SEGMENTS  # 144
ACT_X_START_MIN = -(1 << 35)  # 0x8_0000_0000 as signed 36-bit
ACT_X_START_MAX = (1 << 35) - 1

KERNEL_SIZES = {0: 1, 1: 3}  # kernel_type -> k


# ---------------------------------------------------------------------------------------------
# Pool codes (docs/kpu.md#pooling): code -> (name, kind, window, stride)
@dataclass(frozen=True)
class Pool:
    code: int
    name: str
    kind: str  # bypass | max | mean | pick
    size: int
    stride: int
    pick: tuple = (0, 0)  # (dy, dx) for pick pools

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        return (h // self.stride, w // self.stride)


POOLS = (
    Pool(0, "bypass", "bypass", 1, 1),
    Pool(1, "max_2_s2", "max", 2, 2),
    Pool(2, "mean_2_s2", "mean", 2, 2),
    Pool(3, "max_4_s4", "max", 4, 4),
    Pool(4, "mean_4_s4", "mean", 4, 4),
    Pool(5, "left_top_2_s2", "pick", 2, 2, (0, 0)),
    Pool(6, "right_top_2_s2", "pick", 2, 2, (0, 1)),
    Pool(7, "left_top_4_s4", "pick", 4, 4, (0, 0)),
    Pool(8, "mean_2_s1", "mean", 2, 1),
    Pool(9, "max_2_s1", "max", 2, 1),
)
POOL = {p.code: p for p in POOLS}


# ---------------------------------------------------------------------------------------------
# KPU RAM layout (docs/kpu.md#kpu-ram-layout)
def row_layout(width: int) -> tuple[int, int, int]:
    """(groups g, row pitch p in bytes, row_len L in lines) for a map of this width."""
    if width <= 16:
        return 4, 16, 1
    if width <= 32:
        return 2, 32, 1
    return 1, 64, (width + 63) // 64


def map_lines(c: int, h: int, w: int) -> int:
    """KPU RAM lines a (C, H, W) uint8 map occupies (nncase get_kpu_rows)."""
    g, _, L = row_layout(w)
    return L * h * -(-c // min(c, g))


def map_offsets(c: int, h: int, w: int, base_line: int = 0) -> np.ndarray:
    """Byte address in KPU RAM of every element (c, y, x), shape (C, H, W) int64."""
    g, p, L = row_layout(w)
    ci = np.arange(c, dtype=np.int64)[:, None, None]
    yi = np.arange(h, dtype=np.int64)[None, :, None]
    xi = np.arange(w, dtype=np.int64)[None, None, :]
    return LINE_BYTES * (base_line + (ci // g) * L * h + yi * L) + (ci % g) * p + xi


# ---------------------------------------------------------------------------------------------
# Field packing
def _to_signed(v: int, width: int) -> int:
    return v - (1 << width) if v >> (width - 1) & 1 else v


def unpack_fields(words, fields) -> dict:
    """Decode fields from a sequence of python ints (u64 words)."""
    out = {}
    for f in fields:
        v = (int(words[f.word]) >> f.lo) & ((1 << f.width) - 1)
        out[f.name] = _to_signed(v, f.width) if f.signed else v
    return out


def reserved_bits(words, fields) -> tuple:
    """Bits set in each word that no field covers (kept so round trips are byte-exact)."""
    masks = [0] * len(words)
    for f in fields:
        masks[f.word] |= f.mask
    return tuple(int(w) & ~m & 0xFFFF_FFFF_FFFF_FFFF for w, m in zip(words, masks))


def pack_fields(values: dict, fields, n_words: int, reserved=None) -> list:
    """Encode fields into u64 python ints. Values are range-checked (signed two's complement)."""
    words = list(reserved) if reserved is not None else [0] * n_words
    for f in fields:
        v = int(values.get(f.name, 0))
        lo, hi = (-(1 << (f.width - 1)), (1 << (f.width - 1)) - 1) if f.signed else (0, (1 << f.width) - 1)
        if not lo <= v <= hi:
            raise ValueError(f"KPU field {f.name}={v} does not fit {f.width} "
                             f"{'signed ' if f.signed else ''}bits (range {lo}..{hi})")
        words[f.word] |= (v & ((1 << f.width) - 1)) << f.lo
    return words


def unpack_array(words: np.ndarray, fields) -> dict:
    """Vectorised decode of one-word records (BN table, activation segments)."""
    words = np.asarray(words, dtype=np.uint64)
    out = {}
    for f in fields:
        v = ((words >> np.uint64(f.lo)) & np.uint64((1 << f.width) - 1)).astype(np.int64)
        if f.signed:
            v = np.where(v >> (f.width - 1) & 1, v - (1 << f.width), v)
        out[f.name] = v
    return out


def pack_array(values: dict, fields, n: int) -> np.ndarray:
    """Vectorised encode of one-word records; raises ValueError when a value does not fit."""
    words = np.zeros(n, dtype=np.uint64)
    for f in fields:
        v = np.asarray(values[f.name], dtype=np.int64).reshape(-1)
        lo, hi = (-(1 << (f.width - 1)), (1 << (f.width - 1)) - 1) if f.signed else (0, (1 << f.width) - 1)
        if v.size and (v.min() < lo or v.max() > hi):
            raise ValueError(f"KPU field {f.name} value out of range {lo}..{hi}")
        words |= (v & ((1 << f.width) - 1)).astype(np.uint64) << np.uint64(f.lo)
    return words
