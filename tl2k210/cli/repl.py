"""CLI: `tl2k210 repl put|get|ls|rm|run|exec|reset` (flags like ampy/mpremote: -p/--port,
-b/--baud), `tl2k210 deploy MODEL --via repl` and `tl2k210 board --maixpy --pty` (the last two
are options of the flash package's verbs, handled here)."""
from __future__ import annotations

import os
import sys
import time

from tl2k210.errors import Tl2k210Error
from tl2k210.maixpy.repl import REPL_BAUD, Repl, ReplError


def _baud(text):
    from tl2k210.flash.cli import _baud_arg
    return _baud_arg(text)


def add_port_args(p):
    p.add_argument("-p", "--port", help="serial port or pyserial URL of the board (/dev/ttyUSB0, "
                   "COM3, a pty); default: the only K210-like USB serial port")
    p.add_argument("-b", "--baud", type=_baud, default=REPL_BAUD,
                   help="baud rate to talk at (default 115200, MaixPy's REPL); a higher rate "
                   "(e.g. 1500000) is switched to with machine.UART.repl_uart().init and back at "
                   "the end")
    p.add_argument("--initial-baud", type=_baud, default=REPL_BAUD,
                   help="the rate the board's REPL runs at now (default 115200)")
    p.add_argument("--no-raw-paste", dest="raw_paste", action="store_false", default=True,
                   help="do not probe raw-paste mode (MaixPy's MicroPython 1.11 has none)")
    p.add_argument("--progress", action="store_true", default=None,
                   help="show progress bars even when stderr is not a terminal")
    p.add_argument("-v", "--verbose", action="store_true", help="log protocol events")


def add_repl_parser(sub):
    p = sub.add_parser("repl", help="files and code on a MaixPy board over its REPL (115200 8N1)",
                       description="Talk to a running MaixPy board over its MicroPython raw REPL "
                       "(what ampy, mpremote and rshell use): upload files with checksums the "
                       "board computes (resumable), list, download, remove, run scripts with "
                       "their output streamed.")
    cmds = p.add_subparsers(dest="repl_cmd", metavar="COMMAND")
    cmds.required = True
    c = cmds.add_parser("put", help="upload files (verified by the board's SHA-256, resumable)")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.add_argument("--to", metavar="DIR", help="board folder: /flash or /sd[/sub] (default: the "
                   "board's current folder, /sd with a card, else /flash)")
    c.add_argument("--as", dest="name", metavar="NAME", help="board file name (one FILE only)")
    c.add_argument("--no-resume", dest="resume", action="store_false", default=True,
                   help="start over instead of resuming a FILE.part left by an interrupted put")
    c = cmds.add_parser("get", help="download a board file (CRC-checked)")
    c.add_argument("remote")
    c.add_argument("local", nargs="?", help="local file (default: the board file's name)")
    c = cmds.add_parser("ls", help="list a board folder")
    c.add_argument("path", nargs="?")
    c = cmds.add_parser("rm", help="remove board files")
    c.add_argument("paths", nargs="+", metavar="PATH")
    c = cmds.add_parser("run", help="run a local script on the board, streaming its output")
    c.add_argument("script")
    c.add_argument("--no-follow", dest="follow", action="store_false", default=True,
                   help="start it and return at once")
    c = cmds.add_parser("exec", help="run a line of code on the board, streaming its output")
    c.add_argument("code")
    c.add_argument("--no-follow", dest="follow", action="store_false", default=True)
    cmds.add_parser("reset", help="soft reboot (Ctrl-D): _boot.py, boot.py and main.py run")
    for c in cmds.choices.values():
        add_port_args(c)
    p.set_defaults(func=cmd_repl)


# ---------------------------------------------------------------------------------------------
def _progress(args):
    from tl2k210.progress import Progress
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    return Progress(show)


def connect(args) -> Repl:
    from tl2k210.flash.cli import _auto_port
    log = (lambda m: print(f"tl2k210: {m}", file=sys.stderr)) if args.verbose else None
    port = args.port or _auto_port(None)
    r = Repl.open(port, args.initial_baud, raw_paste=args.raw_paste, log=log)
    try:
        r.enter_raw()
        if args.baud != args.initial_baud:
            r.set_baud(args.baud)
    except BaseException:
        r.port.close()
        raise
    return r


def _stdout(data: bytes):
    sys.stdout.buffer.write(data.replace(b"\r\n", b"\n"))
    sys.stdout.flush()


def run_code(r: Repl, code: bytes, follow=True) -> int:
    """Run code on the board with its output streamed; Ctrl-C here interrupts it there.
    Returns 1 when it raised (the traceback goes to stderr), 130 when interrupted."""
    if not follow:
        r._send(code)
        return 0
    try:
        out, err = r.exec(code, on_output=_stdout, idle=None)
    except KeyboardInterrupt:
        r.interrupt()
        try:
            r.read_until(b"\x04", idle=5.0, on_data=_stdout)
            err = r.read_until(b"\x04", idle=5.0)[:-1]
            r.read_until(b">", idle=2.0)
            sys.stderr.write(err.decode("utf-8", "replace").replace("\r\n", "\n"))
        except ReplError:
            pass
        return 130
    if err:
        sys.stderr.write(err.decode("utf-8", "replace").replace("\r\n", "\n"))
        return 1
    return 0


