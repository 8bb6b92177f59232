"""The board's file systems on host folders: `/flash` (SPIFFS: flat, no directories) and `/sd`
(FAT), with MicroPython 1.11's path rules (docs/maixpy-firmware.md#filesystems):

* a path without a leading `/` follows the current directory (`os.chdir`): on `/sd` it is joined
  like FAT does; on `/flash` SPIFFS turns `x` and `./x` into the flat name `x`;
* `/flash` is flat: `mkdir` raises NotImplementedError("SPIFFS not support"), `rmdir` OSError(EIO),
  `chdir('/flash/any')` is accepted and `getcwd()` stays `/flash`; a name may contain `/`;
  `listdir` of any flash path lists every file; `stat` times are 0;
* `/` is virtual: `listdir('/')` = the mounts (`['flash', 'sd']` with a card), nothing else exists;
* errors are MicroPython's: `OSError(2)` printed `[Errno 2] ENOENT`;
* the board has nothing else: every path is normalised (`..` cannot climb out of a mount, on
  /flash neither), absolute host paths are ENOENT, and a host link inside a folder that
  resolves outside it is EACCES -- a script never reaches a host file beyond the two folders.

Without a host folder for `/flash` a temporary one is used (removed by `close()`); files the
firmware writes itself (`freq.conf`, `config.json`) are served from memory, so the host folders
given by the user only ever get what the script writes.
"""
from __future__ import annotations

import errno
import os
import posixpath
import shutil
import tempfile
import threading
import weakref
from pathlib import Path

from tl2k210.k210.board_facts import FLASH_SECTOR, SPIFFS_SIZE

#: seconds from 1970-01-01 (the host's epoch) to 2000-01-01 (MicroPython's, the RTC's power-on time)
EPOCH_2000 = 946684800


def errno_name(code: int) -> str:
    """MicroPython's name of an errno (py/mperrno.h: 95 is EOPNOTSUPP, where Linux says ENOTSUP)."""
    return "EOPNOTSUPP" if code == errno.EOPNOTSUPP else errno.errorcode.get(code, str(code))


def oserror(code: int) -> OSError:
    """OSError as MicroPython raises it: args[0] is the errno, str() '[Errno 2] ENOENT', and its
    type OSError itself (MicroPython 1.11 has no subclasses; CPython's OSError(2, ...) would be
    a FileNotFoundError, which a script's type(e) shows)."""
    e = OSError()
    e.args = (code, errno_name(code))
    e.errno, e.strerror = e.args
    return e


class MpFile:
    """A host file with MicroPython's stream behaviour: binary files accept str (MicroPython's
    str has the buffer protocol), text files keep line endings as they are."""

    def __init__(self, fh, binary: bool, name: str):
        self._fh, self._binary, self.name = fh, binary, name

    def write(self, data):
        if self._binary and isinstance(data, str):
            data = data.encode()
        elif not self._binary and isinstance(data, (bytes, bytearray, memoryview)):
            data = bytes(data).decode("utf-8", "replace")
        return self._fh.write(data)

    def __getattr__(self, item):
        return getattr(self._fh, item)

    def __iter__(self):
        return iter(self._fh)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()

    def __repr__(self):
        return f"<io.{'FileIO' if self._binary else 'TextIOWrapper'} {self.name}>"


class Mount:
    def __init__(self, name: str, host, flat: bool, defaults=None):
        self.name, self.flat = name, flat
        self._host = host          # a Path, or a callable making one on first use
        self._lock = threading.Lock()   # the board's threads (REPL, line) ask at once
        self.defaults = dict(defaults or {})

    @property
    def host(self) -> Path:
        with self._lock:
            if callable(self._host):
                self._host = Path(self._host())
            return self._host

    def files(self):
        """SPIFFS: every flat name (host files, recursively, plus the firmware's own files)."""
        names = []
        for root, _dirs, fnames in os.walk(self.host):
            for f in fnames:
                rel = os.path.relpath(os.path.join(root, f), self.host).replace(os.sep, "/")
                names.append(rel)
        return sorted(set(names) | set(self.defaults))


