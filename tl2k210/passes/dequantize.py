"""Quantized models (TFLite int8/uint8 through tf2onnx, QDQ ONNX exports) -> the float model their
integers stand for, which the K210 back-end then quantizes its own way (per-channel KPU scales).

After fold_constants has turned weight/bias DequantizeLinear into float constants, what is left
is fake quantization of activations:
  * QuantizeLinear -> DequantizeLinear pairs on a float tensor, also with data-movement ops
    between them (tf2onnx puts its NHWC<->NCHW Transposes there): removed (the identity they
    approximate);
  * an integer graph input read through DequantizeLinear (also through data movement: tf2onnx
    transposes an NHWC int8 input before dequantizing it; a per-tensor DequantizeLinear commutes
    with movement and is moved up to the input): the input becomes that float value;
    its (scale, zero point) is kept in graph.meta["input_quant"] {input: (scale, zp, dtype)} --
    it says which float range the model's 0..255 (or -128..127) input stands for;
  * a graph output written by QuantizeLinear (also through data movement: tf2onnx reshapes
    TOCO's pooled uint8 embedding after quantizing it; a per-tensor QuantizeLinear commutes
    with movement and is moved down to the output; and through a Concat of several quantized
    tensors on one grid): the output becomes the float value (graph.meta["output_quant"] keeps
    its parameters);
  * DynamicQuantizeLinear -> DequantizeLinear of its own (scale, zero point): a dynamic-range
    TFLite file's hybrid FULLY_CONNECTED (a large Dense's weights int8, its input quantized to
    uint8 at run time, per inference), as tf2onnx writes it: removed (the identity it
    approximates, as a Q/DQ pair is).
"""
import numpy as np
from onnx import TensorProto

from tl2k210.errors import UnsupportedOpError
from tl2k210.graph import Node


def _scalar(g, name):
    v = g.const(name) if name else None
    return None if v is None or v.size != 1 else v.reshape(()).item()


#: data movement: exact on the integers (SpaceToDepth/DepthToSpace: TF's SpaceToBatchND and
#: BatchToSpaceND around a dilated conv, as tf2onnx writes them)
MOVES = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "SpaceToDepth", "DepthToSpace", "Tile",
         "Expand")
PICKS = ("Gather", "GatherND", "GatherElements", "Slice", "Split")   # move elements of input 0 (the others: indices)
#: one output each: data movement that a per-tensor QuantizeLinear commutes with
SINGLE_MOVES = MOVES + tuple(p for p in PICKS if p != "Split")
#: ops that read only their input's shape (torch's `x.view(x.size(0), -1)` of a quantized map)
SHAPE_ONLY = ("Shape", "Size")
INT_RANGE = {t: (int(np.iinfo(t).min), int(np.iinfo(t).max)) for t in ("int8", "uint8", "int16", "uint16")}
#: ops whose float output has no bound of its own: a range of theirs that starts at 0 is a ReLU
#: (ReLU6 when it ends at 6) folded into the integers (`_implied_clip`)
UNBOUNDED = ("Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Sub", "BatchNormalization")


