"""A persistent emulated MaixPy board running MicroPython 1.11 code: `Session`.

    s = Session(sd="card/", flash="flash.bin", runtime="maixpy", images=["a.jpg"])
    s.boot()                      # _boot.py: cwd /sd (or /flash), sys.path; then boot.py, main.py
    s.exec("import KPU as kpu\\ntask = kpu.load(0x300000)")
    s.eval("task.model_size()")   # -> 388776
    s.interrupt()                 # Ctrl-C: KeyboardInterrupt at the running code's next line
    s.soft_reset()                # Ctrl-D: models freed, namespace and modules cleared, boot again
    s.output()                    # what was printed (also streamed to `on_output(text)`)
    s.close()                     # input() reads `on_input(prompt)` (EOFError without one)

One `__main__` namespace persists across `exec`/`eval` calls (what a REPL or the IDE sees).
Scripts get MicroPython's world, not CPython's: `import sys/time/os/...` resolve to the board's
modules (the session's own `sys.modules`; the host interpreter's are untouched), user modules are
imported from the board's cwd, /sd and /flash along `sys.path`, `print` and `open` are the board's,
f-strings and `:=` are SyntaxErrors, tracebacks and exception texts are MicroPython's
(`name 'x' isn't defined`, `OSError: [Errno 2] ENOENT`), floats print at single precision.

Each executed line of board code costs timing.LINE_US of board time (virtual clock) and is where
the watchdog (`timeout`) and host stops (camera out of photos, SIGTERM) are raised.
"""
from __future__ import annotations

import ast
import io
import re
import sys
import threading
import tokenize
import traceback
import types

import numpy as np

from tl2k210.maixpy import board as _board
from tl2k210.maixpy import heap as _heap
from tl2k210.maixpy import timing
from tl2k210.maixpy.vfs import errno_name

FROZEN = ("board", "fpioa_manager", "_boot", "ide_debug")


class BoardSyntaxError(SyntaxError):
    pass


class BoardIndentationError(BoardSyntaxError, IndentationError):
    pass


#: py/parse.c (MicroPython 1.11): the two indentation errors it names; any other is "invalid syntax"
INDENTATION = {"unexpected indent": "unexpected indent",
               "unindent does not match any outer indentation level":
               "unindent doesn't match any outer indentation level"}


# ---------------------------------------------------------------------------------------------
# MicroPython text forms
_F32 = np.float32
_POS_POW = [_F32(10.0 ** k) for k in (32, 16, 8, 4, 2, 1)]
_NEG_POW = [_F32(10.0 ** -k) for k in (32, 16, 8, 4, 2, 1)]


