"""THE table of K210 runtimes (firmware builds) a kmodel is deployed under: what each leaves for
models, which kmodel versions it loads, its MicroPython heap. The compiler's `--runtime` check
and the host MaixPy (`tl2k210 demo --runtime`, `kpu.load`, `gc.mem_free`) both read it.

Sources: docs/kmodel-format.md#loading-on-maixpy ("minimum firmware can hold a model of
about 4 MB, full firmware about 2 MiB"), docs/maixpy-firmware.md#gc-heap (GC heap
0x80000 -> 518 144-byte pool), #kpuload (V4 only in *_kmodel_v4* / full builds; minimum builds are
V3-only, which the text of error 2002 tells). `model_budget` is what the system heap has free for
kpu.load after boot: the kmodel file (copied to RAM) plus its main-memory buffers. Board reports
vary with the build (docs/maixpy-firmware.md#gc-heap: 1.3-2 MB on full builds); the figures are the docs'.
The minimum build with V4 support is given the minimum build's budget (its V4 runtime code is
not accounted: UNCERTAIN, probably a little less in practice).
"""
from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class Runtime:
    name: str
    model_budget: int          # bytes of system heap free for model file + main memory
    kmodel_versions: tuple     # versions kpu.load accepts
    gc_heap: int = 0x80000     # MicroPython GC heap (freq.conf default), 0 = not MicroPython
    release: str = ""          # what a user flashes
    maixpy: bool = True
    reported_low: int = 0      # the least system heap boards report free (0: model_budget's figure)

    def short_of(self, need: int) -> str | None:
        """The receipt's note where `need` (model file + main memory) is over what some boards of
        this build report free (hunt 22: a kmodel leaving 11 KB of full MaixPy's 2 MiB, which
        boards reporting 1.3 MB free refuse with 2006); None where it is under."""
        if not self.reported_low or need <= self.reported_low:
            return None
        return (f"needs {need:,} B of the system heap: {self.name} boards report {self.reported_low / 1e6:.1f}-"
                f"{self.model_budget / 1e6:.1f} MB free (Maix.utils.heap_free() after boot); where kpu.load fails "
                "with 2006 (ERR_NO_MEM), convert with --optimize size (the smallest forms) or for a minimum build")

    @property
    def gc_pool(self) -> int:
        """Bytes gc.mem_free() + gc.mem_alloc() add up to: MicroPython 1.11 gc_init splits the
        heap into the allocation table (2 bits a block), the finaliser table (1 bit a block) and
        32-byte blocks: 0x80000 -> 4048 table bytes -> 16192 blocks = 518 144 bytes."""
        atb = self.gc_heap * 8 // (8 + 8 * 4 // 8 + 8 * 4 * 32)
        return atb * 4 * 32

    def version_text(self) -> str:
        """The 2002 message of this build."""
        v = "V3/V4" if 4 in self.kmodel_versions else "V3"
        return f"ERR_KMODEL_VERSION: only support kmodel {v} now"


RUNTIMES = {r.name: r for r in (
    Runtime("maixpy", 2 * MiB, (3, 4), release="maixpy_v0.6.2_*.bin (full build, kmodel V3 + V4)",
            reported_low=1_300_000),
    Runtime("maixpy-minimum", 4 * MiB, (3,), release="maixpy_v0.6.2_*_minimum.bin (no V4 support)"),
    Runtime("maixpy-minimum-v4", 4 * MiB, (3, 4),
            release="maixpy_v0.6.2_*_minimum_with_kmodel_v4_support.bin"),
    Runtime("sdk", 5 * MiB, (3, 4), gc_heap=0, maixpy=False,
            release="kendryte-standalone-sdk application (6 MiB SRAM less code and stack)"),
)}
MAIXPY_RUNTIMES = tuple(n for n, r in RUNTIMES.items() if r.maixpy)


def summary() -> str:
    """One line per build for --runtime's help: what it leaves for a model, which kmodels it loads."""
    return "; ".join(f"{r.name}: {r.model_budget / MiB:g} MiB, kmodel "
                     f"{'/'.join(f'v{v}' for v in r.kmodel_versions)}{'' if 4 in r.kmodel_versions else ' only'}"
                     for r in RUNTIMES.values())


def get(name: str) -> Runtime:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise KeyError(f"unknown runtime {name!r}: choose from {', '.join(RUNTIMES)}") from None
