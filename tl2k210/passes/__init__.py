"""Graph rewrites, each `Graph -> Graph`, named and run in ONE ordered list.

Every pass is `fn(graph, log) -> graph` where `log(node_name, message)` records what it changed;
`run_pipeline` copies the graph before each pass, prunes dead tensors and re-infers shapes after.
Passes marked `default=False` change the float math (or are lowering choices) and are opt-in:
`run_pipeline(g, {"kpu_padding": True})`.
"""
import time
from dataclasses import dataclass
from typing import Callable

from tl2k210.errors import Tl2k210Error
from tl2k210.graph import infer_shapes

from .input_nchw import input_nchw
from .nary_ops import nary_ops
from .spatial_1d import spatial_1d
from .pixel_shuffle import pixel_shuffle
from .decompose import instance_norm, log_softmax, tile
from .input_affine import input_affine
from .dequantize import dequantize
from .output_nchw import output_nchw
from .fold_constants import fold_constants
from .push_transposes import push_transposes
from .global_pool import global_pool
from .layout import upsample_to_resize, normalize_flatten
from .hard_activations import hard_activations
from .l2_normalize import l2_normalize
from .matmul_to_conv import matmul_to_conv
from .fold_batchnorm import fold_batchnorm
from .fold_affine import affine_to_conv, fold_affine_into_conv
from .prelu_split import prelu_pattern, prelu_split
from .pad_into_conv import pad_into_conv
from .square_kernels import square_kernels
from .fuse_activation import fuse_activation
from .channel_shuffle import channel_shuffle
from .entry_conv import entry_conv
from .wide_channels import wide_channels
from .channel_softmax import channel_softmax
from .kpu_padding import kpu_padding
from .stride2_even_maps import stride2_even_maps
from .fuse_pool import fuse_pool
from .check_supported import check_supported


@dataclass(frozen=True)
class Pass:
    name: str
    fn: Callable
    default: bool = True
    exact: bool = True  # False: changes the float results (must be opt-in and reported)


PIPELINE = [
    Pass("dequantize", dequantize),
    Pass("input_nchw", input_nchw),
    Pass("fold_constants", fold_constants),
    Pass("spatial_1d", spatial_1d),
    Pass("pixel_shuffle", pixel_shuffle),
    Pass("log_softmax", log_softmax),
    Pass("instance_norm", instance_norm),
    Pass("nary_ops", nary_ops),
    Pass("input_affine", input_affine),
    Pass("push_transposes", push_transposes),
    Pass("upsample_to_resize", upsample_to_resize),
    Pass("global_pool", global_pool),
    Pass("normalize_flatten", normalize_flatten),
    Pass("hard_activations", hard_activations),
    Pass("prelu_pattern", prelu_pattern),
    Pass("l2_normalize", l2_normalize),
    Pass("matmul_to_conv", matmul_to_conv),
    Pass("fold_batchnorm", fold_batchnorm),
    Pass("pad_into_conv", pad_into_conv),
    Pass("square_kernels", square_kernels),
    Pass("fold_affine_into_conv", fold_affine_into_conv),
    Pass("affine_to_conv", affine_to_conv),
    Pass("prelu_split", prelu_split),
    Pass("fuse_activation", fuse_activation),
    Pass("channel_softmax", channel_softmax),
    Pass("channel_shuffle", channel_shuffle),
    Pass("entry_conv", entry_conv),
    Pass("wide_channels", wide_channels),
    Pass("stride2_even_maps", stride2_even_maps),
    Pass("kpu_padding", kpu_padding, default=False, exact=False),
    Pass("fuse_pool", fuse_pool),
    Pass("cleanup_layout", upsample_to_resize),
    Pass("output_nchw", output_nchw),
    Pass("tile", tile),            # what upsample_to_resize left (Keras UpSampling2D is a Tile too)
    Pass("check_supported", check_supported),
]
PASSES = {p.name: p for p in PIPELINE}


def run_pipeline(graph, options=None):
    """Run the enabled passes in order. options: {pass_name: bool} overrides defaults.

    Returns (graph, log); log is a list of
    {"pass", "exact", "changes": [(node, message)], "nodes": (before, after), "seconds"}."""
    options = dict(options or {})
    unknown = set(options) - set(PASSES)
    if unknown:
        raise ValueError(f"unknown pass option(s) {sorted(unknown)}; passes: {[p.name for p in PIPELINE]}")
    log = []
    for p in PIPELINE:
        if not options.get(p.name, p.default):
            continue
        changes, before, t = [], len(graph.nodes), time.perf_counter()
        try:
            graph = p.fn(graph.copy(), lambda node, msg: changes.append((node, msg)))
            graph = infer_shapes(graph.prune())
        except Tl2k210Error:
            raise
        except Exception as e:   # a bug or an input no pass foresaw: say where, not a traceback
            last = f" (after {changes[-1][0]!r})" if changes else ""
            raise Tl2k210Error(f"pass {p.name}{last} failed on this model: {type(e).__name__}: "
                               f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}; please report it "
                               "with the model") from e
        log.append({"pass": p.name, "exact": p.exact, "changes": changes, "nodes": (before, len(graph.nodes)),
                    "seconds": time.perf_counter() - t})
    return graph, log


def run_pass(name, graph):
    """Run one pass by name (for tests and tools); returns (graph, changes)."""
    changes = []
    g = PASSES[name].fn(graph.copy(), lambda node, msg: changes.append((node, msg)))
    return infer_shapes(g.prune()), changes
