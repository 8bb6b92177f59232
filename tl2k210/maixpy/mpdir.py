"""MicroPython 1.11's `dir()` (py/modbuiltins.c mp_builtin_dir, MaixPy's core @ced340d).

* `dir()` lists the keys of the current locals dict - at module level and inside functions
  alike, the module's globals (functions do not change dict_locals) - in the order of the
  dict's HASH TABLE slots (py/map.c): the key's qstr hash (djb2, 1 byte: MaixPy's
  MICROPY_QSTR_BYTES_IN_HASH 1) modulo the table size, linear probing, a deleted key leaving a
  sentinel (or an empty slot when the next one is empty), the table growing through
  hash_allocation_sizes only when it is full. `__main__`'s dict starts with 1 slot and
  `__name__` (py/runtime.c mp_init), then the frozen _boot.py stores and deletes its names; the
  host replays that history, then adds the namespace's names in their insertion order. (A
  script's own `del` of a global is not replayed: the order after one can differ.)
* `dir(obj)` probes every qstr in the firmware's qstr table order with mp_load_method_maybe:
  `__class__` always answers (MICROPY_CPYTHON_COMPAT), then the names the object really has -
  a module's table (with `__name__`; not CPython's `__doc__`, `__spec__`...), a class's dict
  (with the `__module__` and `__qualname__` the compiler stores), an instance's members. The
  table order is py/makeqstrdata.py's: its static_qstr_list first, then the other dunder names,
  then the rest, ASCII-sorted (the collected Q() lines are sorted); a name the firmware never
  compiled in is interned at run time and would come last on a board - the host cannot know
  which those are and sorts them with the rest.
"""
from __future__ import annotations

import types

HASH_SIZES = (0, 2, 4, 6, 8, 10, 12, 17, 23, 29, 37, 47, 59, 73, 97, 127, 167, 223, 293, 389,
              521, 691, 919, 1223, 1627, 2161, 3229, 4831, 7243, 10861, 16273, 24407, 36607,
              54907)

STATIC_QSTRS = (
    "", "__dir__", "\n", " ", "*", "/", "<module>", "_", "__call__", "__class__", "__delitem__",
    "__enter__", "__exit__", "__getattr__", "__getitem__", "__hash__", "__init__", "__int__",
    "__iter__", "__len__", "__main__", "__module__", "__name__", "__new__", "__next__",
    "__qualname__", "__repr__", "__setitem__", "__str__", "ArithmeticError", "AssertionError",
    "AttributeError", "BaseException", "EOFError", "Ellipsis", "Exception", "GeneratorExit",
    "ImportError", "IndentationError", "IndexError", "KeyError", "KeyboardInterrupt",
    "LookupError", "MemoryError", "NameError", "NoneType", "NotImplementedError", "OSError",
    "OverflowError", "RuntimeError", "StopIteration", "SyntaxError", "SystemExit", "TypeError",
    "ValueError", "ZeroDivisionError", "abs", "all", "any", "append", "args", "bool", "builtins",
    "bytearray", "bytecode", "bytes", "callable", "chr", "classmethod", "clear", "close", "const",
    "copy", "count", "dict", "dir", "divmod", "end", "endswith", "eval", "exec", "extend", "find",
    "format", "from_bytes", "get", "getattr", "globals", "hasattr", "hash", "id", "index",
    "insert", "int", "isalpha", "isdigit", "isinstance", "islower", "isspace", "issubclass",
    "isupper", "items", "iter", "join", "key", "keys", "len", "list", "little", "locals", "lower",
    "lstrip", "main", "map", "micropython", "next", "object", "open", "ord", "pop", "popitem",
    "pow", "print", "range", "read", "readinto", "readline", "remove", "replace", "repr",
    "reverse", "rfind", "rindex", "round", "rsplit", "rstrip", "self", "send", "sep", "set",
    "setattr", "setdefault", "sort", "sorted", "split", "start", "startswith", "staticmethod",
    "step", "stop", "str", "strip", "sum", "super", "throw", "to_bytes", "tuple", "type",
    "update", "upper", "utf-8", "value", "values", "write", "zip")
_STATIC_INDEX = {q: i for i, q in enumerate(STATIC_QSTRS)}

#: the frozen _boot.py (v0.6.2) on __main__'s dict: ("+", name) stores a new name, ("-", name)
#: deletes one; "f" only where it writes the welcome main.py (none in the cwd)
BOOT_OPS = (("+", "os"), ("+", "sys"), ("+", "time"), ("+", "devices"), ("-", "devices"),
            ("+", "i"), ("-", "i"), ("+", "ide_mode_conf"), ("+", "ide"), ("-", "ide"),
            ("-", "ide_mode_conf"), ("+", "main_py"), ("+", "flash_ls"), ("f", None),
            ("-", "main_py"), ("+", "sd_ls"), ("-", "flash_ls"), ("-", "sd_ls"),
            ("+", "banner"), ("-", "banner"))

#: names the host keeps in a namespace that a board's dict does not have
HOST_ONLY = {"__builtins__", "__repl_print__", "__doc__", "__loader__", "__package__", "__spec__",
             "__cached__", "__annotations__"}


def qstr_hash(name: str) -> int:
    h = 5381
    for c in name.encode("utf-8"):
        h = (h * 33) ^ c
    return (h & 0xFF) or 1


