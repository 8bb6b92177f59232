"""Models never seen before, converted as a new user would: every .tflite / .onnx / .h5 / .keras / .pb
file of a folder, for each --runtime, with `tl2k210 convert FILE OUT --dataset PHOTOS --runtime R` (the 12
scikit-image photos of tests/devcorpus.py unless --dataset names another folder or array file;
a file NAME.npy beside a model is its own calibration data). One row per (file, runtime): the
kmodel's bytes, main memory, estimated latency and output SQNR against the float model with the
8-bit ideal beside it (the receipt's numbers, with --min-sqnr 0 so that a kmodel under the
default 15 dB gate still shows its figures), or the refusal's first line; a conversion that dies
without one (a signal: the kernel's out-of-memory kill) or outlives --timeout is a CRASH row, and
the other rows are kept.

    python bench/unseen.py FOLDER [--runtime maixpy sdk] [--json out.json] [--markdown] [--timeout 900]

The files stay where they are (nothing is copied into the repository): docs/results.md says
where each set comes from.
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tl2k210 import paths
from tl2k210.frontends import model_kind

REPO = paths.checkout()
sys.path.insert(0, str(REPO / "tests"))
SUFFIXES = (".tflite", ".onnx", ".h5", ".hdf5", ".keras", ".pb")


def convert(src: Path, runtime: str, dataset: Path, out: Path, timeout: int = 900) -> dict:
    kmodel, report = out / f"{src.stem}_{runtime}.kmodel", out / f"{src.stem}_{runtime}.json"
    cmd = [sys.executable, "-m", "tl2k210.cli", "convert", str(src), str(kmodel), "--dataset", str(dataset),
           "--runtime", runtime, "--report", str(report), "-q", "--min-sqnr", "0"]
    row = {"file": src.name, "runtime": runtime}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        row.update(rc=None, refused=f"CRASH: no answer within {timeout} s (a hang)")
        return row
    row["rc"] = p.returncode
    if p.returncode:
        err = [ln for ln in p.stderr.splitlines() if ln.startswith("tl2k210 convert: error:")]
        last = p.stderr.strip().splitlines()[-1:] or [f"CRASH: exit status {p.returncode}, nothing on stderr "
                                                      "(a signal: -9 / 137 is the kernel's out-of-memory kill)"]
        row["refused"] = (err[0] if err else last[0]).removeprefix("tl2k210 convert: error: ")
        return row
    r = json.loads(report.read_text())
    outs = r["totals"]["outputs"]
    row.update(kmodel_bytes=r["file_size"], main_memory=r["main_memory"], latency_ms=r["latency_ms"],
               format=r["totals"]["format"], sqnr=[(o["sqnr_db"], o["ideal_db"]) for o in outs.values()],
               ideal_weights=r["ideal"]["weight_bytes"], ideal_live=r["ideal"]["live_bytes"])
    return row


def _ratio(ours, ideal) -> str:
    return f" ({ours / ideal:.2f})" if ideal else ""


def markdown(rows) -> str:
    lines = ["| file | runtime | outcome | kmodel (× ideal weights) | main memory (× live set) | est. ms | "
             "SQNR dB (ideal), per output |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['file']} | {r['runtime']} | refused: {r['refused'][:220]} | | | | |")
            continue
        sq = ", ".join("-" if a is None else f"{a:.1f} ({'-' if b is None else f'{b:.1f}'})" for a, b in r["sqnr"])
        lines.append(f"| {r['file']} | {r['runtime']} | converted, {r['format']} | {r['kmodel_bytes']:,} B"
                     f"{_ratio(r['kmodel_bytes'], r.get('ideal_weights'))} | {r['main_memory']:,} B"
                     f"{_ratio(r['main_memory'], r.get('ideal_live'))} | {r['latency_ms']:.2f} | {sq} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--runtime", nargs="+", default=["maixpy", "sdk"])
    ap.add_argument("--dataset", help="calibration folder or array file (default: the 12 photos)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds a conversion may take (a hang is a row)")
    ap.add_argument("--json")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    files = sorted(f for f in Path(args.folder).iterdir() if model_kind(f) in SUFFIXES)   # `.lite`, `.model` too
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.dataset:
            photos = Path(args.dataset)
        else:
            from devcorpus import photo_folder
            (tmp / "photos").mkdir()
            photos = photo_folder(tmp / "photos")
        for runtime in args.runtime:
            for f in files:
                own = f.with_suffix(".npy")
                rows.append(convert(f, runtime, own if own.exists() else photos, tmp, args.timeout))
                r = rows[-1]
                print(f"{f.name:45s} {runtime:8s} " + (f"refused: {r['refused'][:120]}" if "refused" in r else
                      f"{r['kmodel_bytes']:>10,} B + {r['main_memory']:>10,} B  {r['latency_ms']:8.2f} ms  " +
                      " ".join(f"{a:.1f}/{b:.1f}" for a, b in r["sqnr"] if a is not None and b is not None)),
                      flush=True)
    converted = sum("refused" not in r for r in rows)
    print(f"{converted} of {len(rows)} (file, runtime) pairs converted")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.markdown:
        print(markdown(rows))


if __name__ == "__main__":
    main()
