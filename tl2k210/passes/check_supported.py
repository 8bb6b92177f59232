"""Last step: every node left must be in the IR vocabulary (tl2k210.graph docstring); anything else
raises UnsupportedOpError naming the node, op type, attributes and the nearest supported form."""
from tl2k210.errors import UnsupportedOpError

SUPPORTED = {
    "Conv", "Add", "Sub", "Mul", "Div", "Concat", "Resize", "GlobalAveragePool", "GlobalMaxPool", "MaxPool",
    "AveragePool", "Gemm", "MatMul", "Softmax", "Sigmoid", "Relu", "Clip", "LeakyRelu", "Tanh", "HardSigmoid",
    "HardSwish", "LpNormalization", "Flatten", "Reshape", "Transpose", "Pad", "Slice", "Identity", "Squeeze", "Unsqueeze",
    "BatchNormalization",  # only a standalone one survives the passes; the backend runs it as a CPU op
}

NEAREST = {
    "ConvTranspose": "nearest UpSampling2D (Resize) followed by a 3x3 Conv",
    "PRelu": "LeakyReLU with one fixed alpha (an activation of one variable)",
    "Elu": "LeakyReLU or ReLU", "Selu": "LeakyReLU or ReLU", "Gelu": "Swish (x*sigmoid(x)) or ReLU",
    "ReduceMean": "GlobalAveragePooling2D", "ReduceMax": "GlobalMaxPooling2D",
    "LSTM": "a convolutional model (no recurrent ops on the K210)", "GRU": "a convolutional model",
    "RNN": "a convolutional model", "Upsample": "Resize with mode nearest",
    "InstanceNormalization": "BatchNormalization after a Conv (folded into it)",
    "LRN": "BatchNormalization", "DepthToSpace": "nearest UpSampling2D + Conv",
    "Einsum": "Dense (MatMul) layers",
}


def check_supported(g, log):
    for n in g.nodes:
        if n.op in SUPPORTED and not (n.op == "Resize" and n.attrs.get("mode", "nearest") != "nearest"):
            continue
        attrs = {k: v for k, v in n.attrs.items() if not hasattr(v, "shape") or v.size < 8}
        hint = "Resize with mode nearest (UpSampling2D interpolation='nearest')" if n.op == "Resize" else \
            NEAREST.get(n.op, f"one of {sorted(SUPPORTED - {'Identity', 'BatchNormalization'})}")
        raise UnsupportedOpError(f"node {n.name!r}: op {n.op} {attrs} is not supported; nearest supported form: "
                                 f"{hint}")
    return g
