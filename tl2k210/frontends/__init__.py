"""Front-ends: every model kind ends in an onnx.ModelProto (TF ones through tf2onnx).

`load_model(src, **opts)` picks the front-end by object type, directory or file suffix;
`load_graph(src, **opts)` also reads it into the IR (tl2k210.graph.Graph).
TensorFlow is imported lazily inside the TF front-ends only.
"""
import collections
import contextlib
import copy
from pathlib import Path

from tl2k210 import quiet
from tl2k210.errors import ModelLoadError, Tl2k210Error
from tl2k210.fileio import lfs_pointer

OPSET = 18


_CACHE = {}        # (path, size, mtime, opts) -> ModelProto: convert + compare in one process
_CACHE_SIZE = 16   # convert a file once (tf2onnx takes seconds)


def _cache_key(path, opts):
    try:
        st = Path(path).stat()
    except OSError:
        return None
    if Path(path).is_dir() or any(not isinstance(v, (str, int, float, Path, type(None))) for v in opts.values()):
        return None
    return (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, tuple(sorted((k, str(v)) for k, v in opts.items())))


def load_model(src, **opts):
    """Model object or path -> onnx.ModelProto (a file is converted once per process: a cache
    keyed by path, size and modification time).

    TensorLayer `tl.models.Model` (opts: weights=npz/h5 path, input_shape), TensorLayer
    `Model.save` .h5 (architecture and weights: no network needed), Keras model or
    `.keras`/`.h5` file (or an architecture `.json` with weights=`.h5`), SavedModel directory,
    `.tflite`, `.onnx`. A TensorLayer weight file needs its network: `load_model("w.npz",
    network=model)`. opts `outputs` (--outputs' tensor names): a `.tflite` file is cut there before
    TensorFlow Lite's reader meets a custom op after them; other kinds are cut on the graph
    (compiler.cut_outputs), and on the ONNX graph before the IR reads it where they are its tensors
    (cut.end_at). `start` (--inputs' tensor name): the model starts there (cut.start_at; a
    `.tflite` file is cut before TensorFlow Lite reads it)."""
    from .cut import end_at, start_at
    start = opts.pop("start", None)
    model = end_at(_load(src, start, **opts), opts.get("outputs"))
    return model if start is None else start_at(model, start, str(src) if isinstance(src, (str, Path)) else
                                                "the model")


def _load(src, start=None, **opts):
    outputs = opts.pop("outputs", None)
    shape = opts.pop("nchw_input_shape", None)      # --input-shape: a frozen graph's shapeless Placeholder
    pins = opts.pop("input_values", None)           # --input-value: a frozen graph's other Placeholders
    if not isinstance(src, (str, Path)):
        mod = type(src).__module__
        if mod.startswith("tensorlayer"):
            quiet.tensorflow()
            from .tensorlayer import from_tensorlayer
            return from_tensorlayer(src, **opts)
        if mod.startswith(("keras", "tf_keras", "tensorflow")):
            quiet.tensorflow()
            from .keras import from_keras
            return from_keras(src, **opts)
        if mod.startswith("onnx"):
            from .repair import repair
            return repair(src)
        raise ModelLoadError(f"cannot convert a {type(src).__name__} ({mod}); give a TensorLayer/Keras model "
                             "or a .keras/.h5/.tflite/.onnx file or a SavedModel directory")
    import onnx
    key = _cache_key(src, {**opts, "outputs": ",".join(outputs) if outputs else None, "shape": shape, "start": start,
                           "pins": str(sorted(pins.items())) if pins else None})
    if key is not None and key in _CACHE:
        m = onnx.ModelProto()
        m.CopyFrom(_CACHE[key])
        return m
    model = _load_path(Path(src), outputs, shape, pins, start, **opts)
    if key is not None:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = onnx.ModelProto()
        _CACHE[key].CopyFrom(model)
    return model


KNOWN = (".keras", ".h5", ".hdf5", ".json", ".tflite", ".pb", ".onnx", ".npz")


