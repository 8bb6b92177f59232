"""`tl2k210 board --pty`: an emulated K210 on a pseudo-terminal, in ISP mode (stock kflash and
`tl2k210 flash` talk to it) or, with --maixpy, running MaixPy's REPL backed by the host MaixPy
(mpremote, ampy and `tl2k210 repl` talk to it)."""
import os
import sys
import time

from tl2k210 import cliargs
from tl2k210.errors import Tl2k210Error
from tl2k210.fileio import check_writable
from tl2k210.flash.boards import FLASH_SIZE_16M
from tl2k210.flash.emulated_board import EmulatedBoard, FaultConfig, new_flash_file
from tl2k210.flash.transport import LINES_ENV, SHIM_DIR
from tl2k210.maixpy.board import PROFILES
from tl2k210.maixpy.repl_board import ReplBoard


def add_board_parser(sub):
    p = sub.add_parser("board", help="run an emulated K210 board on a pseudo-terminal")
    p.add_argument("--pty", action="store_true", required=True,
                   help="serve the board on a new pty (the only transport so far)")
    p.add_argument("--flash", metavar="FILE", help="16 MiB flash image file (created if "
                   "missing; default: a temporary file)")
    p.add_argument("--wiring", default="dan", type=cliargs.wiring,
                   help="reset wiring: dan, kd233, goE, bit_mic (DTR/RTS via the line shim) or "
                   "isp_on_open (resets into ISP whenever the port is opened)")
    p.add_argument("--throttle", action="store_true", help="simulate the line speed")
    p.add_argument("--fault-rate", type=cliargs.float_range(0.0, 1.0, example=0.001, hi_open=True),
                   default=0.0, help="per-byte fault rate host->board, 0 <= rate < 1")
    p.add_argument("--fault-kinds", type=cliargs.choices_list(cliargs.FAULT_KINDS, "corrupt,drop"),
                   default=("corrupt", "drop"), help="corrupt,drop,delay")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--for", dest="seconds", type=cliargs.float_range(0.0, example=10), default=None,
                   help="stop after this many seconds (default: until Ctrl-C or SIGTERM)")
    add_board_maixpy_args(p)
    p.set_defaults(func=cmd_board)


def _check_flash_file(path):
    """--flash: a 16 MiB flash image (kept) or a new path (created); never another file, which
    the board would silently replace with an erased flash."""
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
    faults = FaultConfig(rate=args.fault_rate, kinds=tuple(args.fault_kinds), seed=args.seed)
    if args.flash:
        _check_flash_file(args.flash)
    if args.maixpy:
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
        stopped = _serve(args.seconds)
        print(f"board state {board.state}; boot: {board.core.boot_message or 'not booted'}")
    if stopped is not None:
        raise stopped
    return 0


def _serve(seconds):
    """Serve until `seconds` pass (None: for ever); Ctrl-C or SIGTERM is returned, for the
    caller to report the board's state and then exit 130 / 143 with it."""
    t0 = time.monotonic()
    try:
        while seconds is None or time.monotonic() - t0 < seconds:
            time.sleep(0.2)
    except KeyboardInterrupt as exc:
        return exc
    return None


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
    g.add_argument("--board", choices=list(PROFILES), default="maix",
                   help="the board's MaixPy build (as `tl2k210 demo --board`): maix or m5stickv")
    g.add_argument("--raw-paste", action="store_true",
                   help="offer raw-paste mode (MicroPython >= 1.14; MaixPy's 1.11 has none)")


def serve_board(args):
    for d, flag in ((args.sd, "--sd"), (args.fs, "--fs")):
        if d and not os.path.isdir(d):
            raise Tl2k210Error(f"{flag} {d}: no such folder")
    if args.flash and not os.path.exists(args.flash):
        new_flash_file(args.flash)
    faults = FaultConfig(rate=args.fault_rate, kinds=tuple(args.fault_kinds), seed=args.seed)
    log = lambda n: print(f"[host note] {n}", file=sys.stderr, flush=True)   # noqa: E731
    board = ReplBoard(sd=args.sd, fs=args.fs, flash=args.flash, images=args.image,
                      runtime=args.runtime, faults=faults, throttle=args.throttle,
                      raw_paste=args.raw_paste, log=log, board=args.board)
    with board:
        print(f"emulated MaixPy board on {board.port} (REPL 115200 8N1; /flash "
              f"{board.board.vfs.host_path('/flash')}, /sd {args.sd or 'none'})")
        print(f"  mpremote connect {board.port} fs ls")
        print(f"  ampy -p {board.port} ls")
        print(f"  tl2k210 repl ls -p {board.port}")
        sys.stdout.flush()
        stopped = _serve(args.seconds)
        s = board.stats
        print(f"board done: {s.rx_bytes} bytes in, {s.tx_bytes} out, {s.commands} commands, "
              f"{s.soft_resets} soft reboots, line faults {s.faults or 'none'}")
    if stopped is not None:
        raise stopped
    return 0
