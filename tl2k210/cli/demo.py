"""`tl2k210 demo NAME|SCRIPT.py|FOLDER`: run a MaixPy board script unchanged on the host.

NAME is a zoo demo (firmware/NAME.py), SCRIPT.py any board script (run as main.py), FOLDER an
SD card's content (the firmware boots it: _boot.py -> cwd /sd, then its boot.py and main.py).
The camera sees the --image photos in order; kpu.load(ADDR) reads an emulated 16 MiB flash
(--flash IMAGE, or --kfpkg / --kmodel FILE[@ADDR] written into a fresh erased one); the LCD
writes PNGs (--out); `print` goes to the terminal. The board's time is virtual (what a board
would spend: camera frames, model latency, LCD), --wall-clock gives host time; --runtime picks
the firmware build (heap and model budget, kmodel versions); --timeout stops a script that takes
no camera frame for that long. Temporary flash images are removed on exit, SIGTERM included.
Without --flash/--kfpkg/--kmodel a zoo demo reads NAME.kfpkg of `tl2k210 zoo build NAME` (in
~/.cache/tl2k210/zoo), and face_detect falls back to the testdata face model. The model's
metadata (MODEL.kmodel.json, in the package or beside the kmodel) gives --kmodel's address and
the labels.txt of /sd.
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path

from tl2k210 import cliargs, paths
from tl2k210.errors import Tl2k210Error
from tl2k210.k210.board_facts import FLASH_BYTES, MAIXPY_MODEL_AREA
from tl2k210.maixpy.board import PROFILES
from tl2k210.tables import printable

TRUST = ("It runs the script as Python on this computer (host emulation, not a sandbox: the "
         "script can read, write and run anything you can), so only run scripts you trust.")


def _kmodel_arg(text: str):
    path, _, addr = text.partition("@")
    return path, (cliargs.address(addr) if addr else None)


def add_demo_parser(sub):
    from tl2k210.k210 import firmware
    p = sub.add_parser("demo", help="run a MaixPy script / SD folder unchanged on the host emulator "
                       "(runs it as Python: trusted scripts only)",
                       description=__doc__.split("\n\n")[0] + " " + TRUST)
    p.add_argument("name", help="zoo demo (face-detect, mobilenet-v1, ...), a MaixPy script, or a "
                                "folder = the SD card (boot.py, main.py, models, labels)")
    p.add_argument("--image", action="append", default=[], metavar="IMG",
                   help="photo the camera sees (repeat for more frames)")
    p.add_argument("--out", help="LCD output: a .png file or a folder (default out/demo/NAME.png)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--flash", metavar="IMAGE", help="flash image file (16 MiB) to read models from")
    src.add_argument("--kfpkg", metavar="PKG", action="append",
                     help="package to flash into a fresh emulated flash (repeatable)")
    p.add_argument("--kmodel", metavar="FILE[@ADDR]", action="append", default=[],
                   help="kmodel to write at ADDR (default --address) in the emulated flash")
    p.add_argument("--address", type=cliargs.address, help="flash address for --kmodel "
                   "(default: the kmodel metadata's, else the recipe's, else 0x300000)")
    p.add_argument("--sd", metavar="DIR", help="host folder seen as /sd (for a script; default: "
                   "a temporary one holding the recipe's labels.txt)")
    p.add_argument("--flash-fs", metavar="DIR", help="host folder seen as /flash (SPIFFS)")
    p.add_argument("--on-flash", action="store_true",
                   help="FOLDER is the board's /flash (no SD card: cwd /flash)")
    p.add_argument("--frames", type=cliargs.int_range(1, example=10),
                   help="stop after this many camera frames (a script that takes none, e.g. an "
                        "LCD animation, stops after 100 LCD frames)")
    p.add_argument("--press", type=cliargs.int_range(0, example=3), action="append", default=[],
                   metavar="FRAME",
                   help="hold the BOOT key down during camera frame FRAME (0-based; repeat)")
    p.add_argument("--runtime", choices=list(firmware.MAIXPY_RUNTIMES), default="maixpy",
                   help="firmware build: heap, model budget, kmodel versions (default maixpy)")
    p.add_argument("--camera", choices=["ov2640", "ov7740", "gc0328"], default="ov2640",
                   help="sensor (windowing is top-left on OV2640/OV7740, centred on GC0328)")
    p.add_argument("--board", choices=list(PROFILES), default="maix",
                   help="the board's MaixPy build: maix (Dock/Bit/Go/Maixduino: board_info from "
                   "/flash/config.json) or m5stickv (M5StickV/UnitV: its pin names, 240x135 LCD, "
                   "the AXP192 power chip and its pmu module)")
    p.add_argument("--wall-clock", action="store_true",
                   help="time.ticks_ms() & co. give host time instead of board time")
    p.add_argument("--timeout", type=cliargs.float_range(0, example=60), default=60.0, metavar="S",
                   help="stop after S seconds without a camera frame (default 60; 0 = never)")
    p.add_argument("-v", "--verbose", action="store_true", help="show TensorFlow's own log output")
    p.set_defaults(func=cmd_demo)


def resolve(name: str):
    """(script path or folder, recipe or None, key)."""
    p = Path(name)
    if p.is_dir():
        return p, None, p.resolve().name
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
    firmware = paths.firmware_dir()
    script = firmware / (r.firmware if r else f"{key}.py")
    if not script.is_file():
        have = sorted(s.stem for s in firmware.glob("*.py"))
        raise Tl2k210Error(f"no demo {name!r}: not a folder, a script or a zoo recipe with a "
                           f"firmware script; demos: {', '.join(have) or 'none'}")
    return script, r, key


def _flash_for(args, recipe, key, tmp: Path, folder: bool):
    """(flash image or None, the main model's metadata or None, the added detector's or None)."""
    from tl2k210 import metadata
    from tl2k210.maixpy import board
    if args.flash:
        if args.kmodel:
            raise Tl2k210Error("--kmodel writes into a fresh emulated flash; with --flash IMAGE "
                               "(yours, left untouched) flash the model into it with "
                               "`tl2k210 board` or pass --kmodel/--kfpkg without --flash")
        if not Path(args.flash).is_file():
            raise Tl2k210Error(f"no flash image {args.flash}")
        return Path(args.flash), None, None
    flash = meta = None
    default = args.address or (recipe.flash_address if recipe else MAIXPY_MODEL_AREA)
    for pkg in args.kfpkg or []:
        if not Path(pkg).is_file():
            raise Tl2k210Error(f"no package {pkg}")
        flash = board.flash_kfpkg(pkg, tmp / "flash.bin", fresh=flash is None)
        meta = meta or metadata.from_kfpkg(pkg)
    for spec in args.kmodel:
        path, addr = _kmodel_arg(spec)
        if not Path(path).is_file():
            raise Tl2k210Error(f"no kmodel {path}")
        m = metadata.load_for(path)
        if addr is None:      # --address, else where the model's metadata says, else the recipe's
            addr = args.address or (m.flash_address if m is not None else None) or default
        flash = board.flash_kmodel(path, tmp / "flash.bin", addr, fresh=flash is None)
        meta = meta or m
    if flash is None and not folder and (recipe is not None or key == "face_detect"):
        flash, meta = _zoo_flash(recipe, key, tmp)
    det = _add_detector(recipe, flash) if flash is not None else None
    return flash, meta, det


def _zoo_flash(recipe, key, tmp: Path):
    from tl2k210 import metadata
    from tl2k210.maixpy import board
    pkg = paths.zoo_dir() / f"{key}.kfpkg"
    if pkg.is_file():
        return board.flash_kfpkg(pkg, tmp / "flash.bin"), metadata.from_kfpkg(pkg)
    if key == "face_detect":
        fallback = paths.testdata("kfpkg", "face_model_at_0x300000.kfpkg")
        if fallback is not None:
            return board.flash_kfpkg(fallback, tmp / "flash.bin"), None
        km = paths.testdata("kmodels", "facedetect_320x240_v3.kmodel")
        if km is not None:
            return board.flash_kmodel(km, tmp / "flash.bin", MAIXPY_MODEL_AREA), None
    raise Tl2k210Error(f"no model for {key}: build it (`tl2k210 zoo build {key}`) or pass "
                       "--kfpkg/--kmodel/--flash")


def _add_detector(recipe, flash: Path):
    """A recipe whose [decode] names a `detector` (face_recognition: detect -> crop -> embed)
    gets that model written too, at `detector_address`: the zoo folder's NAME.kmodel if built,
    else for face_detect the testdata face model. Returns the detector's metadata (or None)."""
    from tl2k210 import metadata
    from tl2k210.maixpy import board
    dec = (recipe.decode or {}) if recipe else {}
    name, address = dec.get("detector"), dec.get("detector_address")
    if not name or address is None:
        return None
    km = paths.zoo_dir() / f"{name}.kmodel"
    if not km.is_file() and name == "face_detect":
        km = paths.testdata("kmodels", "facedetect_320x240_v3.kmodel")
    if km is None or not km.is_file():
        raise Tl2k210Error(f"no {name} model for {recipe.name}: `tl2k210 zoo build {name}`")
    board.flash_kmodel(km, flash, int(address), fresh=False)
    return metadata.load_for(km)


