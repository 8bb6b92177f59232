"""TensorLayer `Model.save` architecture text read without eval (tl2k210/frontends/tl_config.py);
TensorFlow-free: the layouts TensorLayer 2.0, 2.1 and 2.2 write, and hostile text refused by name
without running any of it."""
import base64
import os
import pickle
import subprocess
import sys

import pytest

from conftest import cli_env
from tl2k210.errors import ModelLoadError
from tl2k210.frontends.tl_config import parse_literal, read_config

# cloudpickle.dumps(tf.nn.relu) (protocol 5: a reference to the function) and the same in protocol 3
RELU_P5 = "gAWVLQAAAAAAAACMIHRlbnNvcmZsb3cucHl0aG9uLm9wcy5nZW5fbm5fb3BzlIwEcmVsdZSTlC4="
RELU_P3 = base64.b64encode(b"\x80\x03ctensorflow.python.ops.gen_nn_ops\nrelu\nq\x00.").decode()

# cloudpickle of `lambda x: x * 2` written in a script (by value: code), as TensorLayer saved it
LAMBDA = ("gAWV3gEAAAAAAACMF2Nsb3VkcGlja2xlLmNsb3VkcGlja2xllIwOX21ha2VfZnVuY3Rpb26Uk5QoaACMDV9idWlsdGluX3R5"
          "cGWUk5SMCENvZGVUeXBllIWUUpQoSwFLAEsASwFLAksDQwyXAHwAZAF6BQAAUwCUTksChpQpjAF4lIWUjA48ZHluYW1pYy1j"
          "b2RlPpSMCDxsYW1iZGE+lIwIPGxhbWJkYT6USwpDCoAAmFGYcZlTgACUQwCUKSl0lFKUfZQojAtfX3BhY2thZ2VfX5ROjAhf"
          "X25hbWVfX5SMCF9fbWFpbl9flIwIX19maWxlX1+UjA8vdG1wL3RsaDUvbWsucHmUdU5OTnSUUpRoAIwSX2Z1bmN0aW9uX3Nl"
          "dHN0YXRllJOUaBp9lH2UKGgVjAg8bGFtYmRhPpSMDF9fcXVhbG5hbWVfX5SMCDxsYW1iZGE+lIwPX19hbm5vdGF0aW9uc19f"
          "lH2UjA5fX2t3ZGVmYXVsdHNfX5ROjAxfX2RlZmF1bHRzX1+UTowKX19tb2R1bGVfX5RoFowHX19kb2NfX5ROjAtfX2Nsb3N1"
          "cmVfX5ROjBdfY2xvdWRwaWNrbGVfc3VibW9kdWxlc5RdlIwLX19nbG9iYWxzX1+UfZR1hpSGUjAu")

# what TensorLayer 2.2.5 writes (str() of Model.config; from a real file, two layers kept)
TL22 = ("{'name': 'cnn', 'version_info': {'tensorlayer_version': '2.2.5', 'backend': 'tensorflow', "
        "'backend_version': '2.21.0', 'training_device': 'gpu', 'save_date': '2026-12-02T00:36:09+00:00'}, "
        "'model_architecture': [{'class': '_InputLayer', 'args': {'shape': [None, 32, 32, 3], 'dtype': "
        "'tf.float32', 'name': 'input', 'layer_type': 'normal'}, 'prev_layer': None}, {'class': 'Conv2d', "
        "'args': {'n_filter': 16, 'filter_size': (3, 3), 'strides': (1, 1), 'act': 'lrelu0.1', 'padding': "
        "'SAME', 'data_format': 'channels_last', 'dilation_rate': (1, 1), 'name': 'c1', 'layer_type': "
        "'normal'}, 'prev_layer': ['input_node_0']}, {'class': 'Dense', 'args': {'n_units': 10, 'act': "
        "'softmax_v2', 'name': 'd1', 'layer_type': 'normal'}, 'prev_layer': ['c1_node_0']}], "
        "'inputs': 'input_node_0', 'outputs': 'd1_node_0'}")


def layers(cfg):
    return [(e["class"], e["args"].get("act")) for e in cfg["model_architecture"]]


def test_tensorlayer_22_literal():
    cfg = read_config(TL22)
    assert layers(cfg) == [("_InputLayer", None), ("Conv2d", ("leaky_relu", 0.1)), ("Dense", ("softmax", None))]
    args = cfg["model_architecture"][1]["args"]
    assert args["filter_size"] == (3, 3) and args["padding"] == "SAME"
    assert cfg["model_architecture"][0]["args"]["shape"] == [None, 32, 32, 3]
    assert cfg["outputs"] == "d1_node_0"


