"""The import graph of the Rust core's top-level modules (`rust/core/src`), and a ratchet on its
cycles.

`python tools/module_graph.py` prints each module's dependencies, the layer order the core
follows and every edge that points up it. `--check` (run by `make lint`) fails when an edge
points up the order that `KNOWN_UPWARD` does not list (it lists none: the core is acyclic), so
new code may not add a cycle. Test modules, and helpers a module declares under `#[cfg(test)]`,
are skipped.
"""

from __future__ import annotations

import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "rust" / "core" / "src"

#: The layering, leaves first: a module may use those before it (and its own layer).
LAYERS: list[set[str]] = [
    {"error", "dtype", "location", "shape", "tensor", "value"},
    {"emit"},
    {"ops"},
    {"tape"},
    {"forward"},
    {"graph", "runtime_values"},
    {"passes"},
    {"dataflow"},
    {"trace"},
    {"interpret", "mlir", "runtime", "executor"},
    {"control"},
]

#: Edges that point up the layers today: debts, each to be removed, never added to.
KNOWN_UPWARD: set[tuple[str, str]] = set()

_USE = re.compile(r"\bcrate::([a-z_]+)|\bsuper::super::([a-z_]+)")


def modules() -> list[str]:
    return sorted(
        p.stem if p.is_file() else p.name
        for p in SRC.iterdir()
        if (p.suffix == ".rs" and p.stem not in {"lib"} and not p.stem.endswith("_tests"))
        or (p.is_dir())
    )


def _files(module: str) -> list[pathlib.Path]:
    path = SRC / module
    if path.is_dir():
        return [f for f in sorted(path.rglob("*.rs")) if not _is_test(f)]
    return [SRC / f"{module}.rs"]


_TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod ([a-z_]+);")


def _is_test(f: pathlib.Path) -> bool:
    """A test file by its name, or one its parent declares under `#[cfg(test)]` (helpers)."""
    if f.stem == "tests" or f.stem.endswith("_tests") or "tests" in f.parts[-2:-1]:
        return True
    parent = f.parent / "mod.rs"
    return parent.exists() and f.stem in _TEST_MOD.findall(parent.read_text())


_COMMENT = re.compile(r"//.*")


def _strip_tests(text: str) -> str:
    """The code before a `#[cfg(test)]` module (tests may use anything), comments removed (a
    doc comment naming a module is no dependency)."""
    return _COMMENT.sub("", text.split("#[cfg(test)]")[0])


def edges() -> dict[str, set[str]]:
    names = set(modules())
    graph: dict[str, set[str]] = {m: set() for m in names}
    for m in names:
        for f in _files(m):
            text = _strip_tests(f.read_text())
            for a, b in _USE.findall(text):
                target = a or b
                if target in names and target != m:
                    graph[m].add(target)
    return graph


def layer(module: str) -> int:
    for k, members in enumerate(LAYERS):
        if module in members:
            return k
    raise SystemExit(f"module {module!r} is in no layer of tools/module_graph.py: add it")


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(m, d) for m, ds in graph.items() for d in ds if layer(d) > layer(m)}


def main(argv: list[str]) -> int:
    graph = edges()
    up = upward(graph)
    if "--check" in argv:
        new = sorted(up - KNOWN_UPWARD)
        gone = sorted(KNOWN_UPWARD - up)
        for m, d in new:
            print(f"module_graph: new edge {m} -> {d} points up the layers (a cycle in the core)")
        for m, d in gone:
            print(f"module_graph: {m} -> {d} is gone: delete it from KNOWN_UPWARD")
        return 1 if new or gone else 0
    print("layers (leaves first):", " <- ".join("/".join(sorted(s)) for s in LAYERS))
    for m in sorted(graph, key=lambda m: (layer(m), m)):
        print(f"{m:10} -> {', '.join(sorted(graph[m])) or '-'}")
    print(f"{len(up)} edges point up the layers:")
    for m, d in sorted(up):
        print(f"  {m} -> {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
