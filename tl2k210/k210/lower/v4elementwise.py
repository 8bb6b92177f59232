"""Elementwise ops: binary (Add/Sub/Mul/Div/Min/Max with broadcasting) and unary functions.

* uint8 first (the map stays quantized): `quantized_binary` rescales both inputs into one integer
  domain with `mul_and_carry_shift`, applies the op and rescales to the output (Mul multiplies the
  offset values and rescales the product); a function of one uint8 value is a 256-entry table
  (`table_lookup1d` in v4, REQUANTIZE in v3: exact to the output step, both formats).
* float32 where the input already is float (a float CPU op before it): `binary`, `unary`, and
  `nnil_unary_method` for everything else, with chains of elementwise float ops (a function of one
  tensor and constant scalars) fused into one NNIL program (one pass over memory instead of one
  per op).
"""
from __future__ import annotations

import numpy as np

from tl2k210.graph import RELABELS
from tl2k210.k210 import fixed_point as fx
from tl2k210.passes.fuse_activation import activation_of

from .cpu import clamp_after, table
from .fc import feeds_output, source_unit
from .memory import SLICE_MIN_BYTES, float_slices
from .registry import CPU_F32, CPU_U8, NA, lowering
from .v4emit import F32, NO_CLAMP, U8, Const, main, nnil_code

BINARY = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Min": 4, "Max": 5}
FLT_MAX = float(np.finfo(np.float32).max)


def g4(g, t):
    """A graph tensor's shape right-aligned to the runtime's 4-D NCHW shape."""
    s = tuple(int(v) for v in (g.shape(t) if g.tensors[t].shape is not None else np.shape(g.const(t))))
    return (1,) * (4 - len(s)) + s


def _const_or_none(g, t):
    v = g.const(t)
    return None if v is None else np.asarray(v, np.float64)


# ---------------------------------------------------------------------------------------------
# unary functions: float reference (for tables) and NNIL programs (stack top -> f(top))
def _elu(a):
    return lambda x: np.where(x > 0, x, a * (np.exp(np.minimum(x, 0)) - 1))


def _erf(x):
    from math import erf
    return np.vectorize(erf, otypes=[np.float64])(x)


def _attr(node, k, d):
    return float(node.attrs.get(k, d))


def _scalar_operand(g, node):
    """(index, value) of a two-input op's first constant input when it is a scalar, else None."""
    k = next((i for i in (0, 1) if g.const(node.inputs[i]) is not None), None)
    if k is None or len(node.inputs) != 2:
        return None
    v = np.asarray(g.const(node.inputs[k]), np.float64)
    return (k, float(v.reshape(-1)[0])) if v.size == 1 else None


