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


def _stub_parameters(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args if x.arg != "self"]
    names += ["*" + a.vararg.arg] if a.vararg else []
    names += [x.arg for x in a.kwonlyargs]
    return names + (["**" + a.kwarg.arg] if a.kwarg else [])


def _real_parameters(obj) -> list[str] | None:
    """The parameters the binding declares (pyo3's text signature), or None without one."""
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return None
    marks = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [marks.get(p.kind, "") + p.name for p in params if p.name not in ("self", "$self")]


def test_stub_signatures_name_the_bindings_parameters():
    # Operators' slot wrappers take generic names (`value`): only named functions and methods.
    tree = ast.parse(STUB.read_text())
    pairs = [(node.name, node, core) for node in tree.body if isinstance(node, ast.FunctionDef)]
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        owner = getattr(core, cls.name)
        pairs += [
            (f"{cls.name}.{m.name}", m, owner)
            for m in cls.body
            if isinstance(m, ast.FunctionDef) and not m.name.startswith("__")
        ]
    checked = 0
    for name, node, owner in pairs:
        real = _real_parameters(getattr(owner, node.name.split(".")[-1]))
        if real is None or not hasattr(owner, node.name):
            continue
        checked += 1
        assert _stub_parameters(node) == real, f"{name}: stub {_stub_parameters(node)}"
    assert checked > 150, f"only {checked} signatures compared"


def test_every_public_function_of_the_stub_has_a_docstring():
    # The API reference is generated from them; `tools/stub_docs.py` copies the bindings' own.
    tree = ast.parse(STUB.read_text())
    bare = [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and not node.name.startswith("_")
        and ast.get_docstring(node) is None
    ]
    assert bare == [], "run tools/stub_docs.py"
