"""The import graph of the Rust core's top-level modules (`rust/core/src`), and a ratchet on its
cycles.

`python tools/module_graph.py` prints each module's dependencies, the layer order the core
follows, every edge that points up it and every cycle inside one layer. `--check` (run by
`make lint`) fails on an edge up the order that `KNOWN_UPWARD` does not list (it lists none: the
core is acyclic) and on any cycle within a layer, so new code may not add a cycle.

What counts as a dependency: a path `crate::a...`, a group `crate::{a, b::c}`, or
`super::super::a` from a module's subfolder, anywhere in a module's files (not only in `use`
lines), with comments and string literals blanked first. Items under `#[cfg(test)]` (test
modules, test helpers, a test function), wherever they sit in a file, and files only tests
declare are skipped: tests may use anything.

Inside the modules of `ACYCLIC_WITHIN` the same holds file by file: `--within executor` draws
the graph of the executor's files (a folder's `mod.rs` stands for the folder), and `--check`
fails on any cycle among them, a parent that a child reaches back into included.
"""

from __future__ import annotations

import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "rust" / "core" / "src"

#: The layering, leaves first: a module may use those before it (and its own layer, without a
#: cycle).
LAYERS: list[set[str]] = [
    {"error", "dtype", "location", "memory", "pool", "shape", "subnormals", "tensor", "value"},
    {"emit"},
    {"ops"},
    {"tape"},
    {"forward"},
    {"graph", "runtime_values"},
    {"passes"},
    {"dataflow"},
    {"trace"},
    {"batch"},
    {"interpret", "mlir", "front_end", "executor"},
    {"control"},
    {"import"},
]

#: Edges that point up the layers today: debts, each to be removed, never added to.
KNOWN_UPWARD: set[tuple[str, str]] = set()

#: Top-level modules whose own files form no cycle.
ACYCLIC_WITHIN = ("executor",)


def modules(src: pathlib.Path = SRC) -> list[str]:
    """The top-level modules, less those `lib.rs` compiles only for tests (`testing`)."""
    lib = src / "lib.rs"
    only_tests = set(_TEST_MOD.findall(_code(lib.read_text()))) if lib.exists() else set()
    names = {
        p.stem if p.is_file() else p.name
        for p in src.iterdir()
        if (p.suffix == ".rs" and p.stem != "lib" and not p.stem.endswith("_tests")) or p.is_dir()
    }
    return sorted(names - only_tests)


def _files(module: str, src: pathlib.Path) -> list[pathlib.Path]:
    path = src / module
    if path.is_dir():
        return [f for f in sorted(path.rglob("*.rs")) if not _is_test(f)]
    return [src / f"{module}.rs"]


_TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*;")


def _is_test(f: pathlib.Path) -> bool:
    """A test file by its name, or one its parent module declares under `#[cfg(test)]`."""
    if f.stem == "tests" or f.stem.endswith("_tests") or "tests" in f.parts[-2:-1]:
        return True
    parents = [f.parent / "mod.rs", f.parent.with_suffix(".rs")]
    return any(p.exists() and f.stem in _TEST_MOD.findall(_code(p.read_text())) for p in parents)


# Comments and string and char literals: blanked before scanning, so that neither a brace nor
# a path inside them counts. (Lifetimes such as `'a` are not char literals: no closing quote.)
_NOISE = re.compile(
    r"//[^\n]*|/\*.*?\*/|r(#*)\".*?\"\1|b?\"(?:\\.|[^\"\\])*\"|b?'(?:\\.|[^'\\])'", re.S
)


def _code(text: str) -> str:
    return _NOISE.sub(" ", text)


_CFG_TEST = re.compile(r"#\[cfg\(test\)\]")


def _item_end(code: str, k: int) -> int:
    """Where the item starting at `k` ends: after its `;`, or after the brace closing its
    body."""
    depth = 0
    while k < len(code):
        c = code[k]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return k + 1
        elif c == ";" and depth == 0:
            return k + 1
        k += 1
    return k


