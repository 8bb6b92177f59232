"""`tl2k210` command line: thin argument parsing; the work happens in the library.

One module per verb in this package (tl2k210/cli/VERB.py) defines ``add_VERB_parser(subparsers)``
over library functions; library code never imports these modules. Only the verb being run is
imported, so `inspect` and `run` never pull in TensorFlow.
"""
import argparse
import importlib
import os
import re
import signal
import sys

from tl2k210 import __version__
from tl2k210.errors import KmodelFormatError, Tl2k210Error

# verb -> module that defines add_parser(subparsers) for it. Order = order in --help.
VERBS = {
    "inspect": "tl2k210.cli.inspect",
    "run": "tl2k210.cli.run",
    "convert": "tl2k210.cli.convert",
    "compare": "tl2k210.cli.compare",
    "flash": "tl2k210.cli.flash",
    "package": "tl2k210.cli.package",
    "deploy": "tl2k210.cli.deploy",
    "board": "tl2k210.cli.board",
    "repl": "tl2k210.cli.repl",
    "validate": "tl2k210.cli.validate",
    "zoo": "tl2k210.cli.zoo",
    "demo": "tl2k210.cli.demo",
}


def build_parser(only=None):
    parser = argparse.ArgumentParser(
        prog="tl2k210",
        description="Neural networks onto Kendryte K210: convert, inspect, run (emulated), flash.",
    )
    parser.add_argument("--version", action="version", version=f"tl2k210 {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for verb, modname in VERBS.items():
        if only is not None and verb != only:
            # still list it in --help, cheaply
            sub.add_parser(verb, help=f"(see `tl2k210 {verb} --help`)", add_help=False)
            continue
        mod = importlib.import_module(modname)     # a broken verb fails loudly, never vanishes
        getattr(mod, "add_" + verb + "_parser")(sub)
    _no_abbreviations(parser)
    return parser


def _no_abbreviations(parser):
    """Flags only as spelled: argparse's prefix matching read `run --rgb` (a flag `compare` has:
    RGB order) as `--rgb565`, silently (round 65's second hunt)."""
    parser.allow_abbrev = False
    for action in parser._actions:
        for p in getattr(action, "choices", None).values() if isinstance(action, argparse._SubParsersAction) else ():
            _no_abbreviations(p)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so that every `with`/`finally` cleans up (temporary
    flash images, half-written outputs) before the process ends."""

    def __init__(self, signum=signal.SIGTERM):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame):
    raise Terminated(signum)


CLEANUP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


# flags whose value is a comma-separated number list that may start with a minus sign
# (`--input-range -1,1`): argparse would take "-1,1" for an option
NUMBER_LIST_FLAGS = ("--input-range", "--mean", "--std", "--anchors")


def _join_negative_lists(argv):
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a in NUMBER_LIST_FLAGS and i + 1 < len(argv) and re.match(r"^-[\d.]", argv[i + 1]):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def main(argv=None):
    argv = _join_negative_lists(sys.argv[1:] if argv is None else list(argv))
    verb = argv[0] if argv and not argv[0].startswith("-") else None
    parser = build_parser(only=verb if verb in VERBS else None)
    args = parser.parse_args(argv)
    previous = {}
    if getattr(args, "verbose", False):
        from tl2k210 import quiet
        quiet.set_verbose(True)
    try:
        for sig in CLEANUP_SIGNALS:
            previous[sig] = signal.signal(sig, _on_signal)
    except ValueError:          # not the main thread: leave signals alone
        pass
    try:
        rc = args.func(args) or 0
        sys.stdout.flush()          # a closed pipe shows here, not at interpreter exit
        return rc
    except KmodelFormatError as exc:
        text = str(exc)
        fix = "" if "tl2k210 convert" in text else \
            "; check that this is the kmodel file, or rebuild it (tl2k210 convert)"
        return _fail(args, text + fix)
    except Tl2k210Error as exc:
        return _fail(args, str(exc))
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        _say(f"tl2k210 {args.verb}: {'terminated' if terminated else 'interrupted'}")
        return 128 + int(exc.signum) if terminated else 130
    except BrokenPipeError:
        # the reader went away (`tl2k210 inspect M | head -1`): stop quietly, as Unix tools do
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    except MemoryError:
        return _fail(args, "out of memory: the input is larger than this computer can process; "
                     "use a smaller input")
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(args, f"{where}{exc.strerror or exc}; check the path and its permissions")
    except Exception as exc:
        if os.environ.get("TL2K210_TRACEBACK"):
            raise
        return _fail(args, f"internal error ({type(exc).__name__}: {exc}); this is a bug in "
                     "tl2k210: please report it with the command line (TL2K210_TRACEBACK=1 shows "
                     "the traceback)", code=3)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _say(text):
    try:
        print(text, file=sys.stderr)
    except (OSError, ValueError):
        pass


def _fail(args, message, code=2):
    _say(f"tl2k210 {args.verb}: error: {message}")
    return code


if __name__ == "__main__":
    sys.exit(main())
