"""Departures of the host MaixPy from a v0.6.2 board fixed in round 45: what sensor.reset()
prints while it probes the camera, interleaved sleeping threads, MicroPython's dir(),
sys.stdin reads. Each test names the firmware source it checks against."""
import contextlib

from repl_helpers import Wire, b  # noqa: F401  (b: a fixture, a started REPL board)
from test_maixpy_runtime import PROBE, photo, run  # noqa: F401  (the runner and the photo fixture)


@contextlib.contextmanager
def _friendly_repl(board):
    """A plain serial client at the friendly REPL's prompt of a started board (`b` fixture)."""
    w = Wire(board.port)
    try:
        w.send(b"\x02")
        w.until(b">>> ")
        yield w
    finally:
        w.close()


def test_sensor_reset_prints_the_probe_of_each_camera(tmp_path, photo):
    """sensor.c (v0.6.2) sensor_init_dvp: cambus_init -> sccb_i2c_init prints "init i2c2\\r\\n"
    (sensor_load_config's default bus 2); sensro_ov_detect prints the chip, sensor_init_dvp
    "find ov sensor"; a GC0328 is found by sensro_gc_detect, which prints its id (%x) first."""
    body = "import sensor\nsensor.reset()\nprint('ok')\n"
    res = run(tmp_path, body, images=[photo])
    assert res.stdout == "init i2c2\r\n[MAIXPY]: find ov2640\n[MAIXPY]: find ov sensor\nok\n"
    assert run(tmp_path, body, camera="ov7740").lines == [
        "init i2c2", "[MAIXPY]: find ov7740", "[MAIXPY]: find ov sensor", "ok"]
    assert run(tmp_path, body, camera="gc0328").lines == [
        "init i2c2", "[MAIXPY]: sensor id = 9d", "[MAIXPY]: find gc0328", "ok"]


