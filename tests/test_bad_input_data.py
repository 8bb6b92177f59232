"""Hostile model and data files (issue 25, items 2 and 9): no code runs from a data file, and a
model onnxruntime or the KPU cannot take is refused with its cause (exit 2), before any
memory is spent on it."""
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from test_bad_input import cli, refused, nothing_at, photos, tiny_onnx

MARKER_ENV = "TL2K210_PWNED"


class Evil:
    """Pickled, it runs a shell command when loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_npz(path, marker, key="params"):
    params = np.empty(2, object)
    params[:] = [np.zeros((2, 2), np.float32), Evil(marker)]
    np.savez(path, **{key: params})
    return path


NET = """
import tensorlayer as tl
from tensorlayer.layers import Dense, Input
def build():
    x = Input([1, 4], name="i")
    return tl.models.Model(x, Dense(2, name="fc")(x), name="n")
"""


@pytest.mark.slow
def test_convert_never_unpickles_code_from_weights(tmp_path, capsys):
    marker = tmp_path / "PWNED"
    w = _evil_npz(tmp_path / "w.npz", marker)
    (tmp_path / "net.py").write_text(NET)
    np.save(tmp_path / "ds.npy", np.zeros((2, 4), np.float32))
    rc, _, err = cli(capsys, "convert", w, tmp_path / "o.kmodel", "--network", tmp_path / "net.py",
                     "--dataset", tmp_path / "ds.npy", "-q")
    assert not marker.exists(), "the pickle ran a command"
    refused(rc, err, "params", "system")
    nothing_at(tmp_path / "o.kmodel")


def test_tensorlayer_weights_refuse_pickled_code(tmp_path):
    from tl2k210.errors import Tl2k210Error
    from tl2k210.frontends.tensorlayer import load_weights
    marker = tmp_path / "PWNED"
    w = _evil_npz(tmp_path / "w.npz", marker)
    with pytest.raises(Tl2k210Error, match=r"params.*system"):
        load_weights(None, w)
    assert not marker.exists()


def test_tensorlayer_params_of_arrays_still_load(tmp_path):
    """TensorLayer's own layout (an object array of numeric arrays) loads, nothing else."""
    from tl2k210.arrays import load_params
    params = np.empty(2, object)
    params[:] = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)]
    np.savez(tmp_path / "w.npz", params=params)
    got = load_params(tmp_path / "w.npz")
    assert [a.tolist() for a in got] == [[[0, 1, 2], [3, 4, 5]], [1, 1, 1]]
    params[:] = [np.zeros(2, np.float32), {"a": 1}]
    np.savez(tmp_path / "d.npz", params=params)
    with pytest.raises(ValueError, match=r"params\]\[1\] is a dict"):
        load_params(tmp_path / "d.npz")


def test_zoo_weights_refuse_object_arrays(tmp_path):
    from tl2k210 import zoo
    from tl2k210.errors import Tl2k210Error
    marker = tmp_path / "PWNED"
    _evil_npz(tmp_path / "w.npz", marker, key="arr_0")
    with pytest.raises(Tl2k210Error, match="arr_0"):
        zoo.load_weights(None, tmp_path / "w.npz")
    assert not marker.exists()


def test_every_np_load_refuses_pickles():
    """No np.load in the package, the model recipes or the firmware tools allows pickles."""
    import re
    bad = []
    for top in ("tl2k210", "models", "firmware"):
        for p in (REPO / top).rglob("*.py"):
            for i, line in enumerate(p.read_text().splitlines(), 1):
                if re.search(r"\bnp\.load\(", line) and "allow_pickle=False" not in line:
                    bad.append(f"{p.relative_to(REPO)}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)
