"""`tl2k210` command line: thin argument parsing; the work happens in the library.

Each verb lives in the module that owns it and registers itself through ``register(subparsers)``;
modules are imported lazily so `inspect` and `run` never pull in TensorFlow.
"""
import argparse
import importlib
import sys

from tl2k210 import __version__
from tl2k210.errors import Tl2k210Error

# verb -> module that defines add_parser(subparsers) for it. Order = order in --help.
VERBS = {
    "inspect": "tl2k210.k210.cli",
    "run": "tl2k210.k210.cli",
    "convert": "tl2k210.compiler_cli",
    "compare": "tl2k210.compiler_cli",
    "flash": "tl2k210.flash.cli",
    "package": "tl2k210.flash.cli",
    "deploy": "tl2k210.flash.cli",
    "board": "tl2k210.flash.cli",
    "zoo": "tl2k210.zoo",
    "demo": "tl2k210.maixpy.demo",
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
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        getattr(mod, "add_" + verb + "_parser")(sub)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    verb = argv[0] if argv and not argv[0].startswith("-") else None
    parser = build_parser(only=verb if verb in VERBS else None)
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except Tl2k210Error as exc:
        print(f"tl2k210 {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tl2k210 {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