def _params(g, n):
    """(scale, zero point) of a per-tensor QuantizeLinear/DequantizeLinear, else None."""
    scale = _scalar(g, n.inputs[1])
    zp = _scalar(g, n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else 0
    return None if scale is None or zp is None else (float(scale), int(zp))


def _int_regions(g):
    """The integer islands between QuantizeLinear and DequantizeLinear: [(qs, moves, dqs, boundary)],
    each connected through integer tensors, where moves are data movement, Concat or picks of
    elements of input 0 (Gather/GatherND/Slice/Split, by any indices) -- exact on the integers when every
    Q/DQ of the island shares one per-tensor (scale, zero point), as TFLite's int8 spec requires
    of them. `boundary` is None for such an island, else why its float value
    cannot be recovered (an op computing on the integers, or Q/DQ that disagree). Islands
    reaching a graph input or output are left to the input/output rules (not returned)."""
    seen, out = set(), []
    for q0 in [n for n in g.nodes if n.op == "QuantizeLinear"]:
        if id(q0) in seen:
            continue
        nodes, stack, public, foreign = {id(q0): q0}, [q0], False, None
        while stack:
            n = stack.pop()
            ints = list(n.outputs) if n.op != "DequantizeLinear" else []
            ints += [i for i in n.inputs[:None if n.op == "Concat" else 1] if i] \
                if n.op != "QuantizeLinear" else []
            for t in ints:
                if t in g.inputs or t in g.outputs:
                    public = True
                    continue
                if g.const(t) is not None:
                    continue
                for m in [g.producer(t)] + g.consumers(t):
                    if m is None or id(m) in nodes:
                        continue
                    if m.op in SHAPE_ONLY and m.inputs[0] == t:   # reads the shape, which stays
                        continue
                    if m.op in ("QuantizeLinear", "DequantizeLinear") + MOVES + ("Concat",) \
                            or m.op in PICKS and (m.inputs[0] == t or t in m.outputs):
                        nodes[id(m)] = m
                        stack.append(m)
                    elif foreign is None:
                        foreign = f"node {m.name!r} (op {m.op}) computes on the integers of {t!r}"
        seen.update(nodes)
        qs = [n for n in nodes.values() if n.op == "QuantizeLinear"]
        dqs = [n for n in nodes.values() if n.op == "DequantizeLinear"]
        params = {_params(g, n) for n in qs + dqs}
        if public or not dqs:
            continue
        boundary = foreign or (None if len(params) == 1 and None not in params else
                               "its QuantizeLinear/DequantizeLinear disagree: " + "; ".join(
                                   f"{n.name!r} {'per-axis' if _params(g, n) is None else _params(g, n)}"
                                   for n in qs + dqs))
        out.append((qs, [n for n in nodes.values() if n.op not in ("QuantizeLinear", "DequantizeLinear")],
                    dqs, boundary))
    return out


def _input_dequant(g, u):
    """(scale, zero point) that consumer `u` of an integer graph input reads it with: a
    DequantizeLinear's, or (1, 0) for a Cast to float (MoveNet's uint8 image: the pixels as they
    are); None for anything else."""
    if u.op == "Cast" and u.attrs.get("to") in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16):
        return 1.0, 0
    if u.op != "DequantizeLinear":
        return None
    scale, zp = _scalar(g, u.inputs[1]), _scalar(g, u.inputs[2]) if len(u.inputs) > 2 else 0
    return None if scale is None or zp is None else (float(scale), int(zp))


def _record_range(g, tensor, params, dtype):
    """meta["quant_ranges"] {tensor: (lo, hi)} and, by the node computing it (passes rename
    tensors when they fuse nodes; the fused node keeps their names), meta["quant_ranges_by_node"]."""
    lo, hi = INT_RANGE.get(str(dtype), (None, None))
    if lo is not None:
        s, z = params
        g.meta.setdefault("quant_ranges", {})[tensor] = ((lo - z) * s, (hi - z) * s)
        p = g.producer(tensor)
        if p is not None:
            g.meta.setdefault("quant_ranges_by_node", {})[p.name] = ((lo - z) * s, (hi - z) * s)


def _record_moved(g, moves, params):
    """The island's grid is also the range of every tensor its data movement writes (a Concat of
    the SSD's quantized class logits, -11.1..1.6: its range came from calibration, and 16
    synthetic images, whose logits never go positive, clipped every score at 0.5)."""
    for n in moves:
        for t in n.outputs:
            _record_range(g, t, params, g.tensors[t].dtype)