def mp_format_float(x: float, prec: int = 7, buf_size: int = 16) -> str:
    """py/formatfloat.c's mp_format_float(f, buf, buf_size, 'g', prec, 0) at single precision
    (MICROPY_FLOAT_IMPL_FLOAT, MicroPython 1.11 as MaixPy v1 builds it): the decimal exponent and
    the digits come from float32 multiplications, so the last digit can differ from C's %.7g
    (42.016705 prints 42.01671)."""
    f = _F32(x)
    s = []
    if np.signbit(f) and not np.isnan(f):
        s.append("-")
        f = -f
    if np.isinf(f) or np.isnan(f):
        return "".join(s) + ("inf" if np.isinf(f) else "nan")
    remaining = buf_size - 1 - len(s)
    fmt, e, dec, e_sign, num_digits = "g", 0, 0, "", 0
    if f == 0:
        prec = min(prec, remaining - 6)
    elif f < 1:
        first = "1" if f >= _F32(0.9999995) else "0"
        for e1, pos, neg in zip((32, 16, 8, 4, 2, 1), _POS_POW, _NEG_POW):
            if neg > f:
                e += e1
                f = _F32(f * pos)
        e_sign_char = "-"
        if _F32(0.9999995) <= f < 1:
            f = _F32(1.0)
            e_sign_char = "+" if e == 0 else e_sign_char
        elif f < 1:
            e += 1
            f = _F32(f * _F32(10.0))
        if e <= 4:
            fmt, dec = "f", -1
            s.append(first)
            prec = min(prec + e - 1, remaining - 2)
            num_digits = prec
            if num_digits:
                s.append(".")
                e -= 1
                while e and num_digits:
                    s.append("0")
                    num_digits -= 1
                    e -= 1
        else:
            e_sign = e_sign_char
            if prec > remaining - 6:
                prec = remaining - 6 + 1
    else:
        for e1, pos, neg in zip((32, 16, 8, 4, 2, 1), _POS_POW, _NEG_POW):
            if pos <= f:
                e += e1
                f = _F32(f * neg)
        if int(f) >= 10:
            e += 1
            f = _F32(f * _F32(0.1))
        prec = min(prec, remaining - 5)
        if e < prec:
            fmt = "f"
            prec -= e + 1
            dec, num_digits = e, prec + e + 1
        else:
            e_sign = "+"
    prec = max(prec, 0)
    if fmt == "g":
        prec = prec or 1
        num_digits = prec
    for _ in range(num_digits):
        d = int(f)
        s.append("0" if d < 0 else chr(48 + d))
        if dec == 0 and prec > 0:
            s.append(".")
        f = _F32(_F32(f - _F32(d)) * _F32(10.0))
        dec -= 1
    if f >= 5:                                   # round up the digits printed
        rs = len(s) - 1
        while True:
            if s[rs] == ".":
                rs -= 1
                continue
            if not s[rs].isdigit():
                rs += 1
                break
            if s[rs] < "9":
                s[rs] = chr(ord(s[rs]) + 1)
                break
            s[rs] = "0"
            if rs == 0:
                break
            rs -= 1
        if s[rs] == "0":                         # 9.99 -> 10.0: a leading 1
            if rs + 1 < len(s) and s[rs + 1] == "." and fmt != "f":
                s[rs], s[rs + 1] = ".", "0"
                if e_sign == "-":
                    e -= 1
                    e_sign = "+" if e == 0 else e_sign
                else:
                    e += 1
                s.insert(rs, "1")
                s.pop()
            else:
                s.insert(rs, "1")
    if prec > 0:
        while s[-1] == "0":
            s.pop()
        if s[-1] == ".":
            s.pop()
    if e_sign:
        s += ["e", e_sign, str(e // 10 % 10), str(e % 10)]
    return "".join(s)


def mp_float(x: float) -> str:
    """MicroPython's float repr at single precision (py/objfloat.c float_print: 'g', 7 digits, and
    '.0' where neither a point nor an exponent was printed)."""
    s = mp_format_float(x)
    return s if any(c in s for c in ".en") else s + ".0"


def mp_repr(v) -> str:
    if isinstance(v, bool) or v is None:
        return repr(v)
    if isinstance(v, float):
        return mp_float(v)
    if isinstance(v, BaseException):
        return f"{exc_name(v)}({', '.join(mp_repr(a) for a in v.args)})"
    if type(v) in (list,) or (isinstance(v, list) and type(v).__name__ == "list"):
        return "[" + ", ".join(mp_repr(a) for a in v) + "]"
    if isinstance(v, tuple) and type(v).__name__ == "tuple":
        if len(v) == 1:
            return "(" + mp_repr(v[0]) + ",)"
        return "(" + ", ".join(mp_repr(a) for a in v) + ")"
    if type(v) is dict:
        return "{" + ", ".join(f"{mp_repr(k)}: {mp_repr(a)}" for k, a in v.items()) + "}"
    if isinstance(v, type):                      # py/objtype.c type_print
        return f"<class '{v.__name__}'>"
    if isinstance(v, types.FunctionType):        # py/objfun.c fun_bc_print: the plain name
        return f"<function {v.__name__} at 0x{id(v):x}>"
    if isinstance(v, types.MethodType) and isinstance(v.__func__, types.FunctionType):
        # py/objboundmeth.c bound_meth_print (MICROPY_ERROR_REPORTING_DETAILED)
        return f"<bound_method {id(v):x} {mp_repr(v.__self__)}.{mp_repr(v.__func__)}>"
    if type(v).__repr__ is object.__repr__:     # py/obj.c, py/objtype.c: no print slot, no __repr__
        if type(v).__module__.startswith("tl2k210."):
            return f"<{type(v).__name__}>"                     # a native (firmware) type
        return f"<{type(v).__name__} object at {id(v):x}>"     # a class of the script's
    return repr(v)


def mp_str(v) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, BaseException):
        return exc_message(v)
    if isinstance(v, (float, list, tuple, dict)) or type(v).__str__ is object.__str__:
        return mp_repr(v)
    return str(v)


_MSG_RULES = [
    (re.compile(r"^name '(.+)' is not defined.*$"), r"name '\1' isn't defined"),
    (re.compile(r"^No module named '(.+)'$"), r"no module named '\1'"),
    (re.compile(r"^module '.+' has no attribute '(.+)'$"), r"'module' object has no attribute '\1'"),
    (re.compile(r"^(.*) is not (subscriptable|iterable|callable)$"), r"\1 isn't \2"),
    (re.compile(r"^(integer |float )?division( or modulo)? by zero$"), "divide by zero"),
    (re.compile(r"^float (division|modulo|divmod\(\))( by zero)?$"), "divide by zero"),
    (re.compile(r"^unsupported operand type\(s\) for (.+): '(.+)' and '(.+)'$"),
     r"unsupported types for \1: '\2', '\3'"),
    (re.compile(r"^can only concatenate str \(not \"(.+)\"\) to str$"),
     r"can't convert '\1' object to str implicitly"),
    (re.compile(r"^max\(\) (arg|iterable argument) is an empty sequence$"), "arg is an empty sequence"),
    (re.compile(r"^min\(\) (arg|iterable argument) is an empty sequence$"), "arg is an empty sequence"),
    (re.compile(r"^(.+)\(\) takes (\d+) positional arguments? but (\d+) were given$"),
     r"function takes \2 positional arguments but \3 were given"),
    (re.compile(r"^(.+)\(\) missing (\d+) required positional arguments?: .*$"),
     r"function missing \2 required positional arguments"),
    (re.compile(r"^(.+)\(\) got an unexpected keyword argument '(.+)'$"),
     r"unexpected keyword argument '\2'"),
    (re.compile(r"^'(.+)' object has no attribute '(.+)'$"), r"'\1' object has no attribute '\2'"),
]
_OP_NAMES = {"+": "__add__", "-": "__sub__", "*": "__mul__", "/": "__truediv__",
             "//": "__floordiv__", "%": "__mod__", "**": "__pow__", "** or pow()": "__pow__",
             "<": "__lt__", ">": "__gt__",
             "<=": "__le__", ">=": "__ge__", "&": "__and__", "|": "__or__"}


def exc_name(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return "OSError"
    if isinstance(exc, ModuleNotFoundError):
        return "ImportError"
    if isinstance(exc, RecursionError):
        return "RuntimeError"
    if isinstance(exc, BoardIndentationError):
        return "IndentationError"
    if isinstance(exc, BoardSyntaxError):
        return "SyntaxError"
    t = type(exc)
    for k in t.__mro__:                   # host subclasses (KpuError...) show as the builtin
        if k.__module__ == "builtins":
            return k.__name__
    return t.__name__


def exc_message(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "maximum recursion depth exceeded"
    if isinstance(exc, OSError) and exc.args and isinstance(exc.args[0], int) and len(exc.args) <= 2:
        return f"[Errno {exc.args[0]}] {errno_name(exc.args[0])}"
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        return mp_repr(exc.args[0])
    if isinstance(exc, SyntaxError):
        return exc.msg or "invalid syntax"
    if len(exc.args) == 1:
        msg = mp_str(exc.args[0])
    elif not exc.args:
        msg = ""
    else:
        msg = mp_repr(tuple(exc.args))
    for rx, rep in _MSG_RULES:
        m = rx.match(msg)
        if m:
            if "unsupported types" in rep:
                return f"unsupported types for {_OP_NAMES.get(m.group(1), m.group(1))}: " \
                       f"'{m.group(2)}', '{m.group(3)}'"
            return rx.sub(rep, msg)
    return msg


def exc_line(exc: BaseException) -> str:
    msg = exc_message(exc)
    return f"{exc_name(exc)}: {msg}" if msg else exc_name(exc)


# ---------------------------------------------------------------------------------------------
def _string_prefix(tok) -> str:
    """A string token's prefix, lower case ('rb' of rB'...'), '' for any other token."""
    return re.match(r"^[A-Za-z]*", tok.string).group(0).lower() if tok.type == tokenize.STRING else ""


def utf8_bytes_literals(source: str) -> str:
    """MicroPython's lexer is 8-bit clean: a bytes literal keeps a non-ASCII character as its
    UTF-8 bytes (3 for a Chinese character: Sipeed's font demos draw text so), where CPython
    refuses it. Each such character of a non-raw bytes literal becomes its \\x escapes."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source
    starts = [0]
    for line in io.StringIO(source):            # the lines tokenize counts
        starts.append(starts[-1] + len(line))
    for t in reversed(toks):
        prefix = _string_prefix(t)
        if "b" in prefix and "r" not in prefix and not t.string.isascii():
            a, b = starts[t.start[0] - 1] + t.start[1], starts[t.end[0] - 1] + t.end[1]
            lit = "".join(c if c.isascii() else "".join(f"\\x{v:02x}" for v in c.encode()) for c in t.string)
            source = source[:a] + lit + source[b:]
    return source


def expand_leading_tabs(source: str) -> str:
    """MicroPython's lexer (py/lexer.c) moves a tab to the next multiple of 8 columns, so an
    indentation that mixes tabs and spaces is fine when the columns agree, where CPython raises
    TabError: the indentation's tabs become spaces to those tab stops."""
    out = []
    for line in source.splitlines(keepends=True):
        body = line.lstrip(" \t")
        out.append(line[:len(line) - len(body)].expandtabs(8) + body)
    return "".join(out)


class _ConstFold(ast.NodeTransformer):
    """py/parse.c (MICROPY_COMP_CONST): `NAME = const(int)` is folded while parsing -- no import
    needed; every later use of NAME as a value is that int, and a NAME starting with '_' is
    not assigned at all (the statement becomes `pass`)."""

    def __init__(self):
        self.consts = {}

    def visit_Assign(self, node):
        v = node.value
        if (len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "const"
                and len(v.args) == 1 and not v.keywords):
            arg = self.visit(v.args[0])
            value = None
            if all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop,
                                  ast.expr_context)) for n in ast.walk(arg)):
                try:
                    value = eval(compile(ast.fix_missing_locations(ast.Expression(arg)), "<const>", "eval"))
                except Exception:
                    value = None
            if type(value) is not int:
                err = SyntaxError("constant must be an integer")
                err.lineno, err.offset = node.lineno, node.col_offset + 1
                raise err
            name = node.targets[0].id
            self.consts[name] = value
            if name.startswith("_"):
                return ast.copy_location(ast.Pass(), node)
            node.value = ast.copy_location(ast.Constant(value), v)
            return node
        return self.generic_visit(node)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and node.id in self.consts:
            return ast.copy_location(ast.Constant(self.consts[node.id]), node)
        return node


