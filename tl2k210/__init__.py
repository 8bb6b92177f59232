"""tl2k210: neural networks onto Kendryte K210 (kmodel v3/v4, bit-exact KPU emulator, flasher)."""

__version__ = "0.1.0"