def _zoo_script(script: Path, recipe, meta, det, tmp: Path) -> Path:
    """A zoo demo's script as the board runs it: its `anchor = (...)` line set to the anchors in
    the metadata of the detector it drives (the model itself, or the recipe's `detector`), as
    `zoo build` writes NAME_main.py; unchanged for a model without metadata (MaixPy's own face
    model, whose anchors the script holds)."""
    from tl2k210 import zoo
    src = det if recipe.decode.get("detector") else meta
    if src is None or src.task != "yolo2" or not src.anchors:
        return script
    out = tmp / "script" / script.name
    out.parent.mkdir()
    out.write_text(zoo.render_script(script.read_text(), src.anchors, script))
    return out


def _sd_for(args, recipe, meta, tmp: Path):
    """--sd, else a temporary /sd holding labels.txt when the script reads its labels from
    there (the recipe's labels are a file): from the model's metadata, else the recipe."""
    if args.sd:
        if not Path(args.sd).is_dir():
            raise Tl2k210Error(f"no SD folder {args.sd}")
        return Path(args.sd)
    if not (recipe and isinstance(recipe.decode.get("labels"), str)):
        return None
    if meta is not None and meta.labels:
        labels = meta.labels
    else:
        from tl2k210 import zoo
        labels = zoo.labels(recipe)
    sd = tmp / "sd"
    sd.mkdir()
    (sd / "labels.txt").write_text("\n".join(labels) + "\n")
    return sd


