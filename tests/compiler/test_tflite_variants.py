"""Production-style TFLite files built at test time with the TF converter (never downloaded):
float16 weights, dynamic-range int8, full-integer int8 with uint8 I/O, sparse (DENSIFY)
weights, and TF1/TOCO-era uint8. Each must load, match the TFLite interpreter on the same input, and convert."""
from pathlib import Path

import numpy as np
import pytest

from front_helpers import noise_photos, tf
from tl2k210.frontends import load_graph
from tl2k210.graph import run
from tl2k210.k210.flow import run_pipeline
from tl2k210.quantize.metrics import sqnr_db

pytestmark = pytest.mark.slow
H, W = 48, 64   # non-square on purpose


def _model():
    import keras
    from keras import layers as L
    keras.utils.set_random_seed(0)
    i = keras.Input((H, W, 3), batch_size=1)
    a = L.Conv2D(16, 3, padding="same", activation="relu")(i)
    a = L.DepthwiseConv2D(3, padding="same", activation="relu6")(a)
    a = L.Conv2D(32, 3, strides=2, padding="same", activation="relu")(a)
    a = L.Add()([a, L.Conv2D(32, 1)(a)])
    return keras.Model(i, L.Dense(10)(L.GlobalAveragePooling2D()(a)))


def _rep():
    r = np.random.default_rng(1)
    for _ in range(16):
        yield [r.uniform(0, 1, (1, H, W, 3)).astype(np.float32)]


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    t = tf()
    d = tmp_path_factory.mktemp("tflite")
    m = _model()
    out = {}

    def save(name, **kw):
        c = t.lite.TFLiteConverter.from_keras_model(m)
        for k, v in kw.items():
            if k == "types":
                c.target_spec.supported_types = v
            elif k == "ops":
                c.target_spec.supported_ops = v
            else:
                setattr(c, k, v)
        (d / f"{name}.tflite").write_bytes(c.convert())
        out[name] = d / f"{name}.tflite"

    save("float32")
    save("float16", optimizations=[t.lite.Optimize.DEFAULT], types=[t.float16])
    save("dynamic_int8", optimizations=[t.lite.Optimize.DEFAULT])
    save("full_int8", optimizations=[t.lite.Optimize.DEFAULT], representative_dataset=_rep,
         ops=[t.lite.OpsSet.TFLITE_BUILTINS_INT8], inference_input_type=t.uint8, inference_output_type=t.uint8)
    for layer in m.layers:    # 90 % zeros: the converter stores these weights sparse
        ws = layer.get_weights()
        if ws:
            ws[0] = np.where(np.random.default_rng(2).random(ws[0].shape) < 0.9, 0, ws[0])
            layer.set_weights(ws)
    save("sparse", optimizations=[t.lite.Optimize.EXPERIMENTAL_SPARSITY])
    return out


def _tflite_run(path, x):
    t = tf()
    it = t.lite.Interpreter(model_path=str(path))
    it.allocate_tensors()
    d, o = it.get_input_details()[0], it.get_output_details()[0]
    if d["dtype"] != np.float32:
        s, z = d["quantization"]
        x = np.clip(np.round(x / s + z), 0, 255).astype(d["dtype"])
    it.set_tensor(d["index"], x)
    it.invoke()
    y = it.get_tensor(o["index"])
    ops = {op["op_name"] for op in it._get_ops_details()}
    if o["dtype"] != np.float32:
        s, z = o["quantization"]
        y = (y.astype(np.float32) - z) * s
    return y, ops


@pytest.mark.parametrize("name,marker,min_db", [("float32", None, 100), ("float16", "DEQUANTIZE", 100),
                                                 ("dynamic_int8", None, 35), ("full_int8", "QUANTIZE", 25),
                                                 ("sparse", "DENSIFY", 100)])
def test_variant_matches_tflite(variants, name, marker, min_db):
    x = np.random.default_rng(5).uniform(0, 1, (4, 1, H, W, 3)).astype(np.float32)
    g, _ = run_pipeline(load_graph(variants[name]))
    assert g.shape(g.inputs[0]) == (1, 3, H, W)                   # NHWC in the file, NCHW in the IR
    assert set(g.op_counts()) <= {"Conv", "Add", "GlobalAveragePool", "Reshape"}
    refs, gots = [], []
    for xi in x:
        ref, ops = _tflite_run(variants[name], xi)
        refs.append(ref)
        gots.append(run(g, xi.transpose(0, 3, 1, 2))[g.outputs[0]])
    if marker:
        assert marker in ops                                        # the file really is that variant
    db = sqnr_db(np.stack(refs), np.stack(gots))
    print(f"{name}: IR float graph vs TFLite interpreter SQNR {db:.1f} dB")
    assert db >= min_db   # quantized variants: the float model their integers stand for


@pytest.mark.parametrize("name,floats", [("float32", True), ("float16", True), ("dynamic_int8", False),
                                         ("full_int8", False)])
