"""The K210 back-end's flow: the generic passes (`tl2k210.passes`) and the K210's own
(`tl2k210.k210.passes`) in the ONE order the compiler runs them, ending with the question only
the back-end can answer: does every node left have a K210 lowering?

    graph, log = run_pipeline(graph)                  # the flow with its defaults
    graph, log = run_pipeline(graph, {"kpu_padding": True})
"""
import functools

from tl2k210 import passes as generic
from tl2k210.errors import UnsupportedOpError
from tl2k210.passes import Pass
from tl2k210.passes.channel_shuffle import channel_shuffle
from tl2k210.passes.channel_softmax import channel_softmax
from tl2k210.passes.concat_pad import concat_copies, concat_pad
from tl2k210.passes.constant_outputs import constant_outputs
from tl2k210.passes.conv_transpose import conv_transpose, conv_transpose_3x3
from tl2k210.passes.decompose import (batchnorm_of_activations, centered_norm, group_norm, instance_norm,
                                      log_softmax, lrn, reduce_sum_square, static_where, tile)
from tl2k210.passes.avg_pool_conv import avg_pool_conv
from tl2k210.passes.dequantize import dequantize
from tl2k210.passes.einsum import einsum_dense
from tl2k210.passes.equal_mask import equal_mask
from tl2k210.passes.fold_affine import affine_to_conv, fold_affine_into_conv
from tl2k210.passes.fold_batchnorm import fold_batchnorm
from tl2k210.passes.fold_constants import fold_constants
from tl2k210.passes.fuse_activation import fuse_activation
from tl2k210.passes.fuse_pool import fuse_pool
from tl2k210.passes.gather_slices import gather_slices
from tl2k210.passes.global_pool import global_pool
from tl2k210.passes.hard_activations import hard_activations
from tl2k210.passes.input_affine import input_affine
from tl2k210.passes.input_nchw import input_nchw
from tl2k210.passes.l2_normalize import l2_normalize
from tl2k210.passes.layout import upsample_to_resize, normalize_flatten
from tl2k210.passes.max_unpool import max_unpool
from tl2k210.passes.merge_5d import merge_5d
from tl2k210.passes.nary_ops import nary_ops
from tl2k210.passes.output_nchw import output_nchw
from tl2k210.passes.pad_into_conv import pad_into_conv
from tl2k210.passes.pixel_shuffle import pixel_shuffle
from tl2k210.passes.prelu_split import (prelu_pattern, prelu_residual, prelu_residual_every, prelu_residual_grouped,
                                       prelu_split)
from tl2k210.passes.push_transposes import push_transposes
from tl2k210.passes.space_to_batch import space_to_batch
from tl2k210.passes.spatial_1d import spatial_1d
from tl2k210.passes.square_kernels import square_kernels
from tl2k210.passes.tensordot import tensordot
from tl2k210.quantize.fake_quant import float_dense_convs

from . import hardware as hw
from .ideal import ideal
from .lower import Options, plan_format, select
from .lower.registry import CPU_F32
from .passes.dilated_mosaic import dilated_mosaic
from .passes.entry_conv import entry_conv
from .passes.kpu_padding import kpu_padding
from .passes.kxk_bands import kxk_bands
from .passes.kxk_windows import kxk_windows
from .passes.long_dense import long_dense
from .passes.matmul_to_conv import conv_as_dense, matmul_to_conv
from .passes.stride2_even_maps import stride2_even_maps
from .passes.unequal_strides import unequal_strides
from .passes.upsample_conv import upsample_conv
from .passes.wide_channels import wide_channels
from .passes.wide_dense import wide_dense


def lowers(g, node, opts, fmt) -> bool:
    """Has `node` a lowering in kmodel `fmt`?"""
    try:
        select(g, node, opts, fmt)
        return True
    except UnsupportedOpError:
        return False


