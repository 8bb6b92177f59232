"""Mutated real kmodels that still parse: the emulator either runs them or raises a
Tl2k210Error naming the layer; never a bare numpy traceback."""
import numpy as np
import pytest

from conftest import data_path
from tl2k210.errors import Tl2k210Error
from tl2k210.k210 import kmodel
from tl2k210.k210.emulator import Emulator


@pytest.mark.slow
def test_emulator_on_mutated_models():
    files = [data_path("kmodels", f"{n}.kmodel").read_bytes() for n in ("mnist_v3", "iris_v3", "iris_v4")]
    rng = np.random.default_rng(7)
    ran = refused = 0
    for i in range(600):
        d = bytearray(files[i % 3])
        for _ in range(int(rng.integers(1, 4))):
            d[int(rng.integers(0, min(len(d), 2048)))] = int(rng.integers(256))
        try:
            m = kmodel.loads(bytes(d))
            emu = Emulator(m, threads=1)
            shape, dtype = emu.input_spec()
            if int(np.prod(shape)) > 1 << 22:
                raise Tl2k210Error("absurd input")
            with np.errstate(all="ignore"):
                emu.run(np.zeros(shape, dtype))
            ran += 1
        except Tl2k210Error:
            refused += 1
    assert ran + refused == 600 and ran > 100 and refused > 100