def _implied_clip(g, q, params, dtype, log, output=False):
    """TOCO's uint8 models (TF1 quantization-aware training: MobileNet v1/v2 _quant) may leave an
    op's ReLU/ReLU6 out of the graph: the op's fused activation is NONE and its output range is
    [0, 6] (or [0, max]), the integers saturating at both ends. Removing the Q/DQ pair would drop
    that clamp, so where an op with no bound of its own (UNBOUNDED) writes a range starting at
    exactly 0, the float value the integers stand for, clip(x, 0, hi), gets an explicit Clip
    (which fuse_activation then folds into the op). A model `output`'s integers saturate what the
    user gets at either end, so there the Clip is the whole range: YOLOX-nano's TFLite export
    writes its raw box regressions (-2..3.6) to an int8 output at 1/256, and returns them in
    [0, 0.996] (the Clip goes where the op writes, above data movement that reads it alone: it
    commutes with it). Returns the tensor the op's range now belongs to (for an output, the op's
    own tensor above that data movement: passes drop the moves, and the range stays the op's)."""
    src, (lo, hi) = q.inputs[0], INT_RANGE.get(str(dtype), (None, None))
    reader, p = q, g.producer(src)
    while output and p is not None and p.op in SINGLE_MOVES and len(g.consumers(src)) == 1:
        reader, src = p, p.inputs[0]
        p = g.producer(src)
    if lo is None or p is None or p.op not in UNBOUNDED or not output and params[1] != lo:
        return src      # an output's range is what its op writes too (MoveNet's Sigmoid, transposed)
    bottom, top = ((v - params[1]) * params[0] for v in (lo, hi))
    out = g.add_tensor(f"{src}_clip", g.shape(src))
    clip = Node("Clip", [src, g.add_const(np.float32(bottom), f"{src}_min"),
                         g.add_const(np.float32(top), f"{src}_max")], [out], name=f"{p.name}_range_clip")
    g.nodes.insert(g.nodes.index(p) + 1, clip)
    reader.inputs[0] = out
    log(p.name, f"its quantized output range [{bottom:.6g}, {top:.6g}] clamps it (no activation node): explicit Clip")
    return out


def _hoist_to_input(g, d):
    """Move per-tensor DequantizeLinear `d` above the single-use data movement between it and an
    integer graph input (x -> Transpose -> DQ  =>  x -> DQ -> Transpose). True if moved."""
    chain, t = [], d.inputs[0]
    while t not in g.inputs:
        p = g.producer(t)
        if p is None or p.op not in MOVES or len(g.consumers(t)) != 1:
            return False
        chain.append(p)
        t = p.inputs[0]
    if not chain or _scalar(g, d.inputs[1]) is None or len(g.consumers(t)) != 1:
        return False
    top, out = chain[-1], d.outputs[0]
    mid = g.add_tensor(f"{t}_dequant", g.shape(t))
    d.inputs[0], d.outputs = t, [mid]
    top.inputs[0] = mid
    chain[0].outputs = [out]
    for n in chain[1:]:      # the tensors between the moves now carry floats
        g.tensors[n.outputs[0]].dtype = np.dtype(np.float32)
    g.nodes.remove(d)
    g.nodes.insert(g.nodes.index(top), d)
    return True


def _sink_to_output(g, q):
    """Move per-tensor QuantizeLinear `q` below the single-use data movement between it and a
    graph output (x -> Q -> Reshape -> out  =>  x -> Reshape -> Q -> out; a Slice or Gather of
    elements too: tf2onnx's portrait_video keeps one channel of its softmax). True if moved."""
    chain, t = [], q.outputs[0]
    while t not in g.outputs:
        users = g.consumers(t)
        if len(users) != 1 or users[0].op not in SINGLE_MOVES or users[0].inputs[0] != t:
            return False
        chain.append(users[0])
        t = users[0].outputs[0]
    if not chain or _scalar(g, q.inputs[1]) is None or g.consumers(t):
        return False
    mid = g.add_tensor(f"{t}_prequant", g.shape(t))
    chain[0].inputs[0], chain[-1].outputs = q.inputs[0], [mid]
    q.inputs[0], q.outputs = mid, [t]
    for n in chain[:-1]:     # the tensors between the moves now carry floats
        g.tensors[n.outputs[0]].dtype = np.dtype(np.float32)
    g.nodes.remove(q)
    g.nodes.insert(g.nodes.index(chain[-1]) + 1, q)
    return True


def _quantized_by(g, t):
    """The per-tensor (scale, zero point) of the QuantizeLinear whose integers `t` moves or picks."""
    while (p := g.producer(t)) is not None and p.op in SINGLE_MOVES:
        t = p.inputs[0]
    return _params(g, p) if p is not None and p.op == "QuantizeLinear" else None