def _mp_compile(source: str, filename: str, mode: str):
    if "const" not in source:
        return compile(source, filename, mode, dont_inherit=True)
    tree = _ConstFold().visit(ast.parse(source, filename, mode))
    return compile(ast.fix_missing_locations(tree), filename, mode, dont_inherit=True)


def check_source(source: str, filename: str):
    """Refuse what MicroPython 1.11 cannot parse: f-strings (added upstream in 2021), `:=`."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return
    for t in toks:
        bad = None
        if t.type == tokenize.STRING:
            if "f" in _string_prefix(t):
                bad = "f-strings are not supported by MicroPython 1.11 (MaixPy): use '%' or .format()"
        elif t.type == tokenize.OP and t.string == ":=":
            bad = "':=' is not supported by MicroPython 1.11 (MaixPy)"
        elif getattr(tokenize, "FSTRING_START", None) == t.type:
            bad = "f-strings are not supported by MicroPython 1.11 (MaixPy): use '%' or .format()"
        if bad:
            err = BoardSyntaxError("invalid syntax")
            err.filename, err.lineno, err.offset, err.text = filename, t.start[0], t.start[1], t.line
            err.host_note = f"{filename}, line {t.start[0]}: {bad}"
            raise err


class _Out:
    """The board's stdout: captured, optionally echoed, and streamed to a callback."""

    def __init__(self, session):
        self.s = session
        self.buf = io.StringIO()

    def write(self, text):
        text = str(text)
        self.buf.write(text)
        if self.s.echo:
            sys.stdout.write(text)
            sys.stdout.flush()
        if self.s.on_output:
            self.s.on_output(text)
        return len(text)

    def flush(self):
        pass

    def getvalue(self):
        return self.buf.getvalue()

    def __repr__(self):                 # lib/utils/sys_stdio_mphal.c stdio_obj_print
        return "<io.FileIO 1>"


