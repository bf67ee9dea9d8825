"""Staging on the driver: each item's arguments checked and flattened, and one payload per
input signature of the function (a compiled module or a graph), made once and cached."""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core, _runtime, _validate, compiled, errors, nest
from ..function import Function
from ._worker import CompiledPayload, GraphPayload

_keys = itertools.count()


class Refused(Exception):
    """The function cannot be mapped at all (not one item's failure): `map` raises `error`
    whatever its `errors` says."""

    def __init__(self, error: errors.GradloopError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class Signature:
    """One input signature of a staged function: its payload (`key` names it to the actors)
    and how to rebuild the outputs."""

    key: str
    payload: CompiledPayload | GraphPayload
    entry: Any  # function._Concrete: the traced signature and its output structure


#: Signatures staged per function (by the identity of its trace), kept while it lives.
_staged: weakref.WeakKeyDictionary[Any, dict[int, Signature]] = weakref.WeakKeyDictionary()


def function_of(fn: Any) -> Function:
    """The traced function of `fn`, or a typed error before anything is sent."""
    if isinstance(fn, compiled.Jit):
        return fn._function
    if isinstance(fn, Function):
        return fn
    what = "a Python function" if callable(fn) else f"a {type(fn).__name__}"
    raise errors.InvalidArgumentTypeError(
        _validate.at_user(
            f"gl.distributed needs a staged function, gl.jit(fn) (it travels as a compiled "
            f"module) or gl.function(fn) (as a graph); got {what}"
        )
    )


def _leaf(leaf: Any, index: int, path: str) -> _core.Tensor:
    if isinstance(leaf, _core.Tensor):
        if leaf.is_symbolic:
            raise errors.InvalidArgumentError(
                _validate.at_user(f"item {index}, {path}: a symbolic tensor has no values")
            )
        return leaf
    if isinstance(leaf, (np.ndarray, np.generic)) and leaf.dtype != object:
        return _core.tensor(np.asarray(leaf))
    hint = (
        " (Python numbers are static values: each would trace and compile its own function; "
        "pass gl.tensor(x) or np.float64(x))"
        if isinstance(leaf, (bool, int, float))
        else ""
    )
    raise errors.InvalidArgumentTypeError(
        _validate.at_user(
            f"item {index}, {path}: arguments must be tensors or numpy arrays, not "
            f"{type(leaf).__name__}{hint}"
        )
    )


def arguments(item: Any, index: int) -> tuple[Any, ...]:
    """`item` as a tuple of arguments whose every leaf is a concrete tensor: a tuple or list
    of arguments, or one tensor or array (the single argument)."""
    args = tuple(item) if isinstance(item, (tuple, list)) else (item,)
    if all(isinstance(a, _core.Tensor) and not a.is_symbolic for a in args):
        return args  # the common item, tensors side by side: nothing to convert
    tensors = [
        _leaf(leaf, index, f"arguments{path}") for path, leaf in nest.flatten_with_paths(args)
    ]
    return tuple(nest.pack_sequence_as(args, tensors))


def signature(fn: Any, args: tuple[Any, ...]) -> tuple[Signature, list[np.ndarray], Any]:
    """The staged signature of `fn` for `args` (staged now if new), the flat inputs to send,
    and, when staging a `gl.jit` function now ran it on `args`, its result (else None).
    Staging traces (a typed error for a bad item) and, for `gl.jit`, compiles for a generic
    CPU and checks the module on this item against the reference interpreter."""
    function = function_of(fn)
    entry, tensors = function._lookup(args, {})
    per_fn = _staged.setdefault(fn, {})
    found = per_fn.get(id(entry.fn))
    if found is not None and found.entry is entry:
        return found, [np.asarray(t) for t in tensors], None
    found, result = _stage(fn, entry, tensors)
    per_fn[id(entry.fn)] = found
    return found, [np.asarray(t) for t in tensors], result


def _stage(fn: Any, entry: Any, tensors: list[Any]) -> tuple[Signature, Any]:
    concrete = entry.fn
    name = concrete.graph.entry
    if concrete.assigned_variables:
        raise Refused(
            errors.InvalidArgumentError(
                _validate.at_user(
                    f"gl.distributed cannot run {name}: it assigns Variables, and each "
                    "worker would assign its own copy (read them instead, or return the new "
                    "values)"
                )
            )
        )
    key = f"{name}-{next(_keys)}"
    if isinstance(fn, Function):
        return Signature(key, GraphPayload(concrete), entry), None
    module = compiled._Compiled(concrete, fn.target, portable=True)
    # The module is checked against the interpreter on its first call (as `gl.jit` does):
    # that call is this item's.
    result = entry.outputs(module(tensors))
    captured = tuple(
        np.asarray(c.read() if isinstance(c, _core.VariableHandle) else c) for c in module.captured
    )
    driver_flags = _runtime.DRIVER_FLAGS.get(module.driver, ())
    payload = CompiledPayload(module.vmfb, name, module.driver, driver_flags, captured)
    return Signature(key, payload, entry), result
