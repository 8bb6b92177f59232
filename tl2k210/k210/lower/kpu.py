"""One K210_CONV from float weights and calibrated ranges: weights, batch-norm fixed point,
activation table and the 12 register words (spec §2.4-§2.6, §5). Every number from hardware.py."""
from __future__ import annotations

import numpy as np

from tl2k210.errors import KpuLimitError
from tl2k210.k210 import hardware as hw
from tl2k210.k210.kmodel.kpu import KpuConv
from tl2k210.quantize import fixed_point as fx

IR_POOL_KIND = {"max": "max", "avg": "mean"}


def pool_code(pool: dict | None) -> int | None:
    """KPU pool code of an IR pool attr {"kind", "size", "stride", "pads"}; 0 for none; None if
    the KPU has no such pool. The stride-1 pools pad (0, 0, 1, 1) like the hardware's window."""
    if not pool:
        return 0
    kind = IR_POOL_KIND.get(pool["kind"])
    for p in hw.POOLS:
        if (p.kind, p.size, p.stride) == (kind, pool["size"], pool["stride"]):
            pads = list(pool.get("pads", [0, 0, 1, 1] if p.stride == 1 else [0, 0, 0, 0]))
            if pads == ([0, 0, 1, 1] if p.stride == 1 else [0, 0, 0, 0]) and not (
                    p.stride == 1 and p.kind == "mean"):   # mean_2_s1 replicates edges: not ONNX
                return p.code
    return None


def weight_loads(co: int, per_oc: int, weight_bits: int, depthwise: bool):
    """(output channels per weight load, load_time) of spec §2.5.6."""
    if depthwise:
        return co, 0
    wbytes = weight_bits // 8
    n_oc = max(1, min(co, hw.WEIGHT_LOAD_BUDGET[weight_bits] // (per_oc * wbytes)))
    return n_oc, -(-co // n_oc) - 1


def layout_args(in_shape, out_shape) -> dict:
    """The register fields that follow from the input and output map shapes (§2.3, §2.4)."""
    ci, h, w = in_shape
    co, ph, pw = out_shape
    g_in, _, L_in = hw.row_layout(w)
    g_out, _, L_out = hw.row_layout(pw)
    return dict(i_ch_num=ci - 1, o_ch_num=co - 1, i_row_wid=w - 1, i_col_high=h - 1,
                o_row_wid=pw - 1, o_col_high=ph - 1,
                channel_switch_addr=L_in * h, row_switch_addr=L_in, coef_group=g_in,
                wb_channel_switch_addr=L_out * ph, wb_row_switch_addr=L_out, wb_group=g_out,
                channel_byte_num=ph * pw - 1, dma_total_byte=co * ph * pw - 1)


def check_geometry(name, in_shape, out_shape, code):
    ci, h, w = in_shape
    lo = hw.LIMITS["out_min"]
    if min(out_shape[1:]) < lo:
        raise KpuLimitError(f"node {name!r}: KPU output {out_shape[2]}x{out_shape[1]} after "
                            f"{hw.POOL[code].name}; the KPU writes maps of at least {lo}x{lo} "
                            "(spec §2.7): use a larger input or pool later")


def build_conv(W, B, e, z_x, in_shape, code, depthwise, y_range, z_range, act_attr, weight_bits,
               name, row):
    """One K210_CONV (addresses 0, see `place`): per-channel weights acting on q − z_x, bias
    correction, BN fixed point, activation table; returns (KpuConv, (s_z, z_z))."""
    ci, h, w = in_shape
    co, k = W.shape[0], W.shape[2]
    Wq, zw, sw = fx.quantize_weights(W, weight_bits)
    if e is not None:   # remove the mean shift the weight rounding causes (Nagel et al. 2019)
        dW = ((Wq.astype(np.float64) - zw) * sw[:, None, None, None] - W).sum(axis=(2, 3))
        B = B - (dW[:, 0] * e if depthwise else dW @ e)
        row.notes.append("bias corrected for weight rounding")
    y_lo, y_hi = y_range
    s_z, z_z = fx.qparams(*z_range)
    s_v = fx.choose_v_scale(1.0, sw, B, max(abs(y_lo), abs(y_hi)) * 2)
    bn = fx.bn_params(1.0, sw, B, s_v)
    act = fx.activation_table(act_attr, y_lo, y_hi, s_v, s_z, z_z)
    ph, pw = hw.POOL[code].out_size(h, w)
    check_geometry(name, in_shape, (co, ph, pw), code)
    per_oc = k * k * (1 if depthwise else ci)
    n_oc, load_time = weight_loads(co, per_oc, weight_bits, depthwise)
    para = n_oc * per_oc * weight_bits // 8
    if load_time > hw.LIMITS["load_time_max"] or para > hw.LIMITS["para_size_max"]:
        raise KpuLimitError(f"node {name!r}: {co}x{per_oc} weights need {load_time + 1} weight loads "
                            f"of {para:,} B; the KPU allows {hw.LIMITS['load_time_max'] + 1} loads of "
                            f"at most {hw.LIMITS['para_size_max']:,} B: use fewer input channels")
    args = dict(hw.LAYER_DEFAULTS)
    args.update(layout_args(in_shape, (co, ph, pw)))
    args.update(
        depth_wise_layer=int(depthwise), image_src_addr=0, image_dst_addr=0, o_ch_num_coef=n_oc - 1,
        kernel_type=next(t for t, kk in hw.KERNEL_SIZES.items() if kk == k), pool_type=code,
        pad_value=z_x, load_time=load_time, para_size=para,
        arg_x=-zw, shr_x=0, arg_w=-z_x, shr_w=0, arg_add=k * k * z_x * zw,
        bwsx_base_addr=0, para_start_addr=0, active_addr=0)
    return KpuConv(args, Wq.reshape(-1), bn, act), (s_z, z_z)


def place(conv: KpuConv, src_line: int, dst_line: int) -> KpuConv:
    conv.args["image_src_addr"], conv.args["image_dst_addr"] = src_line, dst_line
    return conv


def out_lines(conv: KpuConv) -> int:
    return hw.map_lines(*conv.out_shape)