def check_supported(g, log, opts=None):
    """The back-end's question, asked once with the user's lowering options (`run_pipeline`'s
    `target`, default Options()): which kmodel format does every node left lower to? The
    answer, (format, the node that forced v4 and why), is kept in g.meta["plan"] for the
    lowering. A node that has no lowering in it raises UnsupportedOpError naming the node, op
    type, attributes, why each way of lowering it does not apply, and the nearest supported
    form: "supported" means "lowered"."""
    opts = opts or Options()
    fmt, forced = plan_format(g, opts)
    chosen = {}
    for n in g.nodes:       # plan_format stops at the node that forces v4: every node must lower in it
        chosen[n.name] = select(g, n, opts, fmt)[0]
    g.meta["plan"] = (fmt, forced)
    if forced and forced[0] and opts.v3_only:   # every node a v3-only build refuses, for the advice (fit.check_format)
        g.meta["v3_refused"] = [n.name for n in g.nodes if not lowers(g, n, opts, "v3")]
    # the dense layers on the model's float input that stay float (the 8-bit ideal keeps them too)
    g.meta["float_dense"] = {name for name in float_dense_convs(g) if chosen[name].unit == CPU_F32}
    return g


PIPELINE = [
    Pass("dequantize", dequantize),
    # shapes a TF export computes from its input's (a SpaceToBatch's pads): input_nchw moves a
    # Pad only once they are constants
    Pass("fold_input_shapes", fold_constants),
    Pass("input_nchw", input_nchw),
    Pass("fold_constants", fold_constants),
    Pass("max_unpool", max_unpool),         # first: MaxUnpool's output_shape leaves its shape unknown
    Pass("spatial_1d", spatial_1d),
    Pass("constant_outputs", constant_outputs),
    Pass("space_to_batch", space_to_batch),
    Pass("gather_slices", gather_slices),
    Pass("pixel_shuffle", pixel_shuffle),
    Pass("conv_transpose_3x3", conv_transpose_3x3),   # off: --optimize size (the exact phases)
    Pass("conv_transpose", conv_transpose),
    Pass("log_softmax", log_softmax),
    Pass("group_norm", group_norm),
    Pass("instance_norm", instance_norm),
    Pass("lrn", lrn),
    Pass("reduce_sum_square", reduce_sum_square),
    Pass("batchnorm_of_activations", batchnorm_of_activations),
    Pass("centered_norm", centered_norm),   # Keras LayerNormalization's batch-norm formula
    Pass("einsum_dense", einsum_dense),
    Pass("tensordot", tensordot),           # a Keras Dense on a 4-D map: a 1x1 conv
    Pass("nary_ops", nary_ops),
    Pass("static_where", static_where),
    Pass("merge_5d", merge_5d),             # Keras' GroupNormalization: (1, H, W, G, C/G) as (1, H*W, G, C/G)
    Pass("equal_mask", equal_mask),         # CenterNet's peak trick, before push_transposes moves its maps
    Pass("input_affine", input_affine),
    Pass("concat_pad", concat_pad),         # Concat(x, zeros): TFLite's channel PAD in old converters
    Pass("concat_copies", concat_copies),   # Concat(x, x): TF OD API's nearest upsampling, a Tile
    Pass("push_transposes", push_transposes),
    Pass("upsample_to_resize", upsample_to_resize),
    Pass("global_pool", global_pool),
    Pass("normalize_flatten", normalize_flatten),
    Pass("hard_activations", hard_activations),
    Pass("prelu_pattern", prelu_pattern),
    Pass("l2_normalize", l2_normalize),
    Pass("matmul_to_conv", matmul_to_conv),
    Pass("long_dense", long_dense),         # over quantized_matmul's exact int32 sum: slices, summed
    Pass("fold_batchnorm", fold_batchnorm),
    Pass("pad_into_conv", pad_into_conv),
    Pass("conv_as_dense", conv_as_dense),
    Pass("wide_dense", wide_dense),
    Pass("square_kernels", square_kernels),
    Pass("fold_affine_into_conv", fold_affine_into_conv),
    Pass("affine_to_conv", affine_to_conv),
    Pass("prelu_residual_every", prelu_residual_every, default=False),      # --optimize size: every PReLU
    Pass("prelu_residual_grouped", prelu_residual_grouped, default=False),  # ... before grouped convs too
    Pass("prelu_residual", prelu_residual, default=False),   # the smaller form: the compiler's choice
    Pass("prelu_split", prelu_split),
    Pass("fuse_activation", fuse_activation),
    Pass("channel_softmax", channel_softmax),
    Pass("channel_shuffle", channel_shuffle),
    Pass("upsample_conv", upsample_conv),   # a form (FORM_PASSES): 4x one conv's weights, no 4x map
    Pass("entry_conv", entry_conv),
    Pass("wide_channels", wide_channels),
    Pass("kxk_windows", kxk_windows),
    Pass("kxk_bands", kxk_bands),           # after the windows: a grouped conv's need no halo
    Pass("dilated_mosaic", dilated_mosaic),
    Pass("stride2_even_maps", stride2_even_maps),
    Pass("unequal_strides", unequal_strides),   # (2, 1): the KPU conv at (1, 1) + a strided slice
    Pass("kpu_padding", kpu_padding, default=False, exact=False),
    Pass("fuse_pool", functools.partial(fuse_pool, min_out=hw.LIMITS["out_min"])),
    Pass("avg_pool_conv", avg_pool_conv),   # a 3x3 mean no conv took: a depthwise KPU conv
    Pass("cleanup_layout", upsample_to_resize),
    Pass("output_nchw", output_nchw),
    Pass("tile", tile),            # what upsample_to_resize left (Keras UpSampling2D is a Tile too)
    Pass("check_supported", check_supported),
]
PASSES = {p.name: p for p in PIPELINE}


