"""Speed against an earlier commit: does any model convert to a slower kmodel than it used to?

Issue 22 asks that no model gets slower than before the fit work by more than 10 % unless that
is what made it fit. This converts every row that `bench/memory.py` converted (its JSON), with
the code of BASE (a `git archive` of it in a temporary folder, run in a subprocess), for the
same runtime, and prints the estimated latency (tl2k210/k210/cost.py) of both. Where BASE
refuses the row for that runtime, the slowdown, if any, is what made it fit.

    python bench/memory.py --json bench/results/memory.json
    python bench/vs_commit.py 6a135f4 [--memory-json bench/results/memory.json] [--only SUBSTRING]
                              [--json bench/results/vs_commit.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from tl2k210 import paths  # noqa: E402

sys.path.insert(0, str(paths.checkout() / "bench"))
import memory  # noqa: E402  (bench/memory.py: the rows' sources)

SLOWER = 1.10
CONVERT = "import sys; from tl2k210.cli import main; sys.exit(main(sys.argv[1:]))"


def checkout(commit, where: Path) -> Path:
    """The tree of `commit` under `where` (no worktree to clean up)."""
    archive = subprocess.run(["git", "-C", str(paths.checkout()), "archive", commit], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def base_ms(tree: Path, src, extra, calib, runtime):
    """(BASE's estimated ms, None) or (None, why it refused)."""
    with tempfile.TemporaryDirectory() as tmp:
        out, rep = Path(tmp) / "m.kmodel", Path(tmp) / "m.json"
        env = dict(os.environ, PYTHONPATH=str(tree), TF_CPP_MIN_LOG_LEVEL="3")
        p = subprocess.run([sys.executable, "-c", CONVERT, "convert", str(src), str(out), "--dataset", str(calib),
                            "--report", str(rep), "-q", "--runtime", runtime]
                           + memory._without(extra, "--min-sqnr"),      # BASE may not know the flag
                           cwd=tree, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            lines = p.stderr.strip().splitlines()
            return None, (lines[-1] if lines else f"exit {p.returncode}")[:160]
        return json.loads(rep.read_text())["latency_ms"], None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="the commit to compare with, e.g. 6a135f4")
    ap.add_argument("--memory-json", default=str(paths.checkout() / "bench" / "results" / "memory.json"))
    ap.add_argument("--only", default="")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = {r["model"]: r for r in json.loads(Path(args.memory_json).read_text())
            if r.get("result") == "converted" and args.only in r["model"]}
    calib = memory.corpus.photo_folder()
    out = []
    with tempfile.TemporaryDirectory(prefix="tl2k210-base-") as tmp:
        tree = checkout(args.base, Path(tmp))
        print(f"{'model':48} {'runtime':18} {args.base + ' ms':>12} {'ours ms':>9}  verdict")
        for name, group, src, extra, _ in memory.sources("all", args.only):
            r = rows.get(name)
            if r is None:
                continue
            ms, why = base_ms(tree, src, extra, calib, r["runtime"])
            if ms is None:
                verdict = f"converts now, {args.base} refused it: {why}"
            elif r["latency_ms"] <= ms * SLOWER:
                verdict = "ok" if r["latency_ms"] <= ms * 1.005 else f"ok ({r['latency_ms'] / ms - 1:+.0%})"
            else:
                verdict = (f"SLOWER {r['latency_ms'] / ms - 1:+.0%}"
                           + (" (traded to fit: " + "; ".join(r["trades"]) + ")" if r.get("trades") else ""))
            out.append({"model": name, "runtime": r["runtime"], "base": args.base, "base_ms": ms,
                        "base_refused": why, "ours_ms": r["latency_ms"], "verdict": verdict})
            base_txt = f"{ms:12.2f}" if ms is not None else f"{'refused':>12}"
            print(f"{name[:48]:48} {r['runtime']:18} {base_txt} {r['latency_ms']:9.2f}  {verdict}", flush=True)
    slower = [o for o in out if o["verdict"].startswith("SLOWER")]
    print(f"\n{len(out)} rows: {len(slower)} more than {SLOWER - 1:.0%} slower than {args.base}, "
          f"{sum(o['base_ms'] is None for o in out)} convert now where {args.base} refused them")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
