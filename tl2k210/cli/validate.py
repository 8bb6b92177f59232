"""`tl2k210 validate`: a kmodel on a MaixPy board against the emulator and the float model
(hardware in the loop, over the REPL)."""
import json
import sys

from tl2k210 import cliargs
from tl2k210.cli.repl import connect, progress_for
from tl2k210.errors import Tl2k210Error
from tl2k210.fileio import atomic_write, check_outputs, check_readable
from tl2k210.maixpy.repl import BoardExecError
from tl2k210.maixpy.validate import plot, report_table, validate


def add_validate_parser(sub):
    p = sub.add_parser("validate", help="run a kmodel on a MaixPy board and compare it with the "
                       "emulator and the float model (hardware in the loop)",
                       description="Upload MODEL (or use the one at --address in flash) and test "
                       "inputs to a MaixPy board over its REPL, run kpu.forward there (per layer "
                       "with --per-layer), read the outputs back and report, per output and per "
                       "layer, max |diff|, cosine and SQNR of board vs emulator vs float model, "
                       "and whether a gap comes from quantization, the runtime or preprocessing.")
    p.add_argument("kmodel")
    p.add_argument("--input", "-i", action="append", default=[], metavar="IMG|NPY",
                   help="test input: an image (resized to the model input) or .npy/.npz "
                   "(uint8 pixels, or float32 vectors for vector models); repeatable; default: "
                   "the astronaut photo")
    p.add_argument("--limit", type=cliargs.int_range(1, example=16), default=16,
                   help="at most this many inputs (16)")
    p.add_argument("--per-layer", action="store_true", help="compare every layer too "
                   "(kpu.set_layers + forward)")
    p.add_argument("--float", dest="float_model", metavar="SRC", help="the float source model "
                   "(.onnx/.tflite/.keras/SavedModel) for the quantization comparison")
    p.add_argument("--address", type=cliargs.address, help="use the model flashed at this "
                   "address (checked) instead of uploading it")
    p.add_argument("--to", metavar="DIR", help="board folder for the model (default: /sd with a "
                   "card, else /flash)")
    p.add_argument("--json", metavar="OUT.json", help="write the report as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="write a PNG plot")
    cliargs.add_preprocess(p)
    cliargs.add_repl_port_args(p)
    p.set_defaults(func=cmd_validate)


def cmd_validate(args):
    check_readable(args.kmodel, "kmodel")
    for f in args.input:
        check_readable(f, "input")
    if args.float_model:
        check_readable(args.float_model, "float model", folder=None)
    check_outputs([("--json", args.json), ("--plot", args.plot)],
                  [args.kmodel, args.float_model] + list(args.input))
    log = lambda m: print(f"tl2k210: {m}", file=sys.stderr)   # noqa: E731
    with connect(args) as r:
        try:
            rep = validate(r, args.kmodel, args.input, args.per_layer, args.float_model,
                           cliargs.pre_opts(args), args.address, args.to, progress_for(args), log, args.limit)
        except BoardExecError as exc:
            raise Tl2k210Error(f"{exc}\n{exc.traceback.strip()}") from None
    print(f"{rep['kmodel']} (kmodel v{rep['version']}) on the board vs the emulator"
          + (f" vs {rep['float_model']}" if rep["float_model"] else "")
          + f", {len(rep['samples'])} input(s): {', '.join(rep['samples'])}")
    for line in report_table(rep):
        print(line)
    for r_ in rep["rows"]:
        if r_["kind"] == "output":
            print(f"{r_['name']}: {r_['verdict']}")
    if rep["per_layer"]:
        print("first layer where the board differs: " + (rep["first_differing_layer"] or "none"))
    if args.json:
        atomic_write(args.json, json.dumps(rep, indent=1).encode(), "--json")
        print(f"wrote {args.json}")
    if args.plot:
        plot(rep, args.plot)
        print(f"wrote {args.plot}")
    bad = any(r_["verdict"].startswith("runtime") for r_ in rep["rows"])
    return 1 if bad else 0          # 1: the board differs from the emulator
