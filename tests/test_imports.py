"""The package's seams, checked on the source (ast, no import): library code never imports a
command-line module, and no two packages import each other, directly or around a circle --
also not through an import hidden inside a function."""
import ast
from collections import defaultdict

from tl2k210 import paths

PKG = paths.PACKAGE


def _modules():
    """{dotted module name: path} for every module of the package."""
    out = {}
    for f in PKG.rglob("*.py"):
        parts = ("tl2k210",) + f.relative_to(PKG).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(name, path, known):
    """The package modules `name` imports, wherever the import statement stands."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known)
    return found


def unit(module):
    """What the cycle rule calls a package: tl2k210.X for a subpackage X (all its modules), the
    module itself for a top-level module."""
    parts = module.split(".")
    return ".".join(parts[:2])


def is_cli(module):
    return module == "tl2k210.cliargs" or module == "tl2k210.cli" or module.startswith("tl2k210.cli.")


def graph():
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def cycles(edges):
    """Strongly connected components (more than one unit) of the unit-level graph."""
    g = defaultdict(set)
    for a, bs in edges.items():
        for b in bs:
            if unit(a) != unit(b):
                g[unit(a)].add(unit(b))
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(list(g)):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_packages():
    edges = graph()
    found = cycles(edges)
    detail = [f"{a} -> {b}" for comp in found for a in sorted(edges) for b in sorted(edges[a])
              if unit(a) in comp and unit(b) in comp and unit(a) != unit(b)]
    assert found == [], "import cycles between packages:\n" + "\n".join(detail)


def test_library_code_never_imports_the_command_line():
    edges = graph()
    bad = [f"{a} -> {b}" for a in sorted(edges) if not is_cli(a) for b in sorted(edges[a]) if is_cli(b)]
    assert bad == [], "library modules importing CLI modules:\n" + "\n".join(bad)


def test_the_checks_find_what_they_are_for():
    assert cycles({"tl2k210.a.x": {"tl2k210.b.y"}, "tl2k210.b.y": {"tl2k210.a.z"}}) == [["tl2k210.a", "tl2k210.b"]]
    assert cycles({"tl2k210.a.x": {"tl2k210.a.y"}, "tl2k210.a.y": {"tl2k210.a.x"}}) == []   # inside one package
    assert is_cli("tl2k210.cli.convert") and is_cli("tl2k210.cliargs") and not is_cli("tl2k210.compiler")
    mods = _modules()
    assert "tl2k210.k210.lower.registry" in _imports("tl2k210.k210.flow", mods["tl2k210.k210.flow"], mods) or \
        "tl2k210.k210.lower" in _imports("tl2k210.k210.flow", mods["tl2k210.k210.flow"], mods)
