"""`Variable`: mutable state holding an immutable tensor, with TensorFlow's gradient semantics.

A Variable's value is replaced, never mutated: `assign` stores a new tensor under a fresh
identity. The value lives in a Rust variable cell (`_core.VariableHandle`), so graphs traced by
`@gl.function` read and write the same Variable: inside a trace, reads and writes become
`read_variable` / `assign_variable` nodes of a resource input, kept in program order and never
pruned, and they act when the graph runs (in a branch only when it is taken, in a loop once per
iteration). Reading a trainable Variable while tapes record watches the value read, and each
Python `GradientTape` notes the read, so the gradient with respect to the Variable is the sum
of the gradients of the values read from it. As in TensorFlow, assignment itself is not
differentiable: the stored value is cut from the tape (gradients flow through reads only).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from . import _core, _recording, _validate, errors

__all__ = ["Variable"]


def _fresh(t: _core.Tensor) -> _core.Tensor:
    """`t`'s value under a new identity, cut from every tape (assignment has no gradient)."""
    return _core.identity(_core.stop_gradient(t))


#: Every Variable alive, to find one from its handle (`live_variable`).
_live: weakref.WeakSet[Variable] = weakref.WeakSet()


def live_variable(handle: Any) -> Variable | None:
    """The live Variable whose handle `handle` is (a handle a trace captured), if any."""
    return next((v for v in list(_live) if v._handle.same(handle)), None)