class HashMap:
    """py/map.c's hash table of qstr keys (only the key slots)."""
    EMPTY, DELETED = None, object()

    def __init__(self, alloc=0):
        self.table = [self.EMPTY] * alloc

    def add(self, key):
        if not self.table:
            self._rehash()
        h = qstr_hash(key)
        while True:
            n = len(self.table)
            pos = start = h % n
            avail = None
            while True:
                k = self.table[pos]
                if k is self.EMPTY:
                    self.table[pos if avail is None else avail] = key
                    return
                if k is self.DELETED:
                    if avail is None:
                        avail = pos
                elif k == key:
                    return
                pos = (pos + 1) % n
                if pos == start:
                    if avail is not None:
                        self.table[avail] = key
                        return
                    self._rehash()
                    break

    def remove(self, key):
        n = len(self.table)
        if not n:
            return
        pos = start = qstr_hash(key) % n
        while True:
            k = self.table[pos]
            if k is self.EMPTY:
                return
            if k is not self.DELETED and k == key:
                nxt = self.table[(pos + 1) % n]
                self.table[pos] = self.EMPTY if nxt is self.EMPTY else self.DELETED
                return
            pos = (pos + 1) % n
            if pos == start:
                return

    def _rehash(self):
        old = self.table
        n = len(old)
        new = next((a for a in HASH_SIZES if a >= n + 1), (n + 1 + (n + 1) // 2) | 1)
        self.table = [self.EMPTY] * new
        for k in old:
            if k is not self.EMPTY and k is not self.DELETED:
                self.add(k)

    def keys(self):
        return [k for k in self.table if k is not self.EMPTY and k is not self.DELETED]


def dir_namespace(ns: dict, history=()) -> list:
    """dir() of the dict `ns`: its 1-slot start with __name__, `history` ops, then the rest."""
    m = HashMap(1)
    if dict.__contains__(ns, "__name__"):
        m.add("__name__")
    for op, name in history:
        if op == "+":
            m.add(name)
        elif op == "-":
            m.remove(name)
    names = list(dict.keys(ns))        # the host dict's own order (a Namespace reorders)
    for k in names:
        if isinstance(k, str) and k not in HOST_ONLY:
            m.add(k)
    present = set(k for k in names if isinstance(k, str))
    return [k for k in m.keys() if k in present]


class Namespace(dict):
    """__main__'s globals as a script sees them (globals(), print(globals())): the host's
    `__builtins__` entry is there for CPython but hidden, and the keys come in the board dict's
    slot order (dir()). Name lookups by the interpreter use the dict itself."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.history = ()

    def _order(self):
        return dir_namespace(self, self.history)

    def __iter__(self):
        return iter(self._order())

    def keys(self):
        return self._order()

    def values(self):
        return [dict.__getitem__(self, k) for k in self._order()]

    def items(self):
        return [(k, dict.__getitem__(self, k)) for k in self._order()]

    def __len__(self):
        return len(self._order())

    def __contains__(self, key):
        return key not in HOST_ONLY and dict.__contains__(self, key)

    def __repr__(self):
        from tl2k210.maixpy.runtime import mp_repr
        return "{" + ", ".join(f"{mp_repr(k)}: {mp_repr(v)}" for k, v in self.items()) + "}"

    __str__ = __repr__

    def copy(self):
        return dict(self.items())


def boot_history(cwd_has_main: bool):
    ops = []
    for op, name in BOOT_OPS:
        if op == "f":
            if not cwd_has_main:
                ops += [("+", "f"), ("-", "f")]
        else:
            ops.append((op, name))
    return ops


def qstr_order(name: str):
    i = _STATIC_INDEX.get(name)
    if i is not None:
        return (0, i, b"")
    return (1 if name.startswith("__") else 2, 0, name.encode("utf-8"))


_DICT_DUNDERS = {"__getitem__", "__setitem__", "__delitem__"}


def _is_board_class(t) -> bool:
    mod = getattr(t, "__module__", "") or ""
    return not mod.startswith(("tl2k210", "builtins")) and t.__module__ not in (
        "numpy", "PIL", "io", "collections", "array")


def dir_object(obj) -> list:
    """dir(obj): the names mp_load_method_maybe finds on `obj`, in qstr table order."""
    names = {"__class__"}
    if isinstance(obj, types.ModuleType):
        names |= {k for k in vars(obj) if isinstance(k, str) and k not in HOST_ONLY}
        names.add("__name__")
    elif isinstance(obj, type) and _is_board_class(obj):
        names |= _class_names(obj)
    elif _is_board_class(type(obj)) and not isinstance(obj, type):
        names |= _class_names(type(obj))
        names |= {k for k in getattr(obj, "__dict__", {}) if isinstance(k, str)}
    else:
        try:
            attrs = dir(obj)
        except Exception:
            attrs = []
        names |= {a for a in attrs if not a.startswith("_")}
        if isinstance(obj, dict) or obj is dict:
            names |= _DICT_DUNDERS
    return sorted(names, key=qstr_order)


def _class_names(cls) -> set:
    out = set()
    for k in cls.__mro__:
        if k is object or not _is_board_class(k):
            if k is not object:
                out |= {a for a in dir(k) if not a.startswith("_")}
            continue
        out |= {a for a in vars(k) if isinstance(a, str)
                and a not in ("__dict__", "__weakref__", "__doc__")}
        out.add("__qualname__")
    return out
