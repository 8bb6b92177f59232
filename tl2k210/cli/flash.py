"""CLI verbs ``flash``, ``package``, ``deploy`` and ``board`` (registered by tl2k210/cli.py).

Imports stay light (no TensorFlow): the compiler is imported only when ``deploy`` converts.
"""
import os
import sys
import tempfile

from tl2k210 import cliargs
from tl2k210.errors import Tl2k210Error
from tl2k210.flash.layout import address_warnings, check_model_address
from tl2k210.k210.board_facts import MAIXPY_MODEL_AREA

KFLASH_USB_VIDS = ("1A86", "0403", "067B", "10C4", "C251")
FAULT_KINDS = ("corrupt", "drop", "delay")


def _baud_arg(text):
    """-b: what the ROM/stub and the boards' USB-serial bridges can do (see boards.py)."""
    import argparse

    from tl2k210.flash.boards import MAX_BAUD, MIN_BAUD
    try:
        baud = int(str(text).strip(), 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; use e.g. 115200 or 1500000") from None
    if not MIN_BAUD <= baud <= MAX_BAUD:
        raise argparse.ArgumentTypeError(
            f"{baud} is out of range: use {MIN_BAUD}..{MAX_BAUD} (the ROM stage runs at {MIN_BAUD}, "
            f"the slowest rate; the boards' CH340/CH552/FT2232 bridges are driven up to {MAX_BAUD}); "
            "e.g. 1500000, or 115200 on a bad cable")
    return baud


def check_link_args(args):
    """Before any work: the baud rate fits the chosen board's USB-serial bridge, --stub exists."""
    from tl2k210.fileio import check_readable
    from tl2k210.flash.boards import get_board
    if args.stub:
        check_readable(args.stub, "--stub")
    if args.board is None:
        return
    b, baud = get_board(args.board), args.baud
    if baud > b.max_baud:
        raise Tl2k210Error(f"--baud {baud} is above what the {b.name} board's USB-serial bridge is "
                           f"rated for ({b.max_baud}{': ' + b.notes if b.notes else ''}); use "
                           f"-b {b.max_baud} or lower")


def _board_arg(text):
    import argparse

    from tl2k210.flash.boards import get_board
    from tl2k210.flash.errors import FlashError

    try:
        return get_board(text).name
    except FlashError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _wiring_arg(text):
    import argparse

    from tl2k210.flash.boards import BOARDS
    names = [b.name for b in BOARDS.values() if b.reset_line] + ["isp_on_open"]
    if text not in names:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(names)}")
    return text


def _common_port_args(p):
    from tl2k210.flash.boards import board_names
    from tl2k210.flash.flasher import DEFAULT_BAUD

    p.add_argument("-p", "--port", help="serial port or pyserial URL (/dev/ttyUSB0, COM3, "
                   "socket://host:port); default: the only K210-like USB serial port")
    p.add_argument("-B", "--board", type=_board_arg, metavar="BOARD",
                   help="board preset (reset wiring): " + ", ".join(board_names()) +
                   "; default: auto-detect")
    p.add_argument("-b", "--baud", type=_baud_arg, default=DEFAULT_BAUD,
                   help=f"baud rate for the flash transfer, 115200..2000000 (default "
                   f"{DEFAULT_BAUD}; the ROM stage always runs at 115200; bit_mic boards "
                   "(CH552) up to 1500000)")
    p.add_argument("--stub", metavar="FILE", help="stage-2 flash program to load instead of the "
                   "one in the installed kflash package")
    p.add_argument("--verify", dest="verify", action="store_true", default=True,
                   help="verify every write (default)")
    p.add_argument("--no-verify", dest="verify", action="store_false")
    p.add_argument("--no-reboot", dest="reboot", action="store_false", default=True,
                   help="leave the board in the flash program afterwards")
    p.add_argument("--progress", action="store_true", default=None,
                   help="show a progress bar even when stderr is not a terminal")
    p.add_argument("-v", "--verbose", action="store_true", help="log protocol events")


