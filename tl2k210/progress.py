"""A one-line progress bar on stderr for long work (flash writes, REPL uploads, batch runs)."""
import sys
import time


class Progress:
    """A one-line progress bar with a rate on a stream (stderr by default). `unit` "B" counts
    bytes (the rate in KiB/s); any other unit counts things ("items": items/s)."""

    def __init__(self, enabled, stream=None, width=30, unit="B"):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.width = width
        self.unit = unit
        self.label, self.total, self.t0, self._last, self.base = "", 0, 0.0, 0.0, 0

    def start(self, label, total, done=0):
        """A new bar; `done`: bytes already there (a resumed upload), not counted in the rate."""
        self.label, self.total, self.t0, self._last = label, total, time.monotonic(), 0.0
        self.base = done
        self.update(done)

    def update(self, done, force=False):
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1 and done < self.total:
            return
        self._last = now
        frac = done / self.total if self.total else 1.0
        rate = (done - self.base) / (now - self.t0) if now > self.t0 else 0.0
        bar = "=" * int(frac * self.width)
        speed = f"{rate / 1024:7.1f} KiB/s" if self.unit == "B" else f"{rate:7.1f} {self.unit}/s"
        self.stream.write(f"\r{self.label:<18} [{bar:<{self.width}}] {frac * 100:5.1f}% "
                          f"{done}/{self.total} {self.unit} {speed}")
        if done >= self.total:
            self.stream.write("\n")
        self.stream.flush()
