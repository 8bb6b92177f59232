"""Run unchanged MaixPy scripts (a board's main.py, or a whole SD-card folder) on the host.

    res = run_script("firmware/face_detect.py", images=["photo.jpg"], flash="flash.bin",
                     out="out/", runtime="maixpy")
    res = run_folder("card/", images=[...])      # /sd = card/: _boot.py, boot.py, main.py
    res.stdout, res.lines, res.frames, res.texts, res.notes, res.traceback, res.board

Both build a `runtime.Session` (one emulated board), boot it like the firmware (cwd /sd when an
SD folder is given, else /flash) and run the script as main.py. The run ends when the script
ends, raises (its MicroPython traceback is in `res.traceback`), calls sys.exit(), the camera has
shown every photo, or the watchdog (`timeout`) fires.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tl2k210.errors import Tl2k210Error
from tl2k210.maixpy import board as _board
from tl2k210.maixpy.runtime import Session


@dataclass
class RunResult:
    stdout: str                                   # what the script printed (board serial output)
    frames: list = field(default_factory=list)    # LCD frames, HWC uint8 RGB arrays
    pngs: list = field(default_factory=list)      # PNG paths written (when out was given)
    texts: list = field(default_factory=list)     # per frame: [(x, y, text)] shown on it
    snapshots: int = 0                            # camera frames taken
    error: BaseException | None = None            # the script's exception (raise_errors=False)
    traceback: str = ""                           # as the MaixPy REPL prints it
    notes: list = field(default_factory=list)     # host hints (why a board-side error happened)
    stop: str = ""                                # why the run ended: "end", "camera", "timeout", ...
    stop_reason: str = ""
    board_ms: float = 0.0                         # board clock at the end (ms since power-on)
    boot: str = ""                                # what the firmware printed before main.py
    board: object = None                          # the Board (gpio_log, uart_log, ...)
    printed: bool = False                         # the traceback is in stdout already (boot run)

    @property
    def lines(self):
        return self.stdout.splitlines()


class ScriptError(Tl2k210Error):
    """The MaixPy script cannot be read."""


def run_script(path, images=(), flash=None, out=None, max_frames=None, sd=None, fs=None,
               echo=False, raise_errors=True, button=(), runtime="maixpy", wall_clock=False,
               timeout=60.0, camera="ov2640", on_output=None, board="maix") -> RunResult:
    """Execute the MaixPy script at `path` (a host file) as the board's main.py: the camera
    yields `images` (paths or PIL images) in order, `kpu.load(ADDR)` reads the flash image file
    `flash`, `lcd.display` frames go to `out` (folder or .png), `/sd` and `/flash` are the host
    folders `sd`/`fs`, the BOOT key reads pressed (0) while the camera frames numbered in
    `button` (0-based) are the latest taken."""
    path = Path(path)
    try:
        source = path.read_bytes().decode("utf-8", "replace")
    except OSError as exc:
        raise ScriptError(f"cannot read MaixPy script {path}: {exc.strerror}") from None
    return _run(lambda s: s.exec(source, path.name), images, flash, out, max_frames, sd, fs, echo,
                raise_errors, button, runtime, wall_clock, timeout, camera, on_output,
                boot_main=False, board=board)


def run_folder(folder, images=(), flash=None, out=None, max_frames=None, fs=None, echo=False,
               raise_errors=True, button=(), runtime="maixpy", wall_clock=False, timeout=60.0,
               camera="ov2640", on_output=None, on="sd", board="maix") -> RunResult:
    """Boot a board whose SD card (or, with on="flash", /flash) is the host `folder`: the
    firmware's _boot.py, then the folder's boot.py and main.py."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ScriptError(f"no folder {folder}")
    sd, fs = (folder, fs) if on == "sd" else (None, folder)
    return _run(None, images, flash, out, max_frames, sd, fs, echo, raise_errors, button, runtime,
                wall_clock, timeout, camera, on_output, boot_main=True, board=board)


def _run(main, images, flash, out, max_frames, sd, fs, echo, raise_errors, button, runtime,
         wall_clock, timeout, camera, on_output, boot_main, board="maix"):
    from tl2k210.maixpy import lcd
    b = _board.Board(flash=flash, images=images, out=out, max_frames=max_frames, sd=sd, fs=fs,
                     button=button, runtime=runtime, wall_clock=wall_clock, timeout=timeout,
                     camera=camera, board=board)
    s = Session(b, echo=echo, on_output=on_output)
    result = RunResult(stdout="", board=b)
    before, boots = "", ""        # what the sessions a machine.reset() ended printed
    try:
        try:
            while True:
                try:
                    err = s.boot(run_main=boot_main)
                    break
                except _board.BoardStop as stop:
                    if stop.kind != "reset" or not boot_main or b.reboots >= _board.MAX_REBOOTS:
                        raise
                    before, boots = before + s.output(), boots + s.boot_out.getvalue()
                    if s.baton is not None:
                        s.baton.close()         # its threads end with the board's RAM
                    b.reboot()
                    b.reboots += 1
                    s = Session(b, echo=echo, on_output=on_output)
            if main is not None:
                main(s)
            elif err is not None:
                result.error, result.printed = err, True
            result.stop = "end"
        except _board.BoardStop as stop:
            result.stop, result.stop_reason = stop.kind, stop.reason
        except SystemExit:
            result.stop = "exit"
        except Exception as exc:                  # the script failed as it would on the board
            result.error = exc
            result.stop = "error"
        if result.error is not None:
            result.traceback = s.format_exception(result.error)
            for n in getattr(result.error, "host_note", "") and [result.error.host_note] or []:
                b.note(n)
        if isinstance(result.error, _board.BoardStop):
            result.error = None
    finally:
        with _board.installed(b):
            lcd.flush(b)
        result.stdout = before + s.output()
        result.boot = boots + s.boot_out.getvalue()
        result.frames, result.pngs, result.texts = b.lcd_frames, b.lcd_pngs, b.lcd_texts
        result.snapshots, result.notes = b.frames_taken, b.notes
        result.board_ms = b.clock.now_us() / 1000
        s.close()
    if result.error is not None and raise_errors:
        raise result.error
    return result
