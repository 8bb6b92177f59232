"""`tl2k210 deploy`: convert (if needed), package and flash a model and print the MaixPy lines
that load it; or, with --via repl, upload it over the REPL with a generated main.py and show
what that prints."""
import os
import re
import sys
import tempfile
import time

from tl2k210 import cliargs, metadata
from tl2k210.cli.flash import do_flash
from tl2k210.cli.repl import connect, progress_for, read_local
from tl2k210.deploy import kmodel_for, main_py, maixpy_snippet, metadata_members
from tl2k210.errors import KmodelFormatError, Tl2k210Error
from tl2k210.fileio import check_outputs, check_readable, read_bytes
from tl2k210.flash.boards import FLASH_SIZE_16M
from tl2k210.flash.flasher import DEFAULT_BAUD
from tl2k210.flash.kfpkg import FlashImage, read_kfpkg, write_kfpkg
from tl2k210.flash.layout import check_model_address
from tl2k210.k210 import kmodel as kfmt
from tl2k210.k210.board_facts import MAIXPY_MODEL_AREA, REPL_BAUD
from tl2k210.k210.kmodel import detect_version
from tl2k210.k210.yolo import parse_anchors
from tl2k210.maixpy.repl import Repl


def add_deploy_parser(sub):
    p = sub.add_parser("deploy", help="convert (if needed), package and flash a model, then "
                       "print the MaixPy lines that load it")
    p.add_argument("model", help="a .kmodel, or a model the compiler can convert")
    p.add_argument("--dataset", help="calibration images when MODEL still needs converting")
    p.add_argument("-a", "--address", type=cliargs.address,
                   help="flash address of the model (default: the model's metadata, else "
                   "0x300000, MaixPy's model area)")
    p.add_argument("--firmware", metavar="FW.bin", help="also write this MaixPy firmware at 0")
    p.add_argument("-o", "--kfpkg", metavar="OUT.kfpkg", help="keep the package here")
    p.add_argument("--force", action="store_true",
                   help="allow an address inside the firmware region (< 0x200000) or SPIFFS")
    cliargs.add_flash_port_args(p)
    add_deploy_repl_args(p)
    p.set_defaults(func=cmd_deploy, baud=None)     # -b: 1500000 for isp, the REPL's rate for repl


def cmd_deploy(args):

    if args.via == "repl":
        check_readable(args.model, "model")
        args.baud = args.baud or args.initial_baud
        return deploy_via_repl(args)
    args.baud = args.baud or DEFAULT_BAUD
    check_readable(args.model, "model")
    cliargs.check_link_args(args)
    check_outputs([("-o", args.kfpkg)], [args.model, args.firmware, args.dataset, args.stub])
    firmware = read_bytes(args.firmware, FLASH_SIZE_16M, "firmware image") if args.firmware else None
    with tempfile.TemporaryDirectory(prefix="tl2k210-deploy-") as tmp:
        kmodel = kmodel_for(args.model, tmp, getattr(args, "dataset", None))
        data = read_bytes(kmodel, FLASH_SIZE_16M, "kmodel")
        if not data:
            raise Tl2k210Error(f"{kmodel} is empty")
        try:
            detect_version(data)
        except KmodelFormatError as exc:
            print(f"warning: {kmodel}: {exc}; MaixPy's kpu.load may reject it", file=sys.stderr)
        meta = metadata.load_for(kmodel, data)
        if args.address is not None:
            address = args.address
        elif meta is not None and meta.flash_address is not None:
            address = meta.flash_address
            print(f"model address 0x{address:x} from {metadata.path_for(kmodel).name}")
        else:
            address = MAIXPY_MODEL_AREA
        check_model_address(address, len(data), args.force)
        images = [FlashImage(address, data, False, os.path.basename(kmodel), kmodel)]
        if firmware is not None:
            images.insert(0, FlashImage(0, firmware, True, os.path.basename(args.firmware),
                                        args.firmware))
        pkg = args.kfpkg or os.path.join(tmp, "deploy.kfpkg")
        write_kfpkg(images, pkg, extras=metadata_members(images[-1:]))
        print(f"packaged {pkg}")
        do_flash(args, read_kfpkg(pkg))
    print("\n# MaixPy: load the model from flash")
    print(maixpy_snippet(address, meta))
    return 0


