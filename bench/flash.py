"""Flash throughput: tl2k210 vs stock kflash 1.1.6, side by side, on emulated boards whose line
is throttled to the baud rate (bytes x 10 / baud, 8N1).

For each image size and baud rate both tools write a firmware image at address 0 to a fresh
board (`-B dan`; the ROM stage always runs at 115200). Reported per run:
  seconds     wall time of the client process (reset, stub upload, transfer, reboot)
  data_s      the data phase as the board sees it: first FLASH_WRITE byte on the wire .. last
              write acknowledged
  efficiency  acknowledged payload bytes / line capacity (baud / 10) over data_s
  exact       the emulated flash holds exactly the image and the emulated bootrom accepts it

    python bench/flash.py                  # 2 and 4 MiB at 115200, 1.5 M and 2 M (~20 min)
    python bench/flash.py --quick          # 256 KiB, same baud rates (~1 min)
    python bench/flash.py --faults 20      # the fault-injection table (1e-5, 1e-4 per byte)
    python bench/flash.py --json out.json
Target: efficiency >= 90 % and never slower than kflash at the same baud.
"""
import argparse
import json
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from tl2k210.flash.emulated_board import EmulatedBoard
from tl2k210.flash.trials import TOOLS, booted_image_is, fault_trial, run_client, summarize

MiB = 1024 * 1024
BAUDS = (115_200, 1_500_000, 2_000_000)


def one_run(tool, size, baud, workdir):
    with tempfile.TemporaryDirectory(dir=workdir, prefix=f"{tool}-") as tmp:
        fw = random.Random(size).randbytes(size)
        path = os.path.join(tmp, "fw.bin")
        with open(path, "wb") as fh:
            fh.write(fw)
        limit = 3.0 * size * 10 / baud + 60
        with EmulatedBoard(os.path.join(tmp, "flash.bin"), wiring="dan", throttle=True) as b:
            ok, msg, secs, timed_out = run_client(tool, b, path, baud, limit)
            time.sleep(0.05)
            exact = booted_image_is(b, fw, size)
            st = b.stats
            data_s = (st.write_t1 - st.write_t0) if st.write_t0 and st.write_t1 else 0.0
            return {"tool": tool, "size": size, "baud": baud, "ok": ok, "exact": exact,
                    "seconds": round(secs, 2), "data_s": round(data_s, 2),
                    "efficiency": round(st.write_efficiency(baud), 4),
                    "boot_ok": bool(b.core.boot_ok), "message": msg[-120:]}


def throughput(sizes, bauds, parallel):
    rows = []
    with tempfile.TemporaryDirectory(prefix="tl2k210-bench-") as work:
        for size in sizes:
            for baud in bauds:
                with ThreadPoolExecutor(parallel) as pool:   # both tools at the same time
                    got = list(pool.map(lambda t: one_run(t, size, baud, work), TOOLS))
                rows.extend(got)
                for r in got:
                    print_row(r)
    return rows


HEADER = f"{'size':>8} {'baud':>9} {'tool':<8} {'seconds':>8} {'data_s':>8} {'effic.':>7} exact"


def print_row(r):
    if not hasattr(print_row, "done"):
        print(HEADER)
        print_row.done = True
    print(f"{r['size'] // 1024:>6}Ki {r['baud']:>9} {r['tool']:<8} {r['seconds']:>8.2f} "
          f"{r['data_s']:>8.2f} {r['efficiency'] * 100:>6.1f}% {r['exact'] and r['boot_ok']}",
          flush=True)


def compare(rows):
    print("\nper size/baud: tl2k210 vs kflash")
    by = {}
    for r in rows:
        by.setdefault((r["size"], r["baud"]), {})[r["tool"]] = r
    verdicts = []
    for (size, baud), d in sorted(by.items()):
        a, k = d.get("tl2k210"), d.get("kflash")
        if not a or not k:
            continue
        faster = a["seconds"] <= k["seconds"] * 1.02
        eff = a["efficiency"] >= 0.90
        verdicts.append(faster and eff and a["exact"])
        print(f"  {size // 1024:>6} KiB @ {baud:>9}: tl2k210 {a['seconds']:7.2f} s "
              f"({a['efficiency'] * 100:5.1f} %), kflash {k['seconds']:7.2f} s "
              f"({k['efficiency'] * 100:5.1f} %)  "
              f"{'OK' if faster and eff else 'MISSED TARGET'}")
    return all(verdicts)


def faults(seeds, size, parallel):
    outs = []
    with tempfile.TemporaryDirectory(prefix="tl2k210-faults-") as work:
        for rate in (1e-5, 1e-4):
            for tool in TOOLS:
                with ThreadPoolExecutor(parallel) as pool:
                    outs.extend(pool.map(lambda s: fault_trial(tool, rate, s, size=size,
                                                               workdir=work), range(seeds)))
    print(f"{'tool':<8} {'rate':>6} {'runs':>4} {'exact':>5} {'silent-bad':>10} {'failed':>6} "
          f"{'timeout':>7} {'failed-but-exact':>16}")
    for (tool, rate), row in summarize(outs).items():
        print(f"{tool:<8} {rate:>6g} {row['runs']:>4} {row['exact']:>5} "
              f"{row['silent_corruption']:>10} {row['failed']:>6} {row['timeout']:>7} "
              f"{row['failed_but_exact']:>16}")
    return [o.as_dict() for o in outs]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="256 KiB images only")
    ap.add_argument("--sizes", help="comma-separated sizes in KiB (default 2048,4096)")
    ap.add_argument("--bauds", help="comma-separated baud rates (default 115200,1500000,2000000)")
    ap.add_argument("--faults", type=int, metavar="SEEDS", help="run the fault table instead")
    ap.add_argument("--fault-size", type=int, default=256, help="KiB per fault trial")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.faults:
        result = {"faults": faults(args.faults, args.fault_size * 1024, max(args.parallel, 4))}
        ok = True
    else:
        sizes = ([int(s) * 1024 for s in args.sizes.split(",")] if args.sizes
                 else [256 * 1024] if args.quick else [2 * MiB, 4 * MiB])
        bauds = [int(b) for b in args.bauds.split(",")] if args.bauds else list(BAUDS)
        rows = throughput(sizes, bauds, args.parallel)
        ok = compare(rows)
        result = {"throughput": rows, "targets_met": ok}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
