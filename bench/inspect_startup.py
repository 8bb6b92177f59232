"""Start-up time of `tl2k210 inspect` (a fresh process, as a user runs it). Target: < 1 s.

    python bench/inspect_startup.py [--runs 5] [--json bench/results/inspect_startup.json]
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tl2k210 import paths

REPO = paths.checkout()
TESTDATA = paths.testdata_dir()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "inspect_startup.json"))
    args = ap.parse_args()
    rows = []
    for name in ("facedetect_320x240_v3", "yolo20_v4", "maix_asr_v4"):
        f = TESTDATA / "kmodels" / f"{name}.kmodel"
        if not f.exists():
            continue
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "tl2k210.cli", "inspect", str(f)], check=True,
                           capture_output=True, cwd=REPO)
            times.append(time.perf_counter() - t)
        rows.append({"model": name, "best_s": min(times), "median_s": sorted(times)[len(times) // 2]})
    print(f"{'model':24} {'best s':>8} {'median s':>9}")
    for r in rows:
        print(f"{r['model']:24} {r['best_s']:8.3f} {r['median_s']:9.3f}")
    print("(fresh `python -m tl2k210.cli inspect` process; target < 1 s)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
