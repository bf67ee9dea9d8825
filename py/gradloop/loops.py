"""Loops written in JAX's forms on top of `while_loop`, so that every mode and transform of
`while_loop` applies to them (reverse mode through data-dependent bounds included)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _core
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
