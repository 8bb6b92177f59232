"""The architecture TensorLayer 2.x `Model.save(path)` writes into an .h5, read without `eval`
(TensorFlow-free).

TensorLayer writes the `model_config` attribute (`model_structure` in early 2.0) with `str()` of a
dict and reads it back with `eval`. Here the text is parsed by `ast` and only literals are taken:
dict, list, tuple, str, numbers (also negative, inf, nan), None, True, False, and the `tf.*` names
of `TF_NAMES` (TensorLayer 2.0/2.1 wrote dtypes bare, `tf.float32`). Functions (`act`,
`combine_fn`) come in three layouts, all read into one name of `FUNCTIONS`:
  2.2.x   the function's name ('relu', 'softmax_v2') or TensorLayer's own string ('lrelu0.1');
  2.1     ('is_Func', base64 cloudpickle): only a pickle *by reference* (module + name, a handful of
          opcodes, read by pickletools, never loaded) of a TensorFlow function is taken;
  2.0     {'module_path': ..., 'func_name': ...}.
Anything else (a call, a lambda, another name, a function pickled by value) is refused by name,
with where it was found.
"""
import ast
import base64
import binascii
import json
import math
import pickletools

from tl2k210.errors import ModelLoadError

TF_NAMES = {f"tf.{d}": d for d in ("float32", "float16", "float64", "int32", "int64", "uint8", "int8", "bool")}
TF_NAMES.update({
    "tf.nn.relu": "relu", "tf.nn.relu6": "relu6", "tf.nn.leaky_relu": "leaky_relu", "tf.identity": "identity",
    "tf.nn.sigmoid": "sigmoid", "tf.sigmoid": "sigmoid", "tf.math.sigmoid": "sigmoid", "tf.nn.tanh": "tanh",
    "tf.tanh": "tanh", "tf.math.tanh": "tanh", "tf.nn.softmax": "softmax", "tf.nn.softplus": "softplus",
    "tf.add": "add", "tf.math.add": "add", "tf.multiply": "multiply", "tf.math.multiply": "multiply",
    "tf.maximum": "maximum", "tf.math.maximum": "maximum", "tf.minimum": "minimum", "tf.math.minimum": "minimum",
    "tf.subtract": "subtract", "tf.math.subtract": "subtract"})
# name of a TensorFlow function as TensorLayer stores it -> ours (`leaky_relu` is alpha 0.2, TF's default)
FUNCTIONS = {"relu": "relu", "relu6": "relu6", "leaky_relu": "leaky_relu", "lrelu": "leaky_relu",
             "identity": "identity", "sigmoid": "sigmoid", "tanh": "tanh", "softmax": "softmax",
             "softmax_v2": "softmax", "softplus": "softplus", "add": "add", "multiply": "multiply",
             "maximum": "maximum", "minimum": "minimum", "subtract": "subtract"}
# the layer arguments that hold a function -> the functions each may name
FUNCTION_ARGS = {"act": {"relu", "relu6", "leaky_relu", "identity", "sigmoid", "tanh", "softmax", "softplus"},
                 "combine_fn": {"add", "multiply", "maximum", "minimum", "subtract"}}
_TOO_DEEP = ("nested too deeply to be a model config", "the file is damaged or not TensorLayer's: save the model again")
_LITERAL_NAMES = {"inf": math.inf, "nan": math.nan, "null": None, "true": True, "false": False}


class TfName(str):
    """A bare `tf.*` name of TF_NAMES found in the text (its value: our name for it)."""


def _short(s, n=80):
    return s if len(s) <= n else s[:n - 3] + "..."


def _refuse(where, what, why="tl2k210 reads only literals and the known tf.* names and runs nothing from "
            "the file; save the model again built from TensorLayer layers and tf.nn activations"):
    raise ModelLoadError(f"{where}: {what}: {why}")


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id] + parts[::-1])
    return None


