"""Generic graph rewrites, each `Graph -> Graph`, named; a back-end orders them with its own
passes in ONE list, its flow (the K210's: `tl2k210.k210.flow`), and runs it with `run_pipeline`.

Every pass is `fn(graph, log) -> graph` where `log(node_name, message)` records what it changed;
`run_pipeline` copies the graph before each pass, prunes dead tensors and re-infers shapes after.
Passes marked `default=False` change the float math (or are lowering choices) and are opt-in:
`flow.run_pipeline(g, {"kpu_padding": True})`.
"""
import time
from dataclasses import dataclass
from typing import Callable

from tl2k210.errors import Tl2k210Error
from tl2k210.graph import infer_shapes



@dataclass(frozen=True)
class Pass:
    name: str
    fn: Callable
    default: bool = True
    exact: bool = True  # False: changes the float results (must be opt-in and reported)


def run_pipeline(pipeline, graph, options=None):
    """Run the enabled passes of `pipeline` (a list of Pass) in order. options: {pass_name: bool}
    overrides defaults.

    Returns (graph, log); log is a list of
    {"pass", "exact", "changes": [(node, message)], "nodes": (before, after), "seconds"}."""
    options = dict(options or {})
    unknown = set(options) - {p.name for p in pipeline}
    if unknown:
        raise ValueError(f"unknown pass option(s) {sorted(unknown)}; passes: {[p.name for p in pipeline]}")
    log = []
    for p in pipeline:
        if not options.get(p.name, p.default):
            continue
        changes, before, t = [], len(graph.nodes), time.perf_counter()
        try:
            graph = p.fn(graph.copy(), lambda node, msg: changes.append((node, msg)))
            graph = infer_shapes(graph.prune())
        except Tl2k210Error:
            raise
        except Exception as e:   # a bug or an input no pass foresaw: say where, not a traceback
            last = f" (after {changes[-1][0]!r})" if changes else ""
            raise Tl2k210Error(f"pass {p.name}{last} failed on this model: {type(e).__name__}: "
                               f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}; please report it "
                               "with the model") from e
        log.append({"pass": p.name, "exact": p.exact, "changes": changes, "nodes": (before, len(graph.nodes)),
                    "seconds": time.perf_counter() - t})
    return graph, log


def run_pass(p, graph):
    """Run one Pass (for tests and tools); returns (graph, changes)."""
    changes = []
    g = p.fn(graph.copy(), lambda node, msg: changes.append((node, msg)))
    return infer_shapes(g.prune()), changes
