"""Last step: every node left must have a K210 lowering (tl2k210.k210.lower registry); anything
else raises UnsupportedOpError naming the node, op type, attributes, why each way of lowering it
does not apply, and the nearest supported form. Same question the lowering asks: "supported"
means "lowered"."""

NEAREST = {
    "ConvTranspose": "nearest UpSampling2D (Resize) followed by a 3x3 Conv",
    "PRelu": "PReLU with constant slopes (the pass prelu_split runs it on the KPU)",
    "Gelu": "Swish (x*sigmoid(x)) or ReLU",
    "ReduceMean": "GlobalAveragePooling2D", "ReduceMax": "GlobalMaxPooling2D",
    "LSTM": "a convolutional model (no recurrent ops on the K210)", "GRU": "a convolutional model",
    "RNN": "a convolutional model", "Upsample": "Resize with mode nearest",
    "InstanceNormalization": "BatchNormalization after a Conv (folded into it)",
    "LRN": "BatchNormalization", "DepthToSpace": "nearest UpSampling2D + Conv",
    "Einsum": "Dense (MatMul) layers",
}


def check_supported(g, log, opts=None):
    from tl2k210.k210.lower import Options, select
    opts = opts or Options()
    for n in g.nodes:
        select(g, n, opts, opts.format)
    return g