def unary_function(g, node):
    """The float function of one variable a node computes, or None."""
    op = node.op
    a = node.attrs
    c = {i: _const_or_none(g, t) for i, t in enumerate(node.inputs) if i and t}
    if op == "Pow":
        p = c.get(1)
        return None if p is None or p.size != 1 else (lambda x, p=float(p.reshape(-1)[0]): np.power(x, p))
    if op in BINARY:
        kv = _scalar_operand(g, node)
        if kv is None:
            return None
        k, v = kv
        f = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
             "Min": np.minimum, "Max": np.maximum}[op]
        return (lambda x: f(x, v)) if k == 1 else (lambda x: f(v, x))
    funcs = {
        "Exp": np.exp, "Log": np.log, "Abs": np.abs, "Neg": np.negative, "Sqrt": np.sqrt,
        "Reciprocal": lambda x: 1 / x, "Sin": np.sin, "Cos": np.cos, "Floor": np.floor, "Ceil": np.ceil,
        "Round": np.round, "Sign": np.sign, "Erf": _erf,
        "Softplus": lambda x: np.logaddexp(0, x), "Softsign": lambda x: x / (1 + np.abs(x)),
        "Elu": _elu(_attr(node, "alpha", 1.0)),
        "Selu": lambda x: _attr(node, "gamma", 1.0507009873554805) * _elu(_attr(node, "alpha", 1.6732632423543772))(x),
        "Celu": lambda x: np.maximum(x, 0) + np.minimum(0, _attr(node, "alpha", 1.0) * (np.exp(x / _attr(node, "alpha", 1.0)) - 1)),
        "ThresholdedRelu": lambda x: np.where(x > _attr(node, "alpha", 1.0), x, 0),
        "Mish": lambda x: x * np.tanh(np.logaddexp(0, x)),
        "Gelu": (lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2)))) if a.get("approximate", "none") == "none" else
                (lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
        "Relu": lambda x: np.maximum(x, 0), "Sigmoid": lambda x: 1 / (1 + np.exp(-x)), "Tanh": np.tanh,
        "LeakyRelu": lambda x: np.where(x >= 0, x, _attr(node, "alpha", 0.01) * x),
        "HardSigmoid": lambda x: np.clip(_attr(node, "alpha", 0.2) * x + _attr(node, "beta", 0.5), 0, 1),
        "HardSwish": lambda x: x * np.clip(x / 6 + 0.5, 0, 1),
        "Swish": lambda x: x / (1 + np.exp(-x)),          # an IR activation (x * sigmoid(x))
    }
    if op == "Clip":
        lo, hi = c.get(1), c.get(2)
        lo = float(lo) if lo is not None else float(a.get("min", -np.inf))
        hi = float(hi) if hi is not None else float(a.get("max", np.inf))
        if (len(node.inputs) > 1 and node.inputs[1] and c.get(1) is None) or \
                (len(node.inputs) > 2 and node.inputs[2] and c.get(2) is None):
            return None
        return lambda x: np.clip(x, lo, hi)
    return funcs.get(op)


def _sigmoid_tail():
    """sigmoid of the stack top anywhere in a program (no operand below it is needed):
    exp(-log(1 + exp(-v)))."""
    return ["neg", "exp", "ldc_r4_1", "add", "log", "neg", "exp"]


def nnil_ops(g, node, head: bool):
    """NNIL instructions replacing the stack top v by f(v), or None. `head`: the op reads the
    method's input (lda_0 is v), so forms that need v below a constant are allowed."""
    op, a = node.op, node.attrs
    direct = {"Abs": "abs", "Ceil": "ceil", "Cos": "cos", "Exp": "exp", "Floor": "floor", "Log": "log",
              "Neg": "neg", "Sin": "sin"}
    if op in direct:
        return [direct[op]]
    if op == "Sqrt":
        return ["dup", 1e-30, "max", "rsqrt", "mul"]           # v * rsqrt(v), 0 at 0
    if op == "Reciprocal":
        return [1.0, "lda_0", "div"] if head else None
    if op == "Relu":
        return ["ldc_r4_0", "max"]
    if op == "Clip":
        f = unary_function(g, node)
        if f is None:
            return None
        lo, hi = float(f(np.array(-np.inf))), float(f(np.array(np.inf)))
        return [max(lo, -FLT_MAX), min(hi, FLT_MAX), "clamp"]
    if op == "LeakyRelu":
        al = _attr(node, "alpha", 0.01)
        return ["dup", al, "mul", "max" if al <= 1 else "min"]
    if op == "Sigmoid":
        return [1.0, "lda_0", "neg", "exp", 1.0, "add", "div"] if head else _sigmoid_tail()
    if op == "Tanh":           # 2 sigmoid(2v) - 1
        s = [1.0, "lda_0", -2.0, "mul", "exp", 1.0, "add", "div"] if head else \
            [2.0, "mul"] + _sigmoid_tail()
        return s + [2.0, "mul", 1.0, "sub"]
    if op == "HardSigmoid":
        return [_attr(node, "alpha", 0.2), "mul", _attr(node, "beta", 0.5), "add", 0.0, 1.0, "clamp"]
    if op == "HardSwish":
        return ["dup", 1 / 6, "mul", 0.5, "add", 0.0, 1.0, "clamp", "mul"]
    if op == "Swish":
        return (["lda_0", 1.0, "lda_0", "neg", "exp", 1.0, "add", "div", "mul"] if head else
                ["dup"] + _sigmoid_tail() + ["mul"])
    if op == "Softplus":
        return ["exp", 1.0, "add", "log"]
    if op == "Softsign":
        return ["dup", "abs", 1.0, "add", "div"]
    if op in ("Elu", "Selu"):
        al = _attr(node, "alpha", 1.0 if op == "Elu" else 1.6732632423543772)
        code = ["dup", "ldc_r4_0", "min", "dup", "exp", 1.0, "sub", al, "mul", "sub", "sub"]
        return code + ([_attr(node, "gamma", 1.0507009873554805), "mul"] if op == "Selu" else [])
    if op == "Mish":          # v * tanh(softplus(v))
        return ["dup", "exp", 1.0, "add", "log", 2.0, "mul"] + _sigmoid_tail() + [2.0, "mul", 1.0, "sub", "mul"]
    if op == "Pow":
        p = _const_or_none(g, node.inputs[1])
        if p is None or p.size != 1:
            return None
        p = float(p.reshape(-1)[0])
        if p == 2:
            return ["dup", "mul"]
        if p == 3:
            return ["dup", "dup", "mul", "mul"]
        if p == 0.5:
            return ["dup", 1e-30, "max", "rsqrt", "mul"]
        if p == -0.5:
            return ["rsqrt"]
        if p == 1:
            return []
        return ["log", p, "mul", "exp"]
    if op in BINARY:
        kv = _scalar_operand(g, node)
        if kv is None:
            return None
        k, v = kv
        name = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Min": "min", "Max": "max"}[op]
        if k == 1 or op in ("Add", "Mul", "Min", "Max"):
            return [v, name]
        if op == "Sub":                                   # c - v
            return ["neg", v, "add"]
        return [v, "lda_0", "div"] if head else None      # c / v
    return None