def add_flash_parser(sub):
    p = sub.add_parser("flash", help="write images or a .kfpkg to a K210 board over serial",
                       description="Write FILE[@ADDR] images (address 0 gets the bootable "
                       "firmware envelope, other addresses raw bytes) or a .kfpkg package.")
    p.add_argument("images", nargs="+", metavar="FILE[@ADDR]|PACKAGE.kfpkg")
    _common_port_args(p)
    p.set_defaults(func=cmd_flash)


def add_package_parser(sub):
    p = sub.add_parser("package", help="build a .kfpkg from images (kflash-compatible)",
                       description="Build a .kfpkg from FILE@ADDR images. A kmodel's metadata "
                       "(MODEL.kmodel.json beside it) travels in the package, unflashed.")
    p.add_argument("images", nargs="+", metavar="FILE[@ADDR]",
                   help="e.g. model.kmodel@0x300000 firmware.bin@0")
    p.add_argument("-o", "--output", required=True, help="output .kfpkg path")
    p.set_defaults(func=cmd_package)


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
    _common_port_args(p)
    from tl2k210.maixpy.repl_cli import add_deploy_repl_args
    add_deploy_repl_args(p)
    p.set_defaults(func=cmd_deploy, baud=None)     # -b: 1500000 for isp, the REPL's rate for repl


def add_board_parser(sub):
    p = sub.add_parser("board", help="run an emulated K210 board on a pseudo-terminal")
    p.add_argument("--pty", action="store_true", required=True,
                   help="serve the board on a new pty (the only transport so far)")
    p.add_argument("--flash", metavar="FILE", help="16 MiB flash image file (created if "
                   "missing; default: a temporary file)")
    p.add_argument("--wiring", default="dan", type=_wiring_arg,
                   help="reset wiring: dan, kd233, goE, bit_mic (DTR/RTS via the line shim) or "
                   "isp_on_open (resets into ISP whenever the port is opened)")
    p.add_argument("--throttle", action="store_true", help="simulate the line speed")
    p.add_argument("--fault-rate", type=cliargs.float_range(0.0, 1.0, example=0.001, hi_open=True),
                   default=0.0, help="per-byte fault rate host->board, 0 <= rate < 1")
    p.add_argument("--fault-kinds", type=cliargs.choices_list(FAULT_KINDS, "corrupt,drop"),
                   default=("corrupt", "drop"), help="corrupt,drop,delay")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--for", dest="seconds", type=cliargs.float_range(0.0, example=10), default=None,
                   help="stop after this many seconds (default: until Ctrl-C or SIGTERM)")
    from tl2k210.maixpy.repl_cli import add_board_maixpy_args
    add_board_maixpy_args(p)
    p.set_defaults(func=cmd_board)


# ---- handlers ---------------------------------------------------------------------------
def _collect_images(args_images, flash_size=None):
    from tl2k210.flash.boards import FLASH_SIZE_16M
    from tl2k210.flash.kfpkg import check_layout, parse_image_arg

    size = flash_size or FLASH_SIZE_16M
    images = []
    for arg in args_images:
        images.extend(parse_image_arg(arg, size))
    check_layout(images, size)
    return images


def _auto_port(board):
    try:
        from serial.tools import list_ports
    except ImportError:  # pragma: no cover
        raise Tl2k210Error("pyserial is not installed; pip install pyserial") from None
    ports = sorted(p for p in list_ports.comports()
                   if any(v in (p.hwid or "").upper() for v in KFLASH_USB_VIDS))
    if not ports:
        raise Tl2k210Error("no K210-like USB serial port found (CH340/CH552/FTDI/CP210x); plug "
                           "the board in or pass --port")
    if board in ("goE", "maixduino") and len(ports) > 1:
        return ports[1].device      # open-ec: the K210 UART is the second port
    if len(ports) > 1:
        names = ", ".join(p.device for p in ports)
        print(f"tl2k210: several serial ports ({names}); using {ports[0].device}; pass --port "
              "to choose", file=sys.stderr)
    return ports[0].device


