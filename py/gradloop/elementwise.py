"""numpy's elementwise functions that are compositions of the op table's, written as JAX writes
them so that values, gradients and the subgradients at kinks match JAX's (each is the same in
every mode: the compositions are traced like any other ops).

The op table itself has `tan`, `arcsin` ... `expm1`, `arctan2` and truncated division's `rem`
and `quotient`; this module builds numpy's `mod`, `fmod`, `floor_divide`, `clip`, `hypot`,
`square`, the float predicates and `finfo` on them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core, errors
from ._core import Tensor


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else _core.tensor(x)


def _pair(a: Any, b: Any) -> tuple[Tensor, Tensor]:
    """Two operands of one dtype: a Python number adapts to the other operand's dtype."""
    if isinstance(a, Tensor) and not isinstance(b, Tensor):
        return a, _core.full([], b, dtype=a.dtype)
    if isinstance(b, Tensor) and not isinstance(a, Tensor):
        return _core.full([], a, dtype=b.dtype), b
    return _tensor(a), _tensor(b)


def square(x: Any) -> Tensor:
    """`x * x`."""
    x = _tensor(x)
    return x * x


def fmod(a: Any, b: Any) -> Tensor:
    """The remainder of `a / b` rounded toward zero, with the sign of `a` (C's and numpy's
    `fmod`). Its gradient is 1 for `a` and `-trunc(a / b)` for `b`."""
    return _core.rem(*_pair(a, b))


def remainder(a: Any, b: Any) -> Tensor:
    """The remainder of floor division, with the sign of `b` (numpy's `mod` / `remainder`,
    Python's `%`). Gradients as `fmod`'s, of which it is a shifted copy."""
    a, b = _pair(a, b)
    r = _core.rem(a, b)
    zero = _core.zeros_like(r)
    shift = _core.logical_and(
        _core.not_equal(r, zero), _core.not_equal(_core.less(r, zero), _core.less(b, zero))
    )
    return _core.where(shift, r + b, r)


mod = remainder
"""numpy's other name for `remainder`: the remainder of floor division, with the sign of `b`."""


def floor_divide(a: Any, b: Any) -> Tensor:
    """`floor(a / b)` (numpy's `floor_divide`, Python's `//`); integers divided by 0 give 0,
    floats by 0 give inf or NaN, as numpy. Its gradient is zero."""
    a, b = _pair(a, b)
    if not a.dtype.is_floating:
        q = _core.quotient(a, b)
        r = _core.rem(a, b)
        zero = _core.zeros_like(r)
        below = _core.logical_and(
            _core.not_equal(_core.sign(a), _core.sign(b)), _core.not_equal(r, zero)
        )
        return _core.where(below, q - 1, q)
    # JAX's float divmod: exact for quotients that floats hold exactly
    r = _core.rem(a, b)
    q = (a - r) / b
    zero = _core.zeros_like(r)
    below = _core.logical_and(
        _core.not_equal(r, zero), _core.not_equal(_core.sign(b), _core.sign(r))
    )
    q = _core.round(_core.where(below, q - 1.0, q))
    exact = a / b
    # numpy's ends: a zero quotient keeps the sign of a / b, division by zero is a / b
    q = _core.where(_core.equal(q, zero), exact * 0.0, q)
    return _core.stop_gradient(_core.where(_core.equal(b, _core.zeros_like(b)), exact, q))


def clip(a: Any, a_min: Any = None, a_max: Any = None) -> Tensor:
    """`a` limited to `[a_min, a_max]` (either may be None). The gradient passes to `a` where
    `a_min <= a <= a_max` (bounds included, as TensorFlow's `clip_by_value`) and to a tensor
    bound where it is the one taken."""
    a = _tensor(a)
    if a_min is None and a_max is None:
        raise errors.InvalidArgumentError("clip: give a_min, a_max or both")
    if a_min is not None:
        a, lo = _pair(a, a_min)
        a = _core.where(_core.less(a, lo), _core.broadcast_to(lo, a.shape), a)
    if a_max is not None:
        a, hi = _pair(a, a_max)
        a = _core.where(_core.greater(a, hi), _core.broadcast_to(hi, a.shape), a)
    return a


def hypot(a: Any, b: Any) -> Tensor:
    """`sqrt(a^2 + b^2)` without overflow or underflow in between (JAX's form); its gradient at
    `a = b = 0` is zero, not NaN."""
    a, b = _pair(a, b)
    a, b = _core.abs(a), _core.abs(b)
    big, small = _core.maximum(a, b), _core.minimum(a, b)
    zero = _core.equal(big, _core.zeros_like(big))
    safe = _core.where(zero, _core.ones_like(big), big)
    ratio = _core.where(zero, _core.zeros_like(big), small / safe)
    return big * _core.sqrt(1.0 + ratio * ratio)


def isnan(x: Any) -> Tensor:
    """Where `x` is NaN (never, for integers)."""
    x = _tensor(x)
    if not x.dtype.is_floating:
        return _core.zeros_like(x, dtype=_core.bool_)
    return _core.not_equal(x, x)


def isinf(x: Any) -> Tensor:
    """Where `x` is +inf or -inf (never, for integers)."""
    x = _tensor(x)
    if not x.dtype.is_floating:
        return _core.zeros_like(x, dtype=_core.bool_)
    return _core.equal(_core.abs(x), float("inf"))


def isfinite(x: Any) -> Tensor:
    """Where `x` is neither NaN nor infinite (everywhere, for integers)."""
    x = _tensor(x)
    if not x.dtype.is_floating:
        return _core.ones_like(x, dtype=_core.bool_)
    return _core.less(_core.abs(x), float("inf"))


def finfo(dtype: Any) -> np.finfo:
    """The limits of a float dtype, as numpy's `finfo` gives them (`eps`, `max`, `min`,
    `tiny`, `bits`, `resolution`): static values, usable anywhere a Python number is."""
    dt = _core.as_dtype(dtype)
    if not dt.is_floating:
        raise errors.DTypeError(f"finfo: {dt} is not a float dtype")
    return np.finfo(np.dtype(dt.name))