UNARY_OPS = ("Exp", "Log", "Abs", "Neg", "Sqrt", "Reciprocal", "Sin", "Cos", "Floor", "Ceil", "Round",
             "Sign", "Erf", "Softsign", "Celu", "ThresholdedRelu", "Gelu", "Pow")
#: activations cpu.py tables (both formats): here only their float form
ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Tanh", "HardSigmoid", "HardSwish", "Sigmoid", "Elu", "Selu",
               "Softplus", "Mish", "Swish")


def _float_source(g, t, opts):
    return source_unit(g, t, opts) in ("input", CPU_F32)



# ---------------------------------------------------------------------------------------------
def _scalar_binary(g, node):
    """A binary op of one tensor and one constant scalar (a function of one variable)."""
    if len(node.inputs) != 2:
        return False
    consts = [g.const(i) for i in node.inputs]
    return sum(c is not None for c in consts) == 1 and next(np.asarray(c).size for c in consts if c is not None) == 1


def table_refuses(g, node, opts):
    if node.op in BINARY and not _scalar_binary(g, node):
        return NA
    f = unary_function(g, node)
    if f is None:
        return f"{node.op} is not a function of one tensor with constant parameters"
    if opts.format == "v4" and _float_source(g, node.inputs[0] if g.const(node.inputs[0]) is None
                                             else node.inputs[1], opts) and nnil_ops(g, node, True) is not None:
        return "its input is float: the float NNIL method keeps full precision"
    return None


@lowering(*UNARY_OPS, unit=CPU_U8, check=table_refuses, name="unary_table")
@lowering(*BINARY, unit=CPU_U8, check=table_refuses, name="scalar_table")
def unary_table(lw, node):
    """f(x) of one uint8 value: a 256-entry table from the input's quantization to the output's."""
    x = next(i for i in node.inputs if lw.g.const(i) is None)
    out = node.outputs[0]
    row = lw.row(node, f"{node.op} on uint8: 256-entry table", in_shape=lw.shape(x), out_shape=lw.shape(out))
    src = lw.need_u8(x, row)
    s_in, z_in = lw.locs[x].quant
    so, zo = lw.quant_of(out)
    f = unary_function(lw.g, node)
    loc = lw.in_place(node, out, x, (so, zo)) or lw.u8_out(out, (so, zo))   # kmodel.v3/v4 IN_PLACE
    with np.errstate(all="ignore"):
        tab = table(lambda v: np.nan_to_num(f(v), nan=0.0, posinf=1e30, neginf=-1e30), s_in, z_in, so, zo)
    lw.emit("REQUANTIZE", dict(flags=1, main_mem_in_address=src, main_mem_out_address=loc.u8,
                               count=int(np.prod(loc.shape))), row, data={"table": tab})
    lw.traced(out, "u8")


