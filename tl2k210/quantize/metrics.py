"""Agreement metrics between a reference (float) and a test (quantized/emulated) output."""
import numpy as np


def sqnr_db(ref, test):
    """Signal-to-quantization-noise ratio in dB: 10 log10(sum ref^2 / sum (ref - test)^2)."""
    ref, test = np.asarray(ref, np.float64), np.asarray(test, np.float64)
    noise = np.sum((ref - test) ** 2)
    signal = np.sum(ref ** 2)
    if noise == 0:
        return float("inf")
    return float(10 * np.log10(signal / noise)) if signal > 0 else float("-inf")


def cosine(ref, test):
    a, b = np.asarray(ref, np.float64).ravel(), np.asarray(test, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))


def topk_agreement(ref_logits, test_logits, k=1):
    """Fraction of samples whose reference top-1 class is in the test's top-k. Tied scores rank
    by index, as argmax does (a quantized output has ties: TFLite's int8 softmax)."""
    r = np.asarray(ref_logits).reshape(len(ref_logits), -1)
    t = np.asarray(test_logits).reshape(len(test_logits), -1)
    top = np.argsort(-t, axis=1, kind="stable")[:, :k]
    return float(np.mean([r[i].argmax() in top[i] for i in range(len(r))]))
