"""argparse types and flag groups the verbs share: a bad value is an argparse error (usage line,
exit 2) that names the flag, the accepted range and an example; never a traceback later."""
from __future__ import annotations

import argparse
import math
import os
import re

from tl2k210.errors import InputFileError, Tl2k210Error
from tl2k210.fileio import check_readable, read_bytes
from tl2k210.flash.boards import BOARDS, MAX_BAUD, MIN_BAUD, board_names, get_board
from tl2k210.flash.errors import FlashError
from tl2k210.flash.flasher import DEFAULT_BAUD
from tl2k210.k210.board_facts import REPL_BAUD
from tl2k210.maixpy.repl import TIMEOUT
from tl2k210.quantize.dataset import parse_range


def _number(text, kind, example):
    try:
        v = kind(str(text).strip(), 0) if kind is int else kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. {example})") from None
    if kind is float and not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number (e.g. {example})")
    return v


def int_range(lo=None, hi=None, example=None):
    example = example if example is not None else (lo if lo is not None else 0)

    def parse(text):
        v = _number(text, int, example)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is out of range: use {_span(lo, hi)} (e.g. {example})")
        return v
    parse.__name__ = "integer"
    return parse


def float_range(lo=None, hi=None, example=None, lo_open=False, hi_open=False):
    example = example if example is not None else (lo if lo is not None else 0)

    def parse(text):
        v = _number(text, float, example)
        low = lo is not None and (v < lo or (lo_open and v == lo))
        high = hi is not None and (v > hi or (hi_open and v == hi))
        if low or high:
            parts = ([f"{'>' if lo_open else '>='} {lo}"] if lo is not None else []) + \
                    ([f"{'<' if hi_open else '<='} {hi}"] if hi is not None else [])
            span = _span(lo, hi) if not (lo_open or hi_open) else " and ".join(parts)
            raise argparse.ArgumentTypeError(f"{text} is out of range: use {span} (e.g. {example})")
        return v
    parse.__name__ = "number"
    return parse


def _span(lo, hi):
    if lo is not None and hi is not None:
        return f"{lo}..{hi}"
    return f">= {lo}" if lo is not None else f"<= {hi}"


probability = float_range(0.0, 1.0, example=0.5)


def address(text):
    """A flash address: decimal or 0x-hex, >= 0."""
    v = _number(text, int, "0x300000")
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; flash addresses start at 0 (e.g. 0x300000)")
    return v


def floats(positive=False, count=None, example="0.5,1.0"):
    """Comma-separated finite numbers (all > 0 with `positive`)."""
    def parse(text):
        try:
            vals = tuple(float(v) for v in str(text).split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated numbers, e.g. {example}") from None
        if not all(math.isfinite(v) for v in vals):
            raise argparse.ArgumentTypeError(f"{text!r}: numbers must be finite (e.g. {example})")
        if positive and any(v <= 0 for v in vals):
            raise argparse.ArgumentTypeError(f"{text!r}: values must be positive (e.g. {example})")
        if count is not None and len(vals) not in count:
            raise argparse.ArgumentTypeError(f"{text!r}: give {' or '.join(map(str, count))} values "
                                             f"(e.g. {example})")
        return vals
    parse.__name__ = "numbers"
    return parse


def shape(text):
    """N,C,H,W (or any rank) of positive integers."""
    try:
        dims = tuple(int(v) for v in str(text).split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, e.g. 1,3,224,224") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"{text!r}: every dimension must be a positive integer "
                                         "(e.g. 1,3,224,224)")
    return dims


def pinned_input(text):
    """NAME=V[,V...]: (name, values)."""
    name, sep, rest = str(text).partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=VALUE[,VALUE...], e.g. threshold=0.5")
    return name.strip(), floats(example="0.5")(rest)


def names_list(text):
    """Comma-separated tensor names."""
    names = tuple(n.strip() for n in str(text).split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: give tensor names, comma-separated")
    return names


def one_name(text):
    """One tensor name (a kmodel has one input)."""
    names = names_list(text)
    if len(names) > 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a kmodel has one input; give one tensor name")
    return names[0]


def choices_list(allowed, example):
    """Comma-separated names, each one of `allowed`."""
    def parse(text):
        names = tuple(n.strip() for n in str(text).split(",") if n.strip())
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(allowed)} "
                                             f"(e.g. {example})")
        return names
    parse.__name__ = "list"
    return parse


def range_arg(text):
    try:
        return parse_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# input_range None: a quantized model's own input scale, else (0, 1) -- ConvertOptions decides
