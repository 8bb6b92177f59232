"""The receipt's quality numbers and its gate: every SQNR a finite number or the reason there is
none, and the refusal of a kmodel whose outputs are NaN/Inf or below --min-sqnr dB."""
from __future__ import annotations

import numpy as np

from tl2k210.errors import QualityError

#: the refusal's words when every output it refuses is within 1 dB of its 8-bit ideal (bench/memory.py reads them)
AT_IDEAL = "That is within 1 dB of the 8-bit ideal"


def finite_sqnr(v):
    """(dB or None, why not) of a measured SQNR: inf is an exact match, -inf a float tensor of
    zeros, NaN a value that is not finite."""
    if v is None or np.isfinite(v):
        return v, None
    if np.isnan(v):
        return None, "NaN: the kmodel's or the float model's values are not finite"
    return None, "exact: no error at all" if v > 0 else "no signal: the float values are all zero"


def sqnr_text(v, note=None):
    if v is not None:
        return f"{v:.1f}"
    return note.split(":")[0] if note else "-"


def ideal_words(o) -> str:
    """'8-bit ideal 31.2 dB' of an output row, or ''."""
    v, bits = o.get("ideal_db"), o.get("ideal_weight_bits", 8)
    label = "8-bit ideal" if bits == 8 else f"ideal at {bits}-bit weights and 8-bit maps:"
    return f"{label} {v:.1f} dB" if v is not None else ""


def ideal_text(o):
    return f" ({ideal_words(o)})" if ideal_words(o) else ""


def _collapsed(r, min_sqnr):
    return (r.get("sqnr_note") or "").startswith("NaN") or r.get("sqnr_db") is not None and r["sqnr_db"] < min_sqnr


def at_own_ideal(r) -> bool:
    """Is output receipt row `r` within 1 dB of its 8-bit ideal (what excuses a quantized model's
    output below --min-sqnr: the loss is the model's own quantization)?"""
    return r.get("sqnr_db") is not None and r.get("ideal_db") is not None and r["sqnr_db"] >= r["ideal_db"] - 1


def excused(totals, min_sqnr) -> list:
    """The outputs below `min_sqnr` that the gate lets pass: a quantized model's (totals
    "own_quantization": its own int8 ranges) within 1 dB of their 8-bit ideal, whose loss is the
    model's own quantization, which the kmodel reproduces. A float model's output is not, nor
    one whose samples lie outside the input range the model states (totals "input_mismatch"):
    its loss is theirs."""
    if min_sqnr <= 0 or not totals.get("own_quantization") or totals.get("input_mismatch"):
        return []
    return [o for o, r in totals["outputs"].items() if _collapsed(r, min_sqnr) and at_own_ideal(r)]


