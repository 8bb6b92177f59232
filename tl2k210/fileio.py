"""Files in and out, the one way every verb treats them.

* ``check_outputs`` runs *before* any work: an output that resolves to an input (the same path,
  a hard link or a symlink), or to another output, is refused; so is a folder, a missing or
  unwritable folder, a read-only filesystem, a block device.
* ``atomic_write`` writes a temporary file next to the target and renames it: never a half-written
  file. New files follow the umask (as ``open()`` would), a replaced file keeps its mode.
  Character devices and FIFOs (``-o /dev/stdout``, ``-o /dev/null``) are streamed to instead:
  renaming a file over ``/dev/null`` would replace the device.
* ``read_bytes`` reads at most ``limit`` bytes (``/dev/zero`` ends), with messages for folders and
  missing files.
* ``lfs_pointer`` says what a Git LFS pointer is (a clone without `git lfs` holds these ~130-byte
  text files where the models should be).
"""
from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from tl2k210.errors import InputFileError, OutputPathError

TEMP_PREFIX = ".tl2k210-"
# files a verb reads from an input folder (dataset, SavedModel, zoo recipe): never replaced
READ_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".npy", ".npz", ".pb", ".onnx", ".tflite", ".h5",
                 ".keras", ".py", ".toml", ".index", ".txt")


def _stat(path):
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def _lstat(path):
    try:
        return os.lstat(path)
    except (OSError, ValueError):
        return None


def same_file(a, b) -> bool:
    """True when `a` and `b` name the same file (same path, hard link or symlink)."""
    sa, sb = _stat(a), _stat(b)
    return sa is not None and sb is not None and (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _inside(path, folder) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real != top and real.startswith(top.rstrip(os.sep) + os.sep)


def _hard_link_in(path, folder, limit=100_000):
    """Another name of file `path` inside `folder` (searched to `limit` entries), if any."""
    st = _stat(path)
    if st is None or st.st_nlink < 2 or not stat.S_ISREG(st.st_mode):
        return None
    seen, real = 0, os.path.realpath(path)
    for top, _, files in os.walk(folder):
        for name in files:
            p = os.path.join(top, name)
            f = _stat(p)
            if f is not None and (f.st_dev, f.st_ino) == (st.st_dev, st.st_ino) and \
                    os.path.realpath(p) != real:
                return p
            seen += 1
            if seen >= limit:
                return None
    return None


def _umask() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _why(exc: OSError) -> str:
    if exc.errno == errno.EROFS:
        return "read-only filesystem"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOSPC:
        return "no space left on the device"
    if exc.errno == errno.ENOENT:
        return "this folder does not accept new files (a virtual filesystem?)"
    return exc.strerror or str(exc)


def _nearest_folder(path, label, shown):
    """The nearest existing ancestor folder of `path` (refusing a file on the way)."""
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise OutputPathError(f"{label} {shown}: {probe} is not a folder; choose a path in an "
                              "existing folder")
    return probe


def _probe(folder, label, shown):
    """Create and remove a temporary file in `folder`: what the write will need."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise OutputPathError(f"cannot write {label} {shown}: {folder}: {_why(exc)}; choose a path "
                              "in a writable folder") from None


def check_writable(path, label: str = "output", make_parents: bool = False):
    """Refuse an output path that cannot be written, before the work starts (`make_parents`:
    its missing folders will be created)."""
    p = os.fspath(path)
    if not p:
        raise OutputPathError(f"{label}: empty path; give a file name")
    st = _stat(p)
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputPathError(f"{label} {p} is a folder; give a file name, e.g. "
                                  f"{os.path.join(p, 'out' + os.path.splitext(p)[1])}")
        if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            return                                  # streamed to (see atomic_write)
        if not stat.S_ISREG(st.st_mode):
            raise OutputPathError(f"{label} {p} is a device or socket, not a file; choose a file "
                                  "name")
    folder = os.path.dirname(os.path.realpath(p))
    near = _nearest_folder(folder, label, p)
    if near != folder and not make_parents:
        raise OutputPathError(f"{label} {p}: the folder {folder} does not exist; create it "
                              f"(mkdir -p {folder}) or choose another path")
    _probe(near, label, p)
    if st is not None and not os.access(p, os.W_OK):
        raise OutputPathError(f"{label} {p} is read-only; make it writable (chmod u+w) or choose "
                              "another name")


SIDECAR_SUFFIX = ".json"      # a kmodel's metadata: face_detect.kmodel -> face_detect.kmodel.json


def sidecar_path(kmodel_path) -> Path:
    """Where a kmodel's metadata lives (tl2k210.metadata reads and writes it)."""
    return Path(str(kmodel_path) + SIDECAR_SUFFIX)


def check_outputs(outputs, inputs=()):
    """`outputs`: [(label, path)] (None paths skipped); `inputs`: paths (files or folders) the
    command reads. Refuses, before any work, an output that is an input or another output, an
    existing output inside an input folder (it would replace a file the command reads), and
    outputs that cannot be written. An input kmodel's metadata (MODEL.kmodel.json, read with
    it) is an input too. (A .kmodel/.json/.kfpkg written again into a SavedModel folder is fine:
    nothing reads it.)"""
    outs = [(label, os.fspath(p)) for label, p in outputs if p is not None]
    ins = [os.fspath(p) for p in inputs if p is not None]
    shown = {os.fspath(sidecar_path(p)): f"metadata of the input {p}" for p in ins
             if p.lower().endswith(".kmodel")}
    ins += list(shown)
    for i, (label, out) in enumerate(outs):
        for src in ins:
            if same_file(out, src):
                raise OutputPathError(
                    f"{label} {out} is the same file as the {shown.get(src, 'input ' + src)}"
                    f"{' (a link to it)' if os.path.realpath(out) != os.path.realpath(src) else ''}; "
                    "refusing to overwrite it: choose another output path")
            if os.path.isdir(src) and os.path.lexists(out) and _inside(out, src) and \
                    (os.path.splitext(out)[1].lower() in READ_SUFFIXES or ".data-" in out):
                raise OutputPathError(
                    f"{label} {out} is a file inside the input folder {src}; refusing to replace "
                    "it: choose another output path")
            linked = _hard_link_in(out, src) if os.path.isdir(src) else None
            if linked is not None:
                raise OutputPathError(
                    f"{label} {out} is a hard link of {linked} in the input folder {src}; "
                    "refusing to overwrite it: choose another output path")
        for other_label, other in outs[:i]:
            if os.path.realpath(out) == os.path.realpath(other) or same_file(out, other):
                raise OutputPathError(f"{label} {out} is the same file as {other_label}; give "
                                      "them different names")
        check_writable(out, label)


def make_folder(path, label: str = "output folder") -> list:
    """An output folder, created with its parents if missing (before the work); refuses a file or
    an unwritable place. Returns the folders it created, for `remove_folders` if the work fails."""
    p = os.path.abspath(os.fspath(path))
    near = _nearest_folder(p, label, path)
    _probe(near, label, path)
    missing = []
    while p != near:
        missing.append(p)
        p = os.path.dirname(p)
    created = []
    try:
        for d in reversed(missing):
            os.mkdir(d)
            created.append(d)
    except OSError as exc:
        remove_folders(created)
        raise OutputPathError(f"cannot create {label} {path}: {_why(exc)}") from None
    return created


def remove_folders(created):
    """Undo `make_folder` (only folders still empty)."""
    for d in reversed(created):
        try:
            os.rmdir(d)
        except OSError:
            pass


def atomic_write(path, data: bytes, label: str = "output", follow: bool = True):
    """Write `data` to `path` atomically: temp file in the same folder, fsync, rename. The new
    file gets 0666 & ~umask, a replaced one keeps its mode; devices/FIFOs are streamed to.
    `follow=False` (a file tl2k210 keeps beside another, MODEL.kmodel.json): whatever is at
    `path` -- a symlink, a FIFO -- is replaced by the new file, never written through."""
    path = os.fspath(path)
    st = _stat(path) if follow else _lstat(path)
    if follow and st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        try:
            with open(path, "wb") as fh:
                fh.write(data)
        except OSError as exc:
            raise OutputPathError(f"cannot write {label} {path}: {_why(exc)}") from None
        return path
    target = os.path.realpath(path) if follow else \
        os.path.join(os.path.realpath(os.path.dirname(path) or "."), os.path.basename(path))
    folder = os.path.dirname(target)
    mode = stat.S_IMODE(st.st_mode) if st is not None and stat.S_ISREG(st.st_mode) \
        else 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=os.path.basename(target), dir=folder)
    except OSError as exc:
        raise OutputPathError(f"cannot write {label} {path}: {folder}: {_why(exc)}; choose a path "
                              "in a writable folder") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise OutputPathError(f"cannot write {label} {path}: {_why(exc)}") from None
        raise
    return path


