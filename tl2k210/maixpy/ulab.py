"""`ulab` as full MaixPy v1 builds have it: micropython-ulab 0.262 (the Neutree fork at c315a57,
sipeed/MaixPy-v1's submodule), one flat module (no `numerical`/`linalg` submodules, which later
ulab versions have). An `ndarray` is a 1 x n row or an m x n matrix of one of five typecodes;
float is the firmware's single precision (MICROPY_FLOAT_IMPL_FLOAT).

What scripts meet, as code/ndarray.c, numerical.c, linalg.c and vectorise.c do it:
* `print(a)`: `array([1.0, 2.0, 3.0], dtype=float)`; rows of 10 or more items print their first
  and last three around `...`; a matrix's rows on lines of their own;
* `a.shape()` is a method (a 2-tuple), as are `rawsize()`, `flatten()`, `transpose()` and
  `reshape()` (both in place), `sort()`; items and reductions are MicroPython ints and floats;
* binary operators (`+ - * /`, and `< <= > >=`, which give lists of bools) take the ndarray on
  the left only (`2 * a`: TypeError), with ulab's upcasting: an int right operand is a uint8,
  int8, uint16 or int16 by its value (0 and larger values: float); `**` is unsupported; `a == b`
  compares the whole arrays (shape, typecode and bytes) to one bool;
* `dot` is a matrix product (two 1 x n rows: ValueError, "matrix dimensions do not match").
"""
from __future__ import annotations

import math

import numpy as np

from tl2k210.maixpy.modules import module
from tl2k210.maixpy.runtime import mp_float

uint8, int8, uint16, int16, float_ = ord("B"), ord("b"), ord("H"), ord("h"), ord("f")
DTYPES = {uint8: np.uint8, int8: np.int8, uint16: np.uint16, int16: np.int16, float_: np.float32}
NAMES = {uint8: "uint8", int8: "int8", uint16: "uint16", int16: "int16", float_: "float"}
PRINT_MAX = 10
#: ndarray_binary_op's result typecode for (left, right) typecodes of different kinds
UPCAST = {(uint8, int8): int16, (uint8, uint16): uint16, (uint8, int16): int16, (int8, uint8): int16,
          (int8, uint16): int16, (int8, int16): int16, (uint16, uint8): uint16, (uint16, int8): uint16,
          (uint16, int16): float_, (int16, uint8): int16, (int16, int8): int16, (int16, uint16): float_}


def _code(dtype) -> int:
    if dtype not in DTYPES:
        raise ValueError("wrong dtype")       # the firmware reads unknown codes as garbage; say so here
    return dtype


def _item(v, code):
    return float(v) if code == float_ else int(v)


def _store(values, code):
    """Numbers into typecode `code`'s storage (mp_binary_set_val_array: an int typecode takes ints
    only, and wraps them)."""
    if code == float_:
        return np.asarray(values, np.float64).astype(np.float32)
    a = np.asarray(values)
    if a.dtype == object and any(isinstance(v, float) for v in a.reshape(-1)) or a.dtype.kind == "f":
        raise TypeError("can't convert float to int")
    return (a.astype(np.int64) & 0xFFFF).astype(np.uint16).astype(DTYPES[code])


