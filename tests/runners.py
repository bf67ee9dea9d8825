"""Running graph functions on a chosen graph runner (`executor`, `frames`, `interpreter`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradloop as gl


def run_on(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` with graphs run by the graph runner `name`; the previous runner is restored."""
    before = gl._core.graph_runner()
    gl._core.set_graph_runner(name)
    try:
        return fn(*args)
    finally:
        gl._core.set_graph_runner(before)


def staged(mode: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` run eagerly (`eager`), as a `gl.function` on graph runner `mode`, or under `gl.jit`
    (`compiled`)."""
    if mode == "eager":
        return fn
    if mode == "compiled":
        return gl.jit(fn)
    traced = gl.function(fn)
    return lambda *args: run_on(mode, traced, *args)