def _check_paths(args, script, out: Path):
    """Before any work: inputs exist, the photos decode, the LCD output (OUT.png, OUT-1.png, ... or
    a folder) is writable and none of it is an input."""
    from tl2k210.fileio import check_outputs, check_readable, check_writable
    from tl2k210.imaging import open_image
    from tl2k210.k210 import kmodel
    for img in args.image:
        if not Path(img).is_file():
            raise Tl2k210Error(f"no image {img}")
        open_image(img)
    kmodels = [_kmodel_arg(k)[0] for k in args.kmodel]
    for flag, files in (("flash", [args.flash] if args.flash else []), ("kfpkg", args.kfpkg or []),
                        ("kmodel", kmodels)):
        for path in files:
            check_readable(path, f"--{flag}")
    for path in kmodels:
        kmodel.load(path)                 # a clean error now, not a failing kpu.load in the script
    if args.flash and os.path.getsize(args.flash) != FLASH_BYTES:
        raise Tl2k210Error(f"--flash {args.flash} is {os.path.getsize(args.flash)} bytes, not a "
                           "16 MiB flash image; pass --kfpkg or --kmodel to build one")
    for flag in ("sd", "flash_fs"):
        if getattr(args, flag):
            check_readable(getattr(args, flag), "--" + flag.replace("_", "-"), folder=True)
    inputs = [script if script.is_file() else None, *args.image, args.flash, *(args.kfpkg or []),
              *kmodels]
    if out.suffix.lower() == ".png":
        if out.parent.is_dir():          # else the folder is made: it cannot hold an input
            check_outputs([("--out", out)], inputs)
        for i in inputs:       # the later frames go to OUT-1.png, OUT-2.png ...
            p = Path(i) if i else None
            if p is not None and p.parent.resolve() == out.parent.resolve() and \
                    p.name.startswith(out.stem + "-") and p.suffix.lower() == ".png":
                raise Tl2k210Error(f"--out {out}: later LCD frames are written as {out.stem}-N.png, "
                                   f"which would replace the input {p}; choose another --out")
        check_writable(out, "--out", make_parents=True)
    else:
        import re
        for i in inputs:       # a folder gets frame_0000.png, frame_0001.png ...
            p = Path(i) if i else None
            if p is not None and p.parent.resolve() == out.resolve() and \
                    re.fullmatch(r"frame_\d{4}\.png", p.name):
                raise Tl2k210Error(f"--out {out}: the LCD frames are written as frame_NNNN.png, "
                                   f"which would replace the input {p}; choose another --out")
        check_writable(out / "frame_0000.png", "--out", make_parents=True)