class ndarray:  # noqa: N801  (the firmware's type name, in its messages)
    def __init__(self, iterable, dtype=float_):
        code = _code(dtype)
        try:
            rows = list(iterable)
        except TypeError:
            raise ValueError("first argument must be an iterable") from None
        lens = [len(r) for r in rows if hasattr(r, "__len__")]
        if lens and len(set(lens)) > 1:
            raise ValueError("iterables are not of the same length")
        data = [list(r) for r in rows] if lens else [rows]
        self._a, self._code = _store(np.array(data, dtype=object), code).reshape(len(data), -1), code

    @classmethod
    def _of(cls, a, code):
        """An ndarray of numpy array `a` (2-D: its shape; else a row) as typecode `code`."""
        out = cls.__new__(cls)
        a = np.ascontiguousarray(a, DTYPES[code])
        out._a, out._code = a.reshape(a.shape[0] if a.ndim == 2 else 1, -1), code
        return out

    # -- text ------------------------------------------------------------------------------
    def _row(self, r):
        items = [mp_float(float(v)) if self._code == float_ else str(int(v)) for v in r]
        if len(items) >= PRINT_MAX:
            items = items[:3] + ["..."] + items[-3:]
        return "[" + ", ".join(items) + "]"

    def __repr__(self):
        m, n = self._a.shape
        if self._a.size == 0:
            body = "[]"
        elif m == 1 or n == 1:
            body = self._row(self._a.reshape(-1))
        else:
            body = "[" + ",\n\t ".join(self._row(r) for r in self._a) + "]"
        return f"array({body}, dtype={NAMES[self._code]})"

    __str__ = __repr__

    # -- methods ---------------------------------------------------------------------------
    def shape(self):
        return tuple(int(d) for d in self._a.shape)

    def rawsize(self):
        m, n = self._a.shape
        return (m, n, m * n, self._a.nbytes, self._a.itemsize)

    def flatten(self, order="C"):
        if order not in ("C", "F"):
            raise ValueError("flattening order must be either 'C', or 'F'")
        return ndarray._of(self._a.flatten(order).reshape(1, -1), self._code)

    def asbytearray(self):
        return bytearray(self._a.tobytes())

    def transpose(self):
        self._a = np.ascontiguousarray(self._a.T)

    def reshape(self, shape):
        if not isinstance(shape, tuple) or len(shape) != 2:
            raise ValueError("shape must be a 2-tuple")
        if shape[0] * shape[1] != self._a.size:
            raise ValueError("cannot reshape array (incompatible input/output shape)")
        self._a = self._a.reshape(shape)
        return self

    def sort(self, axis=-1):
        _sort(self, axis, inplace=True)

    # -- the sequence protocol ----------------------------------------------------------------
    def __len__(self):
        m, n = self._a.shape
        return m if m > 1 else n

    def __iter__(self):
        if self._a.shape[0] == 1:
            return (_item(v, self._code) for v in self._a[0])
        return (ndarray._of(r.reshape(1, -1), self._code) for r in self._a)

    def _index(self, index):
        m, n = self._a.shape

        def one(i, size):
            if isinstance(i, bool) or not isinstance(i, (int, slice, list)):
                raise IndexError("indices must be integers, slices, or Boolean lists")
            if isinstance(i, int):
                j = i + size if i < 0 else i
                if not 0 <= j < size:
                    raise IndexError("index is out of bounds")
                return slice(j, j + 1)
            if isinstance(i, list):
                return np.array([bool(x) for x in i] + [False] * (size - len(i)))[:size]
            return i
        if isinstance(index, tuple):
            if len(index) != 2:
                raise IndexError("too many indices")
            return one(index[0], m), one(index[1], n)
        return (slice(0, 1), one(index, n)) if m == 1 else (one(index, m), slice(None))

    def __getitem__(self, index):
        rows, cols = self._index(index)
        if isinstance(index, int) and not isinstance(index, bool) and self._a.shape[0] == 1:
            return _item(self._a[0, cols][0], self._code)        # one item of a row: a number
        return ndarray._of(self._a[rows][:, cols], self._code)

    def __setitem__(self, index, value):
        if isinstance(value, ndarray):
            v, code = value._a, value._code
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            v, code = np.array([[value]]), float_ if isinstance(value, float) else self._code
        else:
            raise ValueError("right hand side must be an ndarray, or a scalar")
        if code == float_ and self._code != float_:
            v = np.floor(np.asarray(v, np.float64) + 0.5).astype(np.int64)   # insert_binary_value's rounding
        rows, cols = self._index(index)
        target = self._a[rows][:, cols]
        self._a[np.ix_(*[np.arange(s)[k] for s, k in zip(self._a.shape, (rows, cols))])] = \
            _store(np.broadcast_to(np.asarray(v), target.shape), self._code)

    # -- operators ---------------------------------------------------------------------------
    def _operand(self, other):
        if isinstance(other, bool) or not isinstance(other, (int, float, ndarray)):
            raise TypeError("wrong operand type on the right hand side")
        if isinstance(other, ndarray):
            if other._a.shape != self._a.shape:
                raise ValueError("operands could not be broadcast together")
            return other._a, other._code
        if isinstance(other, float):
            return np.float32(other), float_
        code = (uint8 if 0 < other < 256 else uint16 if 255 < other < 65535 else int8 if -128 < other < 0
                else int16 if -32767 < other < -127 else float_)
        return np.array(other).astype(DTYPES[code]), code

    def _arith(self, other, f):
        b, code = self._operand(other)
        out = self._code if code == self._code else float_ if float_ in (code, self._code) else \
            UPCAST[(self._code, code)]
        t = DTYPES[out]
        with np.errstate(all="ignore"):
            return ndarray._of(f(self._a.astype(t), np.asarray(b).astype(t)).astype(t), out)

    def __add__(self, other):
        return self._arith(other, np.add)

    def __sub__(self, other):
        return self._arith(other, np.subtract)

    def __mul__(self, other):
        return self._arith(other, np.multiply)

    def __truediv__(self, other):
        b, _ = self._operand(other)
        with np.errstate(all="ignore"):
            return ndarray._of(self._a.astype(np.float32) / np.asarray(b).astype(np.float32), float_)

    def _compare(self, other, f):
        b, _ = self._operand(other)
        res = [[bool(x) for x in row] for row in f(self._a.astype(np.float64), np.asarray(b, np.float64))]
        return res[0] if len(res) == 1 else res

    def __lt__(self, other):
        return self._compare(other, np.less)

    def __le__(self, other):
        return self._compare(other, np.less_equal)

    def __gt__(self, other):
        return self._compare(other, np.greater)

    def __ge__(self, other):
        return self._compare(other, np.greater_equal)

    def __eq__(self, other):
        if not isinstance(other, ndarray):
            if isinstance(other, bool) or not isinstance(other, (int, float)):
                raise TypeError("wrong operand type on the right hand side")
            b, code = self._operand(other)
            other = ndarray._of(np.asarray(b).reshape(1, 1), code)
        return (self._a.shape == other._a.shape and self._code == other._code
                and self._a.tobytes() == other._a.tobytes())

    def __ne__(self, other):
        return not self == other

    __hash__ = None

    def __neg__(self):
        with np.errstate(all="ignore"):
            return ndarray._of(-self._a, self._code)

    def __pos__(self):
        return ndarray._of(self._a.copy(), self._code)

    def __abs__(self):
        return ndarray._of(np.abs(self._a), self._code)

    def __invert__(self):
        if self._code == float_:
            raise ValueError("operation is not supported for given type")
        return ndarray._of(~self._a, self._code)


