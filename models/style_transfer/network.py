"""Feed-forward style transfer network for the K210 (Johnson et al. 2016, shrunk for the KPU).

128x128 RGB in [0, 1] -> 128x128 RGB in [0, 1] (sigmoid), fully convolutional:

  enc1   3x3 conv 3->16, ReLU                         128x128   KPU
  down1  ZeroPad(1) + 3x3 conv stride 2 VALID, 16->32  64x64     KPU (stride 2 = pick pool)
  down2  ZeroPad(1) + 3x3 conv stride 2 VALID, 32->32  32x32     KPU
  resK   x + conv3x3(ReLU(conv3x3(x)))  (K = 1..RES)  32x32     2 convs KPU, Add CPU
  up1    nearest x2 (CPU) + 3x3 conv 32->16, ReLU      64x64     Resize CPU, conv KPU
  up2    nearest x2 (CPU) + 3x3 conv 16->8, ReLU       128x128   Resize CPU, conv KPU
  out    3x3 conv 8->3, sigmoid                        128x128   KPU

No BatchNorm/InstanceNorm (instance norm has no KPU lowering); convs carry biases. The CPU work
is RES uint8 Adds on 32x32x32 and two uint8 nearest resizes (32x32x32 -> 64x64, 16x64x64 -> 128x128).
"""
import time

CH = (16, 32, 32)   # enc1, down1, down2 (= residual width)
UP = (16, 8)        # up1, up2
RES = 3


def layer_specs(res=RES):
    """(name, kind, cin, cout, act) in weight order; kind: conv | down | up (upsample, then conv)."""
    s = [("enc1", "conv", 3, CH[0], "relu"), ("down1", "down", CH[0], CH[1], "relu"),
         ("down2", "down", CH[1], CH[2], "relu")]
    for k in range(1, res + 1):
        s += [(f"res{k}a", "conv", CH[2], CH[2], "relu"), (f"res{k}b", "conv", CH[2], CH[2], None)]
    s += [("up1", "up", CH[2], UP[0], "relu"), ("up2", "up", UP[0], UP[1], "relu"),
          ("out", "conv", UP[1], 3, "sigmoid")]
    return s


def build(size=128, width=None, height=None, res=RES, batch=1, name=None):
    import tensorflow as tf
    import tensorlayer as tl
    from tensorlayer.layers import Conv2d, Elementwise, Input, UpSampling2d, ZeroPad2d
    acts = {"relu": tf.nn.relu, "sigmoid": tf.nn.sigmoid, None: None}
    w, h = width or size, height or size
    x = Input([batch, h, w, 3], name="input")
    n, skip = x, None
    for lname, kind, cin, cout, act in layer_specs(res):
        if lname.endswith("a"):
            skip = n
        if kind == "down":
            n = ZeroPad2d(((1, 1), (1, 1)), name=f"{lname}_pad")(n)
            n = Conv2d(cout, (3, 3), (2, 2), act=acts[act], padding="VALID", in_channels=cin, name=lname)(n)
            continue
        if kind == "up":
            n = UpSampling2d((2, 2), method="nearest", name=f"{lname}_resize")(n)
        n = Conv2d(cout, (3, 3), (1, 1), act=acts[act], padding="SAME", in_channels=cin, name=lname)(n)
        if lname.startswith("res") and lname.endswith("b"):
            n = Elementwise(tf.add, name=f"{lname[:-1]}_add")([skip, n])
    # TensorLayer wants a unique model name per process
    return tl.models.Model(inputs=x, outputs=n, name=name or f"style_transfer_{time.monotonic_ns()}")