def quality_gate(receipt, nonfinite, min_sqnr):
    """Refuse (QualityError, with the receipt) a kmodel whose outputs are NaN/Inf on the
    calibration samples (`nonfinite`: {output: count}) or below `min_sqnr` dB vs the float model
    (but those `excused`), naming the first layer whose SQNR collapses. `min_sqnr` 0 accepts
    anything."""
    if min_sqnr <= 0:
        return
    t = receipt.totals
    changed = {o: e for o, e in (t.get("kpu_padding_effect") or {}).items() if e["sqnr_db"] < min_sqnr}
    if changed:
        raise QualityError(
            f"{receipt.source}: --kpu-padding changed the float model itself, output "
            + ", ".join(f"{o} {e['sqnr_db']:.1f} dB (cosine {e['cosine']:.4f})" for o, e in changed.items())
            + f" against the exact graph, below --min-sqnr {min_sqnr:g} dB: the KPU's padding differs from "
            "the model's where its maps carry signal. Convert without --kpu-padding. Nothing was written; "
            "--min-sqnr 0 accepts it.", receipt)
    bad = {o: k for o, k in nonfinite.items() if k}
    ok = excused(t, min_sqnr)
    low = {o: r for o, r in t["outputs"].items() if _collapsed(r, min_sqnr) and o not in ok}
    if not bad and not low:
        return
    measured = [r for r in receipt.layers if r.get("sqnr_db") is not None]
    first = next((r for r in receipt.layers if _collapsed(r, min_sqnr)),
                 min(measured, key=lambda r: r["sqnr_db"], default=None))
    where = ("" if first is None else
             f"; the per-layer SQNR first collapses at layer {first['node']!r} ({first['unit']}: {first['why']}, "
             f"{sqnr_text(first.get('sqnr_db'), first.get('sqnr_note'))} dB)")
    n = t["sqnr_samples"]
    if bad:
        what = ", ".join(f"{o} ({k:,} values)" for o, k in bad.items())
        raise QualityError(
            f"{receipt.source}: the kmodel's output {what} is NaN/Inf on {n} calibration samples{where}: "
            "it would hand out garbage. This is a tl2k210 bug: please report it with the model; --format v4 "
            "or --float-fc may route around the layer. Nothing was written (--min-sqnr 0 writes it anyway).",
            receipt)
    what = ", ".join(f"{o} {sqnr_text(r['sqnr_db'], r.get('sqnr_note'))} dB{ideal_text(r)}" for o, r in low.items())
    dense = first is not None and "Gemm" in " ".join(first.get("fused") or []) + first["node"]
    at_ideal = all(at_own_ideal(r) for r in low.values())
    raise QualityError(
        f"{receipt.source}: output SQNR vs the float model {what} on {n} calibration samples, below "
        f"--min-sqnr {min_sqnr:g} dB{where}. "
        + (f"{AT_IDEAL} (the float model with uint8 tensors at the calibrated "
           "ranges): the ranges limit it, not the mapping to the K210. " if at_ideal else "")
        + (f"{_sentence(t['input_mismatch'])}. " if t.get("input_mismatch") else "")
        + _size_trades(receipt)
        + "Try: " + ", ".join(_tries(receipt, dense)) + ". Nothing was written; --min-sqnr 0 accepts it.", receipt)


def _tries(receipt, dense) -> list:
    """What the quality refusal suggests, less what this conversion already did or cannot do
    (16-bit weights in a kmodel v4, whose runtime has 8-bit KPU weights only)."""
    methods = [m for m in ("mse", "percentile") if m != receipt.totals.get("method")]
    # a quantized model's own int8 ranges fix its tensors: no calibration method changes them
    # (MLPerf's keyword spotter as PPQ exports it: MFCCs over 30 % of its input's int8 range)
    own = receipt.totals.get("own_quantization")
    return ([f"--calibrate-method {' or '.join(methods)} (ranges less stretched by rare values)"] * (not own)
            + (["samples over the range the model's own input quantization stands for (its int8 ranges fix "
                "the other tensors)"] if own else [])
            + ["calibration images like the camera sees (--dataset, --calib-limit)",
               "--input-range/--mean/--std as the model was trained"]
            + (["--weight-bits 16"] if (getattr(receipt, "ideal", None) or {}).get("weight_bits", 8) != 16
               and receipt.totals.get("format", "v3") == "v3" else [])    # kmodel v4: 8-bit weights only
            + (["--float-fc (dense layers in float)"] if dense else []))


def _sentence(warning: str) -> str:
    text = warning.removeprefix("warning: ")
    return text[:1].upper() + text[1:]


def _size_trades(receipt) -> str:
    """What --optimize size did to the arithmetic, where it did: the layers it gave uint8 CPU
    forms that round the weights again (an int8 model's own per-channel weights, exact on the
    KPU, lose a little in each; MobileNetV2 from TFLite Micro: 14.7 dB in the default forms, 14.1
    with 21 such layers)."""
    if receipt.totals.get("optimize") != "size":
        return ""
    redone = [t.split(":")[0] for t in receipt.trades if "uint8 weights" in t]
    if not redone:
        return ""
    return (f"--optimize size gave {len(redone)} layer(s) a uint8 CPU form that rounds the weights again "
            f"(the receipt's `traded:` lines, the first {redone[0]!r}); without --optimize size a layer "
            "takes a smaller form only where the model would not fit otherwise. ")
