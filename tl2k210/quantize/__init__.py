"""Calibration (dataset, float reference, range estimators) and quantization metrics.
The K210 fixed-point parameter solving lives in tl2k210.k210 (the lowering)."""
