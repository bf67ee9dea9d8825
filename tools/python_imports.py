"""The import graph of the Python package (`py/gradloop`), and a ratchet on its cycles.

`python tools/python_imports.py` prints each module's imports and the cycles among them.
`--check` (run by `make lint`) fails on a cycle that `KNOWN_CYCLES` does not list, and on a
listed one that is gone. Imports inside functions count (they only defer a cycle; they do not
break it); imports under `if TYPE_CHECKING:` do not (they are annotations).
"""

from __future__ import annotations

import ast
import pathlib
import sys

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "py" / "gradloop"

#: Cycles today, each a set of modules: debts, to be removed, never added to. A construct
#: inside `vmap` dispatches to `batching`, which traces the construct's branches and bodies
#: with `control_flow`'s helpers.
KNOWN_CYCLES: list[set[str]] = [{"batching", "control_flow"}]


def _name(path: pathlib.Path, package: pathlib.Path) -> str:
    parts = list(path.relative_to(package).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(package: pathlib.Path) -> set[str]:
    found = {_name(p, package) for p in package.rglob("*.py")}
    return found | {_name(p, package) for p in package.rglob("*.pyi")}


class _Imports(ast.NodeVisitor):
    """The modules of the package a file imports, relative imports only."""

    def __init__(self, here: list[str], modules: set[str]) -> None:
        self.here, self.modules, self.found = here, modules, set[str]()

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0:
            return
        base = self.here[: len(self.here) - (node.level - 1)]
        target = ".".join([*base, *([node.module] if node.module else [])])
        for alias in node.names:
            item = f"{target}.{alias.name}".strip(".")
            self.found.add(item if item in self.modules else target)


def edges(package: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    modules = _modules(package)
    graph: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        name = _name(path, package)
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        visitor = _Imports([p for p in here if p], modules)
        visitor.visit(ast.parse(path.read_text()))
        graph[name] = {m for m in visitor.found if m in modules and m not in ("", name)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def problems(package: pathlib.Path = PACKAGE) -> list[str]:
    found = cycles(edges(package))
    out = [f"new import cycle: {sorted(c)}" for c in found if c not in KNOWN_CYCLES]
    out += [
        f"{sorted(c)} is gone: delete it from KNOWN_CYCLES" for c in KNOWN_CYCLES if c not in found
    ]
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        found = problems()
        for line in found:
            print(f"python_imports: {line}")
        return 1 if found else 0
    graph = edges()
    for m in sorted(graph):
        print(f"{m:22} -> {', '.join(sorted(graph[m])) or '-'}")
    for c in cycles(graph):
        print(f"cycle: {sorted(c)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
