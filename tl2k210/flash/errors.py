"""Flash-specific errors. Every message says what went wrong and what to try."""
from tl2k210.errors import FlashError, KfpkgError  # noqa: F401  (re-exported)


class GreetingError(FlashError):
    """The ROM bootloader never answered the greeting."""


class PortError(FlashError):
    """The serial port is missing, busy or not accessible."""


class BoardTimeoutError(FlashError):
    """The board stopped answering during a transfer."""


class TransferError(FlashError):
    """The board kept rejecting a frame (checksum/length errors) beyond the retry budget."""


class StubError(FlashError):
    """The stage-2 flash program could not be found or loaded."""
