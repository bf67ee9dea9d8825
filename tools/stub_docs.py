"""Gives each function of `py/gradloop/_core.pyi` that has no docstring the docstring its binding
has at run time (the Rust doc comment pyo3 exposes), so that the API reference documents it.
Run after adding ops to the extension: `python tools/stub_docs.py` (the built extension must be
importable); `tests/test_stub.py` checks that no public function of the stub lacks a docstring.
"""

from __future__ import annotations

import ast
import pathlib
import textwrap

import gradloop._core as core

STUB = pathlib.Path(core.__file__).with_name("_core.pyi")


def with_docstrings(text: str) -> str:
    """`text` with a docstring after each top-level one-line `def ...: ...` that lacks one."""
    lines = text.split("\n")
    tree = ast.parse(text)
    # From the bottom up, so that earlier line numbers stay right.
    for node in sorted(tree.body, key=lambda n: n.lineno, reverse=True):
        if not isinstance(node, ast.FunctionDef) or ast.get_docstring(node) is not None:
            continue
        doc = getattr(getattr(core, node.name, None), "__doc__", None)
        last = node.end_lineno
        assert last is not None
        line = lines[last - 1]
        if not doc or not line.endswith(": ..."):
            continue
        wrapped = textwrap.fill(f'"""{doc.strip()}"""', width=96, break_long_words=False)
        body = textwrap.indent(wrapped, "    ")
        lines[last - 1 : last] = [line.removesuffix(" ..."), body]
    return "\n".join(lines)


if __name__ == "__main__":
    STUB.write_text(with_docstrings(STUB.read_text()))
