"""`_thread` on the host: MicroPython's GIL on the board's virtual clock.

On a MaixPy board (MICROPY_PY_THREAD with the GIL, FreeRTOS tasks on one core) only the thread
holding the GIL runs; `time.sleep*` (mp_hal_delay_ms) releases it for the whole sleep, and the VM
hands it over every few bytecodes (MICROPY_PY_THREAD_GIL_VM_DIVISOR), so two threads that print
and sleep 1 s each print once a second each, in turn. The host's threads are host threads, but
only the one holding the `Baton` runs board code; each waiting thread has a wake time on the
board clock, and the baton goes to the earliest (first come first served on ties). When every
thread sleeps, the clock jumps to the earliest wake time - a discrete-event simulation of the
single CPU, so the output does not depend on host speed.

No scheduler exists until the first `_thread.start_new_thread`, so a script without threads
runs exactly as before. With `--wall-clock` the threads are plain host threads (sleeps are real).
When the run ends (Session.close) the waiting threads end with BoardStop, quietly. Between REPL
commands (Session.idle_threads) the main thread gives the baton away, and the others run paced
to host time (a thread that sleeps 1 s prints once a host second at the prompt, as on a board).
"""
from __future__ import annotations

import itertools
import threading
import time

#: lines of board code a thread runs before it offers the GIL to a waiting thread that is due
#: (MicroPython: MICROPY_PY_THREAD_GIL_VM_DIVISOR = 32 jumps/calls between GIL releases)
SLICE_LINES = 32


class Baton:
    def __init__(self, session):
        self.s = session
        self.clock = session.board.clock
        self.cv = threading.Condition()
        self.owner = threading.get_ident()      # whoever starts the first thread holds the GIL
        self.waiting = {}                       # ident -> (wake us, seq)
        self.seq = itertools.count()
        self.threads = set()                    # idents of _thread threads (not the main one)
        self.main_out = False                   # the main thread is at the REPL prompt
        self.closed = False
        self.lines = 0

    # -- handing over ----------------------------------------------------------------------------
    def _dispatch(self):
        if self.owner is not None or not self.waiting:
            return
        self.owner = min(self.waiting, key=self.waiting.get)
        self.cv.notify_all()

    def _stopped(self):
        b = self.s.board
        if self.closed:
            from tl2k210.maixpy.board import BoardStop
            return b.stop_reason or BoardStop("the run ended", "end")
        return b.stop_reason

    def run_at(self, wake_us: float):
        """Give up the GIL and take it back at board time `wake_us` (or later, when other
        threads due earlier have run)."""
        me = threading.get_ident()
        with self.cv:
            self.waiting[me] = (wake_us, next(self.seq))
            if self.owner == me:
                self.owner = None
            self._dispatch()
            while True:
                stop = self._stopped()
                if stop is not None:
                    self.waiting.pop(me, None)
                    if self.owner == me:
                        self.owner = None
                        self._dispatch()
                    raise stop
                if self.owner == me:
                    left = wake_us - self.clock._t
                    if self.main_out and left > 0 and me in self.threads:
                        # nobody runs board code at the prompt: wait host time, unless the
                        # main thread comes back (it takes the GIL then)
                        t0 = time.perf_counter()
                        self.cv.wait(left / 1e6)
                        if self.owner == me:
                            self.clock._t = max(self.clock._t, min(
                                wake_us, self.clock._t + (time.perf_counter() - t0) * 1e6))
                            if self.clock._t < wake_us:
                                continue
                        else:
                            continue
                    break
                self.cv.wait(0.5)
            self.waiting.pop(me, None)
        if not self.clock.wall and self.clock._t < wake_us:
            self.clock._t = wake_us

    def sleep(self, us: float):
        self.run_at(self.clock.now_us() + us)

    def tick(self):
        """Every SLICE_LINES lines: let a thread that is due (wake time passed) run."""
        self.lines += 1
        if self.lines % SLICE_LINES:
            return
        now = self.clock.now_us()
        if any(w[0] <= now for k, w in self.waiting.items() if k != threading.get_ident()):
            self.run_at(now)

    def wait_for_others(self):
        """A blocked lock.acquire(): let the other threads run until one is due."""
        me = threading.get_ident()
        with self.cv:
            others = [w[0] for k, w in self.waiting.items() if k != me]
        now = self.clock.now_us()
        self.run_at(max(now + 1, min(others)) if others else now + 1000)

    # -- the main thread at the REPL -------------------------------------------------------------
    def leave(self):
        """The main thread returns to the host (the REPL prompt): the others run paced."""
        with self.cv:
            if self.owner == threading.get_ident():
                self.main_out = True
                self.owner = None
                self._dispatch()

    def enter(self):
        me = threading.get_ident()
        with self.cv:
            if self.owner == me or not self.main_out:
                return
            self.main_out = False
            if self.owner is not None and self.owner in self.threads \
                    and me not in self.waiting and self._pacing(self.owner):
                self.owner = me                # a pacing thread waits host time: take over
                self.cv.notify_all()
                return
        self.run_at(self.clock.now_us())

    def _pacing(self, ident):
        w = self.waiting.get(ident)
        return w is not None and w[0] > self.clock.now_us()

    def close(self):
        with self.cv:
            self.closed = True
            self.cv.notify_all()


