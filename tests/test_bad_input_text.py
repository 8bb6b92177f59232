"""Names and text from files (issue 25, items 3 and 4): a generated MaixPy script quotes every
name it embeds, so a hostile name stays a string; what `inspect`/`run` print from a file (labels
from the sidecar or a package, .kfpkg member names) has its control characters escaped, so no
escape sequence reaches the terminal."""
import io
import json
import tokenize
import zipfile

import pytest

from conftest import FACE_ANCHORS, data_path
from test_bad_input_metadata import sidecar
from tl2k210.cli import main

HOSTILE = ["evil\nprint('INJECTED')\n#.kmodel", "q'uo\"te\\\nprint('INJECTED')#",
           "back\\slash'); print('INJECTED'); ('", "\x1b[2J\nprint('INJECTED')\r"]


def only_in_strings(source):
    """Every token that says INJECTED is a string or a comment: no hostile name became code."""
    assert "INJECTED" in source
    toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for t in toks:
        if "INJECTED" in t.string:
            assert t.type in (tokenize.STRING, tokenize.COMMENT), (t, source)
    compile(source, "main.py", "exec")


@pytest.mark.parametrize("name", HOSTILE)
def test_repl_main_py_quotes_every_name(name):
    from tl2k210.k210 import kmodel
    from tl2k210.deploy import main_py
    model = kmodel.loads(data_path("kmodels", "facedetect_320x240_v3.kmodel").read_bytes())
    src = main_py("/sd/" + name, model, "/sd/" + name + ".txt", FACE_ANCHORS, 0.5, 0.3)
    only_in_strings(src)
    for line in src.splitlines():                   # the names are one line each, in quotes
        assert not line.startswith("print("), src


@pytest.mark.parametrize("name", HOSTILE)
def test_deploy_snippet_quotes_every_name(name):
    from tl2k210 import metadata
    from tl2k210.deploy import maixpy_snippet
    data = data_path("kmodels", "facedetect_320x240_v3.kmodel").read_bytes()
    meta = metadata.build(data, name, input={"shape": [1, 3, 240, 320]},
                          outputs=[{"name": name, "shape": [1, 30, 15, 20]}], task="yolo2",
                          anchors=FACE_ANCHORS, labels=[name, "face"],
                          decode={"threshold": 0.5, "nms": 0.3})
    only_in_strings(maixpy_snippet(0x300000, meta))


def test_deploy_via_repl_runs_no_code_from_a_file_name(tmp_path):
    """The reported case: `deploy $'evil\\nprint("INJECTED")\\n#.kmodel' --via repl`."""
    from repl_helpers import board
    km = tmp_path / "evil\nprint('INJECTED')\n#.kmodel"
    km.write_bytes(data_path("kmodels", "mnist_v3.kmodel").read_bytes())
    (tmp_path / "b").mkdir()
    bd = board(tmp_path / "b")
    try:
        assert bd.wait_idle()
        rc = main(["deploy", str(km), "--via", "repl", "-p", bd.port, "--lines", "2",
                   "--seconds", "3"])
        assert rc == 0
        main_py = (bd.sd / "main.py").read_text()
        only_in_strings(main_py)
        assert "INJECTED" not in bd.session.output()
    finally:
        bd.close()


# ---- 4: terminal escapes ----------------------------------------------------------------------
ESC = ["\x1b[2J", "\x1b]0;owned\x07", "\x9b31m", "\u202eevil"]
CONTROL = set("\x1b\x07\x9b\u202e\r")


def clean(text):
    bad = sorted({c for c in text if c in CONTROL})
    assert not bad, f"control characters reached the terminal: {bad!r} in {text!r}"


def test_inspect_escapes_sidecar_text(tmp_path, capsys):
    km = sidecar(tmp_path, labels=[e + "face" for e in ESC], source="\x1b[2Jm.onnx",
                 tl2k210_version="\x1b]0;x\x07", task="yolo2")
    assert main(["inspect", str(km)]) == 0
    out = capsys.readouterr().out
    clean(out)
    assert "\\x1b[2Jface" in out and "\\x1b]0;owned\\x07face" in out


def test_run_escapes_labels_from_the_sidecar(tmp_path, capsys):
    skdata = pytest.importorskip("skimage.data")
    from PIL import Image
    Image.fromarray(skdata.astronaut()).save(tmp_path / "a.png")
    km = sidecar(tmp_path, labels=["\x1b[2Jface\x1b]0;owned\x07"])
    assert main(["run", str(km), "-i", str(tmp_path / "a.png")]) == 0
    out = capsys.readouterr().out
    clean(out)
    assert "\\x1b[2Jface" in out


def test_inspect_escapes_package_member_names(tmp_path, capsys):
    data = data_path("kmodels", "mnist_v3.kmodel").read_bytes()
    name = "m\x1b[2J\x1b]0;owned\x07.kmodel"
    p = tmp_path / "p.kfpkg"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("flash-list.json", json.dumps({"version": "0.1.0", "files": [
            {"address": 0x300000, "bin": name, "sha256Prefix": False}]}))
        z.writestr(name, data)
        z.writestr("\x1b[2Jextra.txt", "x")
    assert main(["inspect", str(p)]) == 0
    out = capsys.readouterr().out
    clean(out)
    assert "m\\x1b[2J" in out and "\\x1b[2Jextra.txt" in out
