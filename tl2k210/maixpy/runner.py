"""Run an unchanged MaixPy script (a board's /flash/main.py) on the host.

The script's `import sensor, image, lcd, KPU ...` resolve to the host modules through an import
hook in the script's own builtins (sys.modules is not touched, so the rest of the process keeps
CPython's `time`, `os`, `gc`). `print` and `open` are the script's own too: prints are captured,
`/sd/...` and `/flash/...` paths go to host folders. The camera stops the script's endless loop
after the last photo.
"""
from __future__ import annotations

import builtins
import io
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from tl2k210.errors import Tl2k210Error
from tl2k210.maixpy import KPU, board, image, lcd, sensor, stubs


@dataclass
class RunResult:
    stdout: str                                   # what the script printed
    frames: list = field(default_factory=list)    # LCD frames, HWC uint8 RGB arrays
    pngs: list = field(default_factory=list)      # PNG paths written (when out was given)
    snapshots: int = 0                            # camera frames taken
    error: BaseException | None = None            # the script's exception (raise_errors=False)
    traceback: str = ""                           # as the MaixPy REPL would print it
    notes: list = field(default_factory=list)     # host hints (e.g. why kpu.load failed)

    @property
    def lines(self):
        return self.stdout.splitlines()


class ScriptError(Tl2k210Error):
    """The MaixPy script cannot be read or compiled."""


def _modules():
    mods = {"sensor": sensor, "image": image, "lcd": lcd, "KPU": KPU}
    mods.update(stubs.make_modules())
    return mods


def run_script(path, images=(), flash=None, out=None, max_frames=None, sd=None, fs=None,
               echo=False, raise_errors=True, button=()) -> RunResult:
    """Execute the MaixPy script at `path`: the camera yields `images` (paths or PIL images) in
    order, `kpu.load(ADDR)` reads the flash image file `flash` (default: env TL2K210_FLASH),
    `lcd.display` frames go to `out` (folder or .png), `/sd` and `/flash` map to `sd`/`fs`,
    the BOOT key (`Maix.GPIO` inputs) reads pressed (0) while the camera frames numbered in
    `button` (0-based) are the latest taken."""
    path = Path(path)
    try:
        source = path.read_text()
        code = compile(source, str(path), "exec")
    except OSError as exc:
        raise ScriptError(f"cannot read MaixPy script {path}: {exc.strerror}") from None
    except SyntaxError as exc:
        raise ScriptError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None

    b = board.Board(flash=flash, images=images, out=out, max_frames=max_frames, sd=sd, fs=fs,
                    button=button)
    captured = io.StringIO()
    mods = _modules()
    real_import, real_print, real_open = builtins.__import__, builtins.print, builtins.open

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name in mods:
            return mods[name]
        return real_import(name, globals, locals, fromlist, level)

    def _print(*args, sep=" ", end="\n", file=None, flush=False):
        if file is not None:
            return real_print(*args, sep=sep, end=end, file=file, flush=flush)
        text = sep.join(str(a) for a in args) + end
        captured.write(text)
        if echo:
            real_print(text, end="", flush=True)

    def _open(file, *args, **kw):
        return real_open(b.host_path(file) if isinstance(file, str) else file, *args, **kw)

    script_builtins = dict(vars(builtins), __import__=_import, print=_print, open=_open)
    g = {"__name__": "__main__", "__file__": str(path), "__builtins__": script_builtins}
    prev = board.install(b)
    sensor._s, lcd._s = sensor._State(), lcd._State()
    result = RunResult(stdout="")
    try:
        exec(code, g)
    except board.StopDemo:
        pass
    except Exception as exc:  # the script failed as it would on the board
        result.error = exc
        tb = traceback.extract_tb(exc.__traceback__)
        frames = [f for f in tb if f.filename == str(path)] or tb[-1:]
        result.traceback = "Traceback (most recent call last):\n" + "".join(
            f'  File "{f.filename}", line {f.lineno}, in {f.name}\n' for f in frames) + \
            f"{type(exc).__name__}: {exc}\n"
    finally:
        board.install(prev)
        result.stdout = captured.getvalue()
        result.frames, result.pngs = b.lcd_frames, b.lcd_pngs
        result.snapshots, result.notes = b.frames_taken, b.notes
    if result.error is not None and raise_errors:
        raise result.error
    return result