# ---------------------------------------------------------------------------------------------
# module functions
def _need(a, what):
    if not isinstance(a, ndarray):
        raise TypeError(what)
    return a


def _axis(axis, allowed=(None, 0, 1)):
    if axis not in allowed:
        raise ValueError("axis must be None, 0, or 1")
    return axis


def _reduce(kind):
    def f(a, *, axis=None):
        _axis(axis)
        if isinstance(a, (list, tuple, range)):
            items = list(a)
            if kind in ("min", "max", "argmin", "argmax"):
                pick = min if kind.endswith("min") else max
                best = pick(range(len(items)), key=lambda i: items[i])
                return best if kind.startswith("arg") else items[best]
            v = np.array([float(x) for x in items], np.float32)
        elif isinstance(a, ndarray):
            v = a._a
            if axis is not None and v.shape[0] > 1 and v.shape[1] > 1:
                if kind in ("argmin", "argmax"):
                    r = getattr(np, kind)(v, axis=axis)
                    return ndarray._of(r.reshape((1, -1) if axis == 0 else (-1, 1)), uint16)
                r = getattr(np, kind)(v.astype(np.float32) if kind in ("sum", "mean", "std") else v, axis=axis)
                code = float_ if kind in ("sum", "mean", "std") else a._code
                return ndarray._of(r.reshape((1, -1) if axis == 0 else (-1, 1)), code)
            v = v.reshape(-1)
            if kind in ("argmin", "argmax"):
                return int(getattr(np, kind)(v))
            if kind in ("min", "max"):
                return _item(getattr(np, kind)(v), a._code)
            v = v.astype(np.float32)
        else:
            raise TypeError("input must be tuple, list, range, or ndarray")
        if v.size == 0:
            raise ValueError("data length is 0!")
        return float(getattr(np, kind)(v))
    return f


