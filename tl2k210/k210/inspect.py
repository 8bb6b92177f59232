"""Describe a kmodel: per layer type, shapes, KPU/CPU placement, MACs, weights, memory ranges."""
from __future__ import annotations

import numpy as np

from tl2k210.k210 import cost
from tl2k210.k210 import hardware as hw
from tl2k210.tables import text_table
from tl2k210.k210.kmodel import v3 as f3
from tl2k210.k210.kmodel import v4 as f4


def _mem_name(t: int) -> str:
    return ("const", "main", "kpu")[t] if 0 <= t < 3 else f"memory{t}?"


def _kpu_row(conv, where, main_out=None, type_name="K210_CONV"):
    a = conv.args
    ci, h, w = conv.in_shape
    co, oh, ow = conv.out_shape
    in_lines, out_lines = hw.map_lines(ci, h, w), hw.map_lines(co, oh, ow)
    return {
        "layer": where, "type": type_name, "unit": "KPU",
        "op": f"{'dw' if conv.depthwise else ''}conv{conv.k}x{conv.k}"
              + ("" if a["pool_type"] == 0 else f"+{conv.pool.name}"),
        "in": [ci, h, w], "out": [co, oh, ow], "macs": conv.macs,
        "weight_bytes": int(conv.weights.nbytes) + 8 * co + hw.ACT_TABLE_BYTES,
        "kpu_lines": in_lines + out_lines,
        "kpu_ranges": [[a["image_src_addr"], a["image_src_addr"] + in_lines],
                       [a["image_dst_addr"], a["image_dst_addr"] + out_lines]],
        "main": [] if main_out is None else [["out", main_out, co * oh * ow]],
    }


_ADDR_KEYS = ("main_mem_in_address", "main_mem_in_a_address", "main_mem_in_b_address",
              "main_mem_out_address", "mem_out_address")


def _cpu_row_v3(L, where):
    f = L.fields
    main = [[k.replace("main_mem_", "").replace("mem_", "").replace("_address", ""), f[k]]
            for k in _ADDR_KEYS if k in f]
    macs = 0
    shape_in = shape_out = None
    if L.name == "FULLY_CONNECTED":
        macs = f["in_channels"] * f["out_channels"]
        shape_in, shape_out = [f["in_channels"]], [f["out_channels"]]
    elif "count" in f:
        shape_in = shape_out = [f["count"]]
    elif "channels" in f:
        shape_in = shape_out = [f["channels"]]
    elif "in_shape" in f:
        shape_in = list(f["in_shape"][::-1])
        shape_out = list(f.get("out_shape", (f.get("out_width", 0), f.get("out_height", 0),
                                             f["in_shape"][2]))[::-1])
    wbytes = sum(int(np.asarray(v).nbytes) for v in L.data.values() if isinstance(v, np.ndarray))
    return {"layer": where, "type": L.name, "unit": "CPU", "op": L.name.lower(),
            "in": shape_in, "out": shape_out, "macs": macs, "weight_bytes": wbytes,
            "kpu_lines": 0, "kpu_ranges": [], "main": main,
            "runs_in_sdk": f3.LAYER_TYPES[L.type].in_sdk}


def _register_notes(model) -> list:
    """KPU register fields whose value differs from what nncase always writes
    (docs/kpu.md#nncase-register-values)."""
    items = model.items
    kind = model.item_kind
    odd = {}
    for i, it in enumerate(items):
        if it.conv is None:
            continue
        for name, want in hw.LAYER_DEFAULTS.items():
            got = it.conv.args.get(name, want)
            if got != want:
                odd.setdefault(f"{name}={got}", []).append(i)
    return [f"{kind}s {', '.join(map(str, ix[:8]))}{' ...' if len(ix) > 8 else ''}: register "
            f"field {k} (nncase always writes {k.split('=')[0]}={hw.LAYER_DEFAULTS[k.split('=')[0]]})"
            for k, ix in sorted(odd.items())]


