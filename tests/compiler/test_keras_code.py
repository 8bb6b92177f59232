"""A Keras file is data: a Lambda layer stored as Python bytecode is refused by name before any
loader (Keras 3, its legacy .h5 loader, tf-keras) could run it (frontends/keras.py refuse_code).
Each file here carries a Lambda whose function writes a marker file: the marker must not appear."""
import numpy as np
import pytest

from front_helpers import rand, tf
from tl2k210.frontends import ModelLoadError, load_graph, load_model
from tl2k210.frontends.keras import _code_layers, refuse_code, refuse_keras1, refuse_qkeras
from tl2k210.graph import run


def _marker(tmp_path):
    return tmp_path / "RAN"


def _lambda_model(tk, marker):
    marker = str(marker)

    def f(x):
        open(marker, "w").write("the Lambda ran")      # noqa: SIM115 (the point of the test)
        return x * 2
    i = tk.Input((8, 8, 3), batch_size=1)
    y = tk.layers.Conv2D(4, 3, padding="same", name="conv")(i)
    return tk.Model(i, tk.layers.Lambda(f, name="doubler")(y))


def test_code_layers_in_hand_made_configs():
    """TF-free: Keras 2 (function_type / output_shape_type 'lambda') and Keras 3 (__lambda__)
    forms are found, named by layer; a Lambda naming a registered function and other layers are not."""
    k2 = {"class_name": "Functional", "config": {"layers": [
        {"class_name": "Conv2D", "config": {"name": "c"}},
        {"class_name": "Lambda", "config": {"name": "l1", "function": ["4wEAAA==", None, None],
                                            "function_type": "lambda", "output_shape_type": "raw"}},
        {"class_name": "Lambda", "config": {"name": "l2", "function": "relu", "function_type": "function",
                                            "output_shape": ["4wEAAA==", None, None],
                                            "output_shape_type": "lambda"}},
        {"class_name": "TFOpLambda", "config": {"name": "t", "function": "nn.relu"}}]}}
    assert _code_layers(k2) == [("l1", "its function as Python bytecode"), ("l2", "its output shape as Python bytecode")]
    k3 = {"class_name": "Functional", "config": {"layers": [
        {"class_name": "Lambda", "config": {"name": "l3", "function": {"class_name": "__lambda__",
                                                                      "config": {"code": "4wEAAA=="}}}}]}}
    assert _code_layers(k3) == [("l3", "a Python lambda")]
    with pytest.raises(ModelLoadError, match=r"layer 'l3' \(Lambda\) stores a Python lambda.*never runs code"):
        refuse_code(k3, "m.keras")
    refuse_code({"class_name": "Functional", "config": {"layers": [k2["config"]["layers"][3]]}}, "ok.h5")


def test_qkeras_layers_are_named_with_what_to_do():
    """TF-free: hls4ml's QKeras models (QConv2DBatchnorm, QActivation, ...) are refused by name
    before a loader fails on them (Keras' raw "Unknown layer ... custom_object_scope" text
    named neither QKeras nor a way out); plain layers pass."""
    cfg = {"class_name": "Functional", "config": {"layers": [
        {"class_name": "InputLayer", "config": {"name": "in"}},
        {"class_name": "QConv2DBatchnorm", "config": {"name": "q_conv"}},
        {"class_name": "QActivation", "config": {"name": "q_act"}},
        {"class_name": "Dense", "config": {"name": "out"}}]}}
    with pytest.raises(ModelLoadError, match=r"'q_conv' \(QConv2DBatchnorm\), 'q_act' \(QActivation\) are "
                                             r"QKeras's.*plain Keras layers"):
        refuse_qkeras(cfg, "rn08.h5")
    refuse_qkeras({"class_name": "Functional", "config": {"layers": cfg["config"]["layers"][3:]}}, "ok.h5")


