"""Side-by-side trials: tl2k210 and stock kflash 1.1.6 flashing the same image to fresh emulated
boards, with seeded line faults or a throttled line. Used by the fault tests and bench/flash.py.

Each client runs as a subprocess (the way users run it); kflash's DTR/RTS reach the board through
the sitecustomize line shim. A client that does not finish within its time limit (kflash retries
some errors forever) counts as "did not report success".
"""
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from tl2k210 import paths
from tl2k210.flash import image as fw_image
from tl2k210.flash.emulated_board import EmulatedBoard, FaultConfig
from tl2k210.flash.transport import shim_env

TOOLS = ("tl2k210", "kflash")


@dataclass
class Outcome:
    tool: str
    rate: float
    seed: int
    reported_success: bool
    exact: bool
    status: str                # exact | silent_corruption | failed | timeout | failed_but_exact
    message: str
    seconds: float
    faults: dict = field(default_factory=dict)

    def as_dict(self):
        return asdict(self)


def _env(board):
    env = shim_env(board.lines_socket)
    env["PYTHONPATH"] = env["PYTHONPATH"] + os.pathsep + str(paths.import_root())
    return env


def command(tool, port, file, baud, board_name="dan"):
    if tool == "tl2k210":
        return [sys.executable, "-m", "tl2k210.cli", "flash", "-p", port, "-B", board_name,
                "-b", str(baud), file]
    if tool == "kflash":
        return [sys.executable, "-m", "kflash", "-p", port, "-B", board_name, "-b", str(baud),
                "-n", file]
    raise ValueError(tool)


def run_client(tool, board, file, baud, timeout, board_name="dan"):
    """Returns (reported_success, last message, seconds, timed_out)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(command(tool, board.port, file, baud, board_name), env=_env(board),
                           capture_output=True, text=True, timeout=timeout)
        out = (p.stdout + p.stderr).strip().splitlines()
        return p.returncode == 0, (out[-1] if out else ""), time.monotonic() - t0, False
    except subprocess.TimeoutExpired:
        return False, f"no result after {timeout:.0f} s (killed)", time.monotonic() - t0, True


def booted_image_is(board, fw, size) -> bool:
    """Does the emulated board's flash at 0 hold exactly the firmware `fw` (its envelope unwraps)?"""
    try:
        return fw_image.unwrap(board.flash_bytes(0, size + 64)) == fw
    except fw_image.ImageError:
        return False


def fault_trial(tool, rate, seed, size=256 * 1024, baud=1_500_000, kinds=("corrupt", "drop"),
                timeout=None, workdir=None):
    """Flash a ``size``-byte firmware at 0 through a line that corrupts/drops host->board bytes
    at ``rate`` per byte; classify the outcome from the emulated flash file."""
    import random

    timeout = timeout or (60.0 if tool == "tl2k210" else 6.0)
    with tempfile.TemporaryDirectory(dir=workdir, prefix="trial-") as tmp:
        fw = random.Random(1000 + seed).randbytes(size)
        path = os.path.join(tmp, "fw.bin")
        with open(path, "wb") as fh:
            fh.write(fw)
        board = EmulatedBoard(os.path.join(tmp, "flash.bin"), wiring="dan",
                              faults=FaultConfig(rate=rate, seed=seed, kinds=tuple(kinds)))
        with board:
            ok, msg, secs, timed_out = run_client(tool, board, path, baud, timeout)
            time.sleep(0.02)
            exact = booted_image_is(board, fw, size)
            faults = dict(board.stats.faults)
    if ok:
        status = "exact" if exact else "silent_corruption"
    else:
        status = "timeout" if timed_out else ("failed_but_exact" if exact else "failed")
    return Outcome(tool, rate, seed, ok, exact, status, msg, round(secs, 3), faults)


def summarize(outcomes):
    """{(tool, rate): counts}"""
    table = {}
    for o in outcomes:
        row = table.setdefault((o.tool, o.rate), {"runs": 0, "exact": 0, "silent_corruption": 0,
                                                  "failed": 0, "timeout": 0,
                                                  "failed_but_exact": 0})
        row["runs"] += 1
        row[o.status] += 1
    return table


def main(argv=None):   # python -m tl2k210.flash.trials [seeds]
    seeds = int((argv or sys.argv[1:] or ["20"])[0])
    outs = [fault_trial(t, r, s) for r in (1e-5, 1e-4) for t in TOOLS for s in range(seeds)]
    for (tool, rate), row in summarize(outs).items():
        print(f"{tool:8} rate {rate:g}: {row}")


if __name__ == "__main__":
    main()
