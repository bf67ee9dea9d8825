"""numpy's reductions and scans beyond `sum`/`max`/`min`/`mean`: `any`, `all`, `argmax`,
`argmin`, `prod`, `cumsum`, `cumprod`, `logsumexp`, `softmax`, `searchsorted`, `argsort` and
`sort`.

Each is a composition of the op table's ops, so gradients, tangents, batching and emission in
every mode are theirs:

- `prod`, `cumsum` and `cumprod` combine in ceil(log2 n) rounds of elementwise products or
  sums of shifted slices (a tree, as JAX's associative scan): the result agrees with numpy's
  sequential one within rounding, and the gradient through the tree is exact where inputs are
  zero (no division by the product);
- `argmax`/`argmin` are a reduction and a first-hit search; `argsort`, `sort` and
  `searchsorted` compare all pairs along the axis (memory n^2 per row: the sizes solvers sort).

Integer results (`argmax`, `argmin`, `argsort`, `searchsorted`) are int32, as JAX's, and have no
gradient. NaN is larger than every number and ties keep their order, as in numpy's sorts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _core, errors
from ._core import Tensor
from .elementwise import isnan


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else _core.tensor(x)


def _axes(axis: int | Sequence[int] | None, ndim: int, op: str) -> list[int]:
    axes = range(ndim) if axis is None else [axis] if isinstance(axis, int) else axis
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise errors.InvalidArgumentError(f"{op}: axis {a} is out of range for {ndim} dims")
        out.append(a % ndim)
    return sorted(set(out))


def _flat_or_axis(x: Tensor, axis: int | None, op: str) -> tuple[Tensor, int]:
    """`x` flattened when `axis` is None, with the axis to work along."""
    if axis is None:
        return _core.reshape(x, [-1]), 0
    return x, _axes(axis, x.ndim, op)[0]


def _along(x: Tensor, axis: int, index: slice) -> Tensor:
    return x[(slice(None),) * axis + (index,)]


def _iota(n: int, axis: int, ndim: int) -> Tensor:
    """0 .. n-1 along `axis` of a rank-`ndim` shape (ones elsewhere), int32."""
    shape = [1] * ndim
    shape[axis] = n
    return _core.reshape(_core.arange(n, dtype="int32"), shape)


def _truth(x: Tensor) -> Tensor:
    return x if x.dtype == _core.bool_ else _core.not_equal(x, _core.zeros_like(x))


def any(  # noqa: A001 (numpy's name)
    a: Any, axis: int | Sequence[int] | None = None, keepdims: bool = False
) -> Tensor:
    """Whether any element along `axis` is nonzero (numpy's `any`; False for none)."""
    hits = _core.cast(_truth(_tensor(a)), "int32")
    return _core.greater(_core.sum(hits, axis=axis, keepdims=keepdims), 0)


def all(  # noqa: A001 (numpy's name)
    a: Any, axis: int | Sequence[int] | None = None, keepdims: bool = False
) -> Tensor:
    """Whether every element along `axis` is nonzero (numpy's `all`; True for none)."""
    misses = _core.cast(_core.logical_not(_truth(_tensor(a))), "int32")
    return _core.equal(_core.sum(misses, axis=axis, keepdims=keepdims), 0)


def _arg_extreme(a: Any, axis: int | None, keepdims: bool, op: str, largest: bool) -> Tensor:
    x = _core.stop_gradient(_tensor(a))
    if x.dtype == _core.bool_:
        x = _core.cast(x, "int32")
    ndim = x.ndim
    x, ax = _flat_or_axis(x, axis, op)
    n = x.shape[ax]
    if n == 0:
        raise errors.InvalidArgumentError(f"{op}: an empty sequence has no {op[3:]}")
    best = (_core.max if largest else _core.min)(x, axis=ax, keepdims=True)
    # the first extreme; the first NaN where there is one (numpy's), which the reduction
    # propagates
    hit = _core.logical_or(_core.equal(x, best), isnan(x))
    first = _core.where(hit, _iota(n, ax, x.ndim), _core.full([], n, dtype="int32"))
    out = _core.min(first, axis=ax, keepdims=keepdims)
    if keepdims and axis is None:
        out = _core.reshape(out, [1] * ndim)
    return out


def argmax(a: Any, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """The index of the first largest element along `axis` (of the flattened array when None):
    numpy's `argmax`, int32 as JAX's."""
    return _arg_extreme(a, axis, keepdims, "argmax", largest=True)


def argmin(a: Any, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """The index of the first smallest element along `axis`: numpy's `argmin`, int32."""
    return _arg_extreme(a, axis, keepdims, "argmin", largest=False)


def _cast(x: Tensor, dtype: Any) -> Tensor:
    if dtype is not None:
        return _core.cast(x, dtype)
    if x.dtype == _core.bool_:
        return _core.cast(x, "int32")
    return x


def prod(
    a: Any, axis: int | Sequence[int] | None = None, keepdims: bool = False, dtype: Any = None
) -> Tensor:
    """The product along `axis` (numpy's `prod`; 1 for none). Its gradient is exact at zeros:
    each factor's is the product of the others."""
    x = _cast(_tensor(a), dtype)
    axes = _axes(axis, x.ndim, "prod")
    for ax in axes:
        x = _halve(x, ax)
    if not keepdims:
        x = _core.squeeze(x, axes) if axes else x
    return x


def _halve(x: Tensor, ax: int) -> Tensor:
    """`x` multiplied down to length 1 along `ax`, pairwise."""
    n = x.shape[ax]
    if n == 0:
        shape = list(x.shape)
        shape[ax] = 1
        return _core.ones(shape, dtype=x.dtype)
    while n > 1:
        if n % 2:
            shape = list(x.shape)
            shape[ax] = 1
            x = _core.concatenate([x, _core.ones(shape, dtype=x.dtype)], axis=ax)
            n += 1
        x = _along(x, ax, slice(0, n, 2)) * _along(x, ax, slice(1, n, 2))
        n //= 2
    return x


def _scan(x: Tensor, ax: int, combine: Any, identity: float) -> Tensor:
    """Inclusive prefix of `combine` along `ax` in ceil(log2 n) rounds: each adds in the
    element `shift` places back (Hillis and Steele's scan)."""
    n = x.shape[ax]
    shift = 1
    while shift < n:
        shape = list(x.shape)
        shape[ax] = shift
        before = _core.full(shape, identity, dtype=x.dtype)
        x = combine(x, _core.concatenate([before, _along(x, ax, slice(0, n - shift))], axis=ax))
        shift *= 2
    return x


def cumsum(a: Any, axis: int | None = None, dtype: Any = None) -> Tensor:
    """Running sums along `axis` (of the flattened array when None): numpy's `cumsum`."""
    x, ax = _flat_or_axis(_cast(_tensor(a), dtype), axis, "cumsum")
    return _scan(x, ax, _core.add, 0)


def cumprod(a: Any, axis: int | None = None, dtype: Any = None) -> Tensor:
    """Running products along `axis`: numpy's `cumprod`, with a gradient exact at zeros."""
    x, ax = _flat_or_axis(_cast(_tensor(a), dtype), axis, "cumprod")
    return _scan(x, ax, _core.mul, 1)


def logsumexp(
    a: Any, axis: int | Sequence[int] | None = None, b: Any = None, keepdims: bool = False
) -> Tensor:
    """`log(sum(b * exp(a)))` along `axis` without overflow (scipy's and JAX's `logsumexp`):
    the largest finite element is taken out first. Its gradient is the softmax."""
    a = _tensor(a)
    axes = _axes(axis, a.ndim, "logsumexp")
    top = _core.max(a, axis=axes, keepdims=True)
    finite = _core.less(_core.abs(top), float("inf"))
    top = _core.stop_gradient(_core.where(finite, top, _core.zeros_like(top)))
    terms = _core.exp(a - top)
    if b is not None:
        terms = terms * _tensor(b)
    out = _core.log(_core.sum(terms, axis=axes, keepdims=True)) + top
    return out if keepdims else _core.squeeze(out, axes) if axes else out


def softmax(x: Any, axis: int | Sequence[int] = -1) -> Tensor:
    """`exp(x) / sum(exp(x))` along `axis` (JAX's `nn.softmax`), the largest element taken out
    first."""
    x = _tensor(x)
    axes = _axes(axis, x.ndim, "softmax")
    top = _core.stop_gradient(_core.max(x, axis=axes, keepdims=True))
    e = _core.exp(x - top)
    return e / _core.sum(e, axis=axes, keepdims=True)


def _before(a: Tensor, b: Tensor) -> Tensor:
    """`a < b` in sort order: NaN after every number (numpy's)."""
    if not a.dtype.is_floating:
        return _core.less(a, b)
    return _core.logical_or(
        _core.less(a, b), _core.logical_and(isnan(b), _core.logical_not(isnan(a)))
    )


def searchsorted(a: Any, v: Any, side: str = "left", sorter: Any = None) -> Tensor:
    """Where each of `v` goes in the sorted 1-D `a` to keep it sorted (numpy's
    `searchsorted`): the first such index for `side="left"`, the last for `"right"`. int32."""
    a, v = _core.stop_gradient(_tensor(a)), _core.stop_gradient(_tensor(v))
    if a.ndim != 1:
        raise errors.InvalidArgumentError(f"searchsorted: `a` must be 1-D, got {a.ndim} dims")
    if side not in ("left", "right"):
        raise errors.InvalidArgumentError(
            f"searchsorted: side must be 'left' or 'right', got {side!r}"
        )
    if sorter is not None:
        a = _core.take(a, _tensor(sorter))
    if a.dtype != v.dtype:
        raise errors.DTypeError(f"searchsorted: `a` is {a.dtype} and `v` {v.dtype}")
    column = _core.expand_dims(v, v.ndim)
    # left: how many of `a` sort before v; right: how many do not sort after it
    below = _before(a, column) if side == "left" else _core.logical_not(_before(column, a))
    return _core.sum(_core.cast(below, "int32"), axis=-1)


def argsort(a: Any, axis: int | None = -1, kind: Any = None, stable: bool = True) -> Tensor:
    """The indices that sort `a` along `axis` (flattened when None), ties in their order
    (numpy's stable `argsort`). int32."""
    x = _core.stop_gradient(_tensor(a))
    x, ax = _flat_or_axis(x, axis, "argsort")
    n = x.shape[ax]
    # rank of i: how many j sort before it, ties broken by position
    xi, xj = _core.expand_dims(x, ax + 1), _core.expand_dims(x, ax)
    i, j = _iota(n, ax, x.ndim + 1), _iota(n, ax + 1, x.ndim + 1)
    earlier = _core.logical_or(
        _before(xj, xi),
        _core.logical_and(_core.logical_not(_before(xi, xj)), _core.less(j, i)),
    )
    rank = _core.sum(_core.cast(earlier, "int32"), axis=ax + 1)
    # the permutation's inverse: position p holds the i whose rank is p
    at = _core.equal(_core.expand_dims(rank, ax), _iota(n, ax, x.ndim + 1))
    positions = _core.where(at, _iota(n, ax + 1, x.ndim + 1), _core.full([], 0, dtype="int32"))
    return _core.sum(positions, axis=ax + 1)


def take_along_axis(arr: Any, indices: Any, axis: int | None) -> Tensor:
    """numpy's `take_along_axis`: `arr` gathered along `axis` at `indices` (which has arr's
    rank). Differentiable in `arr`."""
    arr, idx = _tensor(arr), _tensor(indices)
    if axis is None:
        return _core.take(_core.reshape(arr, [-1]), _core.reshape(idx, [-1]))
    ax = _axes(axis, arr.ndim, "take_along_axis")[0]
    if idx.ndim != arr.ndim:
        raise errors.InvalidArgumentError(
            f"take_along_axis: indices have {idx.ndim} dims and the array {arr.ndim}"
        )
    shape = list(
        np.broadcast_shapes(
            tuple(arr.shape[:ax] + arr.shape[ax + 1 :]), tuple(idx.shape[:ax] + idx.shape[ax + 1 :])
        )
    )
    out_shape = [*shape[:ax], idx.shape[ax], *shape[ax:]]
    arr = _core.broadcast_to(arr, [*shape[:ax], arr.shape[ax], *shape[ax:]])
    idx = _core.broadcast_to(_core.cast(idx, "int32"), out_shape)
    # flat positions: idx along `ax`, the position itself along the others
    strides = np.cumprod([1, *arr.shape[::-1]])[:-1][::-1]
    flat = idx * int(strides[ax])
    for d in range(arr.ndim):
        if d != ax:
            flat = flat + _iota(out_shape[d], d, arr.ndim) * int(strides[d])
    return _core.take(_core.reshape(arr, [-1]), flat)


def sort(a: Any, axis: int | None = -1, kind: Any = None, stable: bool = True) -> Tensor:
    """`a` sorted along `axis` (flattened when None), NaN last (numpy's `sort`). The gradient
    flows to each element from the place it was sorted to."""
    a = _tensor(a)
    if axis is None:
        a, axis = _core.reshape(a, [-1]), 0
    return take_along_axis(a, argsort(a, axis=axis), axis)