class _Err:
    """sys.stderr: the same UART as stdout (mp_sys_stderr_obj, fd 2)."""

    def __init__(self, out):
        self._out = out

    def write(self, text):
        return self._out.write(text)

    def flush(self):
        pass

    def __repr__(self):
        return "<io.FileIO 2>"


class Session:
    """One emulated board (see the module docstring). Board options as for `board.Board`."""

    def __init__(self, board=None, echo=False, on_output=None, on_input=None, **board_kw):
        self.board = board if board is not None else _board.Board(**board_kw)
        self.board.session = self
        self.board.clock.board = self.board
        self.echo, self.on_output, self.on_input = echo, on_output, on_input
        self.on_char = None         # a REPL board's UART: one byte per call (sys.stdin)
        self._inbuf = ""
        self._interrupt = False
        self.baton = None           # _thread's GIL on the board clock (threads.py), once needed
        self.idle_threads = False   # a REPL board: threads run while the prompt waits
        self._depth = 0
        self.pending, self.timers, self._in_callback = [], [], False
        self.out = _Out(self)
        self.boot_out = io.StringIO()
        self.board.vfs.say = lambda text: self._print(text)
        self.code_files = set()
        self._closed = False
        self.exit_status = None
        self._new_interpreter()

    # -- interpreter state -------------------------------------------------------------------
    def _new_interpreter(self):
        from tl2k210.maixpy import modules
        self.board.gc = _heap.Heap(self.board.runtime.gc_pool)
        self.modules = {}
        self.builtins = modules.make_builtins(self)
        self.sys = modules.make_sys(self)
        self.modules["sys"] = self.sys
        from tl2k210.maixpy.mpdir import Namespace
        self.globals = Namespace(__name__="__main__", __builtins__=self.builtins)
        self.dir_history = ()      # what _boot.py did to __main__'s dict (mpdir.py, for dir())

    def output(self) -> str:
        return self.out.getvalue()

    def interrupt(self):
        """Ctrl-C: raise KeyboardInterrupt in the running board code at its next line (safe
        to call from another thread, e.g. a REPL's serial reader)."""
        self._interrupt = True

    def _print(self, text, end="\n"):
        self.out.write(text + end)

    def host_wait(self, fn, *args):
        """Call `fn` that waits for the host (the serial line): like mp_hal_stdin_rx_chr's
        poll loop, the wait releases the GIL, so _threads run meanwhile (paced to host time)."""
        baton = self.baton
        if baton is None or self.in_board_thread():
            return fn(*args)
        baton.leave()
        try:
            return fn(*args)
        finally:
            baton.enter()

    def read_char(self):
        """One character from the REPL UART for sys.stdin (mp_hal_stdin_rx_chr: blocks; '\\r'
        reads as '\\n'): `on_char()` (a byte, None when the console is gone), else the lines
        `on_input` gives; with neither, the board waits until the watchdog stops the run."""
        if self.on_char is not None:
            c = self.host_wait(self.on_char)
            if c is None:
                return None
            data = bytes([c])
            if c >= 0xC0:                             # a UTF-8 character's further bytes
                for _ in range(3 if c >= 0xF0 else 2 if c >= 0xE0 else 1):
                    nxt = self.host_wait(self.on_char)
                    if nxt is None:
                        break
                    data += bytes([nxt])
            ch = data.decode("utf-8", "replace")
            return "\n" if ch == "\r" else ch
        if self.on_input is not None:
            if not self._inbuf:
                self._inbuf = self.host_wait(self.on_input, "") + "\n"
            ch, self._inbuf = self._inbuf[0], self._inbuf[1:]
            return "\n" if ch == "\r" else ch
        b = self.board
        b.note("sys.stdin waits for a character on the REPL UART, and this run has no serial "
               "input (run a script on `tl2k210 board` to type into it): it waits until the "
               "watchdog stops the run", "stdin")
        clock = b.clock
        if not clock.timeout or clock.timeout <= 0:
            b.stop("sys.stdin: waiting for serial input that this run cannot give", "stdin")
        while True:
            clock.sleep(clock.timeout * 1e6 + 1)

    # -- running code --------------------------------------------------------------------------
    def compile(self, source: str, filename: str, mode: str = "exec"):
        self.code_files.add(filename)
        check_source(source, filename)
        src = utf8_bytes_literals(source) if not source.isascii() else source
        try:
            try:
                code = _mp_compile(src, filename, mode)
            except TabError:
                code = _mp_compile(expand_leading_tabs(src), filename, mode)
        except SyntaxError as exc:
            err = (BoardIndentationError(INDENTATION[exc.msg]) if exc.msg in INDENTATION else
                   BoardSyntaxError(exc.msg if exc.msg == "constant must be an integer" else "invalid syntax"))
            err.filename, err.lineno, err.offset, err.text = filename, exc.lineno, exc.offset, exc.text
            err.host_note = f"{filename}, line {exc.lineno}: {exc.msg}"
            raise err from None
        self.code_files.add(filename)
        return code

    def exec(self, source: str, filename: str = "<stdin>", globals=None):
        """Run code in the persistent __main__ namespace (or `globals`). Exceptions propagate
        (format them with `format_exception`); BoardStop ends the run from the board side."""
        code = source if isinstance(source, types.CodeType) else self.compile(source, filename)
        return self._run(lambda: exec(code, self.globals if globals is None else globals))

    def eval(self, source: str, filename: str = "<stdin>"):
        code = self.compile(source, filename, "eval")
        return self._run(lambda: eval(code, self.globals))

    def run_file(self, path: str, name: str | None = None):
        """Execute a board file (path relative to the board's cwd) in __main__."""
        data = self.board.vfs.read_bytes(path)
        return self.exec(data.decode("utf-8", "replace"), name or path.rsplit("/", 1)[-1])

    def _run(self, fn):
        with _board.installed(self.board):
            old = sys.gettrace()
            sys.settrace(self._tracer)
            self._depth += 1
            if self._depth == 1 and self.baton is not None and self.idle_threads:
                self.baton.enter()
            try:
                return fn()
            finally:
                self._depth -= 1
                if self._depth == 0 and self.baton is not None and self.idle_threads:
                    self.baton.leave()
                sys.settrace(old)

    def in_board_thread(self) -> bool:
        """Is the caller a _thread thread (not the main one, which gets Ctrl-C)?"""
        return self.baton is not None and threading.get_ident() in self.baton.threads

    def _tracer(self, frame, event, arg):
        if frame.f_code.co_filename in self.code_files:
            return self._line
        return None

    def _line(self, frame, event, arg):
        if event == "line":
            clock = self.board.clock
            if not clock.wall:
                clock._t += timing.LINE_US
            if self.board.stop_reason is not None:
                raise self.board.stop_reason
            if self._interrupt and not self.in_board_thread():
                self._interrupt = False
                raise KeyboardInterrupt()
            if self.baton is not None:
                self.baton.tick()
            self._n = getattr(self, "_n", 0) + 1
            if self._n & 1023 == 0:
                clock.check()
            if (self.pending or self.timers) and not self._in_callback:
                self._run_callbacks(clock.now_us())
        return self._line

    # -- callbacks (MicroPython's scheduler: between lines of the main program) ------------------
    def schedule(self, fn, arg):
        """Run fn(arg) before the next line of board code (GPIO IRQs, micropython.schedule)."""
        self.pending.append((fn, arg))

    def add_timer(self, timer, period_us: float, periodic: bool):
        self.timers = [t for t in self.timers if t[2] is not timer]
        self.timers.append([self.board.clock.now_us() + period_us, period_us, timer, periodic])

    def remove_timer(self, timer):
        self.timers = [t for t in self.timers if t[2] is not timer]

    def _run_callbacks(self, now):
        self._in_callback = True
        try:
            while self.pending:
                fn, arg = self.pending.pop(0)
                fn(arg)
            for t in list(self.timers):
                if now >= t[0] and t[2]._callback is not None:
                    t[0] = t[0] + t[1] if t[3] else float("inf")
                    t[2]._callback(t[2])          # the Timer; its arg= is callback_arg()
        finally:
            self._in_callback = False

    # -- boot ------------------------------------------------------------------------------------
    def boot(self, run_boot: bool = True, run_main: bool = True):
        """The firmware's start: _boot.py (cwd, sys.path, the names it leaves in __main__), then
        boot.py and main.py from the cwd (docs/maixpy-firmware.md#boot). Returns the main.py outcome
        (None, or the exception it raised)."""
        vfs = self.board.vfs
        self.sys.path[:] = ["", "."]
        if vfs.has_sd:
            vfs.chdir("/sd")
            self.sys.path.append("/sd")
        else:
            vfs.chdir("/flash")
        self.sys.path.append("/flash")
        self.boot_out.write("[MaixPy] init end\n")
        self.board.clock.advance(timing.BOOT_SLEEP_US)      # waiting 200 x 1 ms for Ctrl-C
        # _boot.py runs in __main__ (pyexec_frozen_module): its `import os, sys, time` stay there;
        # what it makes belongs to this board (an M5StickV's `fm` had bound a second, default
        # board: its pins were not the script's, and that board's flash folder was never removed)
        with _board.installed(self.board):
            for name in ("os", "sys", "time"):
                self.globals[name] = self.import_module(name)
            for name in self.board.profile.boot_names:      # the names a board's own _boot.py imports
                self.globals[name] = self._boot_name(name)
        from tl2k210.maixpy import mpdir
        self.dir_history = self.globals.history = mpdir.boot_history(vfs.exists("main.py"))
        self.boot_out.write(BANNER)
        if run_main and not vfs.exists("main.py"):
            self.board.note(f"no main.py in {vfs.getcwd()}: the board's _boot.py would write its "
                            "'Welcome to MaixPy' main.py there (the host leaves the folder as it is)",
                            "welcome")
        result = None
        for name, wanted in (("boot.py", run_boot), ("main.py", run_main)):
            if wanted and vfs.exists(name):
                result = self.run_main_file(name)
        return result

    def _boot_name(self, name):
        """A name an M5StickV-style _boot.py leaves in __main__: a module, or from its module."""
        where = {"board_info": "board", "fm": "fpioa_manager", "pye": "pye_mp", "FPIOA": "Maix", "GPIO": "Maix"}
        return getattr(self.import_module(where[name]), name) if name in where else self.import_module(name)

    def run_main_file(self, name):
        """Run boot.py/main.py like pyexec_file: an exception is printed, not raised."""
        try:
            self.run_file(name)
        except SystemExit:
            return None
        except Exception as exc:     # printed by the REPL, like the board
            self._print(self.format_exception(exc), end="")
            return exc
        return None

    def soft_reset(self, run_main: bool = True):
        """Ctrl-D: `soft reboot`: loaded models are freed (finalisers), the heap, sys.modules and
        __main__ start again, the hardware keeps its state, ticks keep counting; then _boot.py,
        boot.py and main.py run again."""
        from tl2k210.maixpy import KPU
        for t in list(self.board.kpu_tasks):
            KPU.release(self.board, t)
        self._print("MPY: soft reboot")
        if self.baton is not None:          # the threads end with the interpreter
            self.baton.close()
            self.baton = None
        self.pending, self.timers = [], []
        self._new_interpreter()
        return self.boot(run_main=run_main)

    # -- imports -----------------------------------------------------------------------------------
    def import_module(self, name: str):
        from tl2k210.maixpy import modules
        if name in self.modules:
            return self.modules[name]
        factory = modules.BUILTIN.get(name)
        if factory is not None:
            mod = factory(self)
            self.modules[name] = mod
            return mod
        mod = self._import_file(name)
        if mod is not None:
            return mod
        hint = modules.IMPORT_HINTS.get(name)
        if hint:
            self.board.note(f"import {name}: {hint}", ("import", name))
        else:
            self.board.note(f"import {name}: no board module of that name and no {name}.py on "
                            f"sys.path {self.sys.path} (cwd {self.board.vfs.getcwd()})",
                            ("import", name))
        raise ImportError(f"no module named '{name}'")

    def _import_file(self, name):
        """A module from sys.path, as py/builtinimport.c (MicroPython 1.11) finds it: a folder of
        that name first (a package: its __init__.py where there is one, else a namespace package,
        which Sipeed's MaixUI imports as `driver.camera`), then NAME.py."""
        vfs = self.board.vfs
        rel = name.replace(".", "/")

        def kind(path):
            try:
                return "dir" if vfs.stat(path)[0] & 0x4000 else "file"
            except OSError:
                return None
        for entry in list(self.sys.path):
            base = vfs.getcwd() if entry in ("", ".") else entry
            folder = f"{base}/{rel}".replace("//", "/")
            if kind(folder) == "dir" and kind(f"{folder}/__init__.py") != "file":
                mod = types.ModuleType(name)
                mod.__path__ = [folder]
                self.modules[name] = mod
                return mod
            for cand in (f"{folder}/__init__.py", f"{folder}.py"):
                if kind(cand) != "file":
                    continue
                src = vfs.read_bytes(cand).decode("utf-8", "replace")
                mod = types.ModuleType(name)
                mod.__file__ = cand
                mod.__dict__["__builtins__"] = self.builtins
                self.modules[name] = mod
                try:
                    code = self.compile(src, cand.rsplit("/", 1)[-1] if entry in ("", ".") else cand)
                    exec(code, mod.__dict__)
                except BaseException:
                    self.modules.pop(name, None)
                    raise
                return mod
        return None

    def _import(self, name, globals=None, locals=None, fromlist=(), level=0):
        if level:
            raise ImportError("can't perform relative import")
        parts = name.split(".")
        top = self.import_module(parts[0])
        mod = top
        for i, part in enumerate(parts[1:], 1):
            sub = getattr(mod, part, None)
            if not isinstance(sub, types.ModuleType):
                sub = self.import_module(".".join(parts[:i + 1]))
                setattr(mod, part, sub)
            mod = sub
        if fromlist:
            for item in fromlist:
                if item != "*" and not hasattr(mod, item):
                    try:
                        setattr(mod, item, self.import_module(f"{name}.{item}"))
                    except ImportError:
                        raise ImportError(f"cannot import name {item}") from None
            return mod
        return top

    # -- exceptions ----------------------------------------------------------------------------
    def format_exception(self, exc: BaseException) -> str:
        """The traceback as the MaixPy REPL prints it (board frames only)."""
        lines = ["Traceback (most recent call last):\n"]
        for f in traceback.extract_tb(exc.__traceback__):
            if f.filename in self.code_files:
                name = "<module>" if f.name == "<module>" else f.name
                lines.append(f'  File "{f.filename}", line {f.lineno}, in {name}\n')
        if isinstance(exc, SyntaxError) and exc.filename in self.code_files:
            lines.append(f'  File "{exc.filename}", line {exc.lineno}\n')
        lines.append(exc_line(exc) + "\n")
        return "".join(lines)

    def close(self):
        if not self._closed:
            self._closed = True
            if self.baton is not None:
                self.baton.close()
            self.board.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


BANNER = r"""
 __  __              _____  __   __  _____   __     __
|  \/  |     /\     |_   _| \ \ / / |  __ \  \ \   / /
| \  / |    /  \      | |    \ V /  | |__) |  \ \_/ /
| |\/| |   / /\ \     | |     > <   |  ___/    \   /
| |  | |  / ____ \   _| |_   / . \  | |         | |
|_|  |_| /_/    \_\ |_____| /_/ \_\ |_|         |_|

Official Site : https://www.sipeed.com
Wiki          : https://maixpy.sipeed.com

MicroPython v0.6.2 on 2020-12-16; Sipeed_M1 with kendryte-k210 (tl2k210 host emulation)
Type "help()" for more information.
"""