def _read_local(path, what="file"):
    from tl2k210.fileio import check_readable, read_bytes
    check_readable(path, what)
    return read_bytes(path, 64 * 1024 * 1024, what)


def put_files(r: Repl, files, to=None, name=None, resume=True, progress=None):
    results = []
    base = r.abspath(to) if to else r.cwd()
    for f in files:
        data = _read_local(f)
        dest = base.rstrip("/") + "/" + (name or os.path.basename(f))
        try:
            res = r.put(data, dest, progress=progress, resume=resume)
        except KeyboardInterrupt:
            print(f"\n{f}: interrupted; what reached the board stays in {dest}.part and the same "
                  "`tl2k210 repl put` resumes from it", file=sys.stderr)
            raise
        rate = (res.size - res.resumed_from) / res.seconds / 1024 if res.seconds else 0
        how = {"up to date": "up to date (same SHA-256 on the board), skipped",
               "resumed": f"resumed from byte {res.resumed_from}, verified",
               "written": "verified"}[res.status]
        extra = f", {rate:.1f} KiB/s, {res.retries} retries" if res.status != "up to date" else ""
        print(f"{f} -> {dest}: {res.size} bytes, sha256 {res.sha256[:16]}, {how}{extra}")
        results.append(res)
    return results


def cmd_repl(args):
    if args.repl_cmd == "put" and args.name and len(args.files) > 1:
        raise Tl2k210Error("--as names one file; give one FILE or drop --as")
    data = {}
    if args.repl_cmd == "put":
        for f in args.files:
            data[f] = _read_local(f)
    elif args.repl_cmd == "run":
        data[args.script] = _read_local(args.script, "script")
    with connect(args) as r:
        cmd = args.repl_cmd
        if cmd == "put":
            put_files(r, args.files, args.to, args.name, args.resume, _progress(args))
        elif cmd == "get":
            blob = r.get(args.remote, progress=_progress(args))
            local = args.local or os.path.basename(args.remote.rstrip("/"))
            from tl2k210.fileio import atomic_write, check_outputs
            check_outputs([("LOCAL", local)])
            atomic_write(local, blob, "LOCAL")
            print(f"{r.abspath(args.remote)} -> {local}: {len(blob)} bytes")
        elif cmd == "ls":
            for n, is_dir, size in r.ls(args.path):
                print(f"{size if size >= 0 else '?':>10} {n}{'/' if is_dir else ''}")
        elif cmd == "rm":
            for p in args.paths:
                r.rm(p)
                print(f"removed {r.abspath(p)}")
        elif cmd == "run":
            return run_code(r, data[args.script], args.follow)
        elif cmd == "exec":
            return run_code(r, args.code.encode("utf-8"), args.follow)
        elif cmd == "reset":
            r.exit_raw()
            r._write(b"\x04")
            time.sleep(0.2)
            print(r.drain(quiet=0.5, limit=5.0).decode("utf-8", "replace").replace("\r\n", "\n"))
    return 0


# ---- deploy --via repl ---------------------------------------------------------------------------
def main_py(model_file, model, labels_file=None, anchors=None, threshold=0.5, nms=0.3):
    """A MaixPy main.py that runs `model_file` (a board path) on the camera and prints what it
    finds: YOLOv2 boxes with --anchors, else the top class (labels), else output statistics."""
    from tl2k210.k210.emulator import Emulator
    shape, _ = Emulator(model).input_spec()
    if len(shape) == 4:
        shape = shape[1:]
    if len(shape) != 3:
        raise Tl2k210Error(f"{model_file}: the model takes a vector of {shape[0]} values, not an "
                           "image; deploy --via repl writes camera scripts only (upload your own "
                           "main.py with `tl2k210 repl put`)")
    c, h, w = shape
    fs = "QVGA" if w <= 320 and h <= 240 else "VGA"
    lines = [f"# main.py written by `tl2k210 deploy --via repl` for {model_file}",
             "import sensor, lcd, time", "import KPU as kpu", "", "lcd.init()", "sensor.reset()",
             f"sensor.set_pixformat(sensor.{'GRAYSCALE' if c == 1 else 'RGB565'})",
             f"sensor.set_framesize(sensor.{fs})"]
    if (w, h) not in ((320, 240), (640, 480)):
        lines.append(f"sensor.set_windowing(({w}, {h}))   # the model's input size")
    lines += ["sensor.run(1)", "", f"task = kpu.load({model_file!r})"]
    if model.version == 4:
        for i, o in enumerate(model.outputs):
            lines.append(f"kpu.set_outputs(task, {i}, {o[3] // 4}, 1, 1)")
    if labels_file:
        lines.append(f"labels = [l.strip() for l in open({labels_file!r}) if l.strip()]")
    if anchors:
        lines += [f"anchor = {tuple(anchors)!r}",
                  f"kpu.init_yolo2(task, {threshold}, {nms}, {len(anchors) // 2}, anchor)"]
    lines += ["clock = time.clock()", "while True:", "    clock.tick()", "    img = sensor.snapshot()"]
    if anchors:
        name = "labels[o.classid()]" if labels_file else "o.classid()"
        lines += ["    objs = kpu.run_yolo2(task, img)",
                  "    for o in objs or []:",
                  "        img.draw_rectangle(o.rect())",
                  f"        print('%s %.3f at %s' % ({name}, o.value(), o.rect()))",
                  "    print('%d found, %.1f fps' % (len(objs or []), clock.fps()))"]
    else:
        lines += ["    p = kpu.forward(task, img)[:]", "    i = p.index(max(p))"]
        name = "labels[i] if i < len(labels) else i" if labels_file else "i"
        lines += [f"    print('class %s %.3f, %.1f fps' % ({name}, p[i], clock.fps()))"]
    lines += ["    lcd.display(img)", ""]
    return "\n".join(lines)