PRE_DEFAULTS = {"input_range": None, "mean": (0.0,), "std": (1.0,)}


def add_preprocess(p, from_metadata=False):
    """from_metadata (compare): a flag left out comes from the kmodel's MODEL.kmodel.json."""
    g = p.add_argument_group("input preprocessing (how 0..255 camera pixels become model input)"
                             + ("; default: the kmodel's metadata, else" if from_metadata else ""))
    # `--input-range -1,1` / `--mean -0.5,...`: let argparse read a comma list of numbers that starts
    # with a minus sign as a value, not as an unknown option (it only knows plain negative numbers)
    p._negative_number_matcher = re.compile(r"^-\d*\.?\d+(,-?\d*\.?\d+)*$")
    g.add_argument("--input-range", type=range_arg,
                   help="pixels 0..255 map linearly onto MIN,MAX (default 0,1; for a quantized TFLite "
                   "model, the range its integer input stands for)")
    g.add_argument("--mean", type=floats(example="0.485,0.456,0.406"),
                   help="per-channel mean subtracted after the range (0): 1 value or one per channel, "
                   "in R,G,B order also with --bgr (OpenCV's BGR mean 104,117,123 is --mean 123,117,104)")
    g.add_argument("--std", type=floats(positive=True, example="0.229,0.224,0.225"),
                   help="per-channel std divided after the mean (1), > 0; R,G,B order, as --mean")
    g.add_argument("--bgr", action="store_true", default=None,
                   help="the model wants BGR channel order (the kmodel swaps the camera's R and B, and "
                   "--mean/--std with them)")
    if from_metadata:
        g.add_argument("--rgb", dest="bgr", action="store_false", help="RGB order, whatever the metadata says")
    g.add_argument("--input-shape", type=shape, help="N,C,H,W for models with symbolic input dims (an input "
                   "without a batch axis, such as (T, F) frames: its own dims, e.g. 80,40)")
    g.add_argument("--input-value", type=pinned_input, action="append", metavar="NAME=V[,V...]",
                   help="pin a model input other than the one the kmodel is fed to constant values "
                   "(repeatable): a threshold, a flag, a fixed state; 1 value fills the input")
    g.add_argument("--outputs", type=names_list, metavar="NAME[,NAME...]",
                   help="end the model at these tensors (as netron shows them): an ArgMax, decoder or "
                   "post-processing after them stays in the application")
    g.add_argument("--inputs", type=one_name, metavar="NAME",
                   help="start the model at this tensor (as netron shows it): a front end before it (an FFT "
                   "or MFCC, a decoder) stays in the application, and the kmodel is fed what it holds")
    p.add_argument("--weights", help="weights .h5 for a Keras architecture .json (model.to_json())")


def pre_opts(args, meta=None):
    """Preprocessing from the flags; a flag left out comes from `meta` (ModelMetadata of an image
    model), else the default."""
    m = meta.input if meta is not None else {}

    def pick(flag, key):
        v = getattr(args, flag)
        if v is not None:
            return tuple(v)
        if m.get(key) is not None:
            return tuple(m[key])
        return PRE_DEFAULTS[flag]
    bgr = args.bgr if args.bgr is not None else bool(m.get("bgr", False))
    return dict(input_range=pick("input_range", "range"), mean=pick("mean", "mean"), std=pick("std", "std"),
                channel_order="BGR" if bgr else "RGB", outputs=args.outputs,
                # the size the kmodel runs at (a .pb's shapeless input) where the metadata says it, in
                # the source's own shape where the kmodel's input is a relabelled one
                input_shape=args.input_shape or (tuple(m["source_shape"]) if m.get("source_shape") else
                                                 tuple(m["shape"]) if m.get("layout") == "NCHW" else None),
                inputs=args.inputs or m.get("start"),
                input_values=tuple(args.input_value or ()) or tuple(
                    (x, tuple(v)) for x, v in (m.get("pinned") or {}).items()))


MAX_LABELS_BYTES = 1 << 20


def _looks_like_path(spec: str) -> bool:
    return "," not in spec and ("/" in spec or os.sep in spec or
                                os.path.splitext(spec)[1].lower() in (".txt", ".names", ".csv",
                                                                      ".labels", ".lst"))


def labels_file(spec):
    """The file --labels names, or None when it is a list of names."""
    if spec and not isinstance(spec, list) and (os.path.exists(spec) or _looks_like_path(spec)):
        return spec
    return None