def test_a_keras1_file_is_named_as_such(tmp_path):
    """TF-free: a Keras 1.2.1 .h5 (hunt 21: 2016-17 PilotNet steering nets) failed with a raw
    TypeError on its Convolution2D config (nb_filter, subsample), after the Lambda refusal; it is
    named as a Keras 1 file with what to do, its leading Lambda too. A Keras 2 file passes."""
    import json

    import h5py
    cfg = {"class_name": "Sequential", "config": [
        {"class_name": "Lambda", "config": {"name": "lambda_1", "function": ["4wEAAA==", None, None],
                                            "function_type": "lambda"}},
        {"class_name": "Convolution2D", "config": {"name": "convolution2d_1", "nb_filter": 24, "nb_row": 5,
                                                   "nb_col": 5, "subsample": [2, 2], "border_mode": "valid"}}]}
    for version in ("1.2.1", "2.2.4"):
        with h5py.File(tmp_path / f"{version}.h5", "w") as f:
            f.attrs["keras_version"] = version.encode()
            f.attrs["model_config"] = json.dumps(cfg).encode()
    with pytest.raises(ModelLoadError, match=r"saved by Keras 1\.2\.1, whose layer configs .* load it in Keras "
                                             r"2\.0-2\.3 .*its Lambda layer 'lambda_1' stores Python bytecode"):
        refuse_keras1(tmp_path / "1.2.1.h5", cfg)
    refuse_keras1(tmp_path / "2.2.4.h5", cfg)


@pytest.mark.parametrize("kind", ["h5", "json", "savedmodel"])
def test_keras2_lambda_is_refused_and_never_run(tmp_path, kind):
    """tf-keras files (what Keras 2 wrote): .h5, architecture .json + weights, SavedModel."""
    tk = pytest.importorskip("tf_keras")
    tf()
    m = _lambda_model(tk, _marker(tmp_path))
    if kind == "h5":
        m.save(tmp_path / "m.h5")
        src, kw = tmp_path / "m.h5", {}
    elif kind == "json":
        (tmp_path / "m.json").write_text(m.to_json())
        m.save_weights(tmp_path / "w.h5")
        src, kw = tmp_path / "m.json", {"weights": str(tmp_path / "w.h5")}
    else:
        m.save(tmp_path / "sm", save_format="tf")
        _marker(tmp_path).unlink(missing_ok=True)        # saving traced the Lambda
        from tl2k210.frontends.savedmodel import _through_tf_keras
        with pytest.raises(ModelLoadError, match="layer 'doubler' \\(Lambda\\)"):
            _through_tf_keras(tmp_path / "sm", "refused", None, 1)     # the path that would rebuild it
        assert not _marker(tmp_path).exists()
        return
    _marker(tmp_path).unlink(missing_ok=True)
    with pytest.raises(ModelLoadError, match="layer 'doubler' \\(Lambda\\) stores its function as Python bytecode"):
        load_model(src, **kw)
    assert not _marker(tmp_path).exists()


def test_keras3_lambda_is_refused_and_never_run(tmp_path):
    """Keras 3 stores a `lambda` as bytecode (a `def` by name only, which its loader looks up)."""
    import keras
    marker = str(_marker(tmp_path))
    i = keras.Input((8, 8, 3), batch_size=1)
    y = keras.layers.Conv2D(4, 3, padding="same")(i)
    m = keras.Model(i, keras.layers.Lambda(lambda x: (open(marker, "w").write("ran"), x * 2)[1], name="doubler")(y))
    m.save(tmp_path / "m.keras")
    _marker(tmp_path).unlink(missing_ok=True)
    with pytest.raises(ModelLoadError, match="layer 'doubler' \\(Lambda\\) stores a Python lambda"):
        load_model(tmp_path / "m.keras")
    assert not _marker(tmp_path).exists()


def test_keras2_tf_op_layers_still_load(tmp_path):
    """tf-keras' TFOpLambda (a TF op called on a Keras tensor, stored by name) is not code."""
    tk = pytest.importorskip("tf_keras")
    t = tf()
    i = tk.Input((8, 8, 3), batch_size=1)
    y = t.nn.relu6(tk.layers.Conv2D(4, 3, padding="same")(i))
    m = tk.Model(i, y)
    m.save(tmp_path / "ops.h5")
    x = rand(1, 8, 8, 3)
    g = load_graph(tmp_path / "ops.h5")
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], m(x).numpy(), atol=1e-5)