def strip_tests(text: str) -> str:
    """The code of a file without comments, literals and `#[cfg(test)]` items."""
    code = _code(text)
    kept, at = [], 0
    for m in _CFG_TEST.finditer(code):
        if m.start() < at:
            continue  # inside an item already skipped
        kept.append(code[at : m.start()])
        at = _item_end(code, m.end())
    kept.append(code[at:])
    return "".join(kept)


_PATH = re.compile(r"\b(?:crate|super::super)::(\{|[a-z_][a-z0-9_]*)")


def _group_heads(code: str, brace: int) -> list[str]:
    """The first segment of each path of the `{...}` group opening at `brace`."""
    heads, depth, start = [], 0, brace + 1
    for k in range(brace, len(code)):
        c = code[k]
        depth += (c == "{") - (c == "}")
        if (c == "," and depth == 1) or depth == 0:
            head = re.match(r"\s*([a-z_][a-z0-9_]*)", code[start:k])
            if head:
                heads.append(head.group(1))
            start = k + 1
            if depth == 0:
                break
    return heads


def uses(code: str) -> set[str]:
    """The top-level modules that `code` names."""
    found: set[str] = set()
    for m in _PATH.finditer(code):
        if m.group(1) == "{":
            found.update(_group_heads(code, m.end() - 1))
        else:
            found.add(m.group(1))
    return found


def edges(src: pathlib.Path = SRC) -> dict[str, set[str]]:
    names = set(modules(src))
    graph: dict[str, set[str]] = {m: set() for m in names}
    for m in names:
        for f in _files(m, src):
            graph[m] |= {d for d in uses(strip_tests(f.read_text())) if d in names and d != m}
    return graph


def layer(module: str, layers: list[set[str]] = LAYERS) -> int:
    for k, members in enumerate(layers):
        if module in members:
            return k
    raise SystemExit(f"module {module!r} is in no layer of tools/module_graph.py: add it")


def upward(graph: dict[str, set[str]], layers: list[set[str]] = LAYERS) -> set[tuple[str, str]]:
    return {(m, d) for m, ds in graph.items() for d in ds if layer(d, layers) > layer(m, layers)}


def cycles_within_layers(
    graph: dict[str, set[str]], layers: list[set[str]] = LAYERS
) -> list[list[str]]:
    """Each cycle among modules of one layer, as a path that returns to its first module."""
    found: list[list[str]] = []
    for members in layers:
        sub = {m: sorted(graph.get(m, set()) & members) for m in sorted(members)}
        done: set[str] = set()
        for start in sub:
            stack, path = [(start, iter(sub[start]))], [start]
            while stack:
                node, children = stack[-1]
                child = next(children, None)
                if child is None:
                    stack.pop()
                    path.pop()
                    done.add(node)
                elif child in path:
                    cycle = [*path[path.index(child) :], child]
                    if sorted(cycle[:-1]) not in [sorted(c[:-1]) for c in found]:
                        found.append(cycle)
                elif child not in done:
                    stack.append((child, iter(sub[child])))
                    path.append(child)
    return found


def _module_path(f: pathlib.Path, root: pathlib.Path) -> tuple[str, ...]:
    """`f`'s module path below `root` (`frame/mod.rs` is `("frame",)`; `root/mod.rs` is `()`)."""
    parts = f.relative_to(root).with_suffix("").parts
    return parts[:-1] if parts[-1] == "mod" else parts


_SUB_PATH = re.compile(r"\b((?:super::)+|self::|crate::([a-z_][a-z0-9_]*)::|([a-z_][a-z0-9_]*)::)")
_SEGMENTS = re.compile(r"\s*(\{|[a-z_][a-z0-9_]*)(?:\s*::\s*)?")
_CHILD_MOD = re.compile(r"\bmod\s+([a-z_][a-z0-9_]*)\s*;")


