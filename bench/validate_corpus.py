"""`tl2k210 validate` over the real kmodel corpus (testdata/kmodels + testdata/corpus/kmodels):
each model is uploaded to a fresh emulated MaixPy board (tl2k210.maixpy.repl_board) and run
there on the astronaut photo (vector models: seeded float32 rows); the table says, per model,
whether every output of the board equals the emulator's, or why validate refused (the board's
kpu.load error, a kmodel format no K210 firmware loads). A model that the standard MaixPy build
cannot hold (error 2006) is retried on the `maixpy-minimum-v4` build, as a user would.

    python bench/validate_corpus.py [--json bench/results/validate_corpus.json] [KMODEL ...]

This checks the whole path (upload, kpu.load, image + pix_to_ai, forward, fmap read-back,
comparison) on files made by other tools; the board here is the host MaixPy on the emulator, so
"bit-exact" says the tool chain and the REPL path add no difference, not what silicon computes.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from tl2k210 import paths
from tl2k210.maixpy.repl_board import ReplBoard

RUNTIMES = ("maixpy", "maixpy-minimum-v4")


def vectors(kmodel, folder):
    """An .npy of 4 seeded float32 rows for a vector model, else None (the astronaut photo)."""
    import numpy as np

    from tl2k210.k210.emulator import Emulator
    try:
        shape, dtype = Emulator.load(kmodel).input_spec()
    except Exception:
        return None
    shape = tuple(shape[1:] if len(shape) == 4 else shape)
    if len(shape) == 3 and dtype == np.uint8:
        return None
    if len(shape) == 3 and shape[0] in (1, 3) and shape[1] > 1 and shape[2] > 1:
        return None                                 # float32 image input: the photo
    path = os.path.join(folder, "x.npy")
    rows = np.random.default_rng(0).uniform(0, 1, (4, int(np.prod(shape)))).astype(np.float32)
    np.save(path, rows)
    return path


def one(kmodel, runtime):
    env = dict(os.environ, PYTHONPATH=str(paths.import_root()) + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory(prefix="bench-validate-") as tmp:
        os.mkdir(os.path.join(tmp, "sd"))
        npy = vectors(kmodel, tmp)
        with ReplBoard(sd=os.path.join(tmp, "sd"), runtime=runtime) as b:
            b.wait_idle()
            t0 = time.monotonic()
            cmd = [sys.executable, "-m", "tl2k210.cli", "validate", kmodel, "-p", b.port,
                   "--json", os.path.join(tmp, "v.json")] + (["--input", npy] if npy else [])
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
            wall = time.monotonic() - t0
        rep = None
        if os.path.exists(os.path.join(tmp, "v.json")):
            with open(os.path.join(tmp, "v.json")) as fh:
                rep = json.load(fh)
    row = {"kmodel": os.path.basename(kmodel), "runtime": runtime, "rc": p.returncode,
           "wall_s": round(wall, 1), "input": "float32 rows" if npy else "astronaut"}
    if rep is not None:
        outs = [r for r in rep["rows"] if r["kind"] == "output"]
        row.update(version=rep["version"], outputs=len(outs),
                   max_abs_diff=max(r["pairs"]["board_vs_emulator"]["max_abs_diff"] for r in outs),
                   result="bit-exact" if all(r["pairs"]["board_vs_emulator"]["max_abs_diff"] == 0
                                             for r in outs) else "DIFFERS")
    else:
        err = [ln for ln in p.stderr.splitlines() if ln.startswith("tl2k210 validate: error:")]
        msg = err[0].split("error:", 1)[1].strip() if err else p.stderr.strip()[-200:]
        code = re.search(r"load error:(\d+)", msg)
        row.update(result=f"refused (kpu.load error {code.group(1)})" if code else "refused",
                   why=msg[:160])
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kmodels", nargs="*", help="default: every kmodel of the testdata")
    ap.add_argument("--json", default=str(paths.checkout() / "bench" / "results" /
                                          "validate_corpus.json") if paths.checkout() else None,
                    help="write the rows as JSON (default: bench/results/validate_corpus.json)")
    args = ap.parse_args(argv)
    files = args.kmodels
    if not files:
        for sub in (("kmodels",), ("corpus", "kmodels")):
            d = paths.testdata(*sub)
            files += sorted(glob.glob(os.path.join(str(d), "*.kmodel"))) if d else []
    if not files:
        sys.exit("no kmodels: put the testdata at ../shared/testdata or set TL2K210_TESTDATA")
    rows = []
    for k in files:
        row = one(k, RUNTIMES[0])
        if "error 2006" in row["result"]:
            row = one(k, RUNTIMES[1])
        rows.append(row)
        print(f"  {row['kmodel']}: {row['result']} ({row['runtime']}, {row['wall_s']} s)",
              file=sys.stderr, flush=True)
    w = max(len(r["kmodel"]) for r in rows)
    print(f"{'kmodel':{w}}  {'v':>2}  {'outs':>4}  {'firmware':18}  {'input':12}  result")
    for r in rows:
        print(f"{r['kmodel']:{w}}  {str(r.get('version', '-')):>2}  {str(r.get('outputs', '-')):>4}"
              f"  {r['runtime']:18}  {r['input']:12}  {r['result']}"
              + (f": {r['why']}" if r.get("why") and "kpu.load" not in r["result"] else ""))
    exact = sum(r["result"] == "bit-exact" for r in rows)
    differs = sum(r["result"] == "DIFFERS" for r in rows)
    print(f"{len(rows)} kmodels: {exact} board = emulator bit-exact, {differs} differ, "
          f"{len(rows) - exact - differs} refused")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump({"rows": rows}, fh, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
