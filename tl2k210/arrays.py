"""Arrays from .npy / .npz files that may be hostile.

``np.load`` allocates what the header declares (a 100-byte file can ask for 75 GiB), loads pickles
when allowed, and leaves strings, objects, records and NaN to fail later with a message about
something else. Here the header is read first and checked against the bytes the file holds and a
size cap; only numbers (bool, int, float) pass; floats must be finite.
"""
from __future__ import annotations

import math
import os
import zipfile

import numpy as np

from tl2k210.errors import InputFileError

MAX_ARRAY_BYTES = 1 << 30
_KINDS = {"U": "str", "S": "bytes", "O": "Python object", "V": "record (structured)",
          "M": "datetime", "m": "timedelta", "c": "complex"}


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"


def _header(fh, where):
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(fh)
        elif version == (3, 0):         # utf-8 header (numpy >= 1.17); read like 2.0 is
            from numpy.lib import _format_impl
            shape, fortran, dtype = _format_impl._read_array_header(fh, version)
        else:
            raise ValueError(f"unknown .npy format version {version[0]}.{version[1]}")
    except Exception as exc:  # ValueError, SyntaxError, EOFError... from a garbled header
        raise InputFileError(f"{where} is not a .npy array file ({exc}); save it with "
                             "numpy.save") from None
    return tuple(int(d) for d in shape), bool(fortran), np.dtype(dtype)


def check_numbers(dtype, where):
    kind = np.dtype(dtype).kind
    if kind in _KINDS:
        extra = ""
        if kind == "V" and np.dtype(dtype).names:
            extra = f" with fields {', '.join(np.dtype(dtype).names)}"
        raise InputFileError(f"{where} holds {_KINDS[kind]} values (dtype {np.dtype(dtype)}{extra}), "
                             "not numbers; save a plain numeric array (uint8 pixels or floats)")


def check_finite(a: np.ndarray, where):
    if a.dtype.kind == "f" and a.size:
        bad = ~np.isfinite(a)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
            what = " and ".join(w for w in (f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else "") if w)
            raise InputFileError(f"{where} has {what} value(s) (first at index {first}); inputs must "
                                 "be finite numbers: fix or drop those samples")


def _read(fh, available, where, max_bytes, expect_size=None, expect_text="", accept=None):
    shape, fortran, dtype = _header(fh, where)
    check_numbers(dtype, where)
    count = math.prod(shape)
    if expect_size is not None and count != expect_size:
        raise InputFileError(f"{where} declares shape {shape} ({count} values); {expect_text}")
    if accept is not None:
        accept(shape)
    nbytes = count * dtype.itemsize
    if nbytes > max_bytes:
        raise InputFileError(f"{where} declares a {shape} {dtype} array ({_size(nbytes)}), more "
                             f"than the {_size(max_bytes)} tl2k210 loads; pass fewer samples")
    if available is not None and nbytes > available:
        raise InputFileError(f"{where} declares a {shape} {dtype} array ({_size(nbytes)}) but "
                             f"holds {_size(available)} of data: the file is truncated or corrupt: "
                             "save it again (numpy.save)")
    data = fh.read(nbytes)
    if len(data) < nbytes:
        raise InputFileError(f"{where} declares {_size(nbytes)} of data but holds {len(data)} "
                             "bytes: the file is truncated or corrupt: save it again (numpy.save)")
    a = np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")
    a = a.astype(a.dtype.newbyteorder("="), copy=True)
    check_finite(a, where)
    return a


