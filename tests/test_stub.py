"""The `_core.pyi` stub stays in step with the extension: same public names, same members."""

import ast
import inspect
from pathlib import Path

import gradloop._core as core

STUB = Path(core.__file__).with_name("_core.pyi")


def _stub_names():
    tree = ast.parse(STUB.read_text())
    names, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names, classes


def test_every_public_name_of_the_extension_is_in_the_stub_and_back():
    names, _ = _stub_names()
    public = {n for n in dir(core) if not n.startswith("_")}
    assert public - names == set(), "missing from _core.pyi"
    assert names - public - {"TensorLike"} == set(), "in _core.pyi but not in the extension"


def test_stub_classes_list_real_members():
    _, classes = _stub_names()
    for cls_name, members in classes.items():
        cls = getattr(core, cls_name)
        for member in members:
            assert hasattr(cls, member), f"{cls_name}.{member} is in the stub only"
        real = {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")}
        assert real - members == set(), f"{cls_name} members missing from the stub"