def _sort(a, axis=-1, inplace=False):
    _need(a, "sort argument must be an ndarray")
    _axis(axis, (-1, 0, None, 1))
    v = np.sort(a._a.reshape(1, -1) if axis is None else a._a, axis=0 if axis == 0 else 1)
    if inplace:
        a._a = v
        return None
    return ndarray._of(v, a._code)


def argsort(a, *, axis=-1):
    _need(a, "argsort argument must be an ndarray")
    _axis(axis, (-1, 0, None, 1))
    v = a._a.reshape(1, -1) if axis is None else a._a
    return ndarray._of(np.argsort(v, axis=0 if axis == 0 else 1, kind="stable"), uint16)


def _vector(f):
    def g(x):
        if isinstance(x, (int, float)):         # bools too
            return float(f(np.float32(x)))
        if isinstance(x, ndarray):
            return ndarray._of(f(x._a.astype(np.float32)), float_)
        if isinstance(x, (list, tuple, range)):
            return ndarray._of(f(np.array([float(v) for v in x], np.float32)).reshape(1, -1), float_)
        return None
    return g


def _fill(value):
    def f(shape, *, dtype=float_):
        code = _code(dtype)
        if isinstance(shape, int) and not isinstance(shape, bool):
            shape = (1, shape)
        elif not (isinstance(shape, tuple) and len(shape) == 2):
            raise TypeError("input argument must be an integer or a 2-tuple")
        return ndarray._of(np.full(shape, value, DTYPES[code]), code)
    return f


def eye(n, *, M=None, k=0, dtype=float_):
    code = _code(dtype)
    return ndarray._of(np.eye(n, n if M is None else M, k, DTYPES[code]), code)


def dot(m1, m2):
    if m1._a.shape[1] != m2._a.shape[0]:
        raise ValueError("matrix dimensions do not match")
    return ndarray._of(m1._a.astype(np.float32) @ m2._a.astype(np.float32), float_)


def inv(a):
    _need(a, "only ndarrays can be inverted")
    if a._a.shape[0] != a._a.shape[1]:
        raise ValueError("only square matrices can be inverted")
    try:
        return ndarray._of(np.linalg.inv(a._a.astype(np.float64)), float_)
    except np.linalg.LinAlgError:
        raise ValueError("input matrix is singular") from None


def det(a):
    _need(a, "function defined for ndarrays only")
    if a._a.shape[0] != a._a.shape[1]:
        raise ValueError("input must be square matrix")
    return float(np.float32(np.linalg.det(a._a.astype(np.float64))))


def eig(a):
    _need(a, "function defined for ndarrays only")
    if a._a.shape[0] != a._a.shape[1]:
        raise ValueError("input must be square matrix")
    if not np.allclose(a._a, a._a.T):
        raise ValueError("input matrix is asymmetric")
    w, v = np.linalg.eigh(a._a.astype(np.float64))
    return ndarray._of(w.reshape(1, -1), float_), ndarray._of(v, float_)


def size(a, *, axis=None):
    _need(a, "size is defined for ndarrays only")
    m, n = a._a.shape
    if axis is None:
        return m * n
    if axis == 0:
        return n if m == 1 else m
    if axis == 1 and m > 1:
        return n
    raise ValueError("tuple index out of range")


def linspace(start, stop, num=50, *, endpoint=True, retstep=False):
    if num < 2:
        raise ValueError("number of points must be at least 2")
    a, step = np.linspace(start, stop, num, endpoint=endpoint, retstep=True, dtype=np.float32)
    out = ndarray._of(a.reshape(1, -1), float_)
    return (out, float(step)) if retstep else out