def nnil_refuses(g, node, opts):
    if node.op in BINARY and not _scalar_binary(g, node):
        return NA
    if nnil_ops(g, node, True) is None:
        return f"{node.op} has no NNIL form (unary ops and constant scalars only)"
    return None


def chain_code(g, chain):
    """The NNIL method of a chain of elementwise float ops (each nnil_ops of one tensor), in order."""
    first = nnil_ops(g, chain[0], True) if chain else []
    code = first if "lda_0" in first else ["lda_0"] + first      # a head form reads the input itself
    for c in chain[1:]:
        code += nnil_ops(g, c, False)
    return nnil_code(*code, "ret")


def _chain(lw, node):
    """`node` and the single-consumer float elementwise ops after it that fuse into its method."""
    chain = [node]
    while True:
        t = chain[-1].outputs[0]
        cons = lw.consumers(t)
        if len(cons) != 1 or t in lw.g.outputs:
            return chain
        c = cons[0]
        if c.name in lw.folded or lw.lowered_by(c) != "float_elementwise" or nnil_ops(lw.g, c, False) is None:
            return chain
        chain.append(c)


@lowering(*UNARY_OPS, *ACTIVATIONS, *BINARY, unit=CPU_F32, check=nnil_refuses, formats=("v4",),
          name="float_elementwise")
def float_elementwise(lw, node):
    """One float pass: `unary` for a single op the runtime has, else an NNIL method fusing the
    chain of elementwise ops that follows."""
    chain = _chain(lw, node)
    x = next(i for i in node.inputs if lw.g.const(i) is None)
    out = chain[-1].outputs[0]
    ops = " -> ".join(n.op for n in chain)
    row = lw.row(node, f"float {ops}" + (": one NNIL method" if len(chain) > 1 else ""),
                 in_shape=lw.shape(x), out_shape=lw.shape(out))
    src = lw.need_f32(x, row)
    n = int(np.prod(lw.shape(x)))
    unary = {"Abs": 0, "Ceil": 1, "Cos": 2, "Exp": 3, "Floor": 4, "Log": 5, "Neg": 6, "Sin": 8}
    method = not (len(chain) == 1 and node.op in unary)
    # an NNIL method reads input[i] before it writes output[i] (kmodel.v4 IN_PLACE): over its
    # input where this is the input's last reader (a sigmoid on an upsampled float output)
    loc = (method and lw.in_place(node, out, x, kind="f32")) or lw.f32_out(out, lw.shape(x))
    if loc.f32 == src and method:
        row.notes.append("written over its input (its last reader)")
    if not method:
        lw.emit_v4("unary", dict(input=main(F32, src, n), output=main(F32, loc.f32, n), unary_op=unary[node.op]),
                   row)
    else:
        lw.emit_v4("nnil_unary_method", dict(input=main(F32, src, n), output=main(F32, loc.f32, n)), row,
                   data={"code": chain_code(lw.g, chain)})
    for c in chain[1:]:
        lw.folded.add(c.name)
        row.fused.append(c.name)
    lw.traced(out, "f32")
    if len(chain) > 1:
        row.tensor = out


# ---------------------------------------------------------------------------------------------
# binary ops of two tensors (or a tensor and a non-scalar constant)
def _binary_kind(g, node):
    if node.op not in BINARY or len(node.inputs) != 2:
        return None
    consts = [g.const(i) is not None for i in node.inputs]
    if all(consts):
        return None
    if any(consts) and np.asarray(g.const(node.inputs[consts.index(True)])).size == 1:
        return None     # a scalar: unary_table / float_elementwise
    return "tensor"