def _do_flash(args, images):
    from tl2k210.flash.flasher import Progress, flash_images

    show = args.progress if args.progress is not None else sys.stderr.isatty()
    log = (lambda m: print(f"tl2k210: {m}", file=sys.stderr)) if args.verbose else None
    port = args.port or _auto_port(args.board)
    report = flash_images(images, url=port, board=args.board, baud=args.baud, stub=args.stub,
                          verify=args.verify, reboot=args.reboot, progress=Progress(show),
                          log=log)
    for img in report.images:
        kind = "firmware envelope" if img["envelope"] else "raw"
        print(f"wrote {img['name']} at 0x{img['address']:06x}: {img['size']} bytes ({kind}), "
              f"sha256 {img['sha256'][:16]}")
    rate = report.data_bytes / report.data_seconds if report.data_seconds else 0
    status = "verified" if report.verified else "NOT verified (--no-verify)"
    print(f"done: {report.data_bytes} bytes in {report.seconds:.1f} s ({rate / 1024:.1f} KiB/s "
          f"at {report.baud} baud, {report.retries} retries), {status}, board {report.board}")
    for w in report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return report


def _warn(lines):
    for w in lines:
        print(f"warning: {w}", file=sys.stderr)


def cmd_flash(args):
    check_link_args(args)
    images = _collect_images(args.images)
    _warn(address_warnings(images))
    _do_flash(args, images)
    return 0


def cmd_package(args):
    from tl2k210.fileio import check_outputs
    from tl2k210.flash.kfpkg import image_arg_path, write_kfpkg

    check_outputs([("-o", args.output)], [image_arg_path(a) for a in args.images])
    images = _collect_images(args.images)
    _warn(address_warnings(images))
    write_kfpkg(images, args.output, extras=_metadata_members(images))
    for i in images:
        print(f"{i.name} at 0x{i.address:06x} ({len(i.data)} bytes"
              f"{', firmware envelope' if i.envelope else ''})")
    print(f"wrote {args.output}")
    return 0


def _kmodel_for(model, workdir, dataset=None):
    if model.lower().endswith(".kmodel"):
        return model
    try:
        from tl2k210.compiler import convert_file
    except ImportError:
        raise Tl2k210Error(f"{model} is not a .kmodel and model conversion is not available in "
                           "this install; convert it first (`tl2k210 convert`) and pass the "
                           ".kmodel") from None
    out = os.path.join(workdir, os.path.splitext(os.path.basename(model))[0] + ".kmodel")
    try:
        result = convert_file(model, out, dataset=dataset)
    except Tl2k210Error:
        raise
    except Exception as exc:     # the compiler's own failure, reported with the model's name
        raise Tl2k210Error(f"converting {model} to a kmodel failed: {exc}; convert it with "
                           "`tl2k210 convert` to see the details, then deploy the .kmodel") from exc
    return result if isinstance(result, (str, os.PathLike)) and os.path.exists(result) else out


def _metadata_members(images):
    """{NAME.kmodel.json: bytes} for the kmodel images that have metadata beside them."""
    from tl2k210 import metadata
    out = {}
    for img in images:
        if img.source.lower().endswith(".kmodel") and os.path.isfile(img.source):
            meta = metadata.load_for(img.source, img.data)
            if meta is not None:
                out[os.path.basename(img.source) + metadata.SUFFIX] = meta.to_json().encode()
    return out


def maixpy_snippet(address, meta=None):
    """The MaixPy lines that load the model; with its metadata, also the task's setup (the
    anchors and labels copied by hand are a top cause of region_layer_init errors)."""
    lines = ["import KPU as kpu", f"task = kpu.load(0x{address:x})"]
    task = meta.task if meta is not None else None
    if meta is not None and meta.labels and len(meta.labels) <= 100:
        lines.append(f"labels = {meta.labels!r}")
    if task == "yolo2" and meta.anchors:
        d = meta.decode
        lines += [f"anchor = ({', '.join(str(v) for v in meta.anchors)})",
                  f"kpu.init_yolo2(task, {d.get('threshold', 0.5)}, {d.get('nms', 0.3)}, "
                  f"{len(meta.anchors) // 2}, anchor)",
                  "# objects = kpu.run_yolo2(task, img)    # img: sensor.snapshot(), "
                  f"{meta.input['shape'][-1]}x{meta.input['shape'][-2]}"]
    elif task == "classify":
        lines.append("# plist = kpu.forward(task, img)[:]; best = plist.index(max(plist))")
    else:
        lines.append("# fmap = kpu.forward(task, img)      # or kpu.run_yolo2(task, img) after init_yolo2")
    lines.append("kpu.deinit(task)")
    return "\n".join(lines)


