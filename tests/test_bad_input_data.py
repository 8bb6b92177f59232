"""Hostile model and data files (issue 25, items 2 and 9): no code runs from a data file, and a
model onnxruntime or the KPU cannot take is refused with its cause (exit 2), before any
memory is spent on it."""
import os
import sys

import numpy as np
import pytest

from conftest import REPO
from test_bad_input import cli, nothing_at, photos, refused, sh, tiny_onnx

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


# ---- 9: ONNX models the converter cannot take, hostile datasets ------------------------------
def _conv_model(path, *, opset=13, group=1, wshape=(8, 3, 3, 3), shape=(1, 3, 16, 16), extra=(),
                out_shape=None):
    from onnx import helper, save

    from front_helpers import make_model, rand
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], group=group),
             helper.make_node("Relu", ["c"], ["y"]), *extra]
    out = extra[-1].output[0] if extra else "y"
    out_shape = out_shape or [1, wshape[0], *shape[2:]]
    m = make_model(nodes, [("x", list(shape))], [(out, out_shape)], {"w": rand(*wshape, scale=0.3)},
                   opset=opset)
    save(m, str(path))
    return path


def _convert(capsys, tmp_path, m, ds=None):
    ds = ds or photos(tmp_path / "ds")
    rc, out, err = cli(capsys, "convert", m, tmp_path / "o.kmodel", "--dataset", ds, "-q")
    nothing_at(tmp_path / "o.kmodel")
    return rc, out, err


def test_convert_refuses_an_opset_onnxruntime_does_not_know(tmp_path, capsys):
    m = _conv_model(tmp_path / "m.onnx", opset=99999)
    rc, _, err = _convert(capsys, tmp_path, m)
    refused(rc, err, "opset")
    assert "\x1b[" not in err


def test_convert_refuses_a_model_onnxruntime_rejects(tmp_path):
    """A Conv with group=2 on 3 channels: onnxruntime refuses it (and logs in colour)."""
    m = _conv_model(tmp_path / "m.onnx", group=2, wshape=(8, 1, 3, 3))
    p = sh("convert", m, tmp_path / "o.kmodel", "--dataset", photos(tmp_path / "ds"), "-q",
           env={"TERM": "xterm-256color"})
    last = refused(p.returncode, p.stderr, "onnxruntime")
    assert "group" in last.lower() or "channel" in last.lower(), last
    assert "\x1b[" not in p.stderr, p.stderr
    nothing_at(tmp_path / "o.kmodel")


def test_convert_wrong_reshape_is_a_clear_error(tmp_path, capsys):
    from onnx import helper, numpy_helper
    shape = helper.make_node("Constant", [], ["s"],
                             value=numpy_helper.from_array(np.array([1, 7, 100], np.int64)))
    r = helper.make_node("Reshape", ["y", "s"], ["z"])
    m = _conv_model(tmp_path / "m.onnx", extra=(shape, r), out_shape=[1, 7, 100])
    rc, _, err = _convert(capsys, tmp_path, m)
    last = refused(rc, err, "Reshape")
    assert "report" not in last


def _external(tmp_path, case):
    """tiny model whose weights live in an external file named per `case`."""
    import onnx
    from onnx.external_data_helper import convert_model_to_external_data
    d = tmp_path / "model"
    d.mkdir()
    m = onnx.load(str(tiny_onnx(tmp_path / "t.onnx")))
    convert_model_to_external_data(m, all_tensors_to_one_file=True, location="w.bin",
                                   size_threshold=0)
    onnx.save(m, str(d / "m.onnx"))
    if case == "missing":
        (d / "w.bin").unlink()
    else:
        secret = tmp_path / "secret.bin"
        os.replace(d / "w.bin", secret)
        loc = {"absolute": str(secret), "dotdot": "../secret.bin", "symlink": "w.bin"}[case]
        if case == "symlink":
            (d / "w.bin").symlink_to(secret)
        m2 = onnx.load(str(d / "m.onnx"), load_external_data=False)
        for t in m2.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = loc
        onnx.save(m2, str(d / "m.onnx"))
    return d / "m.onnx"


@pytest.mark.parametrize("case,needle", [("missing", "w.bin"), ("absolute", "absolute"),
                                         ("dotdot", ".."), ("symlink", "link")])
def test_convert_external_data_errors_name_the_cause(case, needle, tmp_path, capsys):
    m = _external(tmp_path, case)
    rc, _, err = _convert(capsys, tmp_path, m)
    last = refused(rc, err, needle)
    assert "truncated" not in last, last


def test_dataset_folder_skips_fifos(tmp_path, capsys):
    m = tiny_onnx(tmp_path / "m.onnx")
    ds = photos(tmp_path / "ds")
    os.mkfifo(ds / "zz.png")
    import subprocess
    from conftest import cli_env
    p = subprocess.run([sys.executable, "-m", "tl2k210.cli", "convert", str(m),
                        str(tmp_path / "o.kmodel"), "--dataset", str(ds), "-q"],
                       capture_output=True, text=True, env=cli_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "o.kmodel").exists()


def test_huge_input_is_refused_before_allocating(tmp_path, capsys):
    m = _conv_model(tmp_path / "m.onnx", shape=(1, 3, 100000, 100000))
    np.save(tmp_path / "ds.npy", np.zeros((1, 3, 4, 4), np.float32))
    import resource
    import subprocess
    from conftest import cli_env

    def cap():
        signal_default()
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    p = subprocess.run([sys.executable, "-m", "tl2k210.cli", "convert", str(m),
                        str(tmp_path / "o.kmodel"), "--dataset", str(photos(tmp_path / "ds")),
                        "-q"], capture_output=True, text=True, env=cli_env(), timeout=300,
                       preexec_fn=cap)
    refused(p.returncode, p.stderr, "100000", "--input-shape")     # (a P-Net runs at any size: hunt 22)
    nothing_at(tmp_path / "o.kmodel")


def signal_default():
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)