def describe(model, path: str = "", file_size: int | None = None) -> dict:
    rows = []
    if model.version == 3:
        for i, L in enumerate(model.layers):
            where = f"{i}"
            if L.conv is not None:
                main_out = L.fields["main_mem_out_address"] if L.fields["flags"] & 1 else None
                rows.append(_kpu_row(L.conv, where, main_out))
            else:
                rows.append(_cpu_row_v3(L, where))
        info = {"version": 3, "flags": model.flags,
                "weights": "8-bit" if model.eight_bit else "16-bit",
                "main_memory": model.main_mem_usage,
                "outputs": [{"address": a, "size": s} for a, s in model.outputs],
                "omitted_trailing_padding": model.omitted_tail}
    else:
        for i, n in enumerate(model.nodes):
            where = f"{i}"
            if n.conv is not None:
                mo = n.fields["main_mem_output"]
                rows.append(_kpu_row(n.conv, where, mo[2] if mo[3] else None, "kpu_conv2d"))
                continue
            f = n.fields
            ranges = [[k, v[2], v[3], _mem_name(v[0])]
                      for k, v in f.items() if k in ("input", "input_a", "input_b", "output", "table")]
            macs = cost.node_macs(n)
            if "out_shape" in f:
                out = list(f["out_shape"])
            elif n.name in ("conv2d", "quantized_conv2d") and f:
                out = list(cost.conv_out_shape(f, f["out_channels"]))
            else:
                out = None
            wbytes = sum(int(np.asarray(v).nbytes) for v in n.data.values() if isinstance(v, np.ndarray))
            rows.append({"layer": where, "type": n.name, "unit": "KPU" if n.name == "kpu_upload" else "CPU",
                         "op": n.name, "in": list(f["in_shape"]) if "in_shape" in f else None,
                         "out": out, "macs": macs, "weight_bytes": wbytes, "kpu_lines": 0,
                         "kpu_ranges": [], "main": ranges,
                         "known_layout": f4.OPCODES[n.opcode].struct is not None})
        info = {"version": 4, "flags": model.flags, "target": ("cpu", "k210")[model.target] if model.target in (0, 1) else model.target,
                "weights": "8-bit", "main_memory": model.main_mem,
                "constants": len(model.constants),
                "inputs": [{"range": list(r), "shape": list(s)}
                           for r, s in zip(model.inputs, model.input_shapes)],
                "outputs": [{"memory": r[0], "start": r[2], "size": r[3]} for r in model.outputs],
                "trailing_bytes": len(model.trailer),
                "omitted_trailing_padding": model.omitted_tail,
                "overlapping_io": f4.overlapping_io(model)}
    info["notes"] = list(getattr(model, "notes", [])) + _register_notes(model)
    kpu_rows = [r for r in rows if r["kpu_ranges"]]
    lines_used = set()
    for r in kpu_rows:
        for a, b in r["kpu_ranges"]:
            lines_used.update(range(a, b))
    info.update({
        "file": path, "file_size": file_size, "layers": rows,
        "layer_count": len(rows),
        "kpu_layers": sum(r["type"] in ("K210_CONV", "kpu_conv2d") for r in rows),
        "cpu_layers": sum(r["unit"] == "CPU" for r in rows),
        "total_macs": sum(r["macs"] for r in rows),
        "weight_bytes": sum(r["weight_bytes"] for r in rows),
        "peak_kpu_ram": 64 * max([r["kpu_lines"] for r in kpu_rows] or [0]),
        "kpu_ram_footprint": 64 * len(lines_used),
    })
    return info


def _fmt_shape(s):
    return "x".join(map(str, s)) if s else "-"


def summary(info: dict) -> str:
    """The one-line summary of a describe() result: version, weights, layer counts."""
    return (f"kmodel v{info['version']}, {info['weights']} weights, {info['layer_count']} layers "
            f"({info['kpu_layers']} KPU conv, {info['cpu_layers']} CPU)")


def render(info: dict) -> str:
    """Human-readable table."""
    head = [f"{info['file']}: {summary(info)}"]
    cols = ("#", "type", "unit", "op", "in", "out", "MACs", "weights", "KPU lines", "main memory")
    table = []
    for r in info["layers"]:
        main = ", ".join(f"{m[0]}@{m[1]}" + (f"+{m[2]}" if len(m) > 2 else "") for m in r["main"])
        kpu = " ".join(f"[{a},{b})" for a, b in r["kpu_ranges"])
        table.append((r["layer"], r["type"], r["unit"], r["op"], _fmt_shape(r["in"]),
                      _fmt_shape(r["out"]), f"{r['macs']:,}", f"{r['weight_bytes']:,}",
                      (f"{r['kpu_lines']} {kpu}" if r["kpu_lines"] else "-"), main or "-"))
    out = head + text_table(cols, table)
    out.append("")
    out.append(f"total MACs        {info['total_macs']:,}")
    out.append(f"parameter bytes   {info['weight_bytes']:,}")
    out.append(f"peak KPU RAM      {info['peak_kpu_ram']:,} bytes (one layer's input + output; "
               f"limit {hw.KPU_RAM_BYTES:,}); footprint {info['kpu_ram_footprint']:,} bytes")
    out.append(f"main memory       {info['main_memory']:,} bytes")
    if info["version"] == 3:
        outs = ", ".join(f"@{o['address']} {o['size']} B" for o in info["outputs"])
    else:
        outs = ", ".join(f"{_mem_name(o['memory'])}@{o['start']} {o['size']} B"
                         for o in info["outputs"])
        if info.get("trailing_bytes"):
            out.append(f"trailing data     {info['trailing_bytes']:,} bytes after the last body "
                       "(ignored by the runtime)")
    out.append(f"outputs           {outs}")
    if info.get("file_size") is not None:
        out.append(f"file size         {info['file_size']:,} bytes")
    sdk_missing = [r["type"] for r in info["layers"] if r.get("runs_in_sdk") is False]
    if sdk_missing:
        out.append(f"warning: layer types the SDK v3 runner lacks: {', '.join(sorted(set(sdk_missing)))}")
    for line in info.get("overlapping_io", []):
        out.append(f"warning: {line}: nncase's kernel reads input it has already overwritten "
                   "(docs/kmodel-format.md#v4-interpreter); the emulator computes what that loop does")
    if info.get("notes"):
        out.append("notes (deviations from nncase's writer habits; the loaders accept them):")
        out.extend(f"  - {n}" for n in info["notes"])
    return "\n".join(out)