def _shared_outputs(g, log):
    """A graph output whose integers (or those it moves) are also read by the rest of the model
    (--outputs naming a tensor and one computed from it, on an int8 TFLite: Himax's YOLOv8n,
    42io's keyword spotter; hunt 21) reads a DequantizeLinear of them instead, so that the island
    is the model's own (removed as a whole) and the output is float; its (scale, zero point) kept
    in graph.meta["output_quant"]. Their QuantizeLinear was left over ("no K210 lowering")."""
    for o in list(g.outputs):
        chain, t = [], o
        while (p := g.producer(t)) is not None and p.op in SINGLE_MOVES and len(g.consumers(p.inputs[0])) == 1:
            chain.append(p)
            t = p.inputs[0]
        p = g.producer(t)
        if p is not None and p.op in SINGLE_MOVES:
            chain.append(p)
            t = p.inputs[0]
        others = [u for u in g.consumers(t) if not chain or u is not chain[-1]]
        params = _quantized_by(g, t) if g.tensors[t].dtype.kind in "iu" and others else None
        if params is None:
            continue
        dtype = g.tensors[o].dtype
        if chain:               # t -> moves -> o: the moves read the float value
            f = g.add_tensor(f"{t}_dequant", g.shape(t))
            chain[-1].inputs[0] = f
            for n in chain:
                g.tensors[n.outputs[0]].dtype = np.dtype(np.float32)
        else:                   # t is the output: its integers take another name
            f, t = o, g.add_tensor(f"{o}_int", g.shape(o), dtype)
            g.tensors[o].dtype = np.dtype(np.float32)
            for n in g.nodes:
                n.outputs = [t if v == o else v for v in n.outputs]
                n.inputs = [t if v == o else v for v in n.inputs]
        sc, zp = g.add_const(np.float32(params[0]), f"{t}_scale"), g.add_const(np.array(params[1], dtype), f"{t}_zp")
        g.nodes.insert(g.nodes.index(g.producer(t)) + 1, Node("DequantizeLinear", [t, sc, zp], [f], {}, f"{t}_output"))
        g.meta.setdefault("output_quant", {})[o] = (*params, str(dtype))
        log(o, f"output {o} is also read inside the model: it reads a DequantizeLinear of its integers")


def _output_island(g, o):
    """([QuantizeLinear], [moves]) when graph output `o` is written from float tensors by
    QuantizeLinear nodes through data movement and Concat only (PoseNet's uint8 mid offsets: two
    quantized convs concatenated and transposed), every Q per-tensor with one (scale, zero
    point) and each integer tensor read by the island alone; else None."""
    qs, moves, stack, seen = [], [], [o], set()
    while stack:
        t = stack.pop()
        n = g.producer(t)
        if n is None or (t != o and (t in g.outputs or len(g.consumers(t)) != 1)):
            return None
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op == "QuantizeLinear":
            qs.append(n)
        elif n.op in SINGLE_MOVES + ("Concat",):
            moves.append(n)
            stack += [i for i in (n.inputs if n.op == "Concat" else n.inputs[:1]) if i and g.const(i) is None]
        else:
            return None
    params = {_params(g, q) for q in qs}
    return (qs, moves) if qs and moves and len(params) == 1 and None not in params else None


def _make_float(g, qs, moves, dqs=()):
    """An island's integers become the floats they stand for: its data movement writes float,
    its DequantizeLinear and QuantizeLinear go (each read of theirs reads their input). The
    values keep the name of the integers the file has (a TFLite tensor, not tf2onnx's
    `<name>_dequant`: an ArgMax refusal had told a DeepLab user --outputs ResizeBilinear_2_dequant,
    which the file has not)."""
    for n in moves:
        for o in n.outputs:
            g.tensors[o].dtype = np.dtype(np.float32)
    names = g.meta.setdefault("source_names", {})
    for n in list(dqs) + list(qs):
        g.nodes.remove(n)
        kept = names.get(n.inputs[0], n.inputs[0])
        g.replace_uses(n.outputs[0], n.inputs[0])
        if n.op == "DequantizeLinear":
            names[n.inputs[0]] = kept


