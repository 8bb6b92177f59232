"""One exception hierarchy. Every message names the file/layer/offset and what to do."""


def nearest(name: str, names) -> str:
    """'; nearest: 'a', 'b'' -- the names most like `name` that a message can offer, or ''."""
    import difflib
    near = difflib.get_close_matches(name, list(names), n=3, cutoff=0.5)
    return f"; nearest: {', '.join(map(repr, near))}" if near else ""


class Tl2k210Error(Exception):
    """Base class of every error tl2k210 raises on purpose."""


class KmodelFormatError(Tl2k210Error, ValueError):
    """A kmodel file is truncated, corrupt, absurd or of an unsupported version."""

    def __init__(self, message, offset=None, field=None):
        self.offset = offset
        self.field = field
        where = []
        if field is not None:
            where.append(f"field {field}")
        if offset is not None:
            where.append(f"at byte offset {offset} (0x{offset:x})")
        super().__init__(f"{message}" + (f" [{', '.join(where)}]" if where else ""))


class EmulatorError(Tl2k210Error):
    """The emulator cannot run a layer (bad input shape, memory out of range...)."""


class UnsupportedOpError(Tl2k210Error):
    """An operator the compiler cannot lower."""


class QualityError(Tl2k210Error):
    """A converted model's outputs are NaN/Inf or too far from the float model (`--min-sqnr`);
    `receipt` holds the per-layer measurements (nothing was written)."""

    def __init__(self, message, receipt=None):
        super().__init__(message)
        self.receipt = receipt


class KpuLimitError(Tl2k210Error):
    """A layer exceeds a KPU hardware limit."""


class FlashError(Tl2k210Error):
    """Flashing failed; the message says why and what to try."""


class KfpkgError(Tl2k210Error, ValueError):
    """A .kfpkg package is malformed or unsafe."""


class InputFileError(Tl2k210Error, ValueError):
    """An input file (image, array, dataset, labels...) is missing, unreadable or unusable."""


class OutputPathError(Tl2k210Error):
    """An output path cannot be written, or would overwrite an input."""


class ModelLoadError(Tl2k210Error, ValueError):
    """A model file is missing, corrupt, malformed or of a kind tl2k210 does not read."""


class UnknownOutputError(ModelLoadError):
    """--outputs names a tensor the model file does not have."""