def parse_literal(text, where="model_config"):
    """The Python literal (or JSON) `text` -> Python data; known bare `tf.*` names become TfName."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (RecursionError, MemoryError):
        _refuse(where, *_TOO_DEEP)
    except SyntaxError as e:
        near = (e.text or "")[max(0, (e.offset or 1) - 30):(e.offset or 1) + 30].strip()
        _refuse(where, f"not a Python literal (SyntaxError at column {e.offset}: ...{near}...)",
                "TensorLayer wrote an object it could not store as text (e.g. a functools.partial or a "
                "callable object as act); rebuild the model with act='lrelu0.1' or a tf.nn function and "
                "save it again")

    def seg(node):
        return _short(ast.get_source_segment(text.strip(), node) or type(node).__name__)

    def walk(node, path):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = walk(node.operand, path)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return -v if isinstance(node.op, ast.USub) else v
        elif isinstance(node, ast.Dict):
            out = {}
            for k, v in zip(node.keys, node.values):
                if k is None:
                    _refuse(f"{where} at {path or 'top level'}", f"`**{seg(v)}`")
                key = walk(k, path)
                if not isinstance(key, (str, int, float, bool, type(None), tuple)):
                    _refuse(f"{where} at {path or 'top level'}", f"key {seg(k)} is not hashable")
                out[key] = walk(v, f"{path}.{key}" if path else str(key))
            return out
        elif isinstance(node, (ast.List, ast.Tuple)):
            items = [walk(v, f"{path}[{i}]") for i, v in enumerate(node.elts)]
            return items if isinstance(node, ast.List) else tuple(items)
        elif isinstance(node, ast.Name) and node.id in _LITERAL_NAMES:
            return _LITERAL_NAMES[node.id]
        elif isinstance(node, ast.Attribute) and _dotted(node) in TF_NAMES:
            return TfName(TF_NAMES[_dotted(node)])
        kind = {ast.Call: "a call", ast.Lambda: "a lambda", ast.Name: "the unknown name",
                ast.Attribute: "the unknown name"}.get(type(node), f"a {type(node).__name__} expression")
        _refuse(f"{where} at {path or 'top level'}", f"{kind} `{seg(node)}`")
    try:
        return walk(tree.body, "")
    except RecursionError:
        _refuse(where, *_TOO_DEEP)


def _pickled_reference(b64, where):
    """(module, name) of a pickle that only names a global (cloudpickle of an importable function),
    read opcode by opcode; anything more (a function pickled by value, a call) is refused."""
    try:
        data = base64.b64decode(b64, validate=True)
        ops = list(pickletools.genops(data))
    except (binascii.Error, ValueError, TypeError) as e:
        _refuse(where, f"('is_Func', ...) is not a base64 pickle ({e})", "the file is damaged: save the model again")
    strings, ref = [], None
    for op, arg, _ in ops:
        if op.name in ("PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "STOP"):
            continue
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE") and ref is None:
            strings.append(arg)
        elif op.name == "STACK_GLOBAL" and len(strings) == 2 and ref is None:
            ref = tuple(strings)
        elif op.name == "GLOBAL" and not strings and ref is None:
            ref = tuple(arg.split(" ", 1))
        else:
            _refuse(where, f"a function pickled by value (cloudpickle: pickle opcode {op.name}; a lambda or "
                    "a function defined in a script)", "tl2k210 never unpickles code; rebuild the model "
                    "with act='lrelu0.1' or a tf.nn function and save it again")
    if ref is None or len(ref) != 2:
        _refuse(where, "('is_Func', ...) names no function", "the file is damaged: save the model again")
    return ref


def function_name(value, arg, where):
    """An act/combine_fn value in any TensorLayer layout -> (name of FUNCTIONS, leaky alpha or None)."""
    module = "tensorflow"
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "is_Func" and isinstance(value[1], str):
        module, value = _pickled_reference(value[1], where)
    elif isinstance(value, dict) and set(value) == {"module_path", "func_name"}:
        module, value = str(value["module_path"]), value["func_name"]
    if not isinstance(value, str):
        _refuse(where, f"{_short(repr(value))} is not a function TensorLayer stores",
                "give the layer an activation by name (act='relu') or a tf.nn function")
    allowed = FUNCTION_ARGS[arg]
    if arg == "act" and not isinstance(value, TfName) and value.startswith(("lrelu", "leaky_relu")) \
            and value not in FUNCTIONS:        # TensorLayer's own 'lrelu0.1' / 'leaky_relu0.1'
        try:
            return "leaky_relu", float(value[5 if value.startswith("lrelu") else 10:])
        except ValueError:
            _refuse(where, f"activation {value!r}", "the leaky ReLU slope after 'lrelu' is not a number")
    if module.split(".")[0] != "tensorflow" or FUNCTIONS.get(value) not in allowed:
        full = value if module == "tensorflow" else f"{module}.{value}"
        _refuse(where, f"unknown function {full!r} for {arg}", f"use one of the TensorFlow functions "
                f"{', '.join(sorted(allowed))}" + (" (or TensorLayer's 'lreluALPHA')" if arg == "act" else "")
                + " and save the model again")
    return FUNCTIONS[value], None


def _prev_ok(prev):
    """None (an input) or one entry per call: a tensor name or a list of them."""
    def names(v):
        return isinstance(v, str) or isinstance(v, list) and all(isinstance(x, str) for x in v)
    return prev is None or isinstance(prev, list) and all(names(v) for v in prev)


def read_config(text, where="model_config"):
    """`model_config` text -> the config dict, its `model_architecture` checked to be a list of
    {'class', 'args', 'prev_layer'} with the function arguments read into (name, alpha)."""
    cfg = parse_literal(text, where)
    if isinstance(cfg, dict) and "model_architecture" not in cfg and isinstance(cfg.get("config"), dict):
        cfg = {**cfg, **cfg["config"]}     # TensorLayer 2.0's net2static_graph layout
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model_architecture"), list):
        raise ModelLoadError(f"{where}: no model_architecture list: not a TensorLayer Model.save file")
    for i, layer in enumerate(cfg["model_architecture"]):
        if not (isinstance(layer, dict) and isinstance(layer.get("class"), str) and isinstance(layer.get("args"), dict)
                and isinstance(layer["args"].get("name"), str) and _prev_ok(layer.get("prev_layer"))):
            raise ModelLoadError(f"{where}: model_architecture[{i}] is not a layer entry ({{'class': str, 'args': "
                                 "{'name': str, ...}, 'prev_layer': None or [names]}); the file is damaged: save "
                                 "the model again")
        args = layer["args"]
        for k in FUNCTION_ARGS:
            if k in args and args[k] is not None:
                args[k] = function_name(args[k], k, f"{where} at model_architecture[{i}].args.{k} "
                                        f"(layer {args.get('name', '?')!r})")
    return cfg


def model_file_config(path):
    """The `model_config` text of a TensorLayer `Model.save` .h5, or None for any other file."""
    import h5py
    try:
        with h5py.File(path, "r") as f:
            if "keras_version" in f.attrs:
                return None
            for key in ("model_config", "model_structure"):
                text = f.attrs.get(key)
                if text is not None:
                    text = text.decode("utf8") if isinstance(text, bytes) else str(text)
                    return text if "model_architecture" in text else None
    except (OSError, UnicodeDecodeError):
        return None
    return None
