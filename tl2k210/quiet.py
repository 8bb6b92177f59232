"""Keep TensorFlow's start-up and conversion chatter off the user's terminal.

Our progress lines and errors are the only output of `convert`, `zoo build` and `make demo`
unless `--verbose` (or TL2K210_VERBOSE=1). TensorFlow logs from C++ (absl: the oneDNN and CPU
feature notes, "All log messages before absl::InitializeLog()"), TF Lite prints "Created
TensorFlow Lite XNNPACK delegate", TensorFlow, tf2onnx and TensorLayer log and warn through
Python, and onnxruntime warns about tf2onnx's graphs through its own logger. `tensorflow()`
quiets TensorFlow before it is imported, `onnxruntime()` onnxruntime; `native_stderr()` filters
what C++ writes to fd 2 while TF works: the known noise lines go, everything else (errors,
crashes' last words) is passed on.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import warnings

_state = {"verbose": os.environ.get("TL2K210_VERBOSE", "") not in ("", "0"), "done": False}

# what TF / TF Lite write to fd 2 that says nothing to a tl2k210 user
NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IW]\d{4} [\d:.]+\s+\d+ [\w./-]+:\d+\] "         # absl INFO / WARNING lines
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags"
    r"|INFO: Created TensorFlow Lite XNNPACK delegate for CPU"
    r"|INFO: Initialized TensorFlow Lite runtime)")
LOGGERS = ("tensorflow", "tf2onnx", "tensorlayer", "absl", "h5py", "keras")


def set_verbose(verbose: bool):
    """`--verbose`: let TensorFlow talk (call before anything imports it)."""
    _state["verbose"] = bool(verbose)


def verbose() -> bool:
    return _state["verbose"]


def tensorflow():
    """Quiet TensorFlow, tf2onnx and TensorLayer, and import TensorFlow (idempotent; a no-op
    with --verbose). Call it where TensorFlow may get imported first."""
    if _state["verbose"] or _state["done"]:
        return
    _state["done"] = True
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")       # C++ INFO/WARNING/ERROR off
    for name in LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for module in (r"tensorflow(\.|$)", r"tf2onnx(\.|$)", r"tensorlayer(\.|$)", r"keras(\.|$)",
                   r"google\.protobuf(\.|$)", r"h5py(\.|$)"):
        warnings.filterwarnings("ignore", module=module)
    if "tensorflow" not in sys.modules:
        with native_stderr():
            try:
                import tensorflow  # noqa: F401
            except ImportError:
                return
    import tensorflow as tf
    tf.get_logger().setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging
        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:      # pragma: no cover (absl comes with TensorFlow)
        pass


def onnxruntime():
    """onnxruntime, its default logger at ERROR unless --verbose: its warnings on the graphs
    tf2onnx writes ("`tf_half_pixel_for_nn` is deprecated", from a Keras UpSampling2D) are
    about the exporter, not something the user can change."""
    import onnxruntime as ort
    if not _state["verbose"]:
        ort.set_default_logger_severity(3)
    return ort


@contextlib.contextmanager
def native_stderr():
    """While inside, what C/C++ code writes to fd 2 is collected; on the way out the known
    noise lines (NOISE) are dropped and the rest is written to stderr. No-op with --verbose."""
    if _state["verbose"]:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):      # no real fd 2 (embedded interpreters)
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            for line in tmp.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not NOISE.match(line):
                    sys.stderr.write(line)
            sys.stderr.flush()