def test_a_file_with_per_channel_scales_is_not_float(variants, name, floats):
    """The interpreter check holds a float file to 40 dB and a quantized one to -1 dB: TFLite's
    hybrid kernels quantize activations at run time (hunt 11's YOLOX-nano dynamic-range file read
    21.3 dB against its own float graph and was refused as a misread float file). A TF2
    dynamic-range file's int8 weights are per channel, whose legacy `quantization` pair reads
    (0.0, 0): its scales are in `quantization_parameters`."""
    from tl2k210.frontends import load_model
    from tl2k210.frontends.tflite import _interpreter_db
    db, is_float = _interpreter_db(variants[name], load_model(variants[name]))
    assert is_float is floats and db > 25


def test_fully_connected_on_a_map_keeps_its_bias(tmp_path, monkeypatch):
    """TF1-era files (MTCNN's R-Net and O-Net) feed a FULLY_CONNECTED the 4-D map itself, which
    TFLite flattens (keep_num_dims off). tf2onnx's reshape for that case dropped the bias input,
    so the graph -- and every kmodel of it, whose receipt agreed -- lacked it (13.9 dB against
    the interpreter, O-Net's face decision flipped). Made here from a Flatten + Dense file by
    taking its RESHAPE out: the interpreter's output is unchanged, and the IR matches it. Had
    the front end misread it, the float file's check against the interpreter refuses it."""
    from tl2k210.errors import ModelLoadError
    from tl2k210.frontends import tflite
    import keras
    from keras import layers as L
    from tensorflow.lite.tools import flatbuffer_utils as fu
    keras.utils.set_random_seed(3)
    i = keras.Input((8, 8, 3), batch_size=1)
    m = keras.Model(i, L.Dense(5, bias_initializer="random_uniform")(L.Flatten()(L.Conv2D(4, 3, activation="relu")(i))))
    src = tmp_path / "flat.tflite"
    src.write_bytes(tf().lite.TFLiteConverter.from_keras_model(m).convert())
    fb = fu.read_model(str(src))
    sg = fb.subgraphs[0]
    fc = next(op for op in sg.operators if fu.opcode_to_name(fb, op.opcodeIndex) == "FULLY_CONNECTED")
    rs = next(op for op in sg.operators if op.outputs[0] == fc.inputs[0])
    assert fu.opcode_to_name(fb, rs.opcodeIndex) == "RESHAPE" and np.any(fb.buffers[sg.tensors[fc.inputs[2]].buffer].data)
    fc.inputs[0] = rs.inputs[0]                     # the FC reads the 4-D map, as TOCO wrote it
    sg.operators.remove(rs)
    raw = tmp_path / "fc_on_map.tflite"
    fu.write_model(fb, str(raw))
    x = np.random.default_rng(4).uniform(0, 1, (1, 8, 8, 3)).astype(np.float32)
    ref, ops = _tflite_run(raw, x)
    assert "RESHAPE" not in ops and np.allclose(ref, m(x).numpy(), atol=1e-5)
    g, _ = run_pipeline(load_graph(raw))
    got = run(g, x.transpose(0, 3, 1, 2))[g.outputs[0]]
    assert sqnr_db(ref, got) > 100, sqnr_db(ref, got)
    monkeypatch.setattr(tflite, "flatten_fc_inputs", lambda model: 0)      # tf2onnx's reading: no bias
    with pytest.raises(ModelLoadError, match=r"disagrees with the TFLite interpreter .* float file's two readings"):
        tflite.from_tflite(raw)

def test_shapes_a_file_leaves_out_come_from_the_interpreter(tmp_path):
    """An older converter wrote no shapes for the maps after a resize whose size SHAPE ops compute
    (Magenta's dynamic-range style transfer at a fixed 384x384, hunt 20); tf2onnx read them as
    unknown and failed on the first conv after it ("export it at a fixed input size": it was).
    tflite.fill_shapes takes them from the interpreter, which resolves them as it runs. Made
    here by taking the shapes out of a file's maps: each comes back as the interpreter's."""
    import keras
    from keras import layers as L
    from tensorflow.lite.tools import flatbuffer_utils as fu
    from tl2k210.frontends import tflite
    t = tf()
    keras.utils.set_random_seed(5)
    i = keras.Input((8, 8, 3), batch_size=1)
    a = L.UpSampling2D(2)(L.Conv2D(4, 3, padding="same", activation="relu")(i))
    m = keras.Model(i, L.Conv2D(2, 3, padding="same")(a))
    src = tmp_path / "resize.tflite"
    src.write_bytes(t.lite.TFLiteConverter.from_keras_model(m).convert())
    fb = fu.read_model(str(src))
    sg = fb.subgraphs[0]
    maps = {k: list(sg.tensors[k].shape) for op in sg.operators for k in op.outputs}
    for k in maps:
        sg.tensors[k].shape = sg.tensors[k].shapeSignature = None
    raw = tmp_path / "no_shapes.tflite"
    fu.write_model(fb, str(raw))
    assert tflite.fill_shapes(fb, raw) == len(maps) >= 3
    assert {k: list(sg.tensors[k].shape) for k in maps} == maps
    assert tflite.fill_shapes(fb, raw) == 0                 # nothing left to fill


