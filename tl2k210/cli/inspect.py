"""`tl2k210 inspect`: a kmodel's layers, units, MACs and memory, or a .kfpkg's images (never
imports TensorFlow)."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

from tl2k210 import metadata
from tl2k210.errors import KmodelFormatError
from tl2k210.pkginfo import describe_package, is_package, render_package
from tl2k210.k210 import kmodel
from tl2k210.k210.inspect import describe, render


def add_inspect_parser(sub):
    p = sub.add_parser("inspect", help="describe a kmodel (layers, KPU/CPU, MACs, memory) or "
                       "a .kfpkg package", description="Describe a kmodel (v3 or v4): version, "
                       "flags, each layer (type, shapes, KPU or CPU, MACs, weight bytes, KPU RAM "
                       "lines, main-memory ranges), peak KPU RAM, main memory and outputs; and "
                       "the model's metadata (MODEL.kmodel.json beside it) when there is one. "
                       "For a .kfpkg: each image's file, flash address, size, sha256 and kind "
                       "(firmware, kmodel, unknown), the address warnings of `package`, and "
                       "every kmodel inside described as above.")
    p.add_argument("file", help="kmodel or .kfpkg file")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args):
    if is_package(args.file):
        return _inspect_package(args)
    model = kmodel.load(args.file)
    info = describe(model, args.file, os.path.getsize(args.file))
    meta = metadata.load_for(args.file)
    if args.json:
        info["metadata"] = asdict(meta) if meta else None
        print(json.dumps(info, indent=1, default=int))
        return 0
    print(render(info))
    if meta is not None:
        print(f"\nmetadata ({metadata.path_for(args.file).name}, sha256 matches)")
        print("\n".join("  " + ln for ln in meta.summary_lines()))
    return 0


def _inspect_package(args):
    """The listing of a .kfpkg; a kmodel inside that does not parse fails the command (exit 2)
    after the listing, as `inspect` of that kmodel file would."""
    info = describe_package(args.file, os.path.getsize(args.file))
    print(json.dumps(info, indent=1, default=int) if args.json else render_package(info))
    if info["errors"]:
        sys.stdout.flush()
        raise KmodelFormatError("; ".join(info["errors"]))
    return 0