@_validate.register_variable_type
class Variable:
    """Mutable state: `read()`, `assign(value)`, `assign_add(delta)`, `assign_sub(delta)`.

    Arithmetic and comparison operators act on `read()` (so `v * 2` is a tensor), except `==`
    and `!=`: Variables compare and hash by identity, so they can key dicts and sets; compare
    values with `v.read() == x`.
    """

    def __init__(
        self,
        initial_value: Any,
        dtype: Any = None,
        name: str | None = None,
        trainable: bool = True,
    ) -> None:
        self._name = "Variable" if name is None else str(name)
        self._trainable = bool(trainable)
        if callable(initial_value):
            initial_value = initial_value()  # TensorFlow's lazy initialiser
        if isinstance(initial_value, Variable):
            initial_value = initial_value._value
        if isinstance(initial_value, _core.Tensor):
            if dtype is not None and _core.as_dtype(dtype) != initial_value.dtype:
                raise errors.DTypeError(
                    _validate.at_user(
                        f"Variable '{self._name}': the initial value is "
                        f"{initial_value.dtype.name}, not {_core.as_dtype(dtype).name} "
                        "(cast it with gl.cast)"
                    )
                )
            value = initial_value
        else:
            value = _core.tensor(initial_value, dtype=dtype)
        self._handle = _core.VariableHandle(_fresh(value))
        _live.add(self)

    @property
    def _value(self) -> _core.Tensor:
        """The stored value, not seen by tapes (concrete outside a trace)."""
        return self._handle.read()

    # ---- properties ----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def trainable(self) -> bool:
        return self._trainable

    @property
    def dtype(self) -> _core.DType:
        return self._handle.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._handle.shape)

    @property
    def ndim(self) -> int:
        return len(self._handle.shape)

    @property
    def value(self) -> _core.Tensor:
        """The current value (a read: seen by the recording tapes)."""
        return self.read()

    # ---- reading and assigning -----------------------------------------------------------------

    def read(self) -> _core.Tensor:
        """The current value. Trainable reads are watched by the tapes recording now. Inside a
        trace the value is symbolic: the read happens when the graph runs, in program order."""
        if _core.trace_active():
            # In a graph the tapes watch the variable itself (its resource), so that reads in
            # branches and loop bodies, which the tapes do not see, are differentiable too.
            if _core.any_tape_active():
                _recording.note_variable_use(self, self._handle.resource())
            return self._handle.read()
        value = self._handle.read()
        if _core.any_tape_active():
            _recording.note_variable_read(self, value)
        return value

    def __gl_tensor__(self) -> _core.Tensor:
        """The tensor this Variable stands for in an op (a read)."""
        return self.read()

    def _convert(self, value: Any, what: str) -> _core.Tensor:
        """`value` as a tensor of this Variable's dtype, or DTypeError (no silent casts)."""
        if isinstance(value, Variable):
            value = value.read()
        if not isinstance(value, _core.Tensor):
            natural = np.asarray(value)
            if natural.dtype.kind == "f" and not self.dtype.is_floating:
                raise errors.DTypeError(
                    _validate.at_user(
                        f"Variable '{self._name}': cannot {what} a float value to a "
                        f"{self.dtype.name} variable"
                    )
                )
            value = _core.tensor(value, dtype=self.dtype)
        if value.dtype != self.dtype:
            raise errors.DTypeError(
                _validate.at_user(
                    f"Variable '{self._name}': cannot {what} a {value.dtype.name} value to a "
                    f"{self.dtype.name} variable (cast it with gl.cast)"
                )
            )
        return value

    def _store(self, value: _core.Tensor, what: str) -> Variable:
        if tuple(value.shape) != self.shape:
            raise errors.ShapeError(
                _validate.at_user(
                    f"Variable '{self._name}': cannot {what} a value of shape {tuple(value.shape)} "
                    f"to a variable of shape {self.shape}"
                )
            )
        if _recording.perturbed([value]):
            # As in graph mode (the assign node's tangent rule): reads would silently lose it.
            raise errors.GradientError(
                _validate.at_user(
                    f"Variable '{self._name}': a value with a tangent is assigned: forward mode "
                    "(jvp, jacfwd, hessian) does not carry tangents through Variables; return "
                    "the value instead"
                )
            )
        # Eagerly the stored value gets a fresh identity cut from the tapes (assignment is not
        # differentiable); in a graph, later reads are read_variable nodes, never this value.
        self._handle.assign(value if value.is_symbolic else _fresh(value))
        return self

    def assign(self, value: Any) -> Variable:
        """Replaces the value (same dtype and shape); returns the Variable."""
        return self._store(self._convert(value, "assign"), "assign")

    def assign_add(self, delta: Any) -> Variable:
        """`assign(read() + delta)`; `delta` may broadcast to the Variable's shape."""
        delta = self._convert(delta, "add")
        return self._store(_core.add(self._value, _core.stop_gradient(delta)), "add")

    def assign_sub(self, delta: Any) -> Variable:
        """`assign(read() - delta)`; `delta` may broadcast to the Variable's shape."""
        delta = self._convert(delta, "subtract")
        return self._store(_core.sub(self._value, _core.stop_gradient(delta)), "subtract")

    # ---- numpy interop and printing ------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        return self._value.numpy()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        return np.asarray(self._value.numpy(), dtype=dtype)

    def __repr__(self) -> str:
        return (
            f"<gl.Variable '{self._name}' shape={self.shape} dtype={self.dtype.name} "
            f"numpy={np.array2string(self.numpy(), separator=', ')}>"
        )

    __hash__ = object.__hash__  # identity: Variables key dicts and sets


def _delegate(name: str) -> Any:
    """`Variable.<name>` acting on `read()` (Variable operands are read too)."""

    def method(self: Variable, *args: Any) -> Any:
        args = tuple(a.read() if isinstance(a, Variable) else a for a in args)
        return getattr(self.read(), name)(*args)

    method.__name__ = name
    method.__doc__ = f"`read().{name}(...)`"
    return method


_OPERATORS = (
    *("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__neg__", "__pos__"),
    *("__truediv__", "__rtruediv__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__"),
    *("__lt__", "__le__", "__gt__", "__ge__", "__and__", "__or__", "__invert__", "__abs__"),
    *("__getitem__", "__len__", "__bool__", "__float__", "__int__", "__index__"),
)
for _name in _OPERATORS:
    setattr(Variable, _name, _delegate(_name))
