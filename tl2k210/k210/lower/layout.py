"""Ops that only relabel memory (same bytes in the same order) are no-ops; NCHW->NHWC before a
flatten is the SDK's TENSORFLOW_FLATTEN."""
from __future__ import annotations

import numpy as np

from .registry import CPU_F32, RELABEL, lowering


def _moves_data(perm, shape):
    """Does Transpose(perm) change the byte order? Not if only size-1 axes move."""
    kept = [p for p in perm if shape[p] != 1]
    return kept != sorted(kept)


def transpose_relabel_refuses(g, node, opts):
    perm = list(node.attrs.get("perm", range(len(g.shape(node.inputs[0])))[::-1]))
    if _moves_data(perm, g.shape(node.inputs[0])):
        return f"Transpose {perm} of {g.shape(node.inputs[0])} moves data"
    return None


@lowering("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity", unit=RELABEL, name="relabel")
def relabel(lw, node):
    """NCHW flatten/reshape keeps the CHW byte order: the output is the input under a new shape."""
    _alias(lw, node)


@lowering("Transpose", unit=RELABEL, check=transpose_relabel_refuses, name="relabel")
def transpose_relabel(lw, node):
    _alias(lw, node)


def _alias(lw, node):
    x, out = node.inputs[0], node.outputs[0]
    lw.alias(out, x, lw.shape(out))
    if lw.shape(out) != lw.locs[x].shape:    # a KPU map is laid out for its (C, H, W) only
        lw.locs[out].kpu = lw.locs[out].block = None


def flatten_refuses(g, node, opts):
    perm = tuple(node.attrs.get("perm", ()))
    if perm != (0, 2, 3, 1) or len(g.shape(node.inputs[0])) != 4:
        return f"Transpose {list(perm)}: only NCHW->NHWC (0, 2, 3, 1) before a flatten has a v3 layer"
    return None


@lowering("Transpose", unit=CPU_F32, check=flatten_refuses, name="tensorflow_flatten")
def tensorflow_flatten(lw, node):
    x, out = node.inputs[0], node.outputs[0]
    c, h, w = lw.shape(x)
    row = lw.row(node, "NCHW->NHWC: float TENSORFLOW_FLATTEN", in_shape=(c, h, w), out_shape=lw.shape(out))
    src = lw.need_f32(x, row)
    loc = lw.f32_out(out, lw.shape(out))
    lw.emit("TENSORFLOW_FLATTEN", dict(flags=1, main_mem_in_address=src,
                                       main_mem_out_address=loc.f32, shape=(w, h, c)), row)
    lw.traced(out, "f32")
    assert int(np.prod(loc.shape)) == c * h * w

