"""MaixPy on the host: `sensor`, `image`, `lcd`, `KPU` (+ small stand-ins) backed by the
bit-exact KPU emulator, and a runner for unchanged board scripts (`firmware/*.py`).

    from tl2k210.maixpy import run_script
    res = run_script("firmware/face_detect.py", images=["photo.jpg"], flash="flash.bin",
                     out="out.png")
    print(res.stdout, res.pngs)
"""


def run_script(*args, **kwargs):
    from tl2k210.maixpy.runner import run_script as _run
    return _run(*args, **kwargs)