def _paths_at(code: str, k: int) -> list[list[str]]:
    """The module-like paths that start at `k` (after a prefix): a group's each, up to three
    segments."""
    out: list[list[str]] = []
    segments: list[str] = []
    while len(segments) < 3:
        m = _SEGMENTS.match(code, k)
        if not m:
            break
        if m.group(1) == "{":
            depth, start = 0, m.end() - 1
            for j in range(start, len(code)):
                depth += (code[j] == "{") - (code[j] == "}")
                if (code[j] == "," and depth == 1) or depth == 0:
                    for tail in _paths_at(code[:j] + ";", start + 1) or [[]]:
                        out.append(segments + tail)
                    start = j
                    if depth == 0:
                        break
            return out
        segments.append(m.group(1))
        k = m.end()
        if not code[m.start() : m.end()].rstrip().endswith("::"):
            break
    return [segments]


def submodule_edges(module: str, src: pathlib.Path = SRC) -> dict[str, set[str]]:
    """The graph of `module`'s own files: each file (a folder's `mod.rs` named for the folder)
    to those whose items it names."""
    root = src / module
    files = [f for f in sorted(root.rglob("*.rs")) if not _is_test(f)]
    known = {_module_path(f, root) for f in files}
    name = lambda path: "/".join((module, *path))  # noqa: E731
    graph: dict[str, set[str]] = {name(p): set() for p in known}

    def resolve(path: tuple[str, ...]) -> tuple[str, ...] | None:
        for n in range(len(path), -1, -1):
            if path[:n] in known:
                return path[:n]
        return None

    for f in files:
        own = _module_path(f, root)
        code = strip_tests(f.read_text())
        children = set(_CHILD_MOD.findall(code))
        for m in _SUB_PATH.finditer(code):
            prefix, crate_head, bare = m.group(1), m.group(2), m.group(3)
            if prefix.startswith("super"):
                base = own[: max(len(own) - prefix.count("super"), 0)]
            elif prefix == "self::":
                base = own
            elif crate_head is not None:
                if crate_head != module:
                    continue
                base = ()
            elif bare in children:
                base = (*own, bare)
            else:
                continue
            for tail in _paths_at(code, m.end()) or [[]]:
                target = resolve((*base, *tail))
                if target is not None and target != own:
                    graph[name(own)].add(name(target))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle of `graph`, as a path that returns to its first node."""
    return cycles_within_layers(graph, [set(graph)])


def problems(src: pathlib.Path = SRC, layers: list[set[str]] = LAYERS) -> list[str]:
    """What `--check` reports: new upward edges, paid debts still listed, same-layer cycles."""
    graph = edges(src)
    up = upward(graph, layers)
    out = [
        f"new edge {m} -> {d} points up the layers (a cycle in the core)"
        for m, d in sorted(up - KNOWN_UPWARD)
    ]
    gone = sorted(KNOWN_UPWARD - up)
    out += [f"{m} -> {d} is gone: delete it from KNOWN_UPWARD" for m, d in gone]
    out += [f"cycle within a layer: {' -> '.join(c)}" for c in cycles_within_layers(graph, layers)]
    for module in ACYCLIC_WITHIN:
        out += [
            f"cycle among {module}'s files: {' -> '.join(c)}"
            for c in cycles(submodule_edges(module, src))
        ]
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        found = problems()
        for line in found:
            print(f"module_graph: {line}")
        return 1 if found else 0
    if "--within" in argv:
        module = argv[argv.index("--within") + 1]
        graph = submodule_edges(module)
        for m in sorted(graph):
            print(f"{m:32} -> {', '.join(sorted(graph[m])) or '-'}")
        for c in cycles(graph):
            print(f"cycle: {' -> '.join(c)}")
        return 0
    graph = edges()
    up = upward(graph)
    print("layers (leaves first):", " <- ".join("/".join(sorted(s)) for s in LAYERS))
    for m in sorted(graph, key=lambda m: (layer(m), m)):
        print(f"{m:14} -> {', '.join(sorted(graph[m])) or '-'}")
    print(f"{len(up)} edges point up the layers:")
    for m, d in sorted(up):
        print(f"  {m} -> {d}")
    for c in cycles_within_layers(graph):
        print(f"cycle within a layer: {' -> '.join(c)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