def _dynamic_pairs(g, log):
    """Remove each DynamicQuantizeLinear read only by one DequantizeLinear of its own three
    outputs (integers, scale, zero point): the DequantizeLinear's readers read the float input."""
    for n in [n for n in g.nodes if n.op == "DynamicQuantizeLinear"]:
        users = {id(u): u for t in n.outputs for u in g.consumers(t)}
        d = next(iter(users.values()), None) if len(users) == 1 else None
        if d is None or d.op != "DequantizeLinear" or list(d.inputs[:3]) != list(n.outputs[:3]) \
                or any(t in g.outputs for t in n.outputs):
            continue
        g.nodes.remove(d)
        g.nodes.remove(n)
        g.replace_uses(d.outputs[0], n.inputs[0])
        log(n.name, f"removed run-time quantization DynamicQuantizeLinear/DequantizeLinear of {n.inputs[0]}")


def dequantize(g, log):
    _dynamic_pairs(g, log)
    _shared_outputs(g, log)
    for d in [n for n in g.nodes if n.op == "DequantizeLinear"]:
        if _hoist_to_input(g, d):
            log(d.name, f"moved DequantizeLinear of input {d.inputs[0]} above its data movement")
    for qs, moves, dqs, boundary in _int_regions(g):
        if boundary:
            raise UnsupportedOpError(
                f"node {qs[0].name!r} (QuantizeLinear of {qs[0].inputs[0]!r}) starts a quantized part "
                f"the compiler cannot make float: {boundary}. The model mixes quantized and float "
                "parts here: export it fully quantized (int8 in TFLite's spec) or as float")
        params = _params(g, qs[0])
        for q in qs:
            dtype = g.tensors[q.outputs[0]].dtype
            _record_range(g, _implied_clip(g, q, params, dtype, log), params, dtype)
        _record_moved(g, moves, params)
        _make_float(g, qs, moves, dqs)
        for q in qs:
            log(q.name, f"removed fake quantization QuantizeLinear/DequantizeLinear of {q.inputs[0]}")
    for x in list(g.inputs):
        t = g.tensors[x]
        users = g.consumers(x)
        if t.dtype.kind not in "iu" or not users:
            continue
        params = {_input_dequant(g, u) for u in users}
        if len(params) != 1 or None in params:
            continue
        ((scale, zp),) = params
        g.meta.setdefault("input_quant", {})[x] = (float(scale), int(zp), str(t.dtype))
        t.dtype = np.dtype(np.float32)
        for d in users:
            g.nodes.remove(d)
            g.replace_uses(d.outputs[0], x)
        log(x, f"input {x} is now float: {t.dtype} input q stood for (q - {zp}) * {scale:.6g}")
    for q in [n for n in g.nodes if n.op == "QuantizeLinear"]:
        if _sink_to_output(g, q):
            log(q.name, f"moved QuantizeLinear of output {q.outputs[0]} below its data movement")
    for o in list(g.outputs):
        island = _output_island(g, o)
        if island is None:
            continue
        qs, moves = island
        scale, zp = _params(g, qs[0])
        dtype = g.tensors[o].dtype
        for q in qs:
            _record_range(g, _implied_clip(g, q, (scale, zp), dtype, log, output=True), (scale, zp), dtype)
        _record_moved(g, moves, (scale, zp))
        g.meta.setdefault("output_quant", {})[o] = (scale, zp, str(dtype))
        _make_float(g, qs, moves)
        log(o, f"output {o} is now float (dropped the {len(qs)} QuantizeLinear before its data movement)")
    for i, o in enumerate(list(g.outputs)):
        q = g.producer(o)
        if q is None or q.op != "QuantizeLinear" or q.inputs[0] in g.inputs:
            continue
        scale = _scalar(g, q.inputs[1])
        zp = _scalar(g, q.inputs[2]) if len(q.inputs) > 2 and q.inputs[2] else 0
        dtype = g.tensors[o].dtype
        if scale is not None and zp is not None:
            _record_range(g, _implied_clip(g, q, (float(scale), int(zp)), dtype, log, output=True),
                          (float(scale), int(zp)), dtype)
        g.meta.setdefault("output_quant", {})[o] = (scale, zp, str(dtype))
        g.nodes.remove(q)
        src = q.inputs[0]
        for n in g.nodes:   # the float producer now writes the public output name
            n.outputs = [o if v == src else v for v in n.outputs]
            n.inputs = [o if v == src else v for v in n.inputs]
        g.tensors[o].dtype = np.dtype(np.float32)
        log(o, f"output {o} is now float (dropped its QuantizeLinear)")
    return g