def load_npy(path, max_bytes=MAX_ARRAY_BYTES, expect_size=None, expect_text="", accept=None):
    """One .npy file -> numeric, finite array, memory bounded by the file size and `max_bytes`.
    With `expect_size`, a declared value count other than that is refused before reading;
    `accept(shape)` sees the declared shape before reading too (it raises to refuse it)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            reg = os.path.isfile(p)
            a = _read(fh, None if not reg else size, p, max_bytes, expect_size, expect_text, accept)
            if reg and fh.tell() != size:
                raise InputFileError(f"{p}: {size - fh.tell()} bytes after the array; the file is "
                                     "corrupt (or not one .npy array): save it again (numpy.save)")
            return a
    except FileNotFoundError:
        raise InputFileError(f"{p}: no such file; check the path") from None
    except IsADirectoryError:
        raise InputFileError(f"{p} is a folder, not a .npy file") from None
    except OSError as exc:
        raise InputFileError(f"cannot read {p}: {exc.strerror or exc}") from None


def save_npz(path, arrays):
    """`arrays` as arr_0, arr_1, ... of a compressed .npz at `path`, written atomically (what
    load_npz and zoo.load_weights read)."""
    import io

    from tl2k210.fileio import atomic_write
    buf = io.BytesIO()
    np.savez_compressed(buf, *[np.asarray(a) for a in arrays])
    atomic_write(path, buf.getvalue())


def load_npz(path, max_bytes=MAX_ARRAY_BYTES):
    """[(name, array)] of a .npz archive, each member checked like a .npy file; the total is
    bounded by `max_bytes`."""
    p = os.fspath(path)
    try:
        zf = zipfile.ZipFile(p)
    except FileNotFoundError:
        raise InputFileError(f"{p}: no such file; check the path") from None
    except IsADirectoryError:
        raise InputFileError(f"{p} is a folder, not a .npz file") from None
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise InputFileError(f"{p} is not a .npz archive ({exc}); save it with numpy.savez") from None
    out, left = [], max_bytes
    with zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            where = f"{p}[{name}]"
            try:
                with zf.open(info) as fh:
                    a = _read(fh, info.file_size, where, left)
            except InputFileError:
                raise
            except NotImplementedError as exc:   # unknown compression method
                raise InputFileError(f"{where}: {exc}; save it with numpy.savez") from None
            except RuntimeError as exc:          # encrypted member
                raise InputFileError(f"{where}: {exc}; save the archive without a password") from None
            except Exception as exc:  # BadZipFile (CRC), zlib.error, EOFError, OSError...
                raise InputFileError(f"{where}: the archive is corrupt ({exc}); save it again with "
                                     "numpy.savez") from None
            left -= a.nbytes
            out.append((name, a))
    if not out:
        raise InputFileError(f"{p} holds no arrays; save the samples with numpy.savez")
    return out


def load_any(path, max_bytes=MAX_ARRAY_BYTES):
    """[(name, array)] of a .npy or .npz file."""
    p = os.fspath(path)
    if p.lower().endswith(".npz") or (os.path.isfile(p) and _is_zip(p)):
        return load_npz(p, max_bytes)
    return [(p, load_npy(p, max_bytes))]


def _is_zip(p) -> bool:
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == b"PK\x03\x04"
    except OSError:
        return False


# what numpy's pickle of an object array of numeric arrays (TensorLayer's `params` layout) uses;
# nothing else is ever looked up, so a pickle that names os.system or any other callable fails
_PICKLE_OK = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
              ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


def _arrays_only(data: bytes, where):
    import io
    import pickle

    class Only(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) not in _PICKLE_OK:
                raise InputFileError(f"{where} is a pickle that calls {module}.{name}: tl2k210 runs no "
                                     "code from data files; save plain numeric arrays (numpy.savez)")
            if name == "_reconstruct":
                from numpy._core.multiarray import _reconstruct
                return _reconstruct
            return super().find_class(module, name)
    try:
        return Only(io.BytesIO(data)).load()
    except InputFileError:
        raise
    except Exception as exc:
        raise InputFileError(f"{where}: the pickled arrays are corrupt ({type(exc).__name__}); save "
                             "them again") from None


def load_params(path, key="params", max_bytes=MAX_ARRAY_BYTES) -> list:
    """The arrays of a TensorLayer weight .npz (`key`: one object array of numeric arrays, in
    layer order) -- numpy pickles that layout; only ndarrays of numbers are unpickled."""
    p = os.fspath(path)
    try:
        with zipfile.ZipFile(p) as zf:
            info = zf.getinfo(key + ".npy")
            if info.file_size > max_bytes:
                raise InputFileError(f"{p}[{key}] holds {_size(info.file_size)}, more than the "
                                     f"{_size(max_bytes)} tl2k210 loads; check the file")
            with zf.open(info) as fh:
                shape, fortran, dtype = _header(fh, f"{p}[{key}]")
                if dtype.kind != "O":
                    fh.seek(0)
                    return list(_read(fh, info.file_size, f"{p}[{key}]", max_bytes))
                obj = _arrays_only(fh.read(), f"{p}[{key}]")
    except KeyError:
        raise InputFileError(f"{p} has no '{key}' array (a TensorLayer weight file holds one); "
                             "save the weights with tl.files.save_npz") from None
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise InputFileError(f"{p} is not a .npz archive ({exc}); save it with numpy.savez") from None
    items = list(obj.reshape(-1)) if isinstance(obj, np.ndarray) else []
    for i, a in enumerate(items):
        if not isinstance(a, np.ndarray):
            raise InputFileError(f"{p}[{key}][{i}] is a {type(a).__name__}, not an array of numbers; "
                                 "save numeric arrays only")
        check_numbers(a.dtype, f"{p}[{key}][{i}]")
    return items