def deploy_via_repl(args):
    anchors = None
    if args.anchors:
        anchors = parse_anchors(args.anchors)
    labels = read_local(args.labels, "labels file") if args.labels else None
    main = read_local(args.main, "main.py") if args.main else None
    with tempfile.TemporaryDirectory(prefix="tl2k210-deploy-") as tmp:
        kpath = kmodel_for(args.model, tmp, getattr(args, "dataset", None))
        blob = read_local(kpath, "kmodel")
        try:
            model = kfmt.loads(blob)
        except Tl2k210Error as exc:
            raise Tl2k210Error(f"{kpath}: {exc}; MaixPy's kpu.load would reject it too") from None
        # labels / anchors the flags leave out come from the metadata
        meta = metadata.load_for(kpath, blob)
        decode = meta.decode if meta is not None else {}
        if labels is None and meta is not None and meta.labels:
            labels = ("\n".join(meta.labels) + "\n").encode()
        if anchors is None and meta is not None and meta.task == "yolo2" and meta.anchors:
            anchors = list(meta.anchors)
        threshold = args.threshold if args.threshold is not None else decode.get("threshold", 0.5)
        nms = args.nms if args.nms is not None else decode.get("nms", 0.3)
        with connect(args) as r:
            to = r.abspath(args.to) if args.to else r.cwd()
            boot_dir = r.cwd()
            name = os.path.splitext(os.path.basename(kpath))[0] + ".kmodel"
            mfile = to.rstrip("/") + "/" + name
            lfile = to.rstrip("/") + "/labels.txt" if labels is not None else None
            if main is None:
                main = main_py(mfile, model, lfile, anchors, threshold, nms).encode()
            prog = progress_for(args)
            for data, dest in ((blob, mfile), (labels, lfile), (main, boot_dir + "/main.py")):
                if data is None:
                    continue
                res = r.put(data, dest, progress=prog)
                print(f"{dest}: {res.size} bytes, {res.status}, sha256 {res.sha256[:16]}")
            if boot_dir == "/sd" and to.startswith("/flash"):
                print("note: the board has an SD card, so MaixPy runs /sd/main.py", file=sys.stderr)
            print(f"running {boot_dir}/main.py (soft reboot); its first {args.lines} lines:")
            lines = show_first_lines(r, args.lines, args.seconds)
            for ln in lines:
                print("  " + ln)
            if not lines:
                print("  (no output within %g s)" % args.seconds)
    return 0


#: sensor.c / cambus.c (MaixPy v0.6.2) console lines while sensor.reset() probes the camera
_SENSOR_PROBE = re.compile(r"^(init i2c\d|\[MAIXPY\]: (find \w+( sensor)?|sensor id = [0-9a-f]+))$")


def show_first_lines(r: Repl, n, seconds):
    """Soft-reboot from the friendly REPL (main.py runs, as at power-on) and return the first
    `n` lines it prints after the boot banner; main.py keeps running. The firmware's own
    camera-probe lines (sensor.reset() prints "init i2c2", "[MAIXPY]: find ov2640", ...) are
    not the script's output and are skipped."""
    r.exit_raw()
    r.drain(quiet=0.1, limit=1.0)
    r._write(b"\x04")
    end = time.monotonic() + seconds
    text, started = b"", False
    lines = []
    while time.monotonic() < end and len(lines) < n:
        r._fill(True)
        text += bytes(r._buf)
        r._buf.clear()
        *done, text = text.split(b"\n")
        for ln in done:
            s = ln.decode("utf-8", "replace").rstrip("\r")
            if not started:
                started = s.startswith("Type \"help()\"")
                continue
            if not _SENSOR_PROBE.match(s):
                lines.append(s)
    return lines[:n]


def add_deploy_repl_args(p):
    g = p.add_argument_group("--via repl: upload over the MaixPy REPL instead of flashing")
    g.add_argument("--via", choices=("isp", "repl"), default="isp",
                   help="isp: flash the model at --address (default); repl: copy it to the "
                   "board's /sd or /flash with a generated main.py, run it, show its output")
    g.add_argument("--to", metavar="DIR", help="board folder for the model (default: /sd with a "
                   "card, else /flash)")
    g.add_argument("--labels", metavar="FILE", help="class names, one per line (uploaded; "
                   "default: the model's metadata)")
    g.add_argument("--anchors", help="YOLOv2 anchors w,h,... (main.py uses run_yolo2; default: "
                   "the model's metadata)")
    g.add_argument("--threshold", type=cliargs.probability, default=None,
                   help="run_yolo2 threshold (metadata, else 0.5)")
    g.add_argument("--nms", type=cliargs.probability, default=None,
                   help="run_yolo2 NMS (metadata, else 0.3)")
    g.add_argument("--main", metavar="MAIN.py", help="upload this main.py instead of a generated one")
    g.add_argument("--lines", type=cliargs.int_range(1, example=8), default=8,
                   help="output lines to show (8)")
    g.add_argument("--seconds", type=cliargs.float_range(0.0, example=30, lo_open=True),
                   default=30.0, help="wait at most this long for them (30)")
    g.add_argument("--initial-baud", type=cliargs.baud, default=REPL_BAUD)
    g.add_argument("--no-raw-paste", dest="raw_paste", action="store_false", default=True)
    cliargs.add_repl_timeout(g)
