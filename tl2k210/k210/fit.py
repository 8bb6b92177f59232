"""Does a kmodel fit the firmware it is made for? Checked before anything is written.

* format: kmodel v4 only on builds that load it (firmware.RUNTIMES[...].kmodel_versions;
  docs/kmodel-format.md#versions-and-loaders: MaixPy builds with KMODEL_V4_SUPPORT and the SDK
  since V0.5.7 do, `maixpy-minimum` does not); the refusal names the layer that needs v4.
* memory: model file + main memory within what the build leaves (`model_budget`); the refusal
  gives the budget, the biggest weight blocks and the buffers live at the main-memory peak.
"""
from __future__ import annotations

from tl2k210.errors import Tl2k210Error
from tl2k210.k210 import firmware


class BudgetError(Tl2k210Error):
    pass


class FormatError(Tl2k210Error):
    pass


def loads_format(runtime: str, fmt: str) -> bool:
    return int(fmt.lstrip("v")) in firmware.get(runtime).kmodel_versions


def v4_builds() -> list:
    return [n for n, r in firmware.RUNTIMES.items() if 4 in r.kmodel_versions]


def forced_text(forced) -> str:
    node, why = forced
    return f"node {node!r}: {why}" if node else why


def check_format(fmt: str, forced, runtime: str):
    """FormatError when `runtime` cannot load kmodel `fmt`."""
    if loads_format(runtime, fmt):
        return
    rt = firmware.get(runtime)
    need = f" (needed by {forced_text(forced)})" if forced else ""
    raise FormatError(f"kmodel {fmt}{need} does not load on '{runtime}' ({rt.release}: it loads kmodel "
                      f"{'/'.join(f'v{v}' for v in rt.kmodel_versions)} only; MaixPy says "
                      f"'{rt.version_text()}'). Use --runtime {' or '.join(v4_builds())}, or "
                      + ("change that layer to one kmodel v3 has" if forced else "--format auto (v3 when every "
                         "layer has a v3 form)") + ". Nothing was written.")


def _kb(n):
    return f"{n / 1024:,.0f} KiB" if n >= 10 * 1024 else f"{n:,} B"


def check_budget(model, nbytes: int, runtime: str, lw=None, rows=()):
    """BudgetError when file + main memory exceed what `runtime` leaves."""
    rt = firmware.get(runtime)
    main = model.main_memory
    need = nbytes + main
    if need <= rt.model_budget:
        return
    weights = sorted(((r.weight_bytes, r.node) for r in rows if r.weight_bytes), reverse=True)[:3]
    bufs = []
    if lw is not None:
        bufs = sorted(((size, name) for name, (_, size) in lw.main.at_high.items()), reverse=True)[:3]
        if getattr(lw, "v4_scratch", 0):
            bufs = sorted(bufs + [(lw.v4_scratch, "v4 layer temporaries")], reverse=True)[:3]
    bigger = [n for n, r in firmware.RUNTIMES.items() if r.model_budget >= need
              and model.version in r.kmodel_versions]
    v3 = getattr(lw, "v3_error", None)       # auto fell back to v4 after v3's whole-model refusal
    raise BudgetError(
        (f"kmodel v3: {v3}\nkmodel v4 would run it, but: " if v3 is not None else "") +
        f"kmodel v{model.version} {nbytes:,} B + main memory {main:,} B = {need:,} B exceeds what "
        f"'{runtime}' firmware leaves for model + main memory ({rt.model_budget:,} B)"
        + (f"; biggest weights: {', '.join(f'{n} {_kb(b)}' for b, n in weights)}" if weights else "")
        + (f"; biggest buffers at the main-memory peak: {', '.join(f'{n} {_kb(b)}' for b, n in bufs)}"
           if bufs else "")
        + f". Use a smaller network{', --runtime ' + ' or '.join(bigger) if bigger else ''}"
        + (" or kpu.load_flash (v3)" if model.version == 3 else "") + ". Nothing was written.")
