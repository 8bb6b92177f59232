"""Hostile board scripts and signals on the emulated boards (issue 25, items 1 and 11).

The board has `/flash` and `/sd` and nothing else: whatever a script does with `open`, `os`/`uos`
or `sys.path` + `import`, it never reads, writes, lists, removes or imports a host file outside
the folders given for them (`..`, absolute host paths, symlinks inside that point out); it gets
MicroPython's OSError (ENOENT outside the mounts, EACCES for a link that leaves them).
"""
import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import cli_env
from tl2k210.cli import main
from tl2k210.maixpy import run_script

PY = sys.executable

# every entry a script has to the host's files, each aimed outside the board's folders;
# each line prints the errno it got (or what it reached, which is the failure)
ATTACKS = """
import os, sys
def probe(name, fn):
    try:
        r = fn()
        print(name, 'REACHED', repr(r)[:60])
    except OSError as e:
        print(name, 'errno', e.args[0])
    except ImportError:
        print(name, 'ImportError')
    except Exception as e:
        print(name, 'refused', type(e).__name__)
probe('read', lambda: open(UP + 'outside/secret.txt').read())
probe('write', lambda: open(UP + 'outside/w.txt', 'w').write('pwned'))
probe('append', lambda: open(UP + 'outside/secret.txt', 'a').write('pwned'))
probe('remove', lambda: os.remove(UP + 'outside/victim.txt'))
probe('stat', lambda: os.stat(UP + 'outside/secret.txt'))
probe('listdir', lambda: os.listdir(UP + 'outside'))
probe('rename', lambda: os.rename(UP + 'outside/victim.txt', 'got.txt'))
probe('rename-out', lambda: os.rename('mine.txt', UP + 'outside/planted.txt'))
probe('mkdir', lambda: os.mkdir(UP + 'outside/newdir'))
probe('rmdir', lambda: os.rmdir(UP + 'outside/emptydir'))
probe('chdir', lambda: (os.chdir(UP + 'outside'), os.listdir())[1])
probe('abs-host', lambda: open(OUTSIDE + '/secret.txt').read())
probe('ilistdir', lambda: list(os.ilistdir(UP + 'outside')))
probe('statvfs', lambda: os.statvfs(UP + 'outside'))
probe('uos-stat', lambda: __import__('uos').stat(UP + 'outside/secret.txt'))
probe('image', lambda: __import__('image').Image(UP + 'outside/pic.png'))
probe('kpu', lambda: __import__('KPU').load(UP + 'outside/secret.txt'))
probe('link-read', lambda: open('link.txt').read())
probe('link-write', lambda: open('link.txt', 'w').write('pwned'))
probe('link-stat', lambda: os.stat('link.txt'))
probe('link-remove', lambda: os.remove('link.txt'))
probe('linkdir-list', lambda: os.listdir('linkdir'))
probe('linkdir-read', lambda: open('linkdir/secret.txt').read())
sys.path.insert(0, UP + 'outside')
probe('import', lambda: __import__('evil'))
sys.path[0] = OUTSIDE
probe('import-abs', lambda: __import__('evil2'))
"""
EXPECT = {"read": errno.ENOENT, "write": errno.ENOENT, "append": errno.ENOENT,
          "remove": errno.ENOENT, "stat": errno.ENOENT, "listdir": errno.ENOENT,
          "rename": errno.ENOENT, "rename-out": errno.ENOENT, "mkdir": errno.ENOENT,
          "rmdir": errno.ENOENT, "chdir": errno.ENOENT, "abs-host": errno.ENOENT,
          "ilistdir": errno.ENOENT, "statvfs": errno.ENOENT, "uos-stat": errno.ENOENT,
          "image": errno.ENOENT, "kpu": "refused",
          "link-read": errno.EACCES, "link-write": errno.EACCES, "link-stat": errno.EACCES,
          "link-remove": errno.EACCES, "linkdir-list": errno.EACCES,
          "linkdir-read": errno.EACCES, "import": "ImportError", "import-abs": "ImportError"}