def test_transpose_conv_whose_same_output_is_longer_than_its_taps(tmp_path):
    """A stride-4 3x3 TRANSPOSE_CONV (SAME: output 4 x the input, one more row and column than the
    taps reach; ESRGAN's upsampler): tf2onnx writes ConvTranspose pads [0, 0, -1, -1], which ONNX
    forbids (onnxruntime refuses, shape inference leaves the output unknown, and a pass failed
    with "please report"). The repair's output_padding computes it: the IR equals the
    interpreter, the last row and column the bias alone."""
    import keras
    from keras import layers as L
    keras.utils.set_random_seed(0)
    i = keras.Input((6, 5, 4), batch_size=1)
    m = keras.Model(i, L.Conv2DTranspose(3, 3, strides=4, padding="same", bias_initializer="random_uniform")(i))
    src = tmp_path / "tconv.tflite"
    src.write_bytes(tf().lite.TFLiteConverter.from_keras_model(m).convert())
    x = np.random.default_rng(1).uniform(0, 1, (1, 6, 5, 4)).astype(np.float32)
    ref, _ = _tflite_run(src, x)
    g, _ = run_pipeline(load_graph(src))
    got = run(g, x.transpose(0, 3, 1, 2))[g.outputs[0]]
    assert got.shape == (1, 3, 24, 20) and sqnr_db(ref.transpose(0, 3, 1, 2), got) > 100
    assert np.allclose(got[0, :, -1, :], m.layers[-1].bias.numpy()[:, None], atol=1e-6)

