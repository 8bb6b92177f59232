"""Every place tl2k210 reads from or writes to, decided here and nowhere else.

The same code runs from a source checkout (`models/`, `firmware/` beside the package, the test
data in `../shared/testdata`) and from an installed wheel (the build copies `models/` and
`firmware/` into the package as `tl2k210/data/`; see setup.py):

  PACKAGE          the tl2k210 package folder
  checkout()       the source checkout this package runs from, or None when installed
  models_dir()     zoo recipes, networks, weights: <checkout>/models | tl2k210/data/models
  firmware_dir()   MaixPy board scripts:           <checkout>/firmware | tl2k210/data/firmware
  testdata_dir()   $TL2K210_TESTDATA | <checkout>/../shared/testdata | None
  cache_dir()      $TL2K210_CACHE | $XDG_CACHE_HOME/tl2k210 | ~/.cache/tl2k210
  zoo_dir()        cache_dir()/zoo: where `tl2k210 zoo build` writes and `tl2k210 demo` looks
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
BUNDLED = PACKAGE / "data"        # models/ and firmware/ inside a built wheel


def checkout() -> Path | None:
    root = PACKAGE.parent
    if (root / "pyproject.toml").is_file() and (root / "models").is_dir():
        return root
    return None


def _source(name: str) -> Path:
    root = checkout()
    return root / name if root is not None else BUNDLED / name


def models_dir() -> Path:
    return _source("models")


def firmware_dir() -> Path:
    return _source("firmware")


def import_root() -> Path:
    """The folder to put on PYTHONPATH so that a subprocess imports this same tl2k210."""
    return PACKAGE.parent


def testdata_dir() -> Path | None:
    env = os.environ.get("TL2K210_TESTDATA")
    if env:
        return Path(env)
    root = checkout()
    return root.parent / "shared" / "testdata" if root is not None else None


def testdata(*parts) -> Path | None:
    """A file or folder of the test data, or None when it is not there."""
    root = testdata_dir()
    if root is None:
        return None
    p = root.joinpath(*parts)
    return p if p.exists() else None


def cache_dir() -> Path:
    env = os.environ.get("TL2K210_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tl2k210"


def zoo_dir() -> Path:
    return cache_dir() / "zoo"
