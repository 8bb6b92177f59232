"""`tl2k210 repl put|get|ls|rm|run|exec|reset`: files and code on a running MaixPy board over
its raw REPL (flags like ampy/mpremote: -p/--port, -b/--baud)."""
from __future__ import annotations

import os
import sys
import time

from tl2k210.cliargs import add_repl_port_args
from tl2k210.errors import Tl2k210Error
from tl2k210.fileio import atomic_write, check_outputs, check_readable, read_bytes
from tl2k210.flash.transport import auto_port
from tl2k210.maixpy.repl import DEADLINE, Repl, ReplError
from tl2k210.progress import Progress


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
        add_repl_port_args(c)
    p.set_defaults(func=cmd_repl)


# ---------------------------------------------------------------------------------------------
def progress_for(args):
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    return Progress(show)


def connect(args) -> Repl:
    log = (lambda m: print(f"tl2k210: {m}", file=sys.stderr)) if args.verbose else None
    port = args.port or auto_port(None)
    r = Repl.open(port, args.initial_baud, raw_paste=args.raw_paste, log=log,
                  **({} if args.timeout is None else {"timeout": args.timeout}))
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


def run_code(r: Repl, code: bytes, follow=True, timeout=None) -> int:
    """Run code on the board with its output streamed (until it ends; with a `timeout`, the
    Repl's deadline holds); Ctrl-C here interrupts it there. Returns 1 when it raised (the
    traceback goes to stderr), 130 when interrupted."""
    if not follow:
        r._send(code)
        return 0
    try:
        out, err = r.exec(code, on_output=_stdout, idle=None,
                          total=None if timeout is None else DEADLINE)
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


def read_local(path, what="file"):
    check_readable(path, what)
    return read_bytes(path, 64 * 1024 * 1024, what)


def put_files(r: Repl, files, to=None, name=None, resume=True, progress=None):
    results = []
    base = r.abspath(to) if to else r.cwd()
    for f in files:
        data = read_local(f)
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
            data[f] = read_local(f)
    elif args.repl_cmd == "run":
        data[args.script] = read_local(args.script, "script")
    with connect(args) as r:
        cmd = args.repl_cmd
        if cmd == "put":
            put_files(r, args.files, args.to, args.name, args.resume, progress_for(args))
        elif cmd == "get":
            blob = r.get(args.remote, progress=progress_for(args))
            local = args.local or os.path.basename(args.remote.rstrip("/"))
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
            return run_code(r, data[args.script], args.follow, args.timeout)
        elif cmd == "exec":
            return run_code(r, args.code.encode("utf-8"), args.follow, args.timeout)
        elif cmd == "reset":
            r.exit_raw()
            r._write(b"\x04")
            time.sleep(0.2)
            print(r.drain(quiet=0.5, limit=5.0).decode("utf-8", "replace").replace("\r\n", "\n"))
    return 0
