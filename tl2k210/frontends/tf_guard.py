"""A TensorFlow graph is a program: besides arithmetic it can read and write files and call back
into Python, and TensorFlow runs some of it while loading (a SavedModel's initialisers) or folding
constants. `refuse_side_effects` names any such op before TensorFlow sees the graph; an inference
network needs none of them."""
from . import ModelLoadError

#: op -> what it does beyond computing
SIDE_EFFECTS = {
    "WriteFile": "writes a file", "ReadFile": "reads a file", "MatchingFiles": "lists files",
    "ImmutableConst": "maps a file into memory", "PyFunc": "calls Python", "PyFuncStateless": "calls Python",
    "EagerPyFunc": "calls Python", "DatasetToTFRecord": "writes a file", "WholeFileReader": "reads files",
    "WholeFileReaderV2": "reads files",
}


def _why(node):
    op = node.op
    if op in SIDE_EFFECTS:
        return SIDE_EFFECTS[op]
    if op.startswith("Debug"):
        return "is a debugger op (writes to its debug URLs)"
    if op.endswith(("Dataset", "DatasetV2", "DatasetV3", "Reader", "ReaderV2")):
        return "is an input-pipeline op (reads or writes files)"
    stream = node.attr["output_stream"].s if op == "PrintV2" and "output_stream" in node.attr else b""
    if stream.startswith(b"file://"):
        return "prints to a file"
    return None


def refuse_side_effects(graph_defs, where):
    """ModelLoadError naming the first op in `graph_defs` (GraphDefs, their function libraries
    included) that touches files or calls Python."""
    for gd in graph_defs:
        nodes = [(None, n) for n in gd.node] + [(f.signature.name, n) for f in gd.library.function for n in f.node_def]
        for fn, n in nodes:
            why = _why(n)
            if why:
                inside = f" (in function {fn!r})" if fn else ""
                raise ModelLoadError(f"{where}: node {n.name!r}{inside} is a {n.op} op: it {why}. A graph that "
                                     "touches files or calls Python is a program, not a model: tl2k210 does not "
                                     "load it. Export the network for inference without it.")
