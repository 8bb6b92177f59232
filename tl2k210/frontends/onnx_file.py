"""An .onnx file (the common currency; PyTorch users export to it)."""
from . import ModelLoadError, check_onnx


def from_onnx_file(path):
    import onnx
    try:
        model = onnx.load(str(path))
    except onnx.checker.ValidationError as e:
        # external weights: onnx names the cause (missing, absolute, outside the folder, a link)
        raise ModelLoadError(f"{path}: its external weight data cannot be read: "
                             f"{' '.join(str(e).split())}; put the data file, as a regular file, in "
                             "the model's folder under the name the model gives") from e
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot parse as ONNX protobuf ({type(e).__name__}); "
                             "is the file truncated or of another kind?") from e
    if not model.graph.node:
        raise ModelLoadError(f"{path}: ONNX model has no nodes (empty or not an ONNX file); export the model to ONNX again")
    return check_onnx(model, str(path))