def deploy_via_repl(args):
    import tempfile

    from tl2k210.flash.cli import _kmodel_for
    from tl2k210.k210 import kmodel as kfmt
    anchors = None
    if args.anchors:
        from tl2k210.k210.yolo import parse_anchors
        anchors = parse_anchors(args.anchors)
    labels = _read_local(args.labels, "labels file") if args.labels else None
    main = _read_local(args.main, "main.py") if args.main else None
    with tempfile.TemporaryDirectory(prefix="tl2k210-deploy-") as tmp:
        kpath = _kmodel_for(args.model, tmp, getattr(args, "dataset", None))
        blob = _read_local(kpath, "kmodel")
        try:
            model = kfmt.loads(blob)
        except Tl2k210Error as exc:
            raise Tl2k210Error(f"{kpath}: {exc}; MaixPy's kpu.load would reject it too") from None
        from tl2k210 import metadata              # labels / anchors the flags leave out
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
            prog = _progress(args)
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


def show_first_lines(r: Repl, n, seconds):
    """Soft-reboot from the friendly REPL (main.py runs, as at power-on) and return the first
    `n` lines it prints after the boot banner; main.py keeps running."""
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
            lines.append(s)
    return lines[:n]


def add_deploy_repl_args(p):
    from tl2k210 import cliargs
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
    g.add_argument("--initial-baud", type=_baud, default=REPL_BAUD)
    g.add_argument("--no-raw-paste", dest="raw_paste", action="store_false", default=True)


# ---- board --maixpy --pty ------------------------------------------------------------------------
def add_board_maixpy_args(p):
    g = p.add_argument_group("--maixpy: a board running MaixPy (REPL on the pty) instead of the ISP")
    g.add_argument("--maixpy", action="store_true", help="serve MaixPy's REPL (friendly `>>> ` and "
                   "raw) backed by the host MaixPy: mpremote, ampy and `tl2k210 repl` work on it")
    g.add_argument("--sd", metavar="DIR", help="host folder seen as the SD card /sd (none: no card)")
    g.add_argument("--fs", metavar="DIR", help="host folder seen as /flash (default: a temporary one)")
    g.add_argument("--image", action="append", default=[], metavar="PHOTO",
                   help="camera photos, shown in a loop (repeatable)")
    g.add_argument("--runtime", default="maixpy", help="MaixPy build (tl2k210/k210/firmware.py)")
    g.add_argument("--raw-paste", action="store_true",
                   help="offer raw-paste mode (MicroPython >= 1.14; MaixPy's 1.11 has none)")


def serve_board(args):
    from tl2k210.flash.emulated_board import FaultConfig
    from tl2k210.maixpy.repl_board import ReplBoard
    for d, flag in ((args.sd, "--sd"), (args.fs, "--fs")):
        if d and not os.path.isdir(d):
            raise Tl2k210Error(f"{flag} {d}: no such folder")
    if args.flash and not os.path.exists(args.flash):
        from tl2k210.flash.emulated_board import new_flash_file
        new_flash_file(args.flash)
    faults = FaultConfig(rate=args.fault_rate, kinds=tuple(args.fault_kinds), seed=args.seed)
    log = lambda n: print(f"[host note] {n}", file=sys.stderr, flush=True)   # noqa: E731
    board = ReplBoard(sd=args.sd, fs=args.fs, flash=args.flash, images=args.image,
                      runtime=args.runtime, faults=faults, throttle=args.throttle,
                      raw_paste=args.raw_paste, log=log)
    with board:
        print(f"emulated MaixPy board on {board.port} (REPL 115200 8N1; /flash "
              f"{board.board.vfs.host_path('/flash')}, /sd {args.sd or 'none'})")
        print(f"  mpremote connect {board.port} fs ls")
        print(f"  ampy -p {board.port} ls")
        print(f"  tl2k210 repl ls -p {board.port}")
        sys.stdout.flush()
        t0 = time.monotonic()
        try:
            while args.seconds is None or time.monotonic() - t0 < args.seconds:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        s = board.stats
        print(f"board done: {s.rx_bytes} bytes in, {s.tx_bytes} out, {s.commands} commands, "
              f"{s.soft_resets} soft reboots, line faults {s.faults or 'none'}")
    return 0