def roll(a, shift, *, axis=None):
    _need(a, "roll argument must be an ndarray")
    _axis(axis)
    v = a._a.reshape(-1) if axis is None else a._a
    return ndarray._of(np.roll(v, -shift if axis is None else shift, axis).reshape(a._a.shape), a._code)


def flip(a, *, axis=None):
    _need(a, "flip argument must be an ndarray")
    _axis(axis)
    v = a._a.reshape(-1)[::-1].reshape(a._a.shape) if axis is None else np.flip(a._a, axis)
    return ndarray._of(v, a._code)


def diff(a, *, n=1, axis=-1):
    _need(a, "diff argument must be an ndarray")
    if axis not in (-1, 0, 1):
        raise ValueError("axis must be -1, 0, or 1")
    if not 0 <= n <= 9:
        raise ValueError("n must be between 0, and 9")
    with np.errstate(all="ignore"):
        return ndarray._of(np.diff(a._a, n, axis=0 if axis == 0 else 1), a._code)


def _floats(x):
    return x._a.reshape(-1).astype(np.float64) if isinstance(x, ndarray) else np.array([float(v) for v in x])


def polyval(p, x):
    out = np.polyval(_floats(p), _floats(x)).astype(np.float32)
    return ndarray._of(out.reshape(x._a.shape if isinstance(x, ndarray) else (1, -1)), float_)


def polyfit(*args):
    if len(args) not in (2, 3):
        raise ValueError("number of arguments must be 2, or 3")
    x, y, deg = (np.arange(len(_floats(args[0]))), _floats(args[0]), args[1]) if len(args) == 2 \
        else (_floats(args[0]), _floats(args[1]), args[2])
    return ndarray._of(np.polyfit(x, y, deg).astype(np.float32).reshape(1, -1), float_)


def _fft(kind):
    def f(re, im=None):
        if not isinstance(re, ndarray) or (im is not None and not isinstance(im, ndarray)):
            raise NotImplementedError("FFT is defined for ndarrays only")
        n = re._a.size
        if n & (n - 1):
            raise ValueError("input array length must be power of 2")
        z = _floats(re) + 1j * (_floats(im) if im is not None else 0)
        if im is not None and im._a.size != n:
            raise ValueError("real and imaginary parts must be of equal length")
        r = np.fft.ifft(z) if kind == "ifft" else np.fft.fft(z)
        if kind == "spectrum":
            return ndarray._of(np.abs(r).astype(np.float32).reshape(1, -1), float_)
        return (ndarray._of(r.real.astype(np.float32).reshape(1, -1), float_),
                ndarray._of(r.imag.astype(np.float32).reshape(1, -1), float_))
    return f


def make_module(s):
    attrs = dict(array=ndarray, size=size, inv=inv, dot=dot, zeros=_fill(0), ones=_fill(1), eye=eye,
                 det=det, eig=eig, linspace=linspace, roll=roll, flip=flip, diff=diff,
                 sort=lambda a, *, axis=-1: _sort(a, axis), argsort=argsort, polyval=polyval,
                 polyfit=polyfit, fft=_fft("fft"), ifft=_fft("ifft"), spectrum=_fft("spectrum"),
                 uint8=uint8, int8=int8, uint16=uint16, int16=int16, __version__=0.262)
    attrs["float"] = float_
    attrs.update({k: _reduce(k) for k in ("sum", "mean", "std", "min", "max", "argmin", "argmax")})
    for name, f in dict(acos=np.arccos, acosh=np.arccosh, asin=np.arcsin, asinh=np.arcsinh, atan=np.arctan,
                        atanh=np.arctanh, ceil=np.ceil, cos=np.cos, erf=None, erfc=None, exp=np.exp,
                        expm1=np.expm1, floor=np.floor, gamma=None, lgamma=None, log=np.log,
                        log10=np.log10, log2=np.log2, sin=np.sin, sinh=np.sinh, sqrt=np.sqrt,
                        tan=np.tan, tanh=np.tanh).items():
        attrs[name] = _vector(f or np.vectorize(getattr(math, name)))
    return module("ulab", "micropython-ulab 0.262 on the host", **attrs)