def parse_labels(spec):
    """--labels: an existing file (one name per line) or comma-separated names (or the list of
    names the metadata gives). Something that looks like a path but does not exist is an error,
    not a label called '/missing/file'."""
    if not spec:
        return None
    if isinstance(spec, list):
        return spec
    path = labels_file(spec)
    if path is not None:
        if os.path.isdir(path):
            raise InputFileError(f"--labels {path} is a folder; give a file with one class name "
                                 "per line, or comma-separated names")
        if not os.path.exists(path):
            raise InputFileError(f"no labels file {path}; give an existing file (one class name per "
                                 "line) or comma-separated names, e.g. --labels face or cat,dog")
        text = read_bytes(path, MAX_LABELS_BYTES, "labels file").decode("utf-8", "replace")
        names = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if not names:
            raise InputFileError(f"labels file {path} has no class names (one per line)")
        return names
    names = [s.strip() for s in spec.split(",")]
    if not all(names):
        raise InputFileError(f"--labels {spec!r} has an empty name; give comma-separated names, "
                             "e.g. cat,dog")
    return names


def apply_metadata(args, meta):
    """Fill the decode flags the user left out from the kmodel's metadata (flags win)."""
    if args.decode is None:
        args.decode = "yolo2" if meta is not None and meta.task == "yolo2" else "none"
    if meta is not None:
        if args.anchors is None and meta.anchors:
            args.anchors = ",".join(str(v) for v in meta.anchors)
        if args.labels is None and meta.labels:
            args.labels = meta.labels
    dec = meta.decode if meta is not None else {}
    args.threshold = args.threshold if args.threshold is not None else dec.get("threshold", 0.5)
    args.nms = args.nms if args.nms is not None else dec.get("nms", 0.3)


FAULT_KINDS = ("corrupt", "drop", "delay")


def baud(text):
    """-b: what the ROM/stub and the boards' USB-serial bridges can do (see boards.py)."""
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
    if args.stub:
        check_readable(args.stub, "--stub")
    if args.board is None:
        return
    b, baud = get_board(args.board), args.baud
    if baud > b.max_baud:
        raise Tl2k210Error(f"--baud {baud} is above what the {b.name} board's USB-serial bridge is "
                           f"rated for ({b.max_baud}{': ' + b.notes if b.notes else ''}); use "
                           f"-b {b.max_baud} or lower")


def board_arg(text):
    try:
        return get_board(text).name
    except FlashError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def wiring(text):
    names = [b.name for b in BOARDS.values() if b.reset_line] + ["isp_on_open"]
    if text not in names:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(names)}")
    return text


def add_flash_port_args(p):
    p.add_argument("-p", "--port", help="serial port or pyserial URL (/dev/ttyUSB0, COM3, "
                   "socket://host:port); default: the only K210-like USB serial port")
    p.add_argument("-B", "--board", type=board_arg, metavar="BOARD",
                   help="board preset (reset wiring): " + ", ".join(board_names()) +
                   "; default: auto-detect")
    p.add_argument("-b", "--baud", type=baud, default=DEFAULT_BAUD,
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


def add_repl_port_args(p):
    p.add_argument("-p", "--port", help="serial port or pyserial URL of the board (/dev/ttyUSB0, "
                   "COM3, a pty); default: the only K210-like USB serial port")
    p.add_argument("-b", "--baud", type=baud, default=REPL_BAUD,
                   help="baud rate to talk at (default 115200, MaixPy's REPL); a higher rate "
                   "(e.g. 1500000) is switched to with machine.UART.repl_uart().init and back at "
                   "the end")
    p.add_argument("--initial-baud", type=baud, default=REPL_BAUD,
                   help="the rate the board's REPL runs at now (default 115200)")
    p.add_argument("--no-raw-paste", dest="raw_paste", action="store_false", default=True,
                   help="do not probe raw-paste mode (MaixPy's MicroPython 1.11 has none)")
    p.add_argument("--progress", action="store_true", default=None,
                   help="show progress bars even when stderr is not a terminal")
    add_repl_timeout(p)
    p.add_argument("-v", "--verbose", action="store_true", help="log protocol events")


def add_repl_timeout(p):
    p.add_argument("--timeout", type=float_range(0.0, example=60, lo_open=True), metavar="SECONDS",
                   help=f"the longest one exchange with the board may go on beyond its idle "
                   f"allowance (default {TIMEOUT:g}; `repl run`/`exec` follow the output without a "
                   "limit unless given)")
