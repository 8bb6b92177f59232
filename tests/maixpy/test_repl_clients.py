"""Real clients, unchanged, as subprocesses against the emulated MaixPy board: mpremote (fs cp,
fs ls, run, exec) and adafruit-ampy (put, ls, run), files byte-exact on the board's folders;
then tl2k210's own `repl` verbs and `board --maixpy --pty` run as a program.

A pty has no DTR/RTS: pyserial ignores ENOTTY when it opens one and mpremote catches it when it
closes, and ampy does not touch the lines, so no line shim is needed (unlike kflash)."""
import os
import random
import re
import subprocess
import sys

import pytest

from repl_helpers import b, board, client_env  # noqa: F401 (b: a fixture)

BLOB = random.Random(7).randbytes(20_000) + bytes(range(256)) * 8      # every byte value
SCRIPT = b"import uos\nprint('cwd', uos.getcwd())\nfor i in range(3):\n    print('sq', i * i)\n"


def _have(mod):
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


needs_mpremote = pytest.mark.skipif(not _have("mpremote"), reason="pip install mpremote")
needs_ampy = pytest.mark.skipif(not _have("ampy"), reason="pip install adafruit-ampy")


def run(args, timeout=120, **kw):
    p = subprocess.run(args, capture_output=True, timeout=timeout, env=client_env(), **kw)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


@pytest.fixture
def files(tmp_path):
    (tmp_path / "blob.bin").write_bytes(BLOB)
    (tmp_path / "script.py").write_bytes(SCRIPT)
    return tmp_path


@needs_mpremote
def test_mpremote_fs_cp_ls_run_exec(b, files):
    mp = [sys.executable, "-m", "mpremote", "connect", b.port]
    rc, out, err = run(mp + ["fs", "cp", str(files / "blob.bin"), ":blob.bin"])
    assert rc == 0, err
    assert (b.sd / "blob.bin").read_bytes() == BLOB            # relative: the board's cwd /sd
    rc, out, err = run(mp + ["fs", "cp", str(files / "blob.bin"), ":/flash/b2.bin"])
    assert rc == 0 and (b.fs / "b2.bin").read_bytes() == BLOB, err
    rc, out, err = run(mp + ["fs", "cp", str(files / "blob.bin"), ":blob.bin"])
    assert rc == 0 and "Up to date" in out                     # its sha256 check, on uhashlib
    rc, out, err = run(mp + ["fs", "ls", ":/sd"])
    assert rc == 0 and re.search(r"\bblob\.bin\b", out), out
    rc, out, err = run(mp + ["fs", "ls", ":/flash"])
    assert rc == 0 and "b2.bin" in out and "freq.conf" in out, out
    rc, out, err = run(mp + ["run", str(files / "script.py")])
    assert rc == 0 and out.replace("\r\n", "\n") == "cwd /sd\nsq 0\nsq 1\nsq 4\n", (out, err)
    rc, out, err = run(mp + ["exec", "import sys; print(sys.platform, 6 * 7)"])
    assert rc == 0 and out.strip() == "MaixPy 42", (out, err)
    rc, out, err = run(mp + ["exec", "1/0"])
    assert rc == 1 and "ZeroDivisionError: divide by zero" in out + err
    rc, out, err = run(mp + ["fs", "cp", ":/flash/b2.bin", str(files / "back.bin")])
    assert rc == 0 and (files / "back.bin").read_bytes() == BLOB, err


@needs_mpremote
def test_mpremote_uses_raw_paste_where_the_board_has_it(tmp_path, files):
    bd = board(tmp_path, raw_paste=True)
    try:
        assert bd.wait_idle()
        mp = [sys.executable, "-m", "mpremote", "connect", bd.port]
        rc, out, err = run(mp + ["fs", "cp", str(files / "blob.bin"), ":/sd/p.bin"])
        assert rc == 0, err
        assert (bd.sd / "p.bin").read_bytes() == BLOB
        assert b"R\x01" in bd.output_log                       # it took the raw-paste path
    finally:
        bd.close()