def cmd_demo(args) -> int:
    from tl2k210.maixpy import board as _board
    from tl2k210.maixpy.runner import run_folder, run_script
    target, recipe, key = resolve(args.name)
    out = Path(args.out) if args.out else Path("out/demo") / f"{key}.png"
    _check_paths(args, target, out)

    def _term(signum, frame):
        stop = _board.BoardStop("stopped by SIGTERM", "signal")
        try:
            _board.current().stop_reason = stop
        except Exception:
            pass
        raise stop

    old = signal.signal(signal.SIGTERM, _term)
    try:
        with tempfile.TemporaryDirectory(prefix="tl2k210-demo-") as tmp:
            folder = target.is_dir()
            flash, meta, det = _flash_for(args, recipe, key, Path(tmp), folder)
            script = _zoo_script(target, recipe, meta, det, Path(tmp)) if recipe and not folder else target
            common = dict(images=args.image, flash=flash, out=out, max_frames=args.frames,
                          echo=True, raise_errors=False, button=args.press, runtime=args.runtime,
                          wall_clock=args.wall_clock, timeout=args.timeout or None,
                          camera=args.camera, board=args.board)
            print(f"[host] {target} | flash {flash or 'erased'} | {args.runtime} firmware | "
                  f"{len(args.image)} camera frame(s) | board time "
                  f"{'host' if args.wall_clock else 'virtual'}", flush=True)
            if meta is not None:
                print(f"[host] model: {printable(meta.kmodel['file'])} ({meta.task or 'task not recorded'}, "
                      f"{'x'.join(map(str, meta.input['shape'][-2:][::-1]))} input, made by tl2k210 "
                      f"{meta.tl2k210_version})", flush=True)
            if script != target:
                print(f"[host] {target.name}'s `anchor = (...)` set to the detector's, from its metadata",
                      flush=True)
            if folder:
                res = run_folder(target, fs=args.flash_fs, on="flash" if args.on_flash else "sd",
                                 **common)
            else:
                res = run_script(script, sd=_sd_for(args, recipe, meta, Path(tmp)), fs=args.flash_fs,
                                 **common)
    except _board.BoardStop:
        print("[host] stopped by SIGTERM; temporary files removed", file=sys.stderr)
        return 143
    finally:
        signal.signal(signal.SIGTERM, old)
    if res.error is not None and not res.printed:
        print(res.traceback, end="", file=sys.stderr)
    for note in res.notes:
        print(f"[host] note: {note}", file=sys.stderr)
    if res.stop in ("timeout", "reset", "signal", "host", "lcd"):
        print(f"[host] {res.stop_reason}", file=sys.stderr)
    print(f"[host] {res.snapshots} camera frame(s), {len(res.frames)} LCD frame(s), board time "
          f"{res.board_ms / 1000:.2f} s" + (f"; LCD: {', '.join(str(p) for p in res.pngs)}"
                                           if res.pngs else ""))
    if res.stop == "signal":
        return 143
    # an endless script stopped by the camera running out or by the watchdog ended normally
    return 1 if res.error is not None or res.stop == "host" else 0
