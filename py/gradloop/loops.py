"""Loops written in JAX's forms (`fori_loop`, `scan`) on top of `while_loop`, so that every
mode and transform of `while_loop` applies to them (reverse mode through data-dependent
bounds included)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _core, errors, nest
from ._core import Tensor
from .control_flow import while_loop


def fori_loop(
    lower: Any,
    upper: Any,
    body_fun: Callable[[Tensor, Any], Any],
    init_val: Any,
    *,
    checkpoints: int | None = None,
) -> Any:
    """JAX's `lax.fori_loop`: `val = body_fun(i, val)` for `i` in `[lower, upper)`, then `val`.

    `lower` and `upper` are Python ints or scalar integer tensors (data-dependent bounds are
    fine, and differentiable through, unlike JAX's reverse mode); `init_val` any structure of
    tensors that `body_fun` returns again. `checkpoints` is `while_loop`'s: memory-bounded
    gradients. Reference semantics::

        val = init_val
        for i in range(lower, upper):
            val = body_fun(i, val)
        return val
    """
    lo = lower if isinstance(lower, Tensor) else _core.tensor(lower, dtype=_core.int32)
    hi = upper if isinstance(upper, Tensor) else _core.full([], upper, dtype=lo.dtype)
    if hi.dtype != lo.dtype:
        hi = _core.cast(hi, lo.dtype)

    def cond(i: Tensor, val: Any) -> Tensor:
        return i < hi

    def body(i: Tensor, val: Any) -> tuple[Tensor, Any]:
        return i + 1, body_fun(i, val)

    return while_loop(cond, body, (lo, init_val), checkpoints=checkpoints)[1]


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
    *,
    checkpoints: int | None = None,
) -> tuple[Any, Any]:
    """JAX's `lax.scan`: `carry, y = f(carry, x)` for each `x` along the leading axis of `xs`
    (any structure of tensors; None with `length` for no input), returning the last carry and
    the `y`s stacked. Reference semantics::

        ys = []
        for x in (reversed(xs) if reverse else xs):
            carry, y = f(carry, x)
            ys.append(y)
        return carry, stack(reversed(ys) if reverse else ys)

    It is a `while_loop` of `length` trips (its `maximum_iterations`, so that pure StableHLO
    gradients have fixed-size state): each trip reads its `x` with a dynamic slice and writes
    its `y` into preallocated buffers in place. Every mode and transform of `while_loop`
    applies; `checkpoints` bounds the gradient's memory.
    """
    x_leaves = [_as_tensor(x) for x in (nest.flatten(xs) if xs is not None else [])]
    lengths = {x.shape[0] if x.ndim else None for x in x_leaves}
    if None in lengths:
        raise errors.InvalidArgumentError("scan: every leaf of xs needs a leading axis")
    if length is not None:
        lengths.add(length)
    if len(lengths) != 1:
        detail = "give xs or length" if not lengths else f"leading sizes {sorted(lengths)}"
        raise errors.InvalidArgumentError(f"scan: xs and length disagree ({detail})")
    (n,) = lengths
    carry_leaves = [_as_tensor(c) for c in nest.flatten(init)]
    init = nest.pack_sequence_as(init, carry_leaves)

    def step_input(i: Tensor) -> Any:
        if xs is None:
            return None
        at = (n - 1 - i) if reverse else i
        rows = []
        for x in x_leaves:
            starts = [at] + [_core.tensor(0, dtype=at.dtype)] * (x.ndim - 1)
            row = _core.dynamic_slice(x, starts, [1, *x.shape[1:]])
            rows.append(_core.reshape(row, list(x.shape[1:])))
        return nest.pack_sequence_as(xs, rows)

    y_specs = _output_specs(f, init, xs, x_leaves)
    buffers = [_core.zeros([n, *shape], dtype=dtype) for dtype, shape in y_specs[1]]

    def body(i: Tensor, carry: Any, ys: list[Tensor]) -> tuple[Tensor, Any, list[Tensor]]:
        carry, y = f(carry, step_input(i))
        at = (n - 1 - i) if reverse else i
        leaves = nest.flatten(y) if y is not None else []
        written = []
        for buf, leaf in zip(ys, leaves, strict=True):
            leaf = _as_tensor(leaf)
            starts = [at] + [_core.tensor(0, dtype=at.dtype)] * (buf.ndim - 1)
            written.append(_core.dynamic_update_slice(buf, _core.expand_dims(leaf, 0), starts))
        return i + 1, carry, written

    y_structure = y_specs[0]
    if n == 0:  # no step: the body, which reads a row of xs, is never built
        return init, None if y_structure is None else nest.pack_sequence_as(y_structure, buffers)
    counter = _core.tensor(0, dtype=_core.int32)
    _, carry, ys = while_loop(
        lambda i, carry, ys: i < n,
        body,
        (counter, init, buffers),
        maximum_iterations=n,
        checkpoints=checkpoints,
    )
    return carry, None if y_structure is None else nest.pack_sequence_as(y_structure, ys)


def _as_tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else _core.tensor(x)


def _output_specs(
    f: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any, x_leaves: list[Tensor]
) -> tuple[Any, list[tuple[Any, list[int]]]]:
    """The structure of `f`'s `y` and each leaf's (dtype, shape), from tracing one step on
    symbolic values (never run: no side effect happens twice)."""
    carry_leaves = nest.flatten(init)
    specs = [(t.dtype, list(t.shape)) for t in carry_leaves]
    specs += [(x.dtype, list(x.shape[1:])) for x in x_leaves]
    nested = _core.trace_active()
    symbols = (
        _core.trace_push("scan_step", specs)
        if nested
        else _core.trace_begin("scan_step", specs, closed_over_inputs=True)
    )
    try:
        carry = nest.pack_sequence_as(init, symbols[: len(carry_leaves)])
        x = None if xs is None else nest.pack_sequence_as(xs, symbols[len(carry_leaves) :])
        out = f(carry, x)
        if not isinstance(out, tuple) or len(out) != 2:
            raise errors.InvalidArgumentError(
                f"scan: f must return a pair (carry, y), got {type(out).__name__}"
            )
        y = out[1]
        leaves = [] if y is None else [_as_tensor(leaf) for leaf in nest.flatten(y)]
        found = (None if y is None else y, [(t.dtype, list(t.shape)) for t in leaves])
    finally:
        if nested:
            _core.trace_pop([])
        else:
            _core.trace_abort()
    if any(None in shape for _, shape in found[1]):
        raise errors.InvalidArgumentError("scan: each y must have a static shape")
    return found
