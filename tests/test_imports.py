"""Imports run downward only (../shared/DESIGN.md: ops -> dsf -> mixers -> models -> data,
train, analysis, experiments -> hf, interop -> cli): no circle among the modules of src/seqmix.

The graph is read from the source with ``ast``, every import counted, those inside functions
too (a lazy import hides a circle, it does not break it):

* ``import a.b`` depends on the module ``a.b`` (a package: its ``__init__``);
* ``from a.b import name`` depends on the module ``a.b.name`` when that is a module (a
  submodule imported through its package), else on ``a.b`` (a name the package's
  ``__init__`` defines or re-exports);
* relative imports are resolved against the importing module's package;
* importing ``a.b`` also runs ``a/__init__``, but that implicit step is not an edge: every
  module would then depend on ``seqmix/__init__``, which imports its subpackages. A package
  ``__init__`` that re-exports its submodules is an edge like any other, so a submodule
  that takes a name from its own package's ``__init__`` closes a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "seqmix"


def module_files(src: Path = SRC, root: str = ROOT) -> dict[str, Path]:
    """Module name -> file of every module under src/<root> (a package is its __init__)."""
    out = {}
    for f in sorted((src / root).rglob("*.py")):
        parts = f.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _resolve(name: str, modules) -> str | None:
    """The module ``name`` names, or its longest prefix that is a module (None: not ours)."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in modules:
            return cand
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules) -> set[str]:
    """The internal modules that ``module`` (source at ``path``) imports, anywhere in its body."""
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    deps = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                dep = _resolve(a.name, modules)
                if dep is not None:
                    deps.add(dep)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: -(node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if _resolve(base, modules) is None:
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                deps.add(sub if sub in modules else _resolve(base, modules))
    return deps


def import_graph(src: Path = SRC, root: str = ROOT) -> dict[str, set[str]]:
    modules = module_files(src, root)
    return {m: imports_of(m, f, modules) for m, f in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, and the self-loops
    (Tarjan's algorithm, iterative), each sorted; sorted."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph.get(v, ()):
                    out.append(sorted(comp))
    return sorted(out)


def _describe(comp: list[str], graph) -> str:
    """One circle through the component, as a -> b -> ... -> a (a shortest one from its first module)."""
    members = set(comp)
    start = comp[0]
    prev, frontier, seen = {}, [start], {start}
    while frontier:  # breadth-first back to start inside the component
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:  # v -> start closes the circle: walk back from v to start
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return " -> ".join([*reversed(path), start])
                if w not in seen:
                    seen.add(w)
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return ", ".join(comp)


def test_the_cycle_finder_finds_cycles():
    """It cannot pass vacuously: circles of every shape are found, a DAG has none."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}, "b": set()}) == [["a"]]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "e"}, "e": set()}) == [["a", "b"], ["c", "d"]]
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert _describe(["a", "b", "c"], g) == "a -> b -> c -> a"


def test_the_graph_reader_resolves_imports(tmp_path):
    """Relative imports, imports inside functions, `from package import submodule` vs
    `from package import name`, and a circle through a package's __init__."""
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from .a import A\n",
        "a.py": "import os\nA = 1\ndef f():\n    from .sub import b\n",
        "sub/__init__.py": "from .b import B\n",
        "sub/b.py": "from .. import a\nB = 2\n",
        "sub/c.py": "from . import B\n",  # a name of sub/__init__: an edge to the package
        "d.py": "import p.sub.c\nfrom p.sub import B\n",
        "e.py": "from .sub.b import B\ndef g():\n    from .e2 import x\n",
        "e2.py": "def h():\n    import p.e\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    g = import_graph(tmp_path, "p")
    assert g == {"p": {"p.a"}, "p.a": {"p.sub.b"}, "p.sub": {"p.sub.b"}, "p.sub.b": {"p.a"}, "p.sub.c": {"p.sub"},
                 "p.d": {"p.sub.c", "p.sub"}, "p.e": {"p.sub.b"} | {"p.e2"}, "p.e2": {"p.e"}}
    assert cycles(g) == [["p.a", "p.sub.b"], ["p.e", "p.e2"]]


def test_no_import_circles_in_seqmix():
    graph = import_graph()
    assert len(graph) > 50 and graph["seqmix"], "the source tree was not found"
    found = cycles(graph)
    assert not found, "import circles among the modules of src/seqmix (imports must run downward only):\n" + "\n".join(
        "  " + _describe(c, graph) for c in found)
