"""The `repl` client against a port that misbehaves (issue 25, item 10): every REPL operation
has an overall deadline (`--timeout`), so a port that answers the raw-REPL prompt and `OK`, then
streams bytes without ever ending the reply, costs seconds, not forever: exit 2 saying what it
saw."""
import os
import threading
import time
import tty

import pytest

from tl2k210.cli import main
from tl2k210.maixpy.repl import RAW_BANNER


class Chatty:
    """A pty that plays a raw REPL which never ends a reply: Ctrl-A gets the raw prompt, a
    command's Ctrl-D gets `OK`, then `spam` bytes follow every 20 ms for ever."""

    def __init__(self):
        self.master, slave = os.openpty()
        tty.setraw(self.master)
        tty.setraw(slave)
        self.port = os.ttyname(slave)
        self.slave = slave
        self.running = True
        self.spam = False
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()

    def _loop(self):
        os.set_blocking(self.master, False)
        while self.running:
            try:
                data = os.read(self.master, 4096)
            except BlockingIOError:
                data = b""
            except OSError:
                return
            if b"\x01" in data:
                self.spam = False
                os.write(self.master, RAW_BANNER + b">")
            elif b"\x05" in data:
                os.write(self.master, RAW_BANNER + b">")         # no raw paste (MicroPython 1.11)
            elif b"\x04" in data:
                os.write(self.master, b"OK")
                self.spam = True
            if self.spam:
                os.write(self.master, b"still going ")
            time.sleep(0.02)

    def close(self):
        self.running = False
        self.t.join(2)
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def chatty():
    c = Chatty()
    yield c
    c.close()


@pytest.mark.parametrize("argv", [["ls"], ["rm", "/flash/x.py"], ["exec", "print(1)"]])
def test_repl_gives_up_at_its_deadline(argv, chatty, capsys):
    t0 = time.monotonic()
    rc = main(["repl", *argv, "-p", chatty.port, "--timeout", "2"])
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 2, err
    assert took < 20, took
    last = err.strip().splitlines()[-1]
    assert "still going" in last and "--timeout" in last, last
    assert "Traceback" not in err


def test_repl_timeout_has_a_default(chatty):
    """Without --timeout every operation still has the client's default deadline."""
    from tl2k210.cli import build_parser
    from tl2k210.maixpy import repl
    from tl2k210.cli.repl import connect
    assert 0 < repl.TIMEOUT <= 60
    args = build_parser(only="repl").parse_args(["repl", "ls", "-p", chatty.port])
    with connect(args) as r:
        assert r.timeout == repl.TIMEOUT
