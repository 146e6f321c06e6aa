"""The import graph of the packages, from their source (module-level and deferred imports
alike: a deferred import that closes a circle is still a circle). mofa/ must have none:
cli.py builds the parser from the command modules, and no command imports cli.py."""

import ast
from pathlib import Path


from conftest import ROOT

PACKAGES = ("costmodel", "optimizer", "calibration", "mofa")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    edges = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                # `from pkg import mod` imports the submodule pkg.mod when there is one
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            edges[name] |= {t for t in targets if t in known and t != name}
    return edges


def cycles(edges: dict[str, set[str]], within: str = "") -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    nodes = [n for n in edges if n.startswith(within)]
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if not w.startswith(within):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_imports():
    edges = graph()
    assert "mofa.commands.solve" in edges["mofa.commands"]
    assert "mofa.commands" in edges["mofa.cli"]
    assert "costmodel.loader" in edges["mofa.commands.evaluate"]


def test_no_import_cycle_in_mofa():
    edges = graph()
    assert cycles(edges, "mofa") == []
    assert not any("mofa.cli" in edges[m] for m in edges if m.startswith("mofa.commands"))


def test_no_import_cycle_in_the_packages():
    assert cycles(graph()) == []