def test_legacy_uint8_hybrid_weights_are_read_as_int8(variants, tmp_path, monkeypatch):
    """TOCO's old post_training_quantize wrote a float conv's weights as a UINT8 tensor holding
    int8 values (scale, zero point 0), which TFLite's hybrid kernels read as int8; tf2onnx read
    them as 0..255 and the model came out garbage that its own float graph agreed with (a
    one-class anomaly net and a person UNet of PINTO0309's: -17 and -549 dB against TFLite).
    Made here from the dynamic-range file by retyping its int8 weights the legacy way: the
    interpreter gives the same output, and so does the IR (the same graph as the int8 file's)."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils as fu
    fb = fu.read_model(str(variants["dynamic_int8"]))
    sg = fb.subgraphs[0]
    retyped = 0
    for op in sg.operators:
        if fu.opcode_to_name(fb, op.opcodeIndex) in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            for i in op.inputs:
                t = sg.tensors[i] if i >= 0 else None
                if t is None or t.type != schema.TensorType.INT8 or fb.buffers[t.buffer].data is None:
                    continue
                q = t.quantization       # one scale a tensor, as TOCO wrote them
                w = np.frombuffer(bytes(fb.buffers[t.buffer].data), np.int8).reshape(t.shape).astype(np.float64)
                s = np.asarray(q.scale, np.float64).reshape([-1 if d == q.quantizedDimension else 1
                                                               for d in range(w.ndim)])
                top = float(np.max(s))
                fb.buffers[t.buffer].data = np.rint(w * s / top).astype(np.int8).view(np.uint8).reshape(-1)
                t.type, q.scale, q.zeroPoint, q.quantizedDimension = schema.TensorType.UINT8, [top], [0], 0
                retyped += 1
    assert retyped >= 2
    legacy = tmp_path / "legacy_hybrid.tflite"
    fu.write_model(fb, str(legacy))
    x = np.random.default_rng(5).uniform(0, 1, (4, 1, H, W, 3)).astype(np.float32)
    g = load_graph(legacy)
    got = np.stack([run(g, xi)[g.outputs[0]] for xi in x])
    ref = np.stack([_tflite_run(legacy, xi)[0] for xi in x])
    print(f"legacy uint8 hybrid: IR vs TFLite interpreter {sqnr_db(ref, got):.1f} dB")
    assert sqnr_db(ref, got) >= 35
    # and were a form misread again, the graph's disagreement with the interpreter refuses it
    from tl2k210.errors import ModelLoadError
    from tl2k210.frontends import tflite
    from tl2k210 import frontends
    monkeypatch.setattr(tflite, "retype_legacy_hybrid", lambda model, path: 0)
    monkeypatch.setattr(frontends, "_CACHE", {})
    with pytest.raises(ModelLoadError, match=r"disagrees with the TFLite interpreter on a test input \(output SQNR "
                                             r"-\d+\.\d dB\): tf2onnx misread"):
        load_graph(legacy)


def test_full_int8_input_scale_sets_the_input_range(variants, tmp_path):
    """A full-integer model says which float range its uint8 input stands for: convert takes the
    preprocessing from it (no --input-range) and the kmodel agrees with the TFLite model."""
    from PIL import Image

    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.k210.emulator import Emulator
    rng = np.random.default_rng(3)
    imgs = noise_photos(tmp_path / "imgs", H, W, rng, n=12)
    out = tmp_path / "int8.kmodel"
    r = convert(variants["full_int8"], out, ConvertOptions(dataset=str(imgs), progress=False))
    assert r.totals["input_range"] == pytest.approx([0.0, 1.0], abs=0.01)
    assert "input quantization" in r.totals["input_range_note"]
    emu = Emulator.load(out)
    px = np.stack([np.asarray(Image.open(imgs / f"{i}.png")) for i in range(12)])
    ref = np.concatenate([_tflite_run(variants["full_int8"], p[None].astype(np.float32) / 255)[0] for p in px])
    got = np.stack([emu.run(np.ascontiguousarray(p.transpose(2, 0, 1)))[0] for p in px]).reshape(ref.shape)
    db = sqnr_db(ref, got)
    print(f"full int8 TFLite vs kmodel (emulated): SQNR {db:.1f} dB")
    assert db >= 15
    # compare's reference is the float graph of its integers, and it says so (hunt 23)
    from tl2k210.compare import compare
    assert compare(variants["full_int8"], out, str(imgs))["quantized_source"] is True



def _output_bytes(it, kmodel_path, shape):
    """(TFLite's output bytes, the kmodel's put back on the file's output grid, its scale, zero
    point) on seeded uint8 pixels (N, H, W, C): the interpreter `it` (allocated) and the emulator."""
    from tl2k210.k210.emulator import Emulator
    o = it.get_output_details()[0]
    s, z = o["quantization"]
    emu = Emulator.load(kmodel_path)
    refs, gots = [], []
    for p in np.random.default_rng(8).integers(0, 256, shape, dtype=np.uint8):
        it.set_tensor(it.get_input_details()[0]["index"], p[None])
        it.invoke()
        refs.append(it.get_tensor(o["index"]).astype(np.int64).reshape(-1))
        y = np.asarray(emu.run(np.ascontiguousarray(p.transpose(2, 0, 1)))[0], np.float64).reshape(-1)
        gots.append(np.rint(y / s + z).astype(np.int64))
    return np.stack(refs), np.stack(gots), s, z


# (rounding, the interpreter's kernels, share of equal output bytes): the reference MEAN rounds
# its sum up to e = 2m away from zero; the float pool and one QUANTIZE after it can add that
# on one side only, and this pool reads the add's signed output (a pool after a ReLU: exact)
@pytest.mark.parametrize("rounding,kernels,equal", [("reference", "BUILTIN_REF", 0.95), ("single", "AUTO", 0.99)])
def test_full_int8_without_dataset_gives_tflites_bytes(variants, tmp_path, rounding, kernels, equal):
    """Converted from its own scales (no --dataset), the full-integer model's KPU convs (ReLU,
    ReLU6, stride 2, depthwise), residual add and dense layer round as TFLite's integer kernels
    do -- the default interpreter's XNNPACK kernels by default (--int8-rounding single), the
    reference kernels (TFLite Micro's two roundings) with --int8-rounding reference: the kmodel's output, put back on
    the file's uint8 output grid, is that interpreter's output byte for byte on nearly every value
    (a differing byte only from the global average pool's rounding), and the receipt says
    "int8 exact" for every KPU layer."""
    from tl2k210.compiler import ConvertOptions, convert
    out = tmp_path / "own.kmodel"
    r = convert(variants["full_int8"], out, ConvertOptions(progress=False, min_sqnr=0, int8_rounding=rounding))
    kpu_rows = [row for row in r.layers if row["unit"] == "KPU"]
    assert kpu_rows and all(any(n.startswith("int8 exact") for n in row["notes"]) for row in kpu_rows)
    assert any(n.startswith("int8 exact") for row in r.layers if row["op"] == "Add" for n in row["notes"])
    t = tf()
    it = t.lite.Interpreter(model_path=str(variants["full_int8"]),
                            experimental_op_resolver_type=getattr(t.lite.experimental.OpResolverType, kernels))
    it.allocate_tensors()
    ref, got, s, z = _output_bytes(it, out, (16, H, W, 3))
    print(f"output bytes equal to TFLite's: {np.mean(ref == got):.3f}, max |diff| {np.abs(ref - got).max()}")
    assert np.mean(ref == got) >= equal and np.abs(ref - got).max() <= 1
    assert sqnr_db((ref - z) * s, (got - z) * s) >= 40


def test_an_output_the_gate_lets_pass_at_its_ideal_is_flagged(variants, tmp_path):
    """A fully quantized model's output below --min-sqnr passes the gate where its 8-bit ideal (the
    model's own int8 ranges) is as low: the int8 model's own loss. The receipt says so and asks for
    a check against the source model (round 59's DBFace had passed so with its heat map dead)."""
    from tl2k210.compiler import ConvertOptions, convert
    r = convert(variants["full_int8"], tmp_path / "own.kmodel", ConvertOptions(progress=False, min_sqnr=80))
    out = next(iter(r.totals["outputs"].values()))
    assert out["sqnr_db"] < 80 and out["sqnr_db"] >= out["ideal_db"] - 1
    assert "below --min-sqnr 80 dB passed because the float model with the model's own int8 ranges" in r.table()
    assert "tl2k210 compare" in r.table()
    out["ideal_db"] = out["sqnr_db"] + 5      # an output the gate refuses (a refusal prints the receipt too)
    assert "warning: output" not in r.table()
    r = convert(variants["full_int8"], tmp_path / "own2.kmodel", ConvertOptions(progress=False))
    assert "warning: output" not in r.table()


@pytest.fixture(scope="module")
def toco_uint8(tmp_path_factory):
    """A TF1/TOCO-era uint8 model as the Coral test data holds them (mobilenet_v1_*_quant): fake
    quantization in a TF1 graph, converted with inference_type uint8 -- per-tensor asymmetric
    uint8 weights (zero points far from 128), a stride-2 depthwise conv, and an output written
    by a RESHAPE of the quantized pool (tf2onnx: QuantizeLinear -> Reshape -> output)."""
    t = tf()
    tf1, fq = t.compat.v1, t.quantization.fake_quant_with_min_max_vars
    r = np.random.default_rng(0)
    g = t.Graph()
    with g.as_default():
        x = tf1.placeholder(t.float32, (1, 16, 20, 3), name="input")
        w = fq(t.constant(r.normal(0.05, 0.2, (3, 3, 3, 8)).astype(np.float32)), -0.3, 0.6)
        y = t.nn.conv2d(fq(x, -1.0, 1.0), w, [1, 1, 1, 1], "SAME") + r.normal(0, 0.1, 8).astype(np.float32)
        y = fq(t.nn.relu6(y), 0.0, 6.0)
        dw = fq(t.constant(r.normal(0.02, 0.3, (3, 3, 8, 1)).astype(np.float32)), -0.5, 0.9)
        y = fq(t.nn.relu6(t.nn.depthwise_conv2d(y, dw, [1, 2, 2, 1], "SAME")), 0.0, 6.0)
        y = fq(t.reduce_mean(y, [1, 2], keepdims=True), 0.0, 6.0)
        out = t.reshape(y, (1, 8), name="out")
        with tf1.Session(graph=g) as sess:
            c = tf1.lite.TFLiteConverter.from_session(sess, [x], [out])
            c.inference_type = t.uint8
            c.quantized_input_stats = {"input": (128.0, 127.5)}
            path = tmp_path_factory.mktemp("toco") / "toco_uint8.tflite"
            path.write_bytes(c.convert())
    return path


def test_toco_uint8_gives_tflites_bytes(toco_uint8, tmp_path):
    """TOCO's asymmetric uint8 weights are the KPU's own integers (its weight offset takes the
    zero point): every KPU layer "int8 exact", and the kmodel's output bytes are the TFLite
    interpreter's (the float pool may round one tie the other way)."""
    from tensorflow.lite.tools import flatbuffer_utils as fu

    from tl2k210.compiler import ConvertOptions, convert
    m = fu.read_model(str(toco_uint8))
    sg = m.subgraphs[0]
    zps = {int(sg.tensors[i].quantization.zeroPoint[0]) for op in sg.operators[:2] for i in op.inputs[1:2]}
    assert sg.tensors[sg.inputs[0]].type == 3 and len(zps) == 2 and not zps & {0, 128}   # uint8, asymmetric
    out = tmp_path / "toco.kmodel"
    r = convert(toco_uint8, out, ConvertOptions(progress=False, min_sqnr=0))
    kpu_rows = [row for row in r.layers if row["unit"] == "KPU"]
    assert len(kpu_rows) == 2 and all(any(n.startswith("int8 exact") for n in row["notes"]) for row in kpu_rows)
    it = tf().lite.Interpreter(model_path=str(toco_uint8))
    it.allocate_tensors()
    ref, got, _, _ = _output_bytes(it, out, (32, 16, 20, 3))
    print(f"output bytes equal to TFLite's: {np.mean(ref == got):.3f}, max |diff| {np.abs(ref - got).max()}")
    assert ref.shape == (32, 8) and np.mean(ref == got) >= 0.97 and np.abs(ref - got).max() <= 1


@pytest.mark.parametrize("custom,says", [
    ("Landmarks2TransformMatrix", "of MediaPipe's custom op set (the affine matrix"),
    ("TFLite_Detection_PostProcess", "of TensorFlow Object Detection API's custom op set (an SSD's box decoding"),
    ("ethos-u", "of Arm Vela's custom op set (a command stream for the Ethos-U NPU"),   # Himax's model zoo
    ("edgetpu-custom-op", "convert the .tflite that edgetpu_compiler read"),       # Coral's test_data
    ("SignalWindow", "Lite Micro's signal library's custom op set (a step of an audio front end"),
    ("AcmeWarp", "(no vendor set this converter knows)")])
def test_custom_op_is_refused_by_name(variants, tmp_path, capsys, custom, says):
    """A file whose last op is a CUSTOM opcode: refused naming the op, its vendor set and what it
    does, its inputs and outputs; exit 2, nothing written, no traceback."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils as fu

    from tl2k210.cli import main
    m = fu.read_model(str(variants["float32"]))
    op = m.subgraphs[0].operators[-1]
    code = m.operatorCodes[op.opcodeIndex]
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode = custom.encode()
    src = tmp_path / "custom.tflite"
    fu.write_model(m, str(src))
    out = tmp_path / "out.kmodel"
    assert main(["convert", str(src), str(out), "--dataset", str(tmp_path), "-q"]) == 2
    err = capsys.readouterr().err
    out_name = m.subgraphs[0].tensors[op.outputs[0]].name.decode()
    for part in (f"custom op {custom!r}", says, "inputs: ", f"outputs: {out_name} (1, 10)", "Refused"):
        assert part in err, (part, err)
    assert "Traceback" not in err and not out.exists()


def test_fused_lstm_is_refused_by_name(variants, tmp_path, capsys):
    """TFLite's fused UNIDIRECTIONAL_SEQUENCE_LSTM (Coral's keras_lstm_mnist_ptq) has no tf2onnx
    conversion: tf2onnx only logged it and failed on an internal name. Refused before tf2onnx
    runs, naming the operator, what it computes and its tensors: exit 2, nothing written."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils as fu

    from tl2k210.cli import main
    m = fu.read_model(str(variants["float32"]))
    op = m.subgraphs[0].operators[-1]
    code = m.operatorCodes[op.opcodeIndex]
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM
    src = tmp_path / "lstm.tflite"
    fu.write_model(m, str(src))
    out = tmp_path / "out.kmodel"
    assert main(["convert", str(src), str(out), "-q"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    out_name = m.subgraphs[0].tensors[op.outputs[0]].name.decode()
    for part in (f"operator {len(m.subgraphs[0].operators) - 1} is the builtin op UNIDIRECTIONAL_SEQUENCE_LSTM "
                 "(an LSTM layer over a sequence; the K210 has no recurrent layer)", f"outputs: {out_name} (1, 10)",
                 "tf2onnx, the TFLite reader, has no conversion", "export the model without it"):
        assert part in last, (part, last)
    assert "Traceback" not in err and not out.exists()


def test_an_fft_front_end_is_refused_by_name(tmp_path, capsys):
    """A model that computes its own spectrogram (Kapre's / tf.signal's STFT: SpeechCmdRecognition's
    attRNN) holds RFFT2D, which tf2onnx converts only with a ComplexAbs after it, and whose failure
    read "export it at a fixed input size". Refused naming the op, its tensors and what to do."""
    import tensorflow as tf_

    from tl2k210.cli import main

    class Spectrogram(tf_.Module):
        @tf_.function(input_signature=[tf_.TensorSpec([1, 1024], tf_.float32)])
        def __call__(self, x):
            s = tf_.signal.stft(x, 256, 128, 256)
            return tf_.reduce_mean(tf_.math.log(tf_.abs(s) + 1e-6), axis=1)
    m = Spectrogram()
    src = tmp_path / "stft.tflite"
    src.write_bytes(tf().lite.TFLiteConverter.from_concrete_functions([m.__call__.get_concrete_function()], m).convert())
    out = tmp_path / "out.kmodel"
    assert main(["convert", str(src), str(out), "-q"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    for part in ("is the builtin op RFFT2D (a real FFT: the model computes its own spectrogram", "inputs: ",
                 "no K210 runtime has an FFT op", "convert the network that reads it"):
        assert part in last, (part, last)
    assert "Traceback" not in err and not out.exists()

def test_keras_lstm_loop_is_refused_in_one_line(tmp_path, capsys):
    """Keras 3 writes an LSTM as a TF while_loop (an ONNX Loop through tf2onnx): refused naming the
    node, its body summed up in one phrase (the message used to print the whole body graph)."""
    import keras
    from keras import layers as L

    from tl2k210.cli import main
    keras.utils.set_random_seed(0)
    i = keras.Input((28, 28), batch_size=1)
    src = tmp_path / "lstm.tflite"
    src.write_bytes(tf().lite.TFLiteConverter.from_keras_model(keras.Model(i, L.Dense(10)(L.LSTM(20)(i)))).convert())
    out = tmp_path / "out.kmodel"
    assert main(["convert", str(src), str(out), "-q"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "while_loop': op Loop body=<graph of " in last and "a model without loops" in last, last
    assert len(err.strip().splitlines()) < 8 and "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_mediapipe_transpose_conv_bias_maps_to_builtins(tmp_path, padding):
    """MediaPipe's custom Convolution2DTransposeBias (what its segmentation models use): made here
    from a Keras Conv2DTranspose's TRANSPOSE_CONV by rewriting it into the custom op's form
    (inputs, OHWI weights, bias; options {padding, stride_w, stride_h} as raw int32s). The
    front-end maps it back to TRANSPOSE_CONV + ADD: the original TFLite model's output."""
    import keras
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils as fu
    t = tf()
    keras.utils.set_random_seed(0)
    i = keras.Input((6, 5, 3), batch_size=1)
    layer = keras.layers.Conv2DTranspose(4, 3, strides=2, padding=padding)
    m = keras.Model(i, layer(i))
    layer.set_weights([layer.get_weights()[0], np.array([0.5, -1.0, 0.25, 2.0], np.float32)])
    src = tmp_path / "tconv.tflite"
    src.write_bytes(t.lite.TFLiteConverter.from_keras_model(m).convert())
    x = np.random.default_rng(0).uniform(-1, 1, (1, 6, 5, 3)).astype(np.float32)
    ref, _ = _tflite_run(src, x)
    fb = fu.read_model(str(src))
    sg = fb.subgraphs[0]
    op = next(o for o in sg.operators if fu.opcode_to_name(fb, o.opcodeIndex) == "TRANSPOSE_CONV")
    assert len(op.inputs) == 4               # output_shape, weights (OHWI), input, bias
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode = b"Convolution2DTransposeBias"
    fb.operatorCodes.append(code)
    opts = op.builtinOptions
    op.opcodeIndex, op.inputs = len(fb.operatorCodes) - 1, [op.inputs[2], op.inputs[1], op.inputs[3]]
    op.customOptions = list(np.array([1 if opts.padding == schema.Padding.SAME else 2, opts.strideW, opts.strideH],
                                     "<i4").tobytes())
    op.builtinOptionsType, op.builtinOptions = 0, None
    custom = tmp_path / "custom.tflite"
    fu.write_model(fb, str(custom))
    g = load_graph(custom)
    assert "ConvTranspose" in g.op_counts()
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ref, atol=1e-5)


def test_an_unreadable_flatbuffer_still_names_a_recurrent_op(variants, tmp_path, monkeypatch):
    """TFLite Micro's keyword_scrambled has its names stripped: TF's flatbuffer reader fails on
    it (AttributeError on a None name) where the interpreter lists its ops. A recurrent op the
    interpreter names (there: SVDF) is refused by name, not as a reading failure; otherwise the
    message says the reader failed, not that sparse weights did."""
    from tensorflow.lite.tools import flatbuffer_utils as fu

    from tl2k210.errors import ModelLoadError
    from tl2k210.frontends import tflite

    def unreadable(path):
        raise AttributeError("'NoneType' object has no attribute 'decode'")
    monkeypatch.setattr(fu, "read_model", unreadable)
    with pytest.raises(ModelLoadError) as e:
        tflite.from_tflite(variants["float32"])
    assert "flatbuffer reader could not read it" in str(e.value) and "densify its sparse" not in str(e.value)

    # the interpreter of an SVDF keyword model, as it lists its ops
    monkeypatch.setattr(tflite, "interpreter_ops", lambda path: ["QUANTIZE", "SVDF", "FULLY_CONNECTED"])
    with pytest.raises(ModelLoadError) as e:
        tflite.from_tflite(variants["float32"])
    assert "operator 1 is the builtin op SVDF" in str(e.value) and "no recurrent layer" in str(e.value)


def test_a_truncated_flatbuffer_is_a_clear_error_not_a_crash(variants, tmp_path):
    """A .tflite cut short (an interrupted copy): the flatbuffer reader fails, and TFLite's
    interpreter, which then lists the ops, trusts the flatbuffer and can die of a segmentation
    fault on it (it took `convert` down with it): it runs in a child process, and the error says
    what happened and what to do."""
    from tl2k210.errors import ModelLoadError
    from tl2k210.frontends import tflite
    data = Path(variants["float32"]).read_bytes()
    cut = tmp_path / "cut.tflite"
    cut.write_bytes(data[:len(data) // 3])
    with pytest.raises(ModelLoadError) as e:
        tflite.from_tflite(cut)
    assert "flatbuffer reader could not read it" in str(e.value) and "truncated or damaged" in str(e.value)


def test_outputs_cuts_a_tflite_file_before_its_custom_op(variants, tmp_path, capsys):
    """A .tflite file whose last op is a custom op (an SSD's TFLite_Detection_PostProcess, PoseNet's
    decoder) converts with --outputs naming that op's input: the file is cut before TensorFlow
    Lite's reader meets the op (refused without the flag), and compare cuts the float side too."""
    import json

    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils as fu

    from tl2k210.cli import main
    m = fu.read_model(str(variants["float32"]))
    sg = m.subgraphs[0]
    op = sg.operators[-1]
    code = m.operatorCodes[op.opcodeIndex]
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode = b"AcmeDecode"
    before = sg.tensors[op.inputs[0]].name.decode()
    src = tmp_path / "custom.tflite"
    fu.write_model(m, str(src))
    rng = np.random.default_rng(2)
    photos = noise_photos(tmp_path / "photos", H, W, rng)
    out = tmp_path / "out.kmodel"
    assert main(["convert", str(src), str(out), "--dataset", str(photos), "-q"]) == 2
    assert "custom op 'AcmeDecode'" in capsys.readouterr().err and not out.exists()
    assert main(["convert", str(src), str(out), "--dataset", str(photos), "--outputs", before + "x", "-q"]) == 2
    assert f"--outputs '{before}x': the file has no such tensor; nearest: '{before}'" in capsys.readouterr().err
    assert main(["convert", str(src), str(out), "--dataset", str(photos), "--outputs", before, "-q"]) == 0
    meta = json.loads((tmp_path / "out.kmodel.json").read_text())
    assert [o["name"] for o in meta["outputs"]] == [before]
    assert main(["compare", str(src), str(out), "--dataset", str(photos), "--json", str(tmp_path / "c.json")]) == 0
    rows = json.loads((tmp_path / "c.json").read_text())["outputs"]
    assert list(rows) == [before] and rows[before]["sqnr_db"] > 25, rows


def test_empty_quantization_vectors_read_as_absent(variants, tmp_path):
    """OpenMV's int8 MediaPipe palm and hand detectors store every tensor's min and max as empty
    vectors, and a few unquantized tensors an empty scale and zero point: tf2onnx copied them into
    node attributes that ONNX cannot type ("Could not infer attribute `max` type from empty
    iterator"). Such a file reads as the same graph as the file without them."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils as fu
    m = fu.read_model(str(variants["full_int8"]))
    bare = 0
    for t in m.subgraphs[0].tensors:
        if t.quantization is None or t.quantization.scale is None:
            t.quantization, bare = schema.QuantizationParametersT(), bare + 1
            t.quantization.scale, t.quantization.zeroPoint = [], []
        t.quantization.min, t.quantization.max = [], []
    odd = tmp_path / "empty_vectors.tflite"
    fu.write_model(m, str(odd))
    assert bare and all(len(t.quantization.max) == 0 for t in fu.read_model(str(odd)).subgraphs[0].tensors)
    x = np.random.default_rng(6).uniform(0, 1, (1, 3, H, W)).astype(np.float32)
    a, b = (run_pipeline(load_graph(p))[0] for p in (variants["full_int8"], odd))
    np.testing.assert_array_equal(run(a, x)[a.outputs[0]], run(b, x)[b.outputs[0]])


@pytest.mark.parametrize("name", ["float16", "full_int8"])
def test_an_op_code_in_the_new_field_alone_reads_as_that_op(variants, tmp_path, name):
    """Google's LiteRT quantizer (ai-edge-quantizer, round 71's hunt) writes each operator code in
    `builtin_code` only, leaving `deprecated_builtin_code` 0 (ADD) for DEQUANTIZE and QUANTIZE:
    tf2onnx read the old field, so its weight-only and partly quantized models became Adds ("Graph
    has cycles"). Such a file (here every code below 127 so written) reads as the same graph."""
    from tensorflow.lite.tools import flatbuffer_utils as fu
    m = fu.read_model(str(variants[name]))
    for c in m.operatorCodes:
        c.builtinCode, c.deprecatedBuiltinCode = max(c.builtinCode, c.deprecatedBuiltinCode), 0
    odd = tmp_path / "new_field_only.tflite"
    fu.write_model(m, str(odd))
    assert {fu.opcode_to_name(m, i) for i in range(len(m.operatorCodes))} >= {"DEQUANTIZE" if name == "float16"
                                                                              else "QUANTIZE", "CONV_2D"}
    x = np.random.default_rng(7).uniform(0, 1, (1, 3, H, W)).astype(np.float32)
    a, b = (run_pipeline(load_graph(p))[0] for p in (variants[name], odd))
    np.testing.assert_array_equal(run(a, x)[a.outputs[0]], run(b, x)[b.outputs[0]])


def test_a_streaming_model_with_state_is_refused_saying_so(tmp_path, capsys):
    """microWakeWord's streaming models keep a ring buffer in TFLite resource variables (CALL_ONCE
    initialises them, operator 0: "cut the model before it" cannot be done): refused as a
    streaming model, asking for the non-streaming form; nothing written."""
    from tl2k210.cli import main
    t = tf()

    class Stream(t.Module):
        def __init__(self):
            self.ring = t.Variable(t.zeros((1, 4, 8)))

        @t.function(input_signature=[t.TensorSpec((1, 1, 8), t.float32)])
        def __call__(self, x):
            self.ring.assign(t.concat([self.ring[:, 1:], x], axis=1))
            return t.reduce_sum(self.ring, axis=1)
    m = Stream()
    c = t.lite.TFLiteConverter.from_concrete_functions([m.__call__.get_concrete_function()], m)
    c.experimental_enable_resource_variables = True
    src, out = tmp_path / "stream.tflite", tmp_path / "stream.kmodel"
    src.write_bytes(c.convert())
    assert main(["convert", str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert "a streaming model: it keeps state between calls in variables (" in err and "CALL_ONCE" in err
    assert "convert the model's non-streaming form" in err and "Traceback" not in err and not out.exists()


def test_a_max_pool_fused_into_its_conv_keeps_the_models_grid(tmp_path):
    """TinyML Cookbook's int8 CIFAR-10 (hunt 20): a conv + ReLU + MaxPool, one KPU layer, took the
    grid of what its pool reads (the layer's "act" stage) from 16 synthetic images (no --dataset),
    not the model's: 12 % of the pooled bytes 1 LSB off TFLite, a few 57, under a row that said
    "int8 exact". The layer now requantizes onto the model's grid: the kmodel's output bytes are
    the default interpreter's (XNNPACK's)."""
    import keras
    from keras import layers as L
    from tl2k210.compiler import ConvertOptions, convert
    t = tf()
    keras.utils.set_random_seed(4)
    i = keras.Input((32, 32, 3), batch_size=1)
    a = L.MaxPooling2D(2)(L.Conv2D(16, 3, padding="same", activation="relu")(i))
    a = L.MaxPooling2D(2)(L.Conv2D(24, 3, padding="same", activation="relu")(a))
    m = keras.Model(i, L.Dense(10)(L.Flatten()(a)))
    c = t.lite.TFLiteConverter.from_keras_model(m)
    c.optimizations = [t.lite.Optimize.DEFAULT]
    r = np.random.default_rng(1)
    c.representative_dataset = lambda: ([r.uniform(0, 1, (1, 32, 32, 3)).astype(np.float32)] for _ in range(16))
    c.target_spec.supported_ops = [t.lite.OpsSet.TFLITE_BUILTINS_INT8]
    c.inference_input_type = c.inference_output_type = t.uint8
    src = tmp_path / "pooled.tflite"
    src.write_bytes(c.convert())
    out = tmp_path / "pooled.kmodel"
    rec = convert(src, out, ConvertOptions(progress=False, min_sqnr=0))
    assert sum("max_2_s2" in row["why"] for row in rec.layers) == 2       # both pools fused
    it = t.lite.Interpreter(model_path=str(src))
    it.allocate_tensors()
    ref, got, _, _ = _output_bytes(it, out, (16, 32, 32, 3))
    assert np.abs(ref - got).max() <= 1 and np.mean(ref == got) >= 0.99, (np.abs(ref - got).max(), np.mean(ref == got))