@needs_ampy
@pytest.mark.slow                      # ampy writes 32 bytes per command: ~15 s
def test_ampy_put_ls_run(b, files):
    ampy = [sys.executable, "-m", "ampy.cli", "-p", b.port]
    rc, out, err = run(ampy + ["put", str(files / "blob.bin")])
    assert rc == 0, err
    assert (b.sd / "blob.bin").read_bytes() == BLOB
    rc, out, err = run(ampy + ["put", str(files / "script.py"), "/flash/script.py"])
    assert rc == 0 and (b.fs / "script.py").read_bytes() == SCRIPT, err
    rc, out, err = run(ampy + ["ls"])
    assert rc == 0 and out.split() == ["/flash", "/sd"], out
    rc, out, err = run(ampy + ["ls", "-l", "/sd"])
    assert rc == 0 and f"/sd/blob.bin - {len(BLOB)} bytes" in out, out
    rc, out, err = run(ampy + ["run", str(files / "script.py")])
    assert rc == 0 and out.replace("\r\n", "\n") == "cwd /sd\nsq 0\nsq 1\nsq 4\n", (out, err)


def test_tl2k210_repl_verbs(b, files):
    tl = [sys.executable, "-m", "tl2k210.cli", "repl"]
    rc, out, err = run(tl + ["put", str(files / "blob.bin"), str(files / "script.py"),
                             "--to", "/flash", "-p", b.port])
    assert rc == 0, err
    assert (b.fs / "blob.bin").read_bytes() == BLOB and (b.fs / "script.py").read_bytes() == SCRIPT
    assert "blob.bin -> /flash/blob.bin" in out and "verified" in out
    rc, out, err = run(tl + ["put", str(files / "blob.bin"), "--to", "/flash", "-p", b.port])
    assert rc == 0 and "up to date" in out
    rc, out, err = run(tl + ["ls", "/flash", "-p", b.port])
    assert rc == 0 and re.search(rf"\b{len(BLOB)} blob\.bin", out), out
    rc, out, err = run(tl + ["run", str(files / "script.py"), "-p", b.port])
    assert rc == 0 and out == "cwd /sd\nsq 0\nsq 1\nsq 4\n", (out, err)
    rc, out, err = run(tl + ["exec", "print(sum(range(10)))", "-p", b.port])
    assert rc == 0 and out == "45\n"
    rc, out, err = run(tl + ["exec", "open('/sd/none')", "-p", b.port])
    assert rc == 1 and "OSError: [Errno 2] ENOENT" in err
    rc, out, err = run(tl + ["get", "/flash/blob.bin", str(files / "got.bin"), "-p", b.port])
    assert rc == 0 and (files / "got.bin").read_bytes() == BLOB
    rc, out, err = run(tl + ["put", str(files / "blob.bin"), "--to", "/flash", "--as", "fast.bin",
                             "-b", "1500000", "-p", b.port])
    assert rc == 0 and (b.fs / "fast.bin").read_bytes() == BLOB, err
    assert b.stats.bauds == [1500000, 115200] and b.baud == 115200
    rc, out, err = run(tl + ["rm", "/flash/fast.bin", "-p", b.port])
    assert rc == 0 and not (b.fs / "fast.bin").exists()
    rc, out, err = run(tl + ["put", str(files / "blob.bin"), "--as", "p.bin", "--progress",
                             "-p", b.port])
    assert rc == 0 and re.search(r"p\.bin +\[=+\] +100\.0% .* KiB/s", err), err  # TTY-only bar


def test_tl2k210_repl_errors_say_why(tmp_path, files):
    tl = [sys.executable, "-m", "tl2k210.cli", "repl"]
    rc, out, err = run(tl + ["ls", "-p", str(tmp_path / "ttyUSB7")])
    assert rc == 2 and "does not exist" in err and "Traceback" not in err
    bd = board(tmp_path, sd=False)
    try:
        assert bd.wait_idle()
        rc, out, err = run(tl + ["put", str(files / "blob.bin"), "--to", "/sd", "-p", bd.port])
        assert rc == 2 and "no SD card" in err and "Traceback" not in err
    finally:
        bd.close()


