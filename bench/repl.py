"""Upload throughput over the MaixPy REPL: `tl2k210 repl put` vs mpremote's `fs cp` (and, with
--ampy, `ampy put`), each as a subprocess, to a fresh emulated MaixPy board
(tl2k210.maixpy.repl_board) on the same emulated line, at 115200 and 1.5 Mbaud.

Per run:
  line_s     the board's virtual clock over the whole command (connect, transfer, verify): the
             wire time of every byte both ways + the board's modelled work (compile of each
             command, SPIFFS/SD writes; repl_board.py). Deterministic: host load and the
             clients' own sleeps are not in it.
  wall_s     the client's wall time with the line throttled in real time (bytes x 10 / baud);
             includes the clients' sleeps and turnarounds, and this machine's load (noisy).
  KiB/s      payload / line_s and payload / wall_s
  wire       host->board bytes per payload byte
  exact      the board's file equals the payload

"1.5 Mbaud" runs start the board's REPL UART at 1.5 Mbaud (as after MaixPy's IDE-mode switch)
and let the pty ignore the host's rate, because mpremote always opens its port at 115200; the
extra `tl2k210 -b` row starts at 115200 and switches with UART.repl_uart().init.

    python bench/repl.py                  # the face-detection kmodel (388 KB) if testdata is there
    python bench/repl.py --quick          # 64 KiB
    python bench/repl.py --faults 20 [--rate 1e-3]   # seeded line-fault trials, both clients
    python bench/repl.py --json out.json --no-throttle   # default JSON: bench/results/repl.json
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

from tl2k210 import paths
from tl2k210.maixpy.repl_board import ReplBoard

REPO = str(paths.checkout())

SCENARIOS = [  # (name, tool, line baud, client args)
    ("tl2k210 repl put", "tl2k210", 115200, []),
    ("mpremote fs cp", "mpremote", 115200, []),
    ("tl2k210 repl put", "tl2k210", 1_500_000, ["-b", "1500000", "--initial-baud", "1500000"]),
    ("mpremote fs cp", "mpremote", 1_500_000, []),
    ("tl2k210 repl put -b 1500000 (switch)", "tl2k210-switch", 115200, ["-b", "1500000"]),
]


def command(tool, port, path, extra):
    if tool.startswith("tl2k210"):
        return [sys.executable, "-m", "tl2k210.cli", "repl", "put", path, "--to", "/sd",
                "--no-resume", "-p", port] + extra
    if tool == "mpremote":
        return [sys.executable, "-m", "mpremote", "connect", port, "fs", "cp", "-f", path,
                ":/sd/" + os.path.basename(path)]
    if tool == "ampy":
        return [sys.executable, "-m", "ampy.cli", "-p", port, "put", path,
                "/sd/" + os.path.basename(path)]
    raise ValueError(tool)


def one(name, tool, baud, extra, payload, throttle, workdir):
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        src = os.path.join(tmp, "payload.bin")
        with open(src, "wb") as fh:
            fh.write(payload)
        sd = os.path.join(tmp, "sd")
        os.mkdir(sd)
        switch = tool == "tl2k210-switch"
        b = ReplBoard(sd=sd, fs=None, baud=baud, throttle=throttle,
                      check_baud=switch or baud == 115200)
        with b:
            b.wait_idle()
            t_line, rx0, tx0 = b.line_seconds(), b.stats.rx_bytes, b.stats.tx_bytes
            env = dict(os.environ, PYTHONPATH=str(paths.import_root()) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            t0 = time.monotonic()
            p = subprocess.run(command(tool, b.port, src, extra), capture_output=True, env=env,
                               timeout=3600)
            wall = time.monotonic() - t0
            line = b.line_seconds() - t_line
            rx, tx = b.stats.rx_bytes - rx0, b.stats.tx_bytes - tx0
        dest = os.path.join(sd, "payload.bin")
        exact = p.returncode == 0 and os.path.exists(dest) and open(dest, "rb").read() == payload
    n = len(payload)
    rate = 1_500_000 if switch else baud
    return {"client": name, "baud": f"{baud}->1500000" if switch else baud, "bytes": n, "ok": p.returncode == 0, "exact": exact,
            "line_s": round(line, 2), "wall_s": round(wall, 2),
            "line_kib_s": round(n / line / 1024, 1) if line else None,
            "wall_kib_s": round(n / wall / 1024, 1), "wire_per_byte": round(rx / n, 3),
            "board_to_host_bytes": tx,
            "line_efficiency": round(n / (line * rate / 10), 3) if line else None,
            "error": "" if p.returncode == 0 else (p.stdout + p.stderr).decode()[-300:]}


def fault_trial(tool, rate, seed, size, workdir, timeout=300):
    """One upload of `size` seeded bytes through a line that corrupts/drops host->board bytes at
    `rate`: exact | silent_corruption (reported success, wrong file) | failed | timeout."""
    from tl2k210.flash.emulated_board import FaultConfig
    payload = random.Random(500 + seed).randbytes(size)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        src = os.path.join(tmp, "payload.bin")
        with open(src, "wb") as fh:
            fh.write(payload)
        sd = os.path.join(tmp, "sd")
        os.mkdir(sd)
        with ReplBoard(sd=sd, faults=FaultConfig(rate=rate, seed=seed)) as b:
            b.wait_idle()
            env = dict(os.environ, PYTHONPATH=str(paths.import_root()) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            try:
                p = subprocess.run(command(tool, b.port, src, []), capture_output=True, env=env,
                                   timeout=timeout)
                ok, timed_out = p.returncode == 0, False
            except subprocess.TimeoutExpired:
                ok, timed_out = False, True
            faults = sum(b.stats.faults.values())
        dest = os.path.join(sd, "payload.bin")
        exact = os.path.exists(dest) and open(dest, "rb").read() == payload
    status = ("exact" if exact else "silent_corruption") if ok else \
        ("timeout" if timed_out else "failed")
    return {"client": tool, "rate": rate, "seed": seed, "status": status, "faults": faults}


def faults_table(n, rate, size, tools):
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-repl-faults-") as work:
        for tool in tools:
            for seed in range(n):
                rows.append(fault_trial(tool, rate, seed, size, work))
                print(f"  {tool} seed {seed}: {rows[-1]['status']}", file=sys.stderr, flush=True)
    print(f"{n} seeded uploads of {size} bytes per client, {rate:g} host->board faults per byte "
          "(corrupt/drop)")
    for tool in tools:
        mine = [r for r in rows if r["client"] == tool]
        counts = {k: sum(r["status"] == k for r in mine)
                  for k in ("exact", "silent_corruption", "failed", "timeout")}
        print(f"  {tool:10} {counts}  ({sum(r['faults'] for r in mine)} faults)")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 64 KiB payload")
    ap.add_argument("--size", type=int, help="a random payload of this many bytes")
    ap.add_argument("--no-throttle", dest="throttle", action="store_false", default=True,
                    help="do not pace the line in real time (wall_s then means little)")
    ap.add_argument("--ampy", action="store_true", help="also ampy put at 115200 (very slow)")
    ap.add_argument("--json", default=os.path.join(REPO, "bench", "results", "repl.json"),
                    help="write the rows as JSON (bench/results/repl.json)")
    ap.add_argument("--faults", type=int, metavar="N", help="instead: N seeded uploads per "
                    "client through a faulty line (--rate), counting silent corruptions")
    ap.add_argument("--rate", type=float, default=1e-4, help="faults per byte for --faults (1e-4)")
    args = ap.parse_args(argv)
    if args.faults:
        rows = faults_table(args.faults, args.rate, args.size or 64 * 1024,
                            ["tl2k210", "mpremote"])
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as fh:
                json.dump({"faults": rows}, fh, indent=1)
        return
    from tl2k210 import paths
    face = paths.testdata("kmodels", "facedetect_320x240_v3.kmodel")
    if args.quick or args.size or face is None or not face.is_file():
        size = args.size or 64 * 1024
        payload, what = random.Random(14).randbytes(size), f"{size} random bytes"
    else:
        payload, what = open(face, "rb").read(), "facedetect_320x240_v3.kmodel"
    scen = list(SCENARIOS) + ([("ampy put", "ampy", 115200, [])] if args.ampy else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-repl-") as work:
        for name, tool, baud, extra in scen:
            rows.append(one(name, tool, baud, extra, payload, args.throttle, work))
            r = rows[-1]
            print(f"  {name} @ {baud}: line {r['line_s']} s, wall {r['wall_s']} s"
                  f"{'' if r['ok'] else ' FAILED ' + r['error']}", file=sys.stderr, flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"upload of {what} ({len(payload)} bytes) to /sd of an emulated MaixPy board "
          f"(throttled line: {args.throttle}; load average {load:.1f} on {os.cpu_count()} cores)")
    hdr = ("client", "baud", "line s", "line KiB/s", "eff.", "wall s", "wall KiB/s", "wire B/B",
           "exact")
    print("  ".join(f"{h:>14}" if i == 1 else f"{h:>10}" if i else f"{h:38}"
                    for i, h in enumerate(hdr)))
    for r in rows:
        vals = (r["client"], r["baud"], r["line_s"], r["line_kib_s"], r["line_efficiency"],
                r["wall_s"], r["wall_kib_s"], r["wire_per_byte"], r["exact"])
        print("  ".join(f"{str(v):>14}" if i == 1 else f"{str(v):>10}" if i else f"{str(v):38}"
                        for i, v in enumerate(vals)))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump({"payload": what, "bytes": len(payload), "throttle": args.throttle,
                       "load_average": load, "rows": rows}, fh, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