def model_kind(path) -> str:
    """The file's model kind as a suffix: its own where tl2k210 knows it, else what its first bytes
    say (Edge Impulse's `.lite` TFLite files, the Keras tutorials' HDF5 `.model`), else its own."""
    suffix = path.suffix.lower()
    if suffix in KNOWN or not path.is_file():
        return suffix
    with open(path, "rb") as f:
        head = f.read(8)
    if head[4:8] == b"TFL3":                        # the FlatBuffer's file identifier
        return ".tflite"
    if head == b"\x89HDF\r\n\x1a\n":                # the HDF5 signature
        return ".h5"
    if head[:4] == b"PK\x03\x04":                    # a Keras 3 zip (config.json + weights), not a PyTorch zip
        import zipfile
        try:
            with zipfile.ZipFile(path) as z:
                if "config.json" in z.namelist():
                    return ".keras"
        except (zipfile.BadZipFile, OSError):
            pass
    return suffix


def _as_kind(path, suffix, *args, **opts):
    """`path` loaded through a link named for the kind its bytes say (the loaders, Keras 3's
    among them, go by the suffix); an error names `path`, not the link."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="tl2k210-kind-") as d:
        link = Path(d) / (path.stem + suffix)
        link.symlink_to(path.resolve())
        try:
            return _load_path(link, *args, **opts)
        except Tl2k210Error as e:
            e.args = tuple(a.replace(str(link), str(path)) if isinstance(a, str) else a for a in e.args)
            raise


def _load_path(path, outputs=None, shape=None, pins=None, start=None, **opts):
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or directory; check the path")
    if path.is_file():
        with open(path, "rb") as f:
            if (lfs := lfs_pointer(f.read(64))) is not None:
                raise ModelLoadError(f"{path}: {lfs}")
    suffix = model_kind(path)
    if suffix != path.suffix.lower():
        return _as_kind(path, suffix, outputs, shape, pins, start, **opts)
    if "network" in opts or suffix == ".npz":
        if "network" not in opts:
            raise ModelLoadError(f"{path}: a TensorLayer weight file needs its network (network=tl.models.Model)")
        quiet.tensorflow()
        from .tensorlayer import from_tensorlayer
        net = opts.pop("network")
        return from_tensorlayer(net, weights=path, **opts)
    if suffix in (".h5", ".hdf5"):
        from .tl_config import model_file_config
        text = model_file_config(path)
        if text is not None:       # TensorLayer's Model.save: architecture and weights
            quiet.tensorflow()
            from .tensorlayer_h5 import from_tensorlayer_h5
            return from_tensorlayer_h5(path, text, **opts)
    if path.is_dir():
        quiet.tensorflow()
        from .savedmodel import from_savedmodel
        return from_savedmodel(path, **opts)
    if suffix in (".keras", ".h5", ".hdf5", ".json"):
        quiet.tensorflow()
        from .keras import from_keras
        return from_keras(path, outputs=outputs, **opts)
    if suffix == ".tflite":
        quiet.tensorflow()
        from .tflite import from_tflite
        return from_tflite(path, outputs=outputs, start=start, **opts)
    if suffix == ".pb":
        quiet.tensorflow()
        from .frozen_pb import from_frozen_pb
        return from_frozen_pb(path, input_shape=shape, input_values=pins, outputs=outputs, **opts)
    if suffix == ".onnx":
        from .onnx_file import from_onnx_file
        return from_onnx_file(path)
    if suffix in (".pt", ".pth"):
        raise ModelLoadError(f"{path}: a PyTorch file, which tl2k210 does not read; export the model to ONNX "
                             "(torch.onnx.export(model, torch.randn(1, 3, H, W), 'model.onnx')) and convert that")
    if suffix == ".kmodel":
        raise ModelLoadError(f"{path}: already a kmodel; `tl2k210 inspect` describes it, `tl2k210 run` runs it")
    raise ModelLoadError(f"{path}: unknown model kind {suffix!r} (nor do its first bytes say TFLite, HDF5 or a Keras "
                         "zip); expected .keras/.h5/.json/.tflite/.onnx/.pb (frozen graph), a SavedModel directory "
                         "or a TensorLayer weight file with network=")


def load_graph(src, batch=1, **opts):
    from tl2k210.graph import from_onnx
    return from_onnx(load_model(src, **opts), batch=batch)


def check_onnx(model, where):
    """Validate a converted/loaded ModelProto; raise ModelLoadError naming `where`."""
    import onnx

    from tl2k210.graph import ir4_if_initializers_unlisted

    from .repair import repair
    model = repair(ir4_if_initializers_unlisted(model))
    _refuse_tf_calls(model, where)
    try:
        onnx.checker.check_model(_outputs_shaped(model))
    except Exception as e:  # onnx raises several kinds
        _refuse_unknown_ops(model, where)
        raise ModelLoadError(f"{where}: not a valid ONNX model: {str(e).splitlines()[0]}") from e
    return model


def _outputs_shaped(model):
    """`model` for onnx's checker, which wants a shape on every graph output: tf2onnx writes none
    where TFLite stores the output of a size computed at run time (a style-transfer net's
    Shape -> Resize) and tl2k210 infers it itself. A copy whose such outputs have an empty shape."""
    bare = [i for i, v in enumerate(model.graph.output)
            if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")]
    if not bare:
        return model
    checked = type(model)()
    checked.CopyFrom(model)
    for i in bare:
        checked.graph.output[i].type.tensor_type.shape.SetInParent()
    return checked


def _refuse_unknown_ops(model, where):
    """Where onnx's checker refused the model: a node of the standard domain whose op ONNX does
    not define (a TensorRT-style `Plugin` from a PyTorch export: DBFace's bilinear upsampling) is
    refused naming it, its attributes and its tensors, not as "No Op registered for Plugin".
    Nodes of a domain the file does not import (QONNX's `Quant` and channels-last `Conv`, from
    FINN / Brevitas / hls4ml) are refused naming the domains and their ops.
    (The opset-1..8 experimental ops the checker passes are graph._experimental_ops' work.)"""
    import onnx
    imported = {o.domain for o in model.opset_import} | {"", "ai.onnx"}
    foreign = collections.defaultdict(collections.Counter)
    for n in model.graph.node:
        if n.domain not in imported:
            foreign[n.domain][n.op_type] += 1
    if foreign:
        ops = "; ".join(f"{d!r}: " + ", ".join(f"{op} x{k}" for op, k in c.most_common())
                        for d, c in foreign.items())
        qonnx = any(d.startswith("qonnx.") for d in foreign)
        raise ModelLoadError(
            f"{where}: it uses ops of domains the file does not import, which onnx and onnxruntime refuse ({ops}). "
            + ("These are QONNX's (FINN / Brevitas / hls4ml quantization and channels-last layout); "
               "export the model as standard ONNX: NCHW ops, and the quantizers as QuantizeLinear / "
               "DequantizeLinear (QONNX's QuantToQCDQ) or left out (tl2k210 quantizes for the K210 itself)"
               if qonnx else "Export the model with standard ONNX ops in their place"))
    for n in model.graph.node:
        if n.domain in ("", "ai.onnx") and not onnx.defs.has(n.op_type):
            attrs = []
            for a in n.attribute:
                v = onnx.helper.get_attribute_value(a)
                v = v.decode(errors="replace") if isinstance(v, bytes) else v
                attrs.append(f"{a.name}={str(v)[:60]}")
            raise ModelLoadError(
                f"{where}: node {n.name or n.output[0]!r} is op {n.op_type!r}, which ONNX does not define (a "
                f"vendor's plugin{': ' + ', '.join(attrs) if attrs else ''}); inputs {list(n.input)}, outputs "
                f"{list(n.output)}. Export the model with standard ONNX ops in its place (an upsampling as "
                "Resize), or replace the node in the file")


def _refuse_tf_calls(model, where):
    """tf2onnx leaves a TensorFlow function call it could not inline as a (Stateful)PartitionedCall
    node whose body is not in the file: tf_keras runs a Conv2D with groups > 1 as an XLA-compiled
    function (`_jit_compiled_convolution_op`), and such a file does not run anywhere."""
    for n in model.graph.node:
        if n.domain in ("", "ai.onnx") and n.op_type in ("PartitionedCall", "StatefulPartitionedCall"):
            f = next((a.s.decode(errors="replace") for a in n.attribute if a.name == "f" and a.s), "?")
            hint = ("Keras runs a Conv2D with groups > 1 as an XLA-compiled function (jit_compile), which "
                    "tf2onnx cannot read: convert the Keras model to TFLite (tf.lite.TFLiteConverter) or give "
                    "tl2k210 the .h5 / .keras file") if "jit_compiled_convolution" in f else \
                "export the model without it (tf2onnx could not convert that function)"
            raise ModelLoadError(f"{where}: node {n.name!r} is a TensorFlow function call ({n.op_type} of {f!r}) "
                                 f"that tf2onnx left in the file without its body, so no runtime can run it; {hint}")


#: the metadata_props key of a front end's note on the model's input (what it cut off), for the receipt
INPUT_NOTE = "tl2k210.input_note"
#: ... and the values the input takes when they are pixels the front end decoded ("0,255")
INPUT_RANGE = "tl2k210.input_range"
#: ... and the names of the source file's tensors (JSON), where --outputs takes only those (a
#: .tflite: tf2onnx's own tensors, `X_prequant`, `Relu__14:0`, are not the file's)
FILE_TENSORS = "tl2k210.file_tensors"


#: dB below which a float model's converted graph disagrees with its own framework on a seeded input
#: (the 33 float TFLite files and 34 Keras files of the corpus and hunts 6-10 agree at 103-139 dB;
#: an FC's bias tf2onnx dropped read 13.9 dB): tflite.check_against_interpreter, check_against_source
FLOAT_AGREE_DB = 40.0


def source_agreement(measure, *args):
    """`measure(*args)` -- the converted graph against the model's own framework on a seeded input
    -- or None where either side cannot run it: a guard decides nothing then."""
    try:
        with quiet.native_stderr():
            return measure(*args)
    except Exception:       # noqa: BLE001 -- a side that cannot run decides nothing
        return None


def _agreement_db(onnx_model, run_source, pins=None):
    """SQNR (dB) of the ONNX graph's outputs against `run_source(feed)`'s -- the model's own
    framework, given {graph input name: array} and answering a list in the graph's output order
    or a dict by output name -- on one seeded input (uniform 0..1; a leading dim of no fixed size
    taken as 1; the inputs --input-value `pins` {name: values} their values: a TF1 graph's dropout
    keep_prob, whose random masks the two sides draw differently unless it is 1), or None where
    either side cannot run it (an input of no fixed size or not float, outputs that differ in
    number, name or size, an op onnxruntime lacks)."""
    import numpy as np
    from onnx import TensorProto

    from tl2k210.graph import pin_input
    from tl2k210.quantize.metrics import sqnr_db
    rng, feed = np.random.default_rng(0), {}
    weights = {t.name for t in onnx_model.graph.initializer}
    for v in [v for v in onnx_model.graph.input if v.name not in weights]:
        if v.name in (pins or {}):
            feed[v.name] = pin_input(v, pins[v.name]).value
            continue
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (1 if k == 0 else None)
                for k, d in enumerate(t.shape.dim)]
        if t.elem_type != TensorProto.FLOAT or None in dims:
            return None
        feed[v.name] = rng.uniform(0, 1, dims).astype(np.float32)
    refs = run_source(feed)
    sess = quiet.onnxruntime().InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    got = sess.run(None, feed)
    if isinstance(refs, dict):
        if set(refs) != set(names):
            return None
        refs = [refs[n] for n in names]
    refs = [np.asarray(r, np.float64).ravel() for r in refs]
    got = [np.asarray(g, np.float64).ravel() for g in got]
    if [r.size for r in refs] != [g.size for g in got]:
        return None
    return sqnr_db(np.concatenate(refs), np.concatenate(got))


def check_against_source(where, onnx_model, run_source, framework, remedy, pins=None):
    """Refuse a conversion whose graph computes something else than the model does in its own
    `framework` (tf2onnx's readings of Keras models, SavedModels and frozen graphs): its outputs
    against `run_source`'s on one seeded input below FLOAT_AGREE_DB (the kmodel, its receipt and
    `compare` all measure against this graph). Says nothing where the check cannot run."""
    db = source_agreement(_agreement_db, onnx_model, run_source, pins)
    if db is not None and db < FLOAT_AGREE_DB:
        raise ModelLoadError(f"{where}: the graph tf2onnx made of the model disagrees with {framework} on a test "
                             f"input (output SQNR {db:.1f} dB; the two readings of a float model agree to over "
                             f"{FLOAT_AGREE_DB:.0f} dB): no kmodel of it would compute what the model does; nothing "
                             f"written. Please report it with the file (or {remedy})")


def tf_convert(where, fn, *args, **kwargs):
    """Call a tf2onnx converter; turn its failures into ModelLoadError naming the model."""
    try:
        with quiet.native_stderr(), _optimize_on_one_copy(), _node_failures() as failed:    # TF chatter: quiet.py
            model, _ = fn(*args, opset=kwargs.pop("opset", OPSET), **kwargs)
    except Tl2k210Error:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise ModelLoadError(f"{where}: tf2onnx could not convert it: {type(e).__name__}: "
                             f"{msg[-1] if msg else ''}") from e
    if failed:
        node, err = failed[0]
        more = f" (and {len(failed) - 1} more: {', '.join(repr(n) for n, _ in failed[1:4])})" if len(failed) > 1 else ""
        if any(w in f"{n} {e}".lower() for n, e in failed for w in ("fft", "complex", "angle")):
            fix = ("that is signal processing (an FFT) no kmodel holds: start the model after it (--inputs naming "
                   "the spectrogram or magnitude it computes) and end it before any inverse FFT (--outputs), "
                   "those steps left to the application")     # (hunt 21: DTLN's rfft/angle/irfft)
        else:
            other = ("its SavedModel or Keras model rather than a .tflite" if str(where).lower().endswith(".tflite")
                     else "a .tflite or ONNX export of it")
            fix = (f"convert another of the model's files ({other}), or export it at a fixed input size (a size "
                   "computed at run time, e.g. a resize to an input's shape, leaves the convs after it without one)")
        raise ModelLoadError(f"{where}: tf2onnx could not convert node {node!r}{more}: {err}; it goes on without "
                             f"it, so the graph it writes is wrong there: {fix}")
    return check_onnx(structural_order(model), where)


@contextlib.contextmanager
def _node_failures():
    """[(node name, its exception)] of the nodes tf2onnx failed to convert: its `convert.from_*`
    calls go on past them (continue_on_error), logging each, and return a graph that is wrong
    there (a style-transfer net's convs after a resize to a run-time size: 30 channels meet 16)."""
    import logging
    failed = []

    class Catch(logging.Handler):
        def emit(self, record):
            if str(record.msg).startswith("Failed to convert node") and record.args:
                exc = record.exc_info[1] if record.exc_info else None
                failed.append((record.args[0], f"{type(exc).__name__}: {exc}" if exc else "failed"))
    log, catch = logging.getLogger("tf2onnx"), Catch(logging.ERROR)
    log.addHandler(catch)
    try:
        yield failed
    finally:
        log.removeHandler(catch)


@contextlib.contextmanager
def _optimize_on_one_copy():
    """tf2onnx's optimize_graph deep-copies the graph before each of its ~36 optimizer runs, to
    go on from the graph before a run that raises: half its time (4.4 of 8.7 s on a segmentation
    net). Within this context the runs share one copy, and only where one raises does the
    original loop start again from the untouched graph: the same graph either way."""
    from tf2onnx import optimizer
    original = optimizer.optimize_graph

    def once(graph, catch_errors=True, optimizers=None):
        if not catch_errors:
            return original(graph, False, optimizers)
        try:
            return original(copy.deepcopy(graph), False, optimizers)
        except Exception:       # noqa: BLE001 -- tf2onnx's own loop catches the same
            return original(graph, True, optimizers)
    optimizer.optimize_graph = once
    try:
        yield
    finally:
        optimizer.optimize_graph = original


def structural_order(model):
    """Reorder `model`'s nodes (in place) by the graph's structure alone: depth first from the
    graph outputs, each node after the producers of its inputs in input order; nodes no output
    reads keep their order at the end. tf2onnx's node order (and the names of the constants it
    folds) follow Python's per-process string hashing, so the same file converted twice could
    schedule its branches -- and so lay out its kmodel -- differently; this order does not."""
    nodes = list(model.graph.node)
    producer = {o: n for n in nodes for o in n.output if o}
    done, order = set(), []
    for out in model.graph.output:
        stack = [(producer.get(out.name), False)]
        while stack:
            n, expanded = stack.pop()
            if n is None or id(n) in done:
                continue
            if expanded:
                done.add(id(n))
                order.append(n)
                continue
            stack.append((n, True))
            stack.extend((producer.get(i), False) for i in reversed(n.input) if i in producer)
    order += [n for n in nodes if id(n) not in done]
    del model.graph.node[:]
    model.graph.node.extend(order)
    return model