def test_board_maixpy_pty_program(tmp_path, files):
    sd = tmp_path / "card"
    sd.mkdir()
    (sd / "main.py").write_text("print('hello from main.py')\n")
    p = subprocess.Popen([sys.executable, "-m", "tl2k210.cli", "board", "--maixpy", "--pty",
                          "--sd", str(sd), "--for", "60"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=client_env())
    try:
        first = p.stdout.readline().decode()
        port = re.search(r"on (\S+) \(REPL 115200", first).group(1)
        tl = [sys.executable, "-m", "tl2k210.cli", "repl"]
        rc, out, err = run(tl + ["put", str(files / "blob.bin"), "-p", port])
        assert rc == 0 and (sd / "blob.bin").read_bytes() == BLOB, err
        if _have("mpremote"):
            rc, out, err = run([sys.executable, "-m", "mpremote", "connect", port, "fs", "ls"])
            assert rc == 0 and "blob.bin" in out and "main.py" in out, (out, err)
    finally:
        p.terminate()
        p.wait(timeout=30)


def _wait_for(pred, timeout=60.0, what="condition"):
    import time
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def _readline(stream, timeout=60.0):
    import select
    r, _, _ = select.select([stream], [], [], timeout)
    assert r, "no output from the client"
    return stream.readline().decode("utf-8", "replace")


def test_ctrl_c_in_repl_exec_interrupts_the_board_code(b):
    """Ctrl-C on the host sends Ctrl-C to the board: the loop stops with KeyboardInterrupt, the
    command exits 130 and the board is back at its raw prompt for the next command."""
    import signal
    code = "n = 0\nwhile True:\n    n += 1\n    if n == 1000:\n        print('started')\n"
    p = subprocess.Popen([sys.executable, "-m", "tl2k210.cli", "repl", "exec", code, "-p", b.port],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=client_env())
    try:
        assert _readline(p.stdout) == "started\n"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130 and "KeyboardInterrupt" in err.decode(), err
    assert b.stats.interrupts == 1
    rc, out, err = run([sys.executable, "-m", "tl2k210.cli", "repl", "exec", "print(n >= 1000)",
                        "-p", b.port])
    assert rc == 0 and out == "True\n", (out, err)     # same board session: n survived


def test_ctrl_c_during_put_then_the_same_put_resumes(b, files):
    import signal
    b.throttle = True                                  # real-time line: the put takes seconds
    tl = [sys.executable, "-m", "tl2k210.cli", "repl", "put", str(files / "blob.bin"), "-p",
          b.port]
    p = subprocess.Popen(tl, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=client_env())
    try:
        _wait_for(lambda: b.stats.rx_bytes > 16_000, what="the upload to start")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    err = err.decode()
    assert p.returncode == 130 and "blob.bin.part" in err and "resumes from it" in err, err
    assert not (b.sd / "blob.bin").exists()
    b.throttle = False
    rc, out, err = run(tl)
    assert rc == 0, err
    start = int(re.search(r"resumed from byte (\d+), verified", out).group(1))
    assert 0 < start < len(BLOB) and (b.sd / "blob.bin").read_bytes() == BLOB


def test_repl_reset_soft_reboots_into_main_py(tmp_path):
    (tmp_path / "sd").mkdir()
    (tmp_path / "sd" / "main.py").write_text("print('hello from main.py')\n")
    bd = board(tmp_path)
    try:
        assert bd.wait_idle()
        rc, out, err = run([sys.executable, "-m", "tl2k210.cli", "repl", "reset", "-p", bd.port])
        assert rc == 0, err
        assert "soft reboot" in out and "hello from main.py" in out, out
        assert bd.stats.soft_resets == 1
    finally:
        bd.close()


def test_board_maixpy_pty_line_faults(tmp_path, files):
    """`board --maixpy --pty --fault-rate R --seed S`: the line damages bytes, the verified put
    still lands byte-exact, and the board reports the faults it injected when it stops."""
    import signal
    sd = tmp_path / "card"
    sd.mkdir()
    p = subprocess.Popen([sys.executable, "-m", "tl2k210.cli", "board", "--maixpy", "--pty",
                          "--sd", str(sd), "--fault-rate", "0.002", "--seed", "5", "--for", "120"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=client_env())
    try:
        port = re.search(r"on (\S+) \(REPL 115200", _readline(p.stdout)).group(1)
        (files / "small.bin").write_bytes(BLOB[-8192:])
        rc, out, err = run([sys.executable, "-m", "tl2k210.cli", "repl", "put",
                            str(files / "small.bin"), "-p", port])
        assert rc == 0 and (sd / "small.bin").read_bytes() == BLOB[-8192:], err
        retries = int(re.search(r"(\d+) retries", out).group(1))
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=60)
    finally:
        p.kill()
    faults = eval(re.search(rb"line faults (\{.*?\})", out).group(1))
    assert sum(faults.values()) >= 20 and retries >= 1, (faults, retries)