def _broadcastable(g, node):
    a, b, y = (g4(g, t) for t in (*node.inputs, node.outputs[0]))
    return all(da in (1, dy) and db in (1, dy) for da, db, dy in zip(a, b, y))


def _centres(g, node, opts):
    """Sub(x, mean(x)) with the mean a float reduce of x (or of a relabel of it: onnx.js's
    instance norm means a (1, C, 1, H*W) reshape): a normalization's centred map, whose small
    differences a uint8 grid on x's range would round away."""
    x, m = node.inputs
    p = g.producer(m)
    if node.op != "Sub" or p is None or p.op != "ReduceMean" or not _float_source(g, m, opts):
        return False
    if p.inputs[0] == x:
        return True
    r = p.inputs[0]
    while r != x and (q := g.producer(r)) is not None and q.op in RELABELS:
        r = q.inputs[0]
    # through a relabel, only where the centred map d is read by its square and its division alone:
    # onnx.js's candy, whose d * (d + 1e-9) read d otherwise, fell 15.1 -> 14.2 dB with a float d
    # (fold_constants now makes that product d's square, which this takes)
    d = node.outputs[0]
    cons = g.consumers(d)
    return r == x and sorted(c.op for c in cons) == ["Div", "Mul"] and \
        any(c.op == "Mul" and c.inputs == [d, d] for c in cons)


def qbinary_refuses(g, node, opts):
    if _binary_kind(g, node) is None:
        return NA
    if node.op == "Div":
        return "Div on uint8 truncates the integer quotient: the float binary keeps it"
    if not _broadcastable(g, node):
        return f"shapes {g4(g, node.inputs[0])} and {g4(g, node.inputs[1])} do not broadcast in 4-D"
    if all(_float_source(g, t, opts) for t in node.inputs if g.const(t) is None):
        return "its inputs are float: the float binary keeps them exact and avoids a quantize"
    if _centres(g, node, opts):
        return "it centres a map on its float mean (a normalization): the float binary keeps the difference exact"
    if feeds_output(g, node.outputs[0]):
        return "it computes a model output: the float binary keeps it unclipped and exact"
    return None


def _operand(lw, t, row):
    """(uint8 range, (scale, zero point)) of an activation or a constant tensor (quantized into the
    constants blob with its own range)."""
    v = lw.g.const(t)
    if v is None:
        addr = lw.need_u8(t, row)
        return main(U8, addr, int(np.prod(lw.locs[t].shape))), lw.locs[t].quant
    v = np.asarray(v, np.float64)
    s, z = fx.qparams(v.min(), v.max())
    q = np.clip(np.rint(v / s + z), 0, 255).astype(np.uint8)
    return Const(q.reshape(-1), U8), (s, z)


def _fold_relu(lw, node):
    """A following Relu / Clip(0, ...) folds into the uint8 clamp: (tensor whose range to use, node)."""
    out = node.outputs[0]
    cons = lw.consumers(out)
    if len(cons) == 1 and out not in lw.g.outputs and cons[0].op in ("Relu", "Clip"):
        f = unary_function(lw.g, cons[0])
        if f is not None and float(f(np.array(-1e30))) == 0.0:
            return cons[0]
    return None