def test_sensor_reset_choice_that_excludes_the_camera_fails(tmp_path):
    """choice=2 probes GC sensors only: an OV2640 board prints "no sensor" and py_sensor_reset's
    PY_ASSERT_FALSE_MSG raises OSError("Reset Failed"); snapshot() then says "Not init!"."""
    res = run(tmp_path, """
import sensor
try:
    sensor.reset(choice=2)
except OSError as e:
    print(e)
sensor.reset(choice=1)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["init i2c2", "[MAIXPY]: no sensor", "Reset Failed"] + PROBE


def test_sensor_probe_bus_follows_config_json(tmp_path):
    """sensor_load_config reads the "sensor" dict of /flash/config.json: i2c_num -2 (the DVP's
    SCCB) makes sccb_i2c_init silent."""
    fs = tmp_path / "flash"
    fs.mkdir()
    (fs / "config.json").write_text('{"type": "dock", "sensor": {"i2c_num": -2}}')
    res = run(tmp_path, "import sensor\nsensor.reset()\n", fs=fs)
    assert res.lines == PROBE[1:]


def test_two_sleeping_threads_print_in_turn(tmp_path):
    """basic/demo_thread.py: two _threads that print and sleep 1 s each. On a board
    (modthread.c, the GIL released by mp_hal_delay_ms and every few bytecodes) they alternate,
    once a second each, while the main thread busy-loops; the host used to let one starve."""
    res = run(tmp_path, """
import _thread
import time

def func(name):
    while 1:
        print("hello {}".format(name))
        time.sleep(1)

_thread.start_new_thread(func,("1",))
_thread.start_new_thread(func,("2",))

while 1:
    pass
""", timeout=5)
    assert res.stop == "timeout", res.traceback
    assert res.lines == ["hello 1", "hello 2"] * 5


def test_threads_share_the_board_clock_locks_and_errors(tmp_path):
    """Sleeps of different lengths interleave on the one board clock; a blocked
    lock.acquire() lets the others run; an exception ends its thread with modthread.c's
    "Unhandled exception in thread started by <function ...>" and the traceback."""
    res = run(tmp_path, """
import _thread, time
t0 = time.ticks_ms()
lock = _thread.allocate_lock()
done = []
def f(name, n, ms):
    for i in range(n):
        print(name, i, (time.ticks_ms() - t0) // 10 * 10)
        time.sleep_ms(ms)
    with lock:
        done.append(name)
_thread.start_new_thread(f, ('a', 3, 100))
_thread.start_new_thread(f, ('b', 3, 150))
while len(done) < 2:
    time.sleep_ms(10)
print('main', done, (time.ticks_ms() - t0) // 10 * 10)
lock.acquire()
def g():
    print('g waits')
    lock.acquire()
    print('g got it', (time.ticks_ms() - t0) // 10 * 10)
_thread.start_new_thread(g, ())
time.sleep_ms(50)
lock.release()
time.sleep_ms(50)
def h(x):
    1/x
_thread.start_new_thread(h, (0,))
time.sleep_ms(1)
print('end')
""")
    assert res.error is None, res.traceback
    lines = res.lines
    assert lines[:10] == ["a 0 0", "b 0 0", "a 1 100", "b 1 150", "a 2 200", "b 2 300",
                          "main ['a', 'b'] 450", "g waits", "g got it 500",
                          lines[9]]
    assert lines[9].startswith("Unhandled exception in thread started by <function h at 0x")
    assert lines[10:] == ["Traceback (most recent call last):", '  File "main.py", line 27, in h',
                          "ZeroDivisionError: divide by zero", "end"]


def test_threads_run_while_the_repl_prompt_waits(b):
    """At the REPL prompt a board's _threads keep running (the prompt's UART read releases
    the GIL): a thread that prints every 100 ms prints, paced to host time, while the prompt
    waits; the next command takes the GIL back at once."""
    import time
    with _friendly_repl(b) as w:
        w.send(b"import _thread, time\r")
        w.until(b">>> ")
        w.send(b"def f():\r n = 0\r while True:\r  n += 1\r  print('tick', n)\r  time.sleep_ms(100)\r\r")
        w.until(b">>> ")
        w.send(b"_thread.start_new_thread(f, ())\r")
        time.sleep(0.6)
        got = w.until(b"tick 4\r\n")
        # the prompt comes out before or after the first tick (a GIL hand-over)
        assert b"tick 1\r\ntick 2\r\ntick 3\r\n" in got.replace(b">>> ", b"")
        w.send(b"1+1\r")
        assert b"2\r\n" in w.until(b">>> ")


def test_dir_lists_micropythons_names(tmp_path):
    """py/modbuiltins.c mp_builtin_dir: dir() is the globals dict in hash-table slot order (the
    1-byte djb2 qstr hash modulo the table size, after _boot.py's stores and deletes), also
    inside a function; dir(obj) probes the qstr table: __class__ always, a module's table with
    __name__ (no __doc__/__spec__), a class's __module__/__qualname__, the static qstrs first.
    No CPython names (__builtins__, __dict__, __weakref__...)."""
    from tl2k210.maixpy import mpdir
    res = run(tmp_path, """
x = 1
print(dir())
import sys
print(dir(sys))
class A:
    def f(self): pass
a = A()
a.v = 2
print(dir(a))
print(dir([]))
def g():
    y = 1
    return dir()
print(g() == dir())
""")
    assert res.error is None, res.traceback
    assert res.lines == [
        "['time', 'os', '__name__', 'sys', 'x']",
        "['__class__', '__name__', 'argv', 'byteorder', 'exit', 'implementation', 'maxsize', "
        "'modules', 'path', 'platform', 'print_exception', 'stderr', 'stdin', 'stdout', "
        "'version', 'version_info']",
        "['__class__', '__module__', '__qualname__', 'f', 'v']",
        "['__class__', 'append', 'clear', 'copy', 'count', 'extend', 'index', 'insert', 'pop', "
        "'remove', 'reverse', 'sort']",
        "True"]
    # the slot order by hand: hashes mod the table sizes py/map.c grows through (2, 4, 6, 8)
    assert [mpdir.qstr_hash(n) for n in ("__name__", "os", "sys", "time", "x")] == \
        [0xe2, 0x79, 0xbc, 0xf0, 0xdd]


def test_hash_map_follows_py_map_c():
    """A deleted key leaves a sentinel when its successor slot is taken (an empty slot
    otherwise), a new key takes the first sentinel it passes, and the table grows only when
    full, rehashing in slot order."""
    from tl2k210.maixpy.mpdir import HashMap, qstr_hash
    m = HashMap(1)
    for k in ("__name__", "os", "sys", "time"):
        m.add(k)
    # 2 slots: __name__ 0xe2 % 2 = 0, os 0x79 % 2 = 1; sys finds it full: 4 slots, rehashed in
    # slot order (__name__ -> 2, os -> 1), then sys 0xbc % 4 = 0; time 0xf0 % 4 = 0 probes to 3
    assert len(m.table) == 4 and m.keys() == ["sys", "os", "__name__", "time"]
    m.remove("os")                     # slot 2 is taken: a sentinel
    m.add("x")                         # 0xdd % 4 = 1: probes round the full table, takes it
    assert m.keys() == ["sys", "x", "__name__", "time"]
    assert qstr_hash("") == 0x05 and qstr_hash("a") == (5381 * 33 ^ 97) & 0xFF


def test_stdin_read_blocks_for_the_repl_uart(b):
    """lib/utils/sys_stdio_mphal.c stdio_read: sys.stdin.read(n) takes n characters from the
    REPL UART, blocking for each, '\\r' read as '\\n' and not echoed; Ctrl-C interrupts it."""
    with _friendly_repl(b) as w:
        w.send(b"import sys; print(sys.stdin); c = sys.stdin.read(3); print(repr(c))\r")
        assert w.until(b"<io.FileIO 0>\r\n")
        w.send(b"xy\r")
        assert w.until(b">>> ").endswith(b"'xy\\n'\r\n>>> ")
        w.send(b"sys.stdin.read(1)\r")
        w.until(b"sys.stdin.read(1)\r\n")
        w.send(b"\x03")
        assert b"KeyboardInterrupt" in w.until(b">>> ")


def test_stdin_without_serial_input_waits_like_a_board(tmp_path):
    """A script run on the host (no serial line) that reads sys.stdin waits, as a board with
    nothing typed would, until the watchdog ends the run; a note says why."""
    res = run(tmp_path, "import sys\nprint('before')\nc = sys.stdin.read(1)\nprint('never')\n",
              timeout=2)
    assert res.error is None and res.stop == "timeout" and res.lines == ["before"]
    assert any("sys.stdin waits for a character on the REPL UART" in n for n in res.notes)


def test_threads_run_while_stdin_waits(b):
    """mp_hal_stdin_rx_chr waits in a poll loop that releases the GIL: a _thread keeps
    printing while the main thread's sys.stdin.read(1) waits for the UART."""
    import time
    with _friendly_repl(b) as w:
        w.send(b"import _thread, time, sys\r")
        w.until(b">>> ")
        w.send(b"def f():\r n = 0\r while n < 3:\r  n += 1\r  print('tick', n)\r  time.sleep_ms(100)\r\r")
        w.until(b">>> ")
        w.send(b"_thread.start_new_thread(f, ()); c = sys.stdin.read(1); print('got', c)\r")
        time.sleep(0.5)
        assert b"tick 3\r\n" in w.until(b"tick 3\r\n")
        w.send(b"z")
        assert w.until(b">>> ").endswith(b"got z\r\n>>> ")


def test_thread_module_follows_modthread_c(tmp_path):
    """modthread.c (MicroPython @ced340d): start_new_thread returns None and takes a tuple or
    a list ('object 'int' isn't a tuple or list'), kwargs must be a dict; a lock prints
    `<lock>` and is _thread.LockType, acquire(0) on a held lock is False, releasing an
    unlocked lock raises a bare RuntimeError; stack_size returns the previous size;
    _thread.exit() ends the thread quietly (SystemExit)."""
    res = run(tmp_path, """
import _thread, time
print(_thread.start_new_thread(print, [1, 2]))
time.sleep_ms(1)
try:
    _thread.start_new_thread(print, 5)
except TypeError as e:
    print(e)
try:
    _thread.start_new_thread(print, (), 5)
except TypeError as e:
    print(e)
l = _thread.allocate_lock()
print(l, type(l) is _thread.LockType, l.acquire(), l.acquire(0), l.locked())
l.release()
try:
    l.release()
except RuntimeError as e:
    print(repr(e))
print(_thread.stack_size(8192), _thread.stack_size())
def f():
    print("in f")
    _thread.exit()
    print("never")
_thread.start_new_thread(f, ())
time.sleep_ms(1)
print("end")
""")
    assert res.error is None, res.traceback
    assert res.lines == ["None", "1 2", "object 'int' isn't a tuple or list",
                         "expecting a dict for keyword args", "<lock> True True False True",
                         "RuntimeError()", "0 8192", "in f", "end"]


def test_globals_is_the_boards_main_dict(tmp_path):
    """basic/demo_globals.py: globals() is __main__'s dict, written and popped by the script;
    it prints in the board dict's slot order (as dir()) and has no CPython __builtins__."""
    res = run(tmp_path, """
x = 1
print(globals())
print(len(globals()), "__builtins__" in globals(), list(globals()) == dir())
def var_create(var):
    if var not in globals():
        globals()[var] = 1
var_create("gv")
gv = gv + 1
print(gv)
globals().pop("gv")
print(gv)
""")
    assert res.lines == [
        "{'time': <module 'utime'>, 'os': <module 'uos'>, '__name__': '__main__', "
        "'sys': <module 'sys'>, 'x': 1}", "5 False True", "2"]
    assert res.traceback.endswith('  File "main.py", line 12, in <module>\n'
                                  "NameError: name 'gv' isn't defined\n")


def test_image_host_helpers_are_not_board_methods(tmp_path):
    """py_image.c's Image has no from_rgb, ai_buffer or to_rgb888 (host helpers): a script
    gets the AttributeError a board gives, and dir(img) does not list them."""
    res = run(tmp_path, """
import image
img = image.Image(size=(8, 8))
names = dir(img)
print([n for n in ('from_rgb', 'ai_buffer', 'to_rgb888') if n in names], 'draw_line' in names)
img.to_rgb888()
""")
    assert res.lines == ["[] True"]
    assert res.traceback.endswith("AttributeError: 'Image' object has no attribute 'to_rgb888'\n")


def test_classes_functions_and_bound_methods_print_like_micropython(tmp_path):
    """py/objtype.c type_print `<class 'A'>` (no module), py/objfun.c fun_bc_print
    `<function h at 0x...>` (the plain name, not a qualified one), py/objboundmeth.c
    `<bound_method ADDR <A object at ADDR>.<function f at 0x...>>`."""
    import re
    res = run(tmp_path, """
class A:
    def f(self): pass
def g():
    def h(): pass
    return h
print(A, int, ValueError)
print(g())
print(A().f)
""")
    assert res.error is None, res.traceback
    assert res.lines[0] == "<class 'A'> <class 'int'> <class 'ValueError'>"
    assert re.fullmatch(r"<function h at 0x[0-9a-f]+>", res.lines[1])
    assert re.fullmatch(r"<bound_method [0-9a-f]+ <A object at [0-9a-f]+>\.<function f at 0x[0-9a-f]+>>",
                        res.lines[2])


def test_stdout_and_stderr_are_the_uart_fileio(tmp_path):
    """lib/utils/sys_stdio_mphal.c: sys.stdout/stderr print as <io.FileIO 1>/<io.FileIO 2>,
    both write to the REPL UART, and write returns the count written."""
    res = run(tmp_path, """
import sys
print(sys.stdin, sys.stdout, sys.stderr)
print(sys.stdout.write("bc"))
sys.stderr.write("e\\n")
print("x", file=sys.stderr)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["<io.FileIO 0> <io.FileIO 1> <io.FileIO 2>", "bc2", "e", "x"]
