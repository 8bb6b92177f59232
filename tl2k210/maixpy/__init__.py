"""MaixPy v1 on the host: unchanged board scripts run on the bit-exact KPU emulator, with the
board's MicroPython world (modules, argument rules, /flash and /sd, boot sequence), its clock
(virtual board time: fps and ms a board would print) and its memory (GC heap, the firmware's
model budget).

    from tl2k210.maixpy import run_script, run_folder, Session
    res = run_script("firmware/face_detect.py", images=["photo.jpg"], flash="flash.bin",
                     out="out.png", runtime="maixpy")
    print(res.stdout, res.pngs, res.notes)

    with Session(sd="card/", flash="flash.bin") as s:   # a persistent board (REPL backend)
        s.boot()
        s.exec("import KPU as kpu; t = kpu.load(0x300000)")
        print(s.eval("t.model_size()"), s.output())

Modules: runtime.py (Session: namespace, imports, tracebacks), modules.py (sys, time, os, gc,
u-modules), periph.py (machine, Maix, board, fpioa_manager, audio), ulab.py, image.py, sensor.py,
lcd.py, KPU.py, canmv.py (CanMV `maix`), vfs.py (/flash, /sd), timing.py (board clock and
costs), heap.py (GC heap), args.py (the firmware's argument rules), board.py (the board).
"""


def run_script(*args, **kwargs):
    from tl2k210.maixpy.runner import run_script as _run
    return _run(*args, **kwargs)


def run_folder(*args, **kwargs):
    from tl2k210.maixpy.runner import run_folder as _run
    return _run(*args, **kwargs)


def __getattr__(name):
    if name == "Session":
        from tl2k210.maixpy.runtime import Session
        return Session
    raise AttributeError(name)
