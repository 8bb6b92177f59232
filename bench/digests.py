"""sha256 of every kmodel `tl2k210 convert` writes for the corpus, the developer corpus and the zoo.

A refactor that claims "no output byte changed" is checked by running this before and after:

    python bench/digests.py --json before.json              # on the old commit
    python bench/digests.py --json after.json --against before.json   # exit 1 on any difference

Each row: the model and the kmodel's sha256 (or the refusal's last line).
--skip-dev leaves out the developer corpus (keras.applications builds: minutes). A row that differs
can differ between two runs of the same commit too: run it again with --only NAME before blaming
a change (on a loaded 2-core machine three corpus models came out two ways in three runs).
"""
import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from tl2k210 import paths  # noqa: E402

sys.path.insert(0, str(paths.checkout() / "bench"))
import corpus  # noqa: E402  (bench/corpus.py: REAL, run_cli, photo_folder, the devcorpus builders)


def digest(src, extra, calib, tmp):
    out = Path(tmp) / "model.kmodel"
    out.unlink(missing_ok=True)
    rc, err = corpus.run_cli(["convert", str(src), str(out), "--dataset", str(calib), "-q"] + extra)
    if rc != 0:     # the refusal, with the run's temporary folder left out of it
        return "refused: " + corpus._reason(err).replace(str(tmp), "<tmp>")
    return hashlib.sha256(out.read_bytes()).hexdigest()


def rows(calib, skip_dev, only):
    tmp = tempfile.mkdtemp(prefix="tl2k210-digest-")
    for name, (extra, _) in corpus.REAL.items():
        src = corpus.CORPUS / "models" / name
        if src.exists() and (not only or only in name):
            extra = [a.replace("{models}", str(corpus.CORPUS / "models")) for a in extra]
            yield name, digest(src, extra, calib, tmp)
    from tl2k210 import zoo
    for name in zoo.recipes():
        if not only or only in name:
            r = zoo.build(name, Path(tmp) / "zoo" / name, progress=False)
            yield "zoo " + name, hashlib.sha256(Path(r["kmodel"]).read_bytes()).hexdigest()
    if skip_dev:
        return
    import devcorpus
    for name, e in devcorpus.entries().items():
        if only and only not in name:
            continue
        src = devcorpus.save(name, e.build(), Path(tmp))
        yield "dev " + name, digest(src, corpus._options_args(e.options), calib, tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write {model: sha256} here")
    ap.add_argument("--against", help="a --json file of an earlier run: exit 1 on any difference")
    ap.add_argument("--skip-dev", action="store_true")
    ap.add_argument("--only", help="models whose name contains this")
    a = ap.parse_args()
    before = json.loads(Path(a.against).read_text()) if a.against else {}
    got, changed = {}, []
    for name, h in rows(corpus.photo_folder(), a.skip_dev, a.only):
        got[name] = h
        mark = "" if not before else ("same" if before.get(name) == h else "CHANGED")
        if mark == "CHANGED":
            changed.append(name)
        print(f"{name[:60]:60} {h[:80]} {mark}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(got, indent=1) + "\n")
    missing = sorted(set(before) - set(got)) if not a.only else []
    if before:
        print(f"{len(got) - len(changed)} same, {len(changed)} changed, {len(missing)} missing")
    return 1 if changed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