def cmd_deploy(args):
    from tl2k210 import metadata
    from tl2k210.fileio import check_outputs, check_readable, read_bytes
    from tl2k210.flash.boards import FLASH_SIZE_16M
    from tl2k210.flash.flasher import DEFAULT_BAUD
    from tl2k210.flash.kfpkg import FlashImage, read_kfpkg, write_kfpkg

    if args.via == "repl":
        from tl2k210.maixpy.repl_cli import deploy_via_repl
        check_readable(args.model, "model")
        args.baud = args.baud or args.initial_baud
        return deploy_via_repl(args)
    args.baud = args.baud or DEFAULT_BAUD
    check_readable(args.model, "model")
    check_link_args(args)
    check_outputs([("-o", args.kfpkg)], [args.model, args.firmware, args.dataset, args.stub])
    firmware = read_bytes(args.firmware, FLASH_SIZE_16M, "firmware image") if args.firmware else None
    with tempfile.TemporaryDirectory(prefix="tl2k210-deploy-") as tmp:
        kmodel = _kmodel_for(args.model, tmp, getattr(args, "dataset", None))
        data = read_bytes(kmodel, FLASH_SIZE_16M, "kmodel")
        if not data:
            raise Tl2k210Error(f"{kmodel} is empty")
        from tl2k210.errors import KmodelFormatError
        from tl2k210.k210.kmodel import detect_version
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
        write_kfpkg(images, pkg, extras=_metadata_members(images[-1:]))
        print(f"packaged {pkg}")
        _do_flash(args, read_kfpkg(pkg))
    print("\n# MaixPy: load the model from flash")
    print(maixpy_snippet(address, meta))
    return 0


def _check_flash_file(path):
    """--flash: a 16 MiB flash image (kept) or a new path (created); never another file, which
    the board would silently replace with an erased flash."""
    from tl2k210.fileio import check_writable
    from tl2k210.flash.boards import FLASH_SIZE_16M
    if os.path.isdir(path):
        raise Tl2k210Error(f"--flash {path} is a folder; give a flash image file (created if missing)")
    if os.path.exists(path):
        size = os.path.getsize(path)
        if size != FLASH_SIZE_16M:
            raise Tl2k210Error(f"--flash {path} is {size} bytes, not a 16 MiB flash image; the board "
                               "would erase it: pass a new file name (it is created) or a 16 MiB "
                               "image written by an earlier board")
    else:
        check_writable(path, "--flash")


def cmd_board(args):
    import time

    from tl2k210.flash.emulated_board import EmulatedBoard, FaultConfig
    from tl2k210.flash.transport import LINES_ENV, SHIM_DIR

    faults = FaultConfig(rate=args.fault_rate, kinds=tuple(args.fault_kinds), seed=args.seed)
    if args.flash:
        _check_flash_file(args.flash)
    if args.maixpy:
        from tl2k210.maixpy.repl_cli import serve_board
        return serve_board(args)
    try:
        board = EmulatedBoard(args.flash, wiring=args.wiring, throttle=args.throttle,
                              faults=faults)
    except ValueError as exc:
        raise Tl2k210Error(str(exc)) from None
    kflash_board = args.wiring if args.wiring in ("dan", "kd233", "goE", "bit_mic") else "dan"
    with board:
        print(f"emulated K210 on {board.port} (wiring {args.wiring}, flash {board.flash_path})")
        print(f"DTR/RTS socket: {board.lines_socket}")
        print("run stock kflash against it with:")
        print(f"  {LINES_ENV}={board.lines_socket} PYTHONPATH={SHIM_DIR} "
              f"kflash -p {board.port} -B {kflash_board} -b 1500000 firmware.bin")
        sys.stdout.flush()
        t0 = time.monotonic()
        try:
            while args.seconds is None or time.monotonic() - t0 < args.seconds:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        print(f"board state {board.state}; boot: {board.core.boot_message or 'not booted'}")
    return 0
