"""`tl2k210 demo NAME --image IMG ...`: run a board's MaixPy script (firmware/) unchanged on the
host: the camera sees the photos, `kpu.load(0x300000)` reads an emulated flash image, the LCD
writes PNGs.

Model source (first that applies): --flash IMAGE (a flash image file, e.g. the one the emulated
board wrote), --kfpkg PKG or --kmodel FILE (written into a fresh erased flash image at the
package's / the recipe's address), out/zoo/NAME.kfpkg (`tl2k210 zoo build NAME`), and for
face_detect the testdata face model (MaixPy's face_model_at_0x300000.kfpkg).
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tl2k210.errors import Tl2k210Error

REPO = Path(__file__).resolve().parents[2]
FIRMWARE = REPO / "firmware"
TESTDATA = Path(os.environ.get("TL2K210_TESTDATA", REPO.parent / "shared" / "testdata"))


TRUST = ("It runs the script as Python on this computer (host emulation, not a sandbox: the "
         "script can read, write and run anything you can), so only run scripts you trust.")


def add_demo_parser(sub):
    from tl2k210 import cliargs
    p = sub.add_parser("demo", help="run a MaixPy demo script (firmware/) on the host emulator "
                       "(runs it as Python: trusted scripts only)",
                       description=__doc__.split("\n\n")[0] + " " + TRUST)
    p.add_argument("name", help="zoo name (face-detect, mobilenet-v1, ...) or a MaixPy script path")
    p.add_argument("--image", action="append", required=True, metavar="IMG",
                   help="photo the camera sees (repeat for more frames)")
    p.add_argument("--out", help="LCD output: a .png file or a folder (default out/demo/NAME.png)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--flash", metavar="IMAGE", help="flash image file (16 MiB) to read models from")
    src.add_argument("--kfpkg", metavar="PKG", help="package to flash into a fresh emulated flash")
    src.add_argument("--kmodel", metavar="FILE", help="kmodel to write at --address in a fresh flash")
    p.add_argument("--address", type=cliargs.address, help="flash address for --kmodel "
                   "(default: the recipe's, else 0x300000)")
    p.add_argument("--sd", metavar="DIR", help="host folder seen as /sd (default: a temporary one "
                   "holding the recipe's labels.txt)")
    p.add_argument("--frames", type=cliargs.int_range(1, example=10),
                   help="stop after this many camera frames")
    p.add_argument("--press", type=cliargs.int_range(0, example=3), action="append", default=[],
                   metavar="FRAME",
                   help="hold the BOOT key down during camera frame FRAME (0-based; repeat), "
                        "e.g. to enroll a face in face-recognition")
    p.set_defaults(func=cmd_demo)


def resolve(name: str):
    """(script path, recipe or None, key)."""
    p = Path(name)
    if p.suffix == ".py" or p.is_file():
        if not p.is_file():
            raise Tl2k210Error(f"no MaixPy script {p}")
        return p, None, p.stem
    from tl2k210 import zoo
    key = name.replace("-", "_")
    try:
        r = zoo.get(key)
    except Tl2k210Error:
        r = None
    script = FIRMWARE / (r.firmware if r else f"{key}.py")
    if not script.is_file():
        have = sorted(s.stem for s in FIRMWARE.glob("*.py"))
        raise Tl2k210Error(f"no demo {name!r}: no zoo recipe with a firmware script and no "
                           f"{script}; demos: {', '.join(have) or 'none'}")
    return script, r, key


def _flash_for(args, recipe, key, tmp: Path) -> Path:
    flash = _main_flash(args, recipe, key, tmp)
    if not args.flash:
        _add_detector(recipe, flash)
    return flash


def _add_detector(recipe, flash: Path):
    """A recipe whose [decode] names a `detector` (face_recognition: detect -> crop -> embed)
    gets that model written too, at `detector_address`: out/zoo/NAME.kmodel if built, else for
    face_detect the testdata face model."""
    from tl2k210.maixpy import board
    dec = (recipe.decode or {}) if recipe else {}
    name, address = dec.get("detector"), dec.get("detector_address")
    if not name or address is None:
        return
    km = Path("out/zoo") / f"{name}.kmodel"
    if not km.is_file() and name == "face_detect":
        km = TESTDATA / "kmodels" / "facedetect_320x240_v3.kmodel"
    if not km.is_file():
        raise Tl2k210Error(f"no {name} model for {recipe.name}: `tl2k210 zoo build {name}`")
    board.flash_kmodel(km, flash, int(address), fresh=False)


def _main_flash(args, recipe, key, tmp: Path) -> Path:
    from tl2k210.maixpy import board
    address = args.address or (recipe.flash_address if recipe else 0x300000)
    if args.flash:
        if not Path(args.flash).is_file():
            raise Tl2k210Error(f"no flash image {args.flash}")
        return Path(args.flash)
    if args.kmodel:
        return board.flash_kmodel(args.kmodel, tmp / "flash.bin", address)
    pkg = Path(args.kfpkg) if args.kfpkg else Path("out/zoo") / f"{key}.kfpkg"
    if pkg.is_file():
        return board.flash_kfpkg(pkg, tmp / "flash.bin")
    if args.kfpkg:
        raise Tl2k210Error(f"no package {pkg}")
    if key == "face_detect":
        fallback = TESTDATA / "kfpkg" / "face_model_at_0x300000.kfpkg"
        if fallback.is_file():
            return board.flash_kfpkg(fallback, tmp / "flash.bin")
        km = TESTDATA / "kmodels" / "facedetect_320x240_v3.kmodel"
        if km.is_file():
            return board.flash_kmodel(km, tmp / "flash.bin", address)
    raise Tl2k210Error(f"no model for {key}: build it (`tl2k210 zoo build {key}`) or pass "
                       "--kfpkg/--kmodel/--flash")


def _sd_for(args, recipe, tmp: Path):
    if args.sd:
        return Path(args.sd)
    labels = (recipe.decode or {}).get("labels") if recipe else None
    if isinstance(labels, str):
        from tl2k210 import zoo
        src = zoo._resolve(labels, recipe.folder)
        if src.is_file():
            sd = tmp / "sd"
            sd.mkdir()
            (sd / "labels.txt").write_bytes(src.read_bytes())
            return sd
    return None


def _check_paths(args, script, out: Path):
    """Before any work: inputs exist, the photos decode, the LCD output (OUT.png, OUT-1.png, ... or
    a folder) is writable and none of it is an input."""
    from tl2k210.fileio import check_outputs, check_readable, check_writable
    from tl2k210.imaging import open_image
    for img in args.image:
        if not Path(img).is_file():
            raise Tl2k210Error(f"no image {img}")
        open_image(img)
    for flag in ("flash", "kfpkg", "kmodel"):
        if getattr(args, flag):
            check_readable(getattr(args, flag), f"--{flag}")
    if args.flash and os.path.getsize(args.flash) != 16 << 20:
        raise Tl2k210Error(f"--flash {args.flash} is {os.path.getsize(args.flash)} bytes, not a "
                           "16 MiB flash image; pass --kfpkg or --kmodel to build one")
    if args.sd:
        check_readable(args.sd, "--sd", folder=True)
    inputs = [script, *args.image, args.flash, args.kfpkg, args.kmodel]
    if out.suffix.lower() == ".png":
        check_outputs([("--out", out)], inputs)
        for i in inputs:       # the later frames go to OUT-1.png, OUT-2.png ...
            p = Path(i) if i else None
            if p is not None and p.parent.resolve() == out.parent.resolve() and \
                    p.name.startswith(out.stem + "-") and p.suffix.lower() == ".png":
                raise Tl2k210Error(f"--out {out}: later LCD frames are written as {out.stem}-N.png, "
                                   f"which would replace the input {p}; choose another --out")
        check_writable(out, "--out", make_parents=True)
    else:
        check_writable(out / "frame_0000.png", "--out", make_parents=True)


def cmd_demo(args) -> int:
    from tl2k210.maixpy.runner import run_script
    script, recipe, key = resolve(args.name)
    out = Path(args.out) if args.out else Path("out/demo") / f"{key}.png"
    _check_paths(args, script, out)
    with tempfile.TemporaryDirectory(prefix="tl2k210-demo-") as tmp:
        flash = _flash_for(args, recipe, key, Path(tmp))
        sd = _sd_for(args, recipe, Path(tmp))
        print(f"[host] {script} | flash {flash} | {len(args.image)} camera frame(s)", flush=True)
        res = run_script(script, images=args.image, flash=flash, out=out, max_frames=args.frames,
                         sd=sd, echo=True, raise_errors=False, button=args.press)
    if res.error is not None:
        print(res.traceback, end="", file=sys.stderr)
    for note in res.notes:
        print(f"[host] note: {note}", file=sys.stderr)
    if res.pngs:
        print(f"[host] LCD: {', '.join(str(p) for p in res.pngs)}")
    return 1 if res.error is not None else 0
