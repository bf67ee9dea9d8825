"""The Rust core's import graph: no edge may point up its layers (`tools/module_graph.py`), so
the core stays acyclic; and the Python package's, whose cycles are a ratchet
(`tools/python_imports.py`)."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))

import module_graph
import python_imports


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


LAYERS = [{"low"}, {"mid_a", "mid_b"}, {"high"}]


def plant(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    """A source tree of the modules `low`, `mid_a`, `mid_b`, `high` with these files."""
    for name in ("low.rs", "mid_a.rs", "mid_b.rs", "high.rs"):
        (tmp_path / name).write_text("pub fn f() {}\n")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def found(src: pathlib.Path) -> set[tuple[str, str]]:
    return module_graph.upward(module_graph.edges(src), LAYERS)


def test_an_edge_after_a_test_module_is_found(tmp_path: pathlib.Path) -> None:
    mod = "#[cfg(test)]\nmod tests;\n\nuse crate::high::f;\npub mod inner;\n"
    src = plant(tmp_path, {"low.rs": "", "low/mod.rs": mod, "low/inner.rs": ""})
    (tmp_path / "low.rs").unlink()
    assert found(src) == {("low", "high")}


def test_grouped_and_nested_paths_are_found(tmp_path: pathlib.Path) -> None:
    grouped = "use crate::{low::f, high::{g, h}};\n"
    nested = "fn k() { super::super::high::f() }\n"
    src = plant(tmp_path, {"mid_a.rs": grouped, "mid_b/mod.rs": "mod x;", "mid_b/x.rs": nested})
    (tmp_path / "mid_b.rs").unlink()
    assert found(src) == {("mid_a", "high"), ("mid_b", "high")}


def test_a_cycle_within_a_layer_is_found(tmp_path: pathlib.Path) -> None:
    src = plant(tmp_path, {"mid_a.rs": "use crate::mid_b;\n", "mid_b.rs": "use crate::mid_a;\n"})
    graph = module_graph.edges(src)
    assert found(src) == set()
    assert module_graph.cycles_within_layers(graph, LAYERS) == [["mid_a", "mid_b", "mid_a"]]


def test_the_executor_s_files_form_no_cycle() -> None:
    graph = module_graph.submodule_edges("executor")
    assert "executor/frame/steps" in graph and "executor/frame/native/emit" in graph
    assert module_graph.cycles(graph) == []
    # the tiers in order: each knows only what it is compiled from and what it runs below it
    assert "executor/frame" not in graph["executor/frame/registers"]
    assert "executor/frame/buffers" not in graph["executor/frame/steps"]
    assert "executor/frame/native" not in graph["executor/frame/native/emit"]


def test_a_child_reaching_into_its_parent_is_a_cycle(tmp_path: pathlib.Path) -> None:
    files = {
        "ex/mod.rs": "mod frame;\nmod leaf;\nuse frame::Loop;\npub(crate) fn count() {}\n",
        "ex/leaf.rs": "pub struct Leaf;\n",
        "ex/frame/mod.rs": "mod steps;\nuse steps::{Step, more::X};\npub struct Loop;\n",
        "ex/frame/steps.rs": "use crate::ex::leaf::Leaf;\nfn f() { super::super::count() }\n",
    }
    src = plant(tmp_path, files)
    graph = module_graph.submodule_edges("ex", src)
    assert graph["ex"] == {"ex/frame"}
    assert graph["ex/frame"] == {"ex/frame/steps"}
    assert graph["ex/frame/steps"] == {"ex/leaf", "ex"}
    assert module_graph.cycles(graph) == [["ex", "ex/frame", "ex/frame/steps", "ex"]]


def test_tests_comments_and_strings_are_no_edges(tmp_path: pathlib.Path) -> None:
    text = (
        "// crate::high in a comment\n"
        'const S: &str = "crate::high";\n'
        "#[cfg(test)]\nmod tests {\n    use crate::high;\n    fn t() { let _ = '{'; }\n}\n"
        "#[cfg(test)]\nfn helper() { crate::high::f() }\n"
        "#[cfg(test)]\nmod support;\n"
        "pub fn kept() { crate::mid_a::f() }\n"
    )
    src = plant(tmp_path, {"low/mod.rs": text, "low/support.rs": "use crate::high;\n"})
    (tmp_path / "low.rs").unlink()
    assert module_graph.edges(src)["low"] == {"mid_a"}
    assert found(src) == {("low", "mid_a")}


def test_the_core_has_no_cycle_within_a_layer() -> None:
    assert module_graph.cycles_within_layers(module_graph.edges()) == []


def test_modules_only_tests_compile_are_not_layered(tmp_path: pathlib.Path) -> None:
    lib = "pub mod low;\n#[cfg(test)]\npub(crate) mod testing;\n"
    src = plant(tmp_path, {"lib.rs": lib, "testing/mod.rs": "use crate::high;\n"})
    assert "testing" not in module_graph.modules(src)
    assert found(src) == set()


def test_the_python_package_has_only_its_known_import_cycles() -> None:
    assert python_imports.problems() == []
    graph = python_imports.edges()
    # the hooks both modes share sit below both: reverse mode, forward mode and Variables
    # import in one direction
    assert graph["_recording"] <= {"_core"}
    assert not graph["_custom_ops"] & {"autodiff", "forward", "variables"}
    assert not graph["variables"] & {"autodiff", "forward"}
    assert not graph["autodiff"] & {"forward", "variables"}


def test_a_python_import_cycle_is_found(tmp_path: pathlib.Path) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import g\n")
    (tmp_path / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    assert python_imports.cycles(python_imports.edges(tmp_path)) == [{"a", "b"}]