@pytest.mark.parametrize("act", [f"('is_Func', '{RELU_P5}')", f"('is_Func', '{RELU_P3}')", "tf.nn.relu",
                                 "{'module_path': 'tensorflow.python.ops.gen_nn_ops', 'func_name': 'relu'}"])
def test_tensorlayer_20_21_layouts(act):
    """2.1: bare dtype names, functions as cloudpickles by reference; 2.0: module_path/func_name;
    'model_structure' is read the same way (the text is all that matters here)."""
    text = TL22.replace("'tf.float32'", "tf.float32").replace("'lrelu0.1'", act)
    cfg = read_config(text)
    assert layers(cfg)[1] == ("Conv2d", ("relu", None))
    assert cfg["model_architecture"][0]["args"]["dtype"] == "float32"


def test_literals_and_json():
    assert parse_literal("{'a': (1, -2.5, +3, inf, None, True), 'b': [tf.float32, 'x', b'']}".replace(", b''", "")) \
        == {"a": (1, -2.5, 3, float("inf"), None, True), "b": ["float32", "x"]}
    assert parse_literal('{"model_architecture": [], "n": null, "t": true}') == \
        {"model_architecture": [], "n": None, "t": True}
    cfg = read_config('{"name": "m", "model_architecture": [{"class": "Dense", "args": {"act": "relu6", "name": "d"}, '
                      '"prev_layer": ["x"]}]}')
    assert layers(cfg) == [("Dense", ("relu6", None))]


class Boom:
    def __reduce__(self):
        return (os.system, (f"touch {Boom.marker}",))


@pytest.mark.parametrize("value, needles", [
    ("__import__('os').system('touch {m}')", ["a call", "__import__('os').system", "model_architecture[1].args.act"]),
    ("lambda x: x", ["a lambda", "lambda x: x", "model_architecture[1].args.act"]),
    ("tf.io.write_file", ["unknown name", "tf.io.write_file", "model_architecture[1].args.act"]),
    ("open('{m}', 'w')", ["a call", "open("]),
    ("os", ["unknown name", "`os`"]),
    ("'tf.nn.relu'.__class__", ["unknown name"]),
    ("[x for x in ()]", ["ListComp"]),
    ("('is_Func', '{boom}')", ["pickled by value", "layer 'c1'"]),
    ("('is_Func', '{byval}')", ["pickled by value"]),
    ("('is_Func', '{system}')", ["unknown function", "posix.system"]),
    ("'swish'", ["unknown function 'swish'", "relu6"]),
    ("'add'", ["unknown function 'add' for act"]),
    ("'lreluX'", ["not a number"]),
    ("functools.partial(<function leaky_relu at 0x7f>, alpha=0.1)", ["not a Python literal", "functools.partial"]),
])
def test_hostile_text_is_refused_by_name_and_never_run(tmp_path, value, needles):
    marker = tmp_path / "ran"
    Boom.marker = marker
    subs = {"m": marker, "boom": base64.b64encode(pickle.dumps(Boom())).decode(),
            "byval": LAMBDA,
            "system": base64.b64encode(pickle.dumps(os.system, protocol=4)).decode()}
    text = TL22.replace("'lrelu0.1'", value.format(**subs))
    with pytest.raises(ModelLoadError) as e:
        read_config(text)
    for n in needles:
        assert n in str(e.value), str(e.value)
    assert not marker.exists()


def test_parser_is_tensorflow_free():
    code = ("import sys; from tl2k210.frontends.tl_config import read_config; "
            "assert not [m for m in sys.modules if m.startswith(('tensorflow', 'tensorlayer', 'h5py'))]")
    subprocess.run([sys.executable, "-c", code], check=True, env=cli_env())


@pytest.mark.parametrize("text, needle", [
    ("{'name': 'x'}", "no model_architecture"),
    ("{'model_architecture': [1]}", r"model_architecture\[0\] is not a layer entry"),
    ("{'model_architecture': [{'class': 'Dense', 'args': {'name': 'd'}, 'prev_layer': [{'a': 1}]}]}",
     r"model_architecture\[0\] is not a layer entry"),
    ("{'model_architecture': [{'class': 'Dense', 'args': {'name': 3}, 'prev_layer': None}]}", "is not a layer"),
    ("[" * 5000 + "]" * 5000, "nested too deeply|not a Python literal"),
    ("{'a': " + "-" * 100000 + "1}", "nested too deeply|not a Python literal"),
    ("('is_Func', 'no base64!')", "not a base64 pickle"),
])
def test_not_a_model_architecture(text, needle):
    with pytest.raises(ModelLoadError, match=needle):
        read_config(text if "is_Func" not in text else TL22.replace("'lrelu0.1'", text))
