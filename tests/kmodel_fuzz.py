"""Fuzzer for the kmodel reader and emulator, run in a subprocess under a memory limit.

    python tests/kmodel_fuzz.py --cases 10000 --limit-mb 3072 FILE...

Mutations of real files: truncation, byte flips (biased to the headers), and header claims
(counts, sizes, offsets, shapes set to huge or absurd values). Every case must end in a parse
(then inspect renders it, and small models run on the emulator) or in KmodelFormatError /
EmulatorError; anything else (MemoryError included) is a failure. Prints one JSON line.
"""
import argparse
import json
import resource
import struct
import sys
import time
from pathlib import Path

import numpy as np

def peak_rss_mb() -> int:
    """VmHWM of this process (ru_maxrss would include the forking parent's peak)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return 0


HUGE = [0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 26_000_000, 0x10000000, 1 << 20, 0]


def claim_offsets(data: bytes) -> list:
    """Byte offsets of the u32 fields that claim counts, sizes or offsets."""
    first, second = struct.unpack_from("<II", data, 0)
    out = []
    if first == 3:
        out += [12, 16, 20, 24]
        n_layers, = struct.unpack_from("<I", data, 12)
        n_out, = struct.unpack_from("<I", data, 24)
        table = 28 + 8 * n_out
        out += [28 + 8 * i + k for i in range(min(n_out, 8)) for k in (0, 4)]
        pos = table + 8 * n_layers
        for i in range(min(n_layers, 64)):
            typ, size = struct.unpack_from("<II", data, table + 8 * i)
            out.append(table + 8 * i + 4)
            if pos + 24 <= len(data):
                out += [pos + k for k in range(4, 24, 4)]  # addresses / conv block offsets
            pos += size
    else:
        out += [16, 20, 24, 28, 32]
        ni, no = struct.unpack_from("<II", data, 28)
        out += [40 + 16 * ni + 4 * k for k in range(4 * min(ni, 2))]  # input shapes
        nc, nn = struct.unpack_from("<II", data, 16)[0], struct.unpack_from("<I", data, 24)[0]
        hdr = 40 + 32 * ni + 16 * no + nc
        pos = hdr + 8 * nn
        for i in range(min(nn, 64)):
            if hdr + 8 * i + 8 > len(data):
                break
            size, = struct.unpack_from("<I", data, hdr + 8 * i + 4)
            out.append(hdr + 8 * i + 4)
            out += [pos + k for k in range(8, 64, 4) if pos + k + 4 <= len(data)]
            pos += size
    return [o for o in out if o + 4 <= len(data)]


def mutate(data: bytes, rng) -> bytes:
    d = bytearray(data)
    kind = int(rng.integers(4))
    if kind == 0:  # truncate
        return bytes(d[:int(rng.integers(0, len(d)))])
    if kind == 3:  # header claims
        offs = claim_offsets(data)
        for _ in range(int(rng.integers(1, 4))):
            at = offs[int(rng.integers(len(offs)))]
            old, = struct.unpack_from("<I", d, at)
            v = [*HUGE, len(data), 2 * len(data), old + int(rng.integers(-64, 65)),
                 int(rng.integers(0, 1 << 32))][int(rng.integers(len(HUGE) + 4))]
            struct.pack_into("<I", d, at, v & 0xFFFFFFFF)
        return bytes(d)
    for _ in range(int(rng.integers(1, 9))):  # byte flips, biased to the headers
        hi = len(d) if rng.random() < 0.3 else min(len(d), 4096)
        d[int(rng.integers(0, hi))] = int(rng.integers(256))
    if kind == 2:
        d = d[:int(rng.integers(len(d) // 2, len(d) + 1))]
    return bytes(d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--limit-mb", type=int, default=3072)
    ap.add_argument("--emulate-every", type=int, default=8, help="run the emulator on every N-th "
                    "parsed mutant of a file under 300 kB")
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    lim = a.limit_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    from tl2k210.errors import EmulatorError, KmodelFormatError
    from tl2k210.k210 import kmodel
    from tl2k210.k210.emulator import Emulator
    from tl2k210.k210.inspect import describe, render
    files = [Path(f).read_bytes() for f in a.files]
    rng = np.random.default_rng(a.seed)
    counts = {"parsed": 0, "format_error": 0, "emulated": 0, "emulator_error": 0}
    slowest = 0.0
    t0 = time.perf_counter()
    for i in range(a.cases):
        src = files[i % len(files)]
        data = mutate(src, rng)
        t = time.perf_counter()
        try:
            m = kmodel.loads(data)
            render(describe(m))
            counts["parsed"] += 1
            if len(src) < 300_000 and counts["parsed"] % a.emulate_every == 0:
                try:
                    emu = Emulator(m, threads=1)
                    shape, dtype = emu.input_spec()
                    if int(np.prod(shape)) > 1 << 22:
                        raise EmulatorError("absurd input")
                    with np.errstate(all="ignore"):
                        emu.run(np.zeros(shape, dtype))
                    counts["emulated"] += 1
                except EmulatorError:
                    counts["emulator_error"] += 1
        except KmodelFormatError:
            counts["format_error"] += 1
        except Exception as exc:  # noqa: BLE001 - the point of the fuzzer
            print(json.dumps({"case": i, "error": f"{type(exc).__name__}: {exc}"[:500]}))
            sys.exit(1)
        slowest = max(slowest, time.perf_counter() - t)
    counts.update(cases=a.cases, seconds=round(time.perf_counter() - t0, 1), slowest_case_s=round(slowest, 3),
                  max_rss_mb=peak_rss_mb())
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
