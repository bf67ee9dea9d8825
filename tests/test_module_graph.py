"""The Rust core's import graph: no edge may point up its layers (`tools/module_graph.py`), so
the core stays acyclic."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))

import module_graph


def test_no_edge_points_up_the_layers() -> None:
    up = module_graph.upward(module_graph.edges())
    assert up - module_graph.KNOWN_UPWARD == set(), "a new cycle in the core"
    assert module_graph.KNOWN_UPWARD - up == set(), "a debt was paid: delete it from the list"
    assert not module_graph.KNOWN_UPWARD, "the core is acyclic: keep it so"


def test_every_module_has_a_layer() -> None:
    for m in module_graph.modules():
        module_graph.layer(m)


def test_an_upward_edge_is_found() -> None:
    graph = {"dtype": {"error"}, "error": set(), "ops": {"mlir"}, "mlir": {"ops"}}
    assert module_graph.upward(graph) == {("ops", "mlir")}