@lowering(*BINARY, unit=CPU_U8, check=qbinary_refuses, formats=("v4",), name="quantized_binary")
def quantized_binary(lw, node):
    a_t, b_t = node.inputs
    out = node.outputs[0]
    row = lw.row(node, f"{node.op} with broadcasting: quantized_binary on uint8", in_shape=lw.shape(a_t)
                 if lw.g.const(a_t) is None else lw.shape(b_t), out_shape=lw.shape(out))
    ra, (sa, za) = _operand(lw, a_t, row)
    rb, (sb, zb) = _operand(lw, b_t, row)
    relu = _fold_relu(lw, node)
    so, zo = lw.quant_of(relu.outputs[0] if relu else out)
    if node.op == "Mul":
        ma, sha, mb, shb = 1, 0, 1, 0
        om, osh = fx.fixed_mul(sa * sb / so, 32, 62)
    else:                      # one integer domain: 2^20 steps of the coarser input
        sc = max(sa, sb) / (1 << 20)
        ma, sha = fx.fixed_mul(sa / sc, 32, 62)
        mb, shb = fx.fixed_mul(sb / sc, 32, 62)
        om, osh = fx.fixed_mul(sc / so, 32, 62)
    # an input of the output's shape that dies here may take the output (kmodel.v4.IN_PLACE)
    loc = next((loc for t in (a_t, b_t) if lw.g.const(t) is None and g4(lw.g, t) == g4(lw.g, out)
                for loc in [lw.in_place(node, out, t, (so, zo))] if loc is not None), None)
    loc = loc or lw.u8_out(out, (so, zo))
    n = int(np.prod(loc.shape))
    lw.emit_v4("quantized_binary", dict(
        input_a=ra, input_b=rb, output=main(U8, loc.u8, n), binary_op=BINARY[node.op],
        in_a_shape=g4(lw.g, a_t), in_b_shape=g4(lw.g, b_t), out_shape=g4(lw.g, out),
        input_a_offset=-za, input_a_mul=ma, input_a_shift=sha, input_b_offset=-zb, input_b_mul=mb,
        input_b_shift=shb, output_offset=zo, output_mul=om, output_shift=osh), row)
    lw.traced(out, "u8")
    if relu is not None:
        clamp_after(lw, out, activation_of(lw.g, relu), row)
        lw.alias(relu.outputs[0], out)
        lw.traced(relu.outputs[0], "u8")
        row.tensor = relu.outputs[0]
        lw.folded.add(relu.name)
        row.notes.append(f"{relu.op} folded into the uint8 clamp")


def fbinary_refuses(g, node, opts):
    if _binary_kind(g, node) is None:
        return NA
    if not _broadcastable(g, node):
        return f"shapes {g4(g, node.inputs[0])} and {g4(g, node.inputs[1])} do not broadcast in 4-D"
    return None


@lowering(*BINARY, unit=CPU_F32, check=fbinary_refuses, formats=("v4",), name="float_binary")
def float_binary(lw, node):
    a_t, b_t = node.inputs
    out = node.outputs[0]
    row = lw.row(node, f"{node.op} with broadcasting: float binary", out_shape=lw.shape(out))
    if _sliced_binary(lw, node, row):
        return
    rngs = []
    for t in (a_t, b_t):
        v = lw.g.const(t)
        if v is None:
            rngs.append(main(F32, lw.need_f32(t, row), int(np.prod(lw.locs[t].shape))))
        else:
            rngs.append(Const(np.asarray(v, np.float32).reshape(-1)))
    loc = lw.f32_out(out)
    lw.emit_v4("binary", dict(input_a=rngs[0], input_b=rngs[1], output=main(F32, loc.f32, int(np.prod(loc.shape))),
                              binary_op=BINARY[node.op], in_a_shape=g4(lw.g, a_t), in_b_shape=g4(lw.g, b_t),
                              out_shape=g4(lw.g, out), fused_activation=NO_CLAMP), row)
    lw.traced(out, "f32")


def _per_channel(g, t, c) -> bool:
    """A scalar or per-channel operand ((1, 1, 1, 1) or (1, c, 1, 1)): a normalization's
    deviation or scale, which a channel slice of the map reads a slice of (or all of)."""
    n0, c0, h0, w0 = g4(g, t)
    return n0 == h0 == w0 == 1 and c0 in (1, c)