def run_pipeline(graph, options=None, target=None):
    """The flow's enabled passes in order (options: {pass_name: bool}); `target`: the lowering
    Options that check_supported answers for (the user's format and weights). Returns (graph, log)."""
    if target is None:
        return generic.run_pipeline(PIPELINE, graph, options)
    v3 = target.format == "v3" or target.v3_only     # kmodel v3 has no pad layer: fold every Pad it can
    bound = {check_supported: functools.partial(check_supported, opts=target),
             pad_into_conv: functools.partial(pad_into_conv, repeat=v3),
             kxk_windows: functools.partial(kxk_windows, v4=not v3),
             kxk_bands: functools.partial(kxk_bands, v4=not v3),
             dilated_mosaic: functools.partial(dilated_mosaic, v4=not v3),
             long_dense: functools.partial(long_dense, v4=not v3),
             upsample_conv: functools.partial(upsample_conv, v4=not v3),
             wide_dense: functools.partial(wide_dense, float_fc=target.float_fc)}
    pipeline = [Pass(p.name, bound.get(p.fn, p.fn), p.default, p.exact) for p in PIPELINE]
    return generic.run_pipeline(pipeline, graph, options)


#: the passes that give layers the KPU's forms at a cost in maps or weights: the PReLU pair doubles
#: the maps it writes and its readers' weights (MobileFaceNet's 8-bit weights 0.25 MB, 0.48 MB
#: after it), the residual form adds depthwise convs and adds, a dilated conv's mosaic copies its
#: input twice, a 2x2 conv made 3x3 stores 9 taps of which 5 are zeros, a mean pool made a depthwise
#: conv stores weights the pool has not. What the network needs at 8 bits is its graph without them.
FORM_PASSES = ("prelu_residual_every", "prelu_residual_grouped", "prelu_residual", "prelu_split", "dilated_mosaic",
               "square_kernels", "avg_pool_conv", "upsample_conv")


def network_ideal(graph, flowed, log, options=None, target=None, weight_bits=8):
    """The 8-bit ideal (ideal.ideal) of the network: of `flowed`, what run_pipeline(graph,
    options, target) made with `log`, or where a FORM_PASSES form changed it, of `graph` run without them."""
    if not any(r["pass"] in FORM_PASSES and r["changes"] for r in log):
        return ideal(flowed, weight_bits)
    off = dict(options or {}, check_supported=False, **{p: False for p in FORM_PASSES})
    return ideal(run_pipeline(graph, off, target)[0], weight_bits)


def run_pass(name, graph):
    """One pass of the flow by name (for tests and tools); returns (graph, changes)."""
    return generic.run_pass(PASSES[name], graph)
