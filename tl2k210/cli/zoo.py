"""`tl2k210 zoo list|build`: the model zoo's networks, built into kmodel + kfpkg + script."""
from pathlib import Path

from tl2k210 import paths
from tl2k210.errors import Tl2k210Error
from tl2k210.tables import text_table
from tl2k210.zoo import _resolve, build, recipes


def add_zoo_parser(sub):
    p = sub.add_parser("zoo", help="the model zoo: list networks, build kmodel + kfpkg + script",
                       description="TensorLayer networks designed for the KPU, trained by the "
                       "scripts in models/, converted by tl2k210.")
    zs = p.add_subparsers(dest="zoo_verb", metavar="ACTION")
    zs.required = True
    lp = zs.add_parser("list", help="list the zoo networks")
    lp.set_defaults(func=cmd_list)
    bp = zs.add_parser("build", help="build NAME into kmodel + kfpkg + MaixPy script + report")
    bp.add_argument("name")
    bp.add_argument("--out", help=f"output folder (default {paths.zoo_dir()}, where "
                    "`tl2k210 demo NAME` finds it; $XDG_CACHE_HOME or $TL2K210_CACHE move it)")
    bp.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    bp.add_argument("-v", "--verbose", action="store_true", help="show TensorFlow's own log output")
    bp.set_defaults(func=cmd_build)


def cmd_list(args):
    rows = []
    for name, r in recipes().items():
        try:
            weights = "yes" if _resolve(r.weights, r.folder).exists() else "no (run train.py)"
        except Tl2k210Error:
            weights = "no (in the test data)"
        rows.append((name, r.task, f"{r.input['width']}x{r.input['height']}", f"0x{r.flash_address:x}",
                     weights, r.summary))
    cols = ("name", "task", "input", "flash", "weights", "summary")
    print("\n".join(text_table(cols, rows, rule=False)))
    return 0


def cmd_build(args):
    if args.out is not None and not str(args.out).strip():
        raise Tl2k210Error(f"--out: empty path; give an output folder (default {paths.zoo_dir()})")
    out = Path(args.out) if args.out else paths.zoo_dir()
    rep = build(args.name, out, progress=not args.quiet)
    print(Path(rep["kmodel"]).with_suffix(".report.txt").read_text())
    print(f"\nwrote {rep['kmodel']}, {rep['kfpkg']} (model at {rep['flash_address']})"
          + (f", {out / (rep['name'] + '_main.py')}" if rep["firmware"] else ""))
    return 0