def _sliced_binary(lw, node, row) -> bool:
    """Uint8 maps of the output's shape that no later op reads as float (SCI's low-light Div,
    240x320x3; an instance normalization's centred map divided by its deviation per channel),
    with any other operand a scalar or per-channel one: dequantized, combined and written out a
    slice at a time -- rows, or whole channels beside a per-channel operand -- to the output's
    uint8 map where no reader wants it float, else into its float map, so no whole float copy of
    an input exists. Each element goes through the same dequantize, binary and quantize as in
    the whole-map form: the same bytes. False where that does not apply."""
    out = node.outputs[0]
    shape = g4(lw.g, out)
    n, c, h, w = shape
    maps = [t for t in node.inputs if lw.g.const(t) is None and g4(lw.g, t) == shape]
    small = [t for t in node.inputs if t not in maps]
    if not maps or n != 1 or any(lw.locs[t].f32 is not None or lw.float_readers(t, lw.at + 1) for t in maps) \
            or any(not _per_channel(lw.g, t, c) for t in small):
        return False
    to_u8 = not lw.float_readers(out, lw.at + 1)
    srcs = {t: lw.need_u8(t, row) for t in maps}
    if to_u8:
        loc = lw.u8_out(out, lw.quant_of(out))
        s_y, z_y = loc.quant
    else:
        loc = lw.f32_out(out)
    # rows of w where every operand is a map; whole channels of h x w beside a per-channel one
    units, per = (n * c * h, w) if not small else (c, h * w)
    room = lw.float_room(units * per * (1 if to_u8 else 4))   # at least SLICE_MIN_BYTES: a few nodes, not one a row
    slices = float_slices(units, per, 4 * per * len(node.inputs), None if room is None else max(room, SLICE_MIN_BYTES))
    k = max(u1 - u0 for u0, u1 in slices)
    tag = f"{out}:binary"
    tmp = {t: lw.main.alloc(f"{tag}:{'ab'[i]}", 4 * k * per) for i, t in enumerate(dict.fromkeys(maps))}
    consts = {t: np.asarray(lw.g.const(t), np.float32).reshape(-1) for t in small if lw.g.const(t) is not None}
    floats = {t: lw.need_f32(t, row) for t in small if t not in consts}
    idx = []
    for u0, u1 in slices:
        m = (u1 - u0) * per
        for t, dst in tmp.items():
            s, z = lw.locs[t].quant
            lw.emit("DEQUANTIZE", dict(flags=1, main_mem_in_address=srcs[t] + u0 * per, mem_out_address=dst,
                                       count=m, scale=s, bias=-z * s), row)
        cs = u1 - u0
        ranges, shapes = [], []
        for t in node.inputs:
            if t in tmp:
                ranges.append(main(F32, tmp[t], m))
                shapes.append((1, 1, cs, w) if not small else (1, cs, h, w))
                continue
            whole = g4(lw.g, t)[1] == 1
            part = slice(0, 1) if whole else slice(u0, u1)
            ranges.append(Const(consts[t][part]) if t in consts else
                          main(F32, floats[t] + 4 * part.start, part.stop - part.start))
            shapes.append((1, 1 if whole else cs, 1, 1))
        first = tmp[maps[0]]
        dst = first if to_u8 else loc.f32 + 4 * u0 * per     # in place over a map: kmodel.v4.IN_PLACE
        lw.emit_v4("binary", dict(input_a=ranges[0], input_b=ranges[1], output=main(F32, dst, m),
                                  binary_op=BINARY[node.op], in_a_shape=shapes[0], in_b_shape=shapes[1],
                                  out_shape=(1, 1, cs, w) if not small else (1, cs, h, w),
                                  fused_activation=NO_CLAMP), row)
        if to_u8:
            lw.emit("QUANTIZE", dict(flags=0, main_mem_in_address=first, mem_out_address=loc.u8 + u0 * per,
                                     count=m, scale=s_y, bias=-(z_y + lw.u8_offset.get(out, 0.0)) * s_y), row)
        idx.append(len(lw.layers) - 1)
    for i in range(len(tmp)):
        lw.main.free(f"{tag}:{'ab'[i]}")
    lw.trace_map[out] = (idx[0] if len(idx) == 1 else tuple(idx), "u8" if to_u8 else "f32")
    what = f"{k} row{'s' if k > 1 else ''} of {w}" if not small else f"{k} channel{'s' if k > 1 else ''} of {h}x{w}"
    row.notes.append(f"uint8 inputs dequantized {what} at a time"
                     + (", quantized into the uint8 output" if to_u8 else ""))
    return True