class lock:
    """_thread.allocate_lock() (modthread.c mp_type_thread_lock, printed `<lock>`): a blocked
    acquire releases the GIL; acquire(waitflag[, timeout]) ignores the timeout; release of an
    unlocked lock raises a bare RuntimeError."""

    def __init__(self, session):
        self._s = session
        self._lock = threading.Lock()

    def acquire(self, waitflag=1, timeout=-1):
        from tl2k210.maixpy.args import get_int
        if self._lock.acquire(False):
            return True
        if not get_int(waitflag):
            return False
        baton = self._s.baton
        if baton is None or self._s.board.clock.wall:
            return self._lock.acquire()
        while not self._lock.acquire(False):
            baton.wait_for_others()
        return True

    def release(self):
        try:
            self._lock.release()
        except RuntimeError:
            raise RuntimeError() from None

    def locked(self):
        return self._lock.locked()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


Lock = lock


def start_new_thread(s, fn, args, kwargs=None):
    """modthread.c mod_thread_start_new_thread: the new thread runs when the GIL comes to it;
    args is any tuple or list (mp_obj_get_array), kwargs a dict; returns None."""
    from tl2k210.maixpy import board as _b
    from tl2k210.maixpy.args import type_name
    b = s.board
    if not isinstance(args, (tuple, list)):
        raise TypeError("object '%s' isn't a tuple or list" % type_name(args))
    args = tuple(args)
    if kwargs is not None and type(kwargs) is not dict:
        raise TypeError("expecting a dict for keyword args")
    virtual = not b.clock.wall
    if virtual and s.baton is None:
        s.baton = Baton(s)
    baton = s.baton if virtual else None
    ready = threading.Event()

    def run():
        import sys
        _b.install(b)
        me = threading.get_ident()
        if baton is not None:
            baton.threads.add(me)
        ready.set()
        try:
            if baton is not None:
                baton.run_at(b.clock.now_us())
            sys.settrace(s._tracer)
            fn(*args, **(kwargs or {}))
        except SystemExit:
            pass
        except _b.BoardStop:          # the run is over (watchdog, frames): the thread ends
            pass
        except Exception as exc:
            s.out.write("Unhandled exception in thread started by %s\n%s" %
                        (_fn_repr(fn), s.format_exception(exc)))
        finally:
            sys.settrace(None)
            if baton is not None:
                baton.threads.discard(me)
                with baton.cv:
                    if baton.owner == me:
                        baton.owner = None
                        baton._dispatch()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    ready.wait()
    return None


def _fn_repr(fn):
    from tl2k210.maixpy.runtime import mp_repr
    return mp_repr(fn)