class VFS:
    def __init__(self, sd=None, flash=None, defaults=None):
        self._tmp, self._closed = None, False
        if flash is None:
            flash = self._make_tmp
        self.mounts = {"flash": Mount("flash", flash if callable(flash) else Path(flash), True,
                                      defaults)}
        if sd is not None:
            if not Path(sd).is_dir():
                raise FileNotFoundError(f"SD folder {sd} does not exist")
            self.mounts["sd"] = Mount("sd", Path(sd), False)
        self.cwd = "/"
        self.say = print          # where SPIFFS prints its error codes (the session's stdout)
        self.note = None          # the board's host notes

    def _missing(self, path):
        """ENOENT, with a host note naming what is there instead."""
        if self.note is not None:
            a = self.abspath(path)
            parent = a.rsplit("/", 1)[0] or "/"
            try:
                have = self.listdir(parent)
                there = f"{parent} has: {', '.join(have[:12])}{' ...' if len(have) > 12 else ''}" \
                    if have else f"{parent} is empty"
            except OSError:
                there = f"there is no folder {parent}"
            self.note(f"open('{path}') -> {a}: no such file on the board ({there})", ("enoent", a))
        return oserror(errno.ENOENT)

    def _make_tmp(self):
        if self._closed:            # nothing made after close() is ever removed
            raise oserror(errno.EIO)
        self._tmp = tempfile.mkdtemp(prefix="tl2k210-flashfs-")
        # removed with the VFS, or at exit, where nobody closes it (the default board a library
        # call makes outside a session: the zoo tests' pix_to_ai left one a suite run)
        weakref.finalize(self, shutil.rmtree, self._tmp, True)
        return self._tmp

    def close(self):
        with self.mounts["flash"]._lock:
            self._closed = True
            if self._tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None

    @property
    def has_sd(self) -> bool:
        return "sd" in self.mounts

    # -- paths -------------------------------------------------------------------------------
    def abspath(self, path) -> str:
        p = os.fspath(path)
        if isinstance(p, bytes):
            p = p.decode()
        if p.startswith("/"):
            return "/" if p.strip("/") == "" else posixpath.normpath(p)
        return posixpath.normpath(posixpath.join("/flash" if self.cwd.startswith("/flash")
                                                 else self.cwd, p))

    def split(self, path):
        """(Mount or None for '/', relative name); ENOENT outside the mounts."""
        a = self.abspath(path)
        if a == "/":
            return None, ""
        top, _, rest = a[1:].partition("/")
        m = self.mounts.get(top)
        if m is None:
            raise oserror(errno.ENOENT)
        return m, rest

    @staticmethod
    def _host(m: Mount, rel: str) -> Path:
        """The host path of `rel` on mount `m`; EACCES when it resolves outside the mount's
        folder (a symlink inside that points out): the board has nothing but /flash and /sd."""
        host = m.host / rel if rel else m.host
        top = os.path.realpath(m.host)
        real = os.path.realpath(host)
        if real != top and not real.startswith(top.rstrip(os.sep) + os.sep):
            raise oserror(errno.EACCES)
        return host

    def host_path(self, path) -> Path:
        m, rel = self.split(path)
        if m is None:
            raise oserror(errno.ENOENT)
        if m.flat and rel in m.defaults and not (m.host / rel).exists():
            self._materialise(m, rel)
        return self._host(m, rel)

    def _materialise(self, m: Mount, rel: str):
        """A firmware file (served from memory) is read through the host: write it to the
        flash folder only when it is the temporary one."""
        if m.name == "flash" and m.host and self._tmp:
            (m.host / rel).parent.mkdir(parents=True, exist_ok=True)
            (m.host / rel).write_bytes(m.defaults[rel])

    # -- file API ------------------------------------------------------------------------------
    def open(self, path, mode="r", *args, **kw):
        m, rel = self.split(path)
        if m is None or rel == "":
            raise oserror(errno.EISDIR if m is not None else errno.ENOENT)
        binary = "b" in mode
        host = self._host(m, rel)
        if m.flat and rel in m.defaults and not host.exists() and "r" in mode and "+" not in mode:
            import io
            data = m.defaults[rel]
            return MpFile(io.BytesIO(data) if binary else io.StringIO(data.decode()), binary,
                          self.abspath(path))
        if any(c in mode for c in "wax"):
            if m.flat:
                host.parent.mkdir(parents=True, exist_ok=True)
                m.defaults.pop(rel, None)
            elif not host.parent.is_dir():
                raise self._missing(path)
        if host.is_dir():
            raise oserror(errno.EISDIR)
        try:
            if binary:
                fh = open(host, mode)
            else:
                fh = open(host, mode, encoding="utf-8", errors="replace", newline="")
        except FileNotFoundError:
            raise self._missing(path) from None
        except IsADirectoryError:
            raise oserror(errno.EISDIR) from None
        except PermissionError:
            raise oserror(errno.EACCES) from None
        return MpFile(fh, binary, self.abspath(path))

    def listdir(self, path=None):
        m, rel = self.split(self.cwd if path is None else path)
        if m is None:
            return sorted(self.mounts)
        if m.flat:
            return m.files()
        d = self._host(m, rel)
        if not d.is_dir():
            raise oserror(errno.ENOENT)
        return sorted(os.listdir(d))

    def ilistdir(self, path=None):
        base = self.cwd if path is None else path
        for name in self.listdir(path):
            m, rel = self.split(base)
            full = (m.host / rel / name) if m is not None else None
            kind = 0x4000 if (m is None or (full is not None and full.is_dir())) else 0x8000
            yield (name, kind, 0)

    def stat(self, path):
        m, rel = self.split(path)
        if m is None or rel == "":
            return (0x4000, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        host = self._host(m, rel)
        if m.flat and rel in m.defaults and not host.exists():
            return (0x8000, 0, 0, 0, 0, 0, len(m.defaults[rel]), 0, 0, 0)
        try:
            st = host.stat()
        except OSError:
            raise oserror(errno.ENOENT) from None
        mode = 0x4000 if host.is_dir() else 0x8000
        if m.flat:
            return (mode, 0, 0, 0, 0, 0, st.st_size, 0, 0, 0)
        t = max(0, int(st.st_mtime) - EPOCH_2000)      # FAT times, MicroPython's 2000 epoch
        return (mode, 0, 0, 0, 0, 0, st.st_size, t, t, t)

    def remove(self, path):
        m, rel = self.split(path)
        if m is None or rel == "":
            raise oserror(errno.EPERM)
        host = self._host(m, rel)
        if m.flat and rel in m.defaults and not host.exists():
            m.defaults.pop(rel)
            return
        if not host.is_file():
            if m.flat:
                self.say("[MaixPy]:SPIFFS Error Code -10002")   # SPIFFS_ERR_NOT_FOUND
            raise oserror(errno.ENOENT if not host.is_dir() else errno.EISDIR)
        host.unlink()

    def rename(self, old, new):
        m1, r1 = self.split(old)
        m2, r2 = self.split(new)
        if m1 is None or m2 is None or m1 is not m2:
            raise oserror(errno.EXDEV if (m1 and m2) else errno.ENOENT)
        src = self._host(m1, r1)
        if not src.exists():
            if m1.flat and r1 in m1.defaults:
                m1.defaults[r2] = m1.defaults.pop(r1)
                return
            raise oserror(errno.ENOENT)
        dst = self._host(m2, r2)
        if m2.flat:
            dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)

    def mkdir(self, path):
        m, rel = self.split(path)
        if m is None or rel == "":
            raise oserror(errno.EEXIST)
        if m.flat:
            raise NotImplementedError("SPIFFS not support")
        d = self._host(m, rel)
        if d.exists():
            raise oserror(errno.EEXIST)
        if not d.parent.is_dir():
            raise oserror(errno.ENOENT)
        d.mkdir()

    def rmdir(self, path):
        m, rel = self.split(path)
        if m is None or rel == "" or m.flat:
            raise oserror(errno.EIO if (m is not None and m.flat) else errno.EPERM)
        d = self._host(m, rel)
        if not d.is_dir():
            raise oserror(errno.ENOENT)
        try:
            d.rmdir()
        except OSError:
            raise oserror(errno.EACCES) from None

    def chdir(self, path):
        a = self.abspath(path)
        m, rel = self.split(a)
        if m is None:
            self.cwd = "/"
        elif m.flat:
            self.cwd = "/flash"
        else:
            if not self._host(m, rel).is_dir():
                raise oserror(errno.ENOENT)
            self.cwd = a

    def getcwd(self) -> str:
        return self.cwd

    def statvfs(self, path):
        m, _ = self.split(path)
        if m is None:
            raise oserror(errno.ENOENT)
        if m.flat:      # the SPIFFS at SPIFFS_START, 4 KiB pages
            used = sum((m.host / f).lstat().st_size for f in m.files()   # a link: its own size
                       if os.path.lexists(m.host / f))
            free = max(0, SPIFFS_SIZE - used) // FLASH_SECTOR
            return (FLASH_SECTOR, FLASH_SECTOR, SPIFFS_SIZE // FLASH_SECTOR, free, free, 0, 0, 0, 0, 255)
        st = os.statvfs(m.host)
        return (st.f_bsize, st.f_frsize, st.f_blocks, st.f_bfree, st.f_bavail, 0, 0, 0, 0, 255)

    def exists(self, path) -> bool:
        try:
            self.stat(path)
            return True
        except OSError:
            return False

    def read_bytes(self, path) -> bytes:
        with self.open(path, "rb") as f:
            return f.read()