def lfs_pointer(head: bytes) -> str | None:
    """What to say of a file that starts with `head`, where it is a Git LFS pointer, else None."""
    if not head.startswith(b"version https://git-lfs.github.com/spec/"):
        return None
    return ("a Git LFS pointer (a small text file naming the real file's hash), not the file itself: "
            "the repository keeps its models in Git LFS; fetch them with `git lfs install && git lfs pull` "
            "in the clone, or download the file from the repository's web page")


def read_bytes(path, limit: int, what: str = "file") -> bytes:
    """The file's bytes; refuses folders, missing files and more than `limit` bytes."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as fh:
            data = fh.read(limit + 1)
    except FileNotFoundError:
        raise InputFileError(f"{p}: no such file; check the path") from None
    except IsADirectoryError:
        raise InputFileError(f"{p} is a folder, not a {what}; give the {what} itself") from None
    except OSError as exc:
        raise InputFileError(f"cannot read {p}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise InputFileError(f"{p} is larger than {limit // 2**20} MiB; that is not a {what}: check "
                             "the path")
    return data


def check_readable(path, what: str = "file", folder: bool | None = False):
    """Refuse a missing input up front (and a folder where a file is needed, or a file where a
    folder is; `folder=None` accepts either)."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise InputFileError(f"{what} {p}: no such {'folder' if folder else 'file'}; check the path")
    if folder and not os.path.isdir(p):
        raise InputFileError(f"{what} {p} is not a folder; give a folder")
    if folder is False and os.path.isdir(p):
        raise InputFileError(f"{what} {p} is a folder, not a file; give a file")