def _host(tmp_path, mount):
    """tmp_path/outside (the host files a script must not reach) and the board folder `mount`,
    with links inside it pointing out."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text("SECRET")
    (out / "victim.txt").write_text("keep me")
    (out / "emptydir").mkdir()
    (out / "evil.py").write_text("print('EVIL RAN')\n")
    (out / "evil2.py").write_text("print('EVIL2 RAN')\n")
    from PIL import Image
    Image.new("RGB", (8, 8)).save(out / "pic.png")
    mount.mkdir(exist_ok=True)
    (mount / "mine.txt").write_text("mine")
    (mount / "link.txt").symlink_to(out / "secret.txt")
    (mount / "linkdir").symlink_to(out)
    return out


def _script(tmp_path, out, up):
    p = tmp_path / "e.py"
    p.write_text(f"UP = {up!r}\nOUTSIDE = {str(out)!r}\n" + ATTACKS)
    return p


def _outside_untouched(out):
    assert sorted(os.listdir(out)) == ["emptydir", "evil.py", "evil2.py", "pic.png", "secret.txt",
                                       "victim.txt"]
    assert (out / "secret.txt").read_text() == "SECRET"
    assert (out / "victim.txt").read_text() == "keep me"


def _verdicts(text):
    got = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in EXPECT:
            got[parts[0]] = int(parts[2]) if parts[1] == "errno" else parts[1]
    return got


def _check(text, out, links=True, flat=True):
    """`flat`: /flash (SPIFFS), whose listdir of any path lists every flash file."""
    assert "EVIL" not in text and "SECRET" not in text and "pwned" not in text, text
    assert "victim.txt" not in text and "evil.py" not in text, text
    got = _verdicts(text)
    want = {k: v for k, v in EXPECT.items() if links or not k.startswith("link")}
    if flat and links:
        want["linkdir-list"] = "REACHED"
    assert {k: got.get(k) for k in want} == want, text
    _outside_untouched(out)


@pytest.mark.parametrize("mount", ["flash", "sd"])
def test_scripts_stay_inside_the_board_folders(mount, tmp_path):
    folder = tmp_path / mount
    out = _host(tmp_path, folder)
    for up in ("../", "./../", "/" + mount + "/../", "a/../../"):
        res = run_script(_script(tmp_path, out, up), raise_errors=False,
                         **({"fs": folder} if mount == "flash" else {"sd": folder}))
        assert res.error is None, res.traceback
        _check(res.stdout, out, flat=mount == "flash")


def test_demo_flash_fs_is_confined(tmp_path, capsys):
    ffs = tmp_path / "ffs"
    out = _host(tmp_path, ffs)
    rc = main(["demo", str(_script(tmp_path, out, "../")), "--flash-fs", str(ffs),
               "--out", str(tmp_path / "lcd.png")])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    _check(cap.out, out)


def test_demo_without_flash_fs_is_confined(tmp_path, capsys, monkeypatch):
    """Without --flash-fs /flash is a temporary folder: `..` there is /tmp, still off limits."""
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = _host(tmp_path, tmp_path / "unused")
    rc = main(["demo", str(_script(tmp_path, out, "../")), "--out", str(tmp_path / "lcd.png")])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    _check(cap.out, out, links=False)
    assert not list(tmp_path.glob("tl2k210-flashfs-*"))


def test_a_board_made_outside_a_session_leaves_no_flash_folder(tmp_path, monkeypatch):
    """A MaixPy call outside a session (an image's pix_to_ai in a test) makes a default board,
    whose temporary /flash nobody closes: it goes with the board (and at exit)."""
    import gc
    import tempfile

    from tl2k210.maixpy import board
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    b = board.Board()
    assert b.vfs.read_bytes("/flash/freq.conf") and list(tmp_path.glob("tl2k210-flashfs-*"))
    del b
    gc.collect()
    assert not list(tmp_path.glob("tl2k210-flashfs-*"))


def test_repl_exec_is_confined(tmp_path):
    from tl2k210.maixpy.repl import Repl
    from tl2k210.maixpy.repl_board import ReplBoard
    fs = tmp_path / "fs"
    out = _host(tmp_path, fs)
    src = f"UP = '../'\nOUTSIDE = {str(out)!r}\n" + ATTACKS
    with ReplBoard(fs=str(fs)) as b, Repl.open(b.port) as r:
        assert b.wait_idle()
        r.enter_raw()
        text, err = r.exec(src)
    assert not err, err
    _check(text.decode(), out)


# ---- 11: signals and the temporary /flash of board --pty ------------------------------------
def _restore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _board(tmp_path, *extra):
    env = dict(cli_env(), TMPDIR=str(tmp_path))
    return subprocess.Popen([PY, "-m", "tl2k210.cli", "board", "--pty", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_restore_sigint)


def _wait_ready(p):
    line = p.stdout.readline()
    assert "emulated" in line, line + p.stderr.read()


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
@pytest.mark.parametrize("maixpy", [True, False])
def test_board_pty_exits_with_the_signal(sig, code, maixpy, tmp_path):
    extra = ["--maixpy"] if maixpy else ["--flash", str(tmp_path / "flash.bin")]
    p = _board(tmp_path, *extra)
    try:
        _wait_ready(p)
        time.sleep(0.3)
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == code, err
    assert "Traceback" not in err, err
    assert not list(tmp_path.glob("tl2k210-flashfs-*"))


def test_board_maixpy_leaves_no_temporary_flash(tmp_path):
    for _ in range(4):
        p = _board(tmp_path, "--maixpy", "--for", "0.3")
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert not list(tmp_path.glob("tl2k210-flashfs-*")), out
    for _ in range(4):
        p = _board(tmp_path, "--maixpy")
        _wait_ready(p)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        assert not list(tmp_path.glob("tl2k210-flashfs-*"))


def test_host_folder_tempdir_is_made_once_under_threads(tmp_path, monkeypatch):
    """The lazily made /flash folder: many threads asking at once get one folder."""
    import tempfile
    import threading

    from tl2k210.maixpy.vfs import VFS
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    v = VFS()
    made = []
    real = tempfile.mkdtemp

    def slow(*a, **k):
        time.sleep(0.05)
        made.append(real(*a, **k))
        return made[-1]
    monkeypatch.setattr(tempfile, "mkdtemp", slow)
    ts = [threading.Thread(target=lambda: v.host_path("/flash")) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    v.close()
    assert len(made) == 1
    assert not list(tmp_path.glob("tl2k210-flashfs-*"))
    v = VFS()
    v.close()
    with pytest.raises(OSError):        # closed before use: no temporary folder to leak
        v.host_path("/flash/x")
    assert not list(tmp_path.glob("tl2k210-flashfs-*"))
