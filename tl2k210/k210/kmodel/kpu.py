"""The KPU conv parameter set shared by kmodel v3 (K210_CONV) and v4 (kpu_conv2d).

A ``KpuConv`` is the decoded 12-word layer argument plus its weights, batch-norm table and
activation table. Bit positions come from ``tl2k210.k210.hardware`` only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tl2k210.k210 import hardware as hw
from tl2k210.k210.kmodel.binio import Reader, check


@dataclass
class KpuConv:
    args: dict                      # LAYER_FIELDS values
    weights: np.ndarray             # flat uint8 or uint16, OIHW (normal) / CHW (depthwise)
    bn: dict                        # norm_mul, norm_add, norm_shift: int64 arrays (C_out,)
    act: dict                       # shift_number, y_mul, x_start: (16,); bias: uint8 (16,)
    reserved: tuple = (0,) * 12     # layer-argument bits no field covers (round-trip exactness)
    bn_reserved: np.ndarray | None = None
    act_reserved: np.ndarray | None = None

    # ----- geometry derived from the registers
    @property
    def depthwise(self) -> bool:
        return bool(self.args["depth_wise_layer"])

    @property
    def k(self) -> int:
        return hw.KERNEL_SIZES.get(self.args["kernel_type"], 0)

    @property
    def in_shape(self) -> tuple:
        a = self.args
        return (a["i_ch_num"] + 1, a["i_col_high"] + 1, a["i_row_wid"] + 1)

    @property
    def out_shape(self) -> tuple:
        a = self.args
        return (a["o_ch_num"] + 1, a["o_col_high"] + 1, a["o_row_wid"] + 1)

    @property
    def pool(self) -> hw.Pool:
        return hw.POOL[self.args["pool_type"]]

    @property
    def macs(self) -> int:
        ci, h, w = self.in_shape
        co = self.out_shape[0]
        return h * w * co * self.k * self.k * (1 if self.depthwise else ci)

    def weight_count(self) -> int:
        ci, co = self.in_shape[0], self.out_shape[0]
        return ci * self.k ** 2 if self.depthwise else co * ci * self.k ** 2

    # ----- encoding
    def layer_bytes(self) -> bytes:
        words = hw.pack_fields(self.args, hw.LAYER_FIELDS, 12, self.reserved)
        return np.array(words, dtype="<u8").tobytes()

    def bn_bytes(self) -> bytes:
        n = self.out_shape[0]
        w = hw.pack_array(self.bn, hw.BN_FIELDS, n)
        if self.bn_reserved is not None:
            w |= self.bn_reserved
        return w.astype("<u8").tobytes()

    def act_bytes(self) -> bytes:
        w = hw.pack_array(self.act, hw.ACT_SEGMENT_FIELDS, hw.ACT_SEGMENTS)
        if self.act_reserved is not None:
            w |= self.act_reserved
        return w.astype("<u8").tobytes() + np.asarray(self.act["bias"], np.uint8).tobytes()

    def weight_bytes(self) -> bytes:
        dt = "<u2" if self.weights.dtype.itemsize == 2 else "u1"
        return self.weights.astype(dt).tobytes()


def read_layer_args(r: Reader, at: int, where: str):
    words = r.array("<u8", 12, f"{where} layer argument", at)
    args = hw.unpack_fields(words, hw.LAYER_FIELDS)
    return args, hw.reserved_bits(words, hw.LAYER_FIELDS)


def validate_geometry(args: dict, where: str, at: int):
    """Reject register values no KPU could run, before any allocation depends on them."""
    field = f"{where} layer argument"
    check(args["kernel_type"] in hw.KERNEL_SIZES,
          f"{where}: kernel_type {args['kernel_type']} is not 1x1 (0) or 3x3 (1)", at, field)
    check(args["pool_type"] in hw.POOL, f"{where}: unknown pool_type {args['pool_type']}", at, field)
    if args["depth_wise_layer"]:
        check(args["i_ch_num"] == args["o_ch_num"],
              f"{where}: depthwise layer with {args['i_ch_num'] + 1} input and "
              f"{args['o_ch_num'] + 1} output channels", at, field)


def read_bn(r: Reader, at: int, n: int, where: str):
    words = r.array("<u8", n, f"{where} batch-norm table", at).astype(np.uint64)
    return hw.unpack_array(words, hw.BN_FIELDS), _residue(words, hw.BN_FIELDS)


def read_act(r: Reader, at: int, where: str):
    words = r.array("<u8", hw.ACT_SEGMENTS, f"{where} activation table", at).astype(np.uint64)
    act = hw.unpack_array(words, hw.ACT_SEGMENT_FIELDS)
    act["bias"] = r.array("u1", hw.ACT_SEGMENTS, f"{where} activation result_bias",
                          at + 8 * hw.ACT_SEGMENTS)
    return act, _residue(words, hw.ACT_SEGMENT_FIELDS)


def _residue(words: np.ndarray, fields) -> np.ndarray | None:
    mask = 0
    for f in fields:
        mask |= f.mask
    res = words & np.uint64(~mask & 0xFFFF_FFFF_FFFF_FFFF)
    return res if res.any() else None


def infer_align(prev_end: int, actual: int) -> int | None:
    """Largest power-of-two alignment (<= 256) that puts a block at ``actual`` right after
    ``prev_end``; None when no alignment explains the gap (the block sits at an arbitrary gap)."""
    for a in (256, 128, 64, 32, 16, 8, 4, 2, 1):
        if -(-prev_end // a) * a == actual:
            return a
    return None
