"""Nested structures of leaves: tuples, lists, namedtuples and dicts (as in TensorFlow's `nest`).

A *structure* is a leaf or a tuple/list/namedtuple/dict of structures; anything else (tensors,
Variables, numbers, None) is a leaf. Dicts are flattened in sorted-key order, as JAX and
TensorFlow do, so two dicts with the same keys flatten alike whatever their insertion order.

Paths name a leaf's position for error messages: `[1]['b']` is key `'b'` of the second item;
a namedtuple field is `.name`. The empty path (the structure itself) prints as `<root>`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import errors

__all__ = [
    "assert_same_structure",
    "flatten",
    "flatten_with_paths",
    "format_structure",
    "is_nested",
    "map_structure",
    "pack_sequence_as",
    "path_str",
    "structure_difference",
    "unflatten",
]


def is_nested(x: Any) -> bool:
    """True for tuples (namedtuples included), lists and dicts."""
    return isinstance(x, (tuple, list, dict))


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _sorted_keys(d: dict[Any, Any]) -> list[Any]:
    try:
        return sorted(d)
    except TypeError as e:
        # Without an order the flattening of two equal dicts could differ.
        raise errors.InvalidArgumentError(
            f"nest only supports dicts with sortable keys; got keys {list(d)!r}"
        ) from e


def _children(x: Any) -> list[tuple[str, Any]]:
    """(path component, child) pairs of a nested value, in flattening order."""
    if isinstance(x, dict):
        return [(f"[{k!r}]", x[k]) for k in _sorted_keys(x)]
    if _is_namedtuple(x):
        return [(f".{name}", v) for name, v in zip(type(x)._fields, x, strict=True)]
    return [(f"[{i}]", v) for i, v in enumerate(x)]


def _rebuild(like: Any, values: list[Any]) -> Any:
    """A value of `like`'s type holding `values` (in flattening order)."""
    if isinstance(like, dict):
        by_key = dict(zip(_sorted_keys(like), values, strict=True))
        # Keep the original key order (and dict subclass) for the user's benefit.
        return type(like)((k, by_key[k]) for k in like)
    if _is_namedtuple(like):
        return type(like)(*values)
    if isinstance(like, list):
        return values if type(like) is list else type(like)(values)
    return tuple(values)


def _values(x: Any) -> list[Any]:
    """The children of a nested value, in flattening order (`_children` without the paths)."""
    if isinstance(x, dict):
        return [x[k] for k in _sorted_keys(x)]
    return list(x)


def _leaves(structure: Any, out: list[Any]) -> list[Any]:
    if not is_nested(structure):
        out.append(structure)
    else:
        for child in _values(structure):
            _leaves(child, out)
    return out


def _walk(structure: Any, path: str) -> Iterator[tuple[str, Any]]:
    if not is_nested(structure):
        yield path, structure
        return
    for part, child in _children(structure):
        yield from _walk(child, path + part)


def path_str(path: str) -> str:
    """A path for messages: `<root>` for the structure itself."""
    return path or "<root>"


def flatten(structure: Any) -> list[Any]:
    """The leaves of `structure`, depth first, dicts in sorted-key order."""
    return _leaves(structure, [])


def flatten_with_paths(structure: Any) -> list[tuple[str, Any]]:
    """(path, leaf) pairs of `structure`, in `flatten` order."""
    return list(_walk(structure, ""))


def _pack(structure: Any, flat: Sequence[Any], start: int) -> tuple[Any, int]:
    if not is_nested(structure):
        return flat[start], start + 1
    values = []
    for child in _values(structure):
        value, start = _pack(child, flat, start)
        values.append(value)
    return _rebuild(structure, values), start


def pack_sequence_as(structure: Any, flat_sequence: Sequence[Any]) -> Any:
    """The inverse of `flatten`: `flat_sequence`'s items placed in `structure`'s shape."""
    flat_sequence = list(flat_sequence)
    n = len(flatten(structure))
    if n != len(flat_sequence):
        raise errors.InvalidArgumentError(
            f"pack_sequence_as: the structure has {n} leaves but {len(flat_sequence)} values "
            "were given"
        )
    return _pack(structure, flat_sequence, 0)[0]


def unflatten(structure: Any, leaves: Sequence[Any]) -> Any:
    """Alias of `pack_sequence_as(structure, leaves)`."""
    return pack_sequence_as(structure, leaves)


def _kind(x: Any) -> str:
    if isinstance(x, dict):
        return f"a dict with keys {_sorted_keys(x)!r}"
    if _is_namedtuple(x):
        return f"a {type(x).__name__} namedtuple"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)} items"
    return f"a leaf ({type(x).__name__})"


def _same_node(a: Any, b: Any, check_types: bool) -> bool:
    """Whether the top levels of `a` and `b` match (their children are compared separately)."""
    if is_nested(a) != is_nested(b) or isinstance(a, dict) != isinstance(b, dict):
        return False
    if not is_nested(a):
        return True
    if isinstance(a, dict):
        return _sorted_keys(a) == _sorted_keys(b)
    if check_types and type(a) is not type(b):
        return False
    return len(a) == len(b)


def _difference(a: Any, b: Any, path: str, check_types: bool) -> tuple[str, str, str] | None:
    if not _same_node(a, b, check_types):
        return path, _kind(a), _kind(b)
    if not is_nested(a):
        return None
    for (part, ca), (_, cb) in zip(_children(a), _children(b), strict=True):
        found_child = _difference(ca, cb, path + part, check_types)
        if found_child is not None:
            return found_child
    return None


def structure_difference(a: Any, b: Any, check_types: bool = True) -> tuple[str, str, str] | None:
    """The first place where `a` and `b` differ, as `(path, what a has there, what b has)`.

    Leaves match any leaf. With `check_types=False` any two sequences (tuple, list, namedtuple)
    of the same length match; dicts must have the same keys either way.
    """
    return _difference(a, b, "", check_types)


def assert_same_structure(a: Any, b: Any, check_types: bool = True) -> None:
    """Raises `errors.InvalidArgumentError` naming the first path where `a` and `b` differ."""
    found = structure_difference(a, b, check_types)
    if found is not None:
        path, in_a, in_b = found
        raise errors.InvalidArgumentError(
            f"the structures differ at {path_str(path)}: {in_a} vs {in_b}"
        )


def map_structure(fn: Callable[..., Any], *structures: Any, check_types: bool = True) -> Any:
    """`fn` applied leaf-wise to structures of the same shape; the result has the first's shape."""
    if not structures:
        raise errors.InvalidArgumentError("map_structure needs at least one structure")
    for other in structures[1:]:
        assert_same_structure(structures[0], other, check_types)
    columns = zip(*(flatten(s) for s in structures), strict=True)
    return pack_sequence_as(structures[0], [fn(*leaves) for leaves in columns])


def format_structure(structure: Any, leaf: Callable[[Any], str]) -> str:
    """A compact text form of `structure` with each leaf printed by `leaf`, for messages."""
    if not is_nested(structure):
        return leaf(structure)
    if isinstance(structure, dict):
        inner = ", ".join(f"{k!r}: {format_structure(structure[k], leaf)}" for k in structure)
        return "{" + inner + "}"
    items = [format_structure(v, leaf) for v in structure]
    if _is_namedtuple(structure):
        fields = ", ".join(f"{n}={v}" for n, v in zip(type(structure)._fields, items, strict=True))
        return f"{type(structure).__name__}({fields})"
    if isinstance(structure, list):
        return "[" + ", ".join(items) + "]"
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
