"""Calibration tensors for the keyword spotters of docs/results.md's round-50 set (no audio data
ships offline): synthetic 1 s clips (voiced-like harmonic chirps, noise, silence gaps), turned
into the features each model reads.

    python bench/audio_features.py graph MODEL.pb OUT.npy [N]   # (N, frames, coefficients): the
        .pb's own front end (wav_data -> DecodeWav -> AudioSpectrogram -> Mfcc: ARM ML-KWS-for-MCU)
    python bench/audio_features.py mfcc16 OUT.npy [N]           # (N, 16, 16, 1): 16 MFCCs x 16
        frames at 8 kHz, 0.256 s windows every 0.05 s (ShawnHymel's tflite-speech-recognition)

Put OUT beside the model as MODEL.npy and bench/unseen.py calibrates with it.
"""
import sys

import numpy as np


def clips(n, sr, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(sr) / sr
    for _ in range(n):
        y = np.zeros(sr)
        for _ in range(rng.integers(1, 4)):
            f0 = rng.uniform(90, 260)
            a, b = sorted(rng.integers(0, sr, 2))
            env = np.zeros(sr)
            if b > a:
                env[a:b] = np.hanning(b - a)
            ph = 2 * np.pi * np.cumsum(f0 * (1 + 0.3 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t))) / sr
            y += env * sum(rng.uniform(0.1, 1) / h * np.sin(h * ph) for h in range(1, 12))
        y += rng.uniform(0.001, 0.05) * rng.standard_normal(sr)
        yield (0.5 * y / max(1e-6, np.abs(y).max()) * rng.uniform(0.1, 1)).astype(np.float32)


def graph_features(pb, n):
    import tensorflow as tf
    gd = tf.compat.v1.GraphDef()
    gd.ParseFromString(open(pb, "rb").read())
    wavs = [tf.audio.encode_wav(c[:, None], 16000).numpy() for c in clips(n, 16000)]
    with tf.Graph().as_default() as g:
        tf.import_graph_def(gd, name="")
        with tf.compat.v1.Session(graph=g) as s:
            return np.concatenate([s.run("Mfcc:0", {"wav_data:0": w}) for w in wavs])


def mfcc16(n):
    import tensorflow as tf
    out = []
    for y in clips(n, 8000, seed=1):
        stft = tf.signal.stft(y / max(1e-6, np.abs(y).max()), frame_length=2048, frame_step=400,
                              fft_length=2048, pad_end=True)
        mel = tf.tensordot(tf.abs(stft) ** 2, tf.signal.linear_to_mel_weight_matrix(26, 1025, 8000, 0, 4000), 1)
        out.append(tf.signal.mfccs_from_log_mel_spectrograms(tf.math.log(mel + 1e-6))[:16, :16].numpy().T[..., None])
    return np.stack(out)


def main(argv):
    if argv[:1] == ["graph"] and len(argv) in (3, 4):
        x = graph_features(argv[1], int(argv[3]) if len(argv) > 3 else 24)
        out = argv[2]
    elif argv[:1] == ["mfcc16"] and len(argv) in (2, 3):
        x = mfcc16(int(argv[2]) if len(argv) > 2 else 32)
        out = argv[1]
    else:
        sys.exit(__doc__)
    np.save(out, x.astype(np.float32))
    print(f"wrote {out}: {x.shape}")


if __name__ == "__main__":
    main(sys.argv[1:])
