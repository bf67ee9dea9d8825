"""`x.at[idx]`: JAX's functional updates, `set`, `add`, `mul`, `min`, `max` and `get`.

Each returns a new tensor (tensors are immutable) and is a composition of the op table's
differentiable ops, so gradients, tangents and every mode come with it:

- a static index (ints, slices, `None`, `...`, integer numpy arrays or lists) becomes the flat
  positions it selects, computed once in numpy: `add` is a `scatter_add` at them, `set` a
  `where` on a constant mask, `mul`/`min`/`max` a `set` of the combined window, `get` a `take`;
- a scalar integer tensor (a data-dependent position, as a loop counter) and tuples of them
  lower to `dynamic_slice` / `dynamic_update_slice`: only the window is read and written;
- an integer tensor of indices (any shape) selects along axis 0 through `take` and
  `scatter_add`.

Out of range, as JAX's `.at`: `get` clamps, updates are dropped; negative indices count from the
end. Repeated indices accumulate in `add` and combine one after another in `mul`, `min` and
`max`; in `set` the last one wins for a static index (numpy's assignment) and, for a tensor of
indices, the mean of the values written there (JAX leaves the choice unspecified).

Gradients: `set` zeroes the written window of the operand's cotangent and gathers the
update's; `add` passes the cotangent to the operand and gathers the update's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core, errors
from ._core import Tensor


class IndexUpdateHelper:
    """`x.at`: indexing it (`x.at[idx]`) gives the updates at `idx`."""

    __slots__ = ("_x",)

    def __init__(self, x: Tensor) -> None:
        self._x = x

    def __getitem__(self, idx: Any) -> IndexUpdateRef:
        return IndexUpdateRef(self._x, idx)

    def __repr__(self) -> str:
        return f"_IndexUpdateHelper({self._x!r})"


class IndexUpdateRef:
    """`x.at[idx]`: `set`, `add`, `mul`, `min`, `max` and `get` at `idx`."""

    __slots__ = ("_idx", "_x")

    def __init__(self, x: Tensor, idx: Any) -> None:
        self._x, self._idx = x, idx

    def get(self) -> Tensor:
        """`x[idx]`, with out-of-range indices clamped."""
        return _get(self._x, self._idx)

    def set(self, values: Any) -> Tensor:
        """`x` with `values` written at `idx`."""
        return _update(self._x, self._idx, values, "set")

    def add(self, values: Any) -> Tensor:
        """`x` with `values` added at `idx` (repeated indices accumulate)."""
        return _update(self._x, self._idx, values, "add")

    def mul(self, values: Any) -> Tensor:
        """`x` with the elements at `idx` multiplied by `values`."""
        return _update(self._x, self._idx, values, "mul")

    def min(self, values: Any) -> Tensor:
        """`x` with the elements at `idx` replaced by their minimum with `values`."""
        return _update(self._x, self._idx, values, "min")

    def max(self, values: Any) -> Tensor:
        """`x` with the elements at `idx` replaced by their maximum with `values`."""
        return _update(self._x, self._idx, values, "max")


def _values(x: Tensor, values: Any) -> Tensor:
    """`values` as a tensor: a Python number or a list in `x`'s dtype."""
    if isinstance(values, Tensor):
        return values
    if isinstance(values, bool | int | float):
        return _core.full([], values, dtype=x.dtype)
    return _core.tensor(np.asarray(values), dtype=x.dtype)


def _combine(kind: str, old: Tensor, new: Tensor) -> Tensor:
    if kind == "set":
        return _core.broadcast_to(new, old.shape) if new.shape != old.shape else new
    if kind == "add":
        return old + new
    if kind == "mul":
        return old * new
    if kind == "min":
        return _core.minimum(old, new)
    return _core.maximum(old, new)


# ---- the three index forms ---------------------------------------------------------------------


def _dynamic_position(items: tuple[Any, ...]) -> bool:
    """Scalar integer tensors and ints, at least one tensor: one window at a data-dependent
    position."""
    scalar = all((isinstance(i, Tensor) and i.ndim == 0) or isinstance(i, int) for i in items)
    return bool(items) and scalar and any(isinstance(i, Tensor) for i in items)


def _get(x: Tensor, idx: Any) -> Tensor:
    items = idx if isinstance(idx, tuple) else (idx,)
    if _dynamic_position(items):
        starts, sizes = _window(x, items)
        return _core.reshape(_core.dynamic_slice(x, starts, sizes), x.shape[len(items) :])
    if isinstance(idx, Tensor):
        _check_index_tensor(idx)
        return _core.take(x, _clamped(idx, x.shape[0]), axis=0)
    positions = _static_positions(x.shape, idx, clamp=True)
    flat = _core.reshape(x, (int(np.prod(x.shape)),))
    return _core.take(flat, _core.tensor(positions.astype(np.int64)), axis=0)


def _update(x: Tensor, idx: Any, values: Any, kind: str) -> Tensor:
    v = _values(x, values)
    if v.dtype != x.dtype:
        v = _core.cast(v, x.dtype)  # as JAX: the values take the tensor's dtype
    items = idx if isinstance(idx, tuple) else (idx,)
    if _dynamic_position(items):
        return _update_window(x, items, v, kind)
    if isinstance(idx, Tensor):
        return _update_gathered(x, idx, v, kind)
    return _update_static(x, idx, v, kind)


# A data-dependent position: one window, read and written in place where the executor can.


def _window(x: Tensor, items: tuple[Any, ...]) -> tuple[list[Tensor], list[int]]:
    """Starts (negative ones counted from the end) and sizes of the window `items` select."""
    if len(items) > x.ndim:
        raise errors.IndexError(f"at: {len(items)} indices for a tensor of rank {x.ndim}")
    starts = []
    for i, n in zip(items, x.shape, strict=False):
        t = i if isinstance(i, Tensor) else _core.tensor(i, dtype=_core.int64)
        _check_index_tensor(t)
        starts.append(_core.where(t < 0, t + n, t))
    starts += [_core.zeros([], dtype=starts[0].dtype)] * (x.ndim - len(items))
    return starts, [1] * len(items) + list(x.shape[len(items) :])


def _update_window(x: Tensor, items: tuple[Any, ...], v: Tensor, kind: str) -> Tensor:
    starts, sizes = _window(x, items)
    old = _core.dynamic_slice(x, starts, sizes)
    inner = tuple(sizes[len(items) :])
    new = _combine(kind, _core.reshape(old, inner), v)
    new = _core.reshape(_core.broadcast_to(new, inner), tuple(sizes))
    # out of range: dropped (the window written back as it was)
    inside = None
    for s, n in zip(starts, x.shape, strict=False):
        ok = _core.logical_and(s >= 0, s < n)
        inside = ok if inside is None else _core.logical_and(inside, ok)
    new = _core.where(inside, new, old)
    return _core.dynamic_update_slice(x, new, starts)


# A tensor of indices along axis 0.


def _check_index_tensor(i: Tensor) -> None:
    if i.dtype not in (_core.int32, _core.int64):
        raise errors.IndexError(f"at: indices must be int32 or int64, got {i.dtype}")


def _clamped(i: Tensor, n: int) -> Tensor:
    i = _core.where(i < 0, i + n, i)
    return _core.minimum(_core.maximum(i, 0), n - 1)


def _update_gathered(x: Tensor, idx: Tensor, v: Tensor, kind: str) -> Tensor:
    _check_index_tensor(idx)
    n = x.shape[0]
    window = tuple(idx.shape) + tuple(x.shape[1:])
    wrapped = _core.where(idx < 0, idx + n, idx)
    inside = _core.logical_and(wrapped >= 0, wrapped < n)
    safe = _core.where(inside, wrapped, _core.zeros_like(wrapped))
    keep = _core.reshape(inside, tuple(idx.shape) + (1,) * (x.ndim - 1))
    if kind == "add":
        v = _core.where(keep, _core.broadcast_to(v, window), _core.zeros(window, dtype=x.dtype))
        return x + _core.scatter_add(v, safe, 0, n)
    old = _core.take(x, safe, axis=0)
    new = _core.broadcast_to(_combine(kind, old, v), window)
    one = _core.ones(window, dtype=x.dtype)
    zero = _core.zeros(window, dtype=x.dtype)
    count = _core.scatter_add(_core.where(keep, one, zero), safe, 0, n)
    total = _core.scatter_add(_core.where(keep, new, zero), safe, 0, n)
    written = _core.greater(count, _core.zeros_like(count))
    if x.dtype.is_floating:
        mean = total / _core.where(written, count, _core.ones_like(count))
    else:
        mean = _core.quotient(total, _core.where(written, count, _core.ones_like(count)))
    return _core.where(written, mean, x)


# A static index: flat positions computed once.


def _static_positions(shape: tuple[int, ...], idx: Any, clamp: bool) -> np.ndarray:
    """The flat positions `idx` selects, shaped as the window; out-of-range integers clamped
    (`clamp`) or marked -1 (dropped)."""
    items = list(idx) if isinstance(idx, tuple) else [idx]
    if any(isinstance(i, Tensor) for i in items):
        raise errors.IndexError(
            "at: a tensor index must be the whole index (an integer tensor, or scalar integer "
            "tensors and ints), not mixed with slices"
        )
    dims = list(shape)
    consuming = sum(1 for j in items if j is not None and j is not Ellipsis)
    # integer entries (and arrays of them) made non-negative; out of range -> clamp or drop
    fixed: list[Any] = []
    dropped = None
    axis = 0
    for i in items:
        if i is None:
            fixed.append(None)
            continue
        if i is Ellipsis:
            fixed.append(i)
            axis += len(dims) - consuming
            continue
        if isinstance(i, slice):
            fixed.append(i)
            axis += 1
            continue
        a = np.asarray(i)
        if a.dtype.kind not in "iu":
            raise errors.IndexError(f"at: unsupported index {i!r} (ints, slices, integer arrays)")
        if axis >= len(dims):
            raise errors.IndexError(f"at: too many indices for a tensor of rank {len(dims)}")
        n = dims[axis]
        a = np.where(a < 0, a + n, a)
        out = (a < 0) | (a >= n)
        if out.any():
            if clamp:
                a = np.clip(a, 0, n - 1)
            else:
                dropped = out if dropped is None else (dropped | out)
                a = np.where(out, 0, a)
        fixed.append(a if a.ndim else int(a))
        axis += 1
    positions = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)[tuple(fixed)]
    if dropped is not None:
        positions = np.where(np.broadcast_to(dropped, positions.shape), -1, positions)
    return np.asarray(positions)


def _update_static(x: Tensor, idx: Any, v: Tensor, kind: str) -> Tensor:
    positions = _static_positions(tuple(x.shape), idx, clamp=False)
    window = positions.shape
    size = int(np.prod(x.shape))
    flat = _core.reshape(x, (size,))
    values = _core.reshape(_core.broadcast_to(v, window), (int(np.prod(window)),))
    positions = positions.reshape(-1)
    live = np.nonzero(positions >= 0)[0]
    if kind == "add":
        picked = _core.take(values, _core.tensor(live.astype(np.int64)), axis=0)
        where = _core.tensor(positions[live])
        return _core.reshape(flat + _core.scatter_add(picked, where, 0, size), x.shape)
    # Repeated positions: one round per repetition, in the order written (numpy's for set).
    rank = np.zeros(len(live), dtype=np.int64)
    seen: dict[int, int] = {}
    for k, p in enumerate(positions[live]):
        rank[k] = seen.get(int(p), 0)
        seen[int(p)] = rank[k] + 1
    for r in range(int(rank.max(initial=-1)) + 1):
        chosen = live[rank == r]
        where = positions[chosen]
        picked = _core.take(values, _core.tensor(chosen.astype(np.int64)), axis=0)
        old = _core.take(flat, _core.tensor(where), axis=0)
        new = _combine(kind, old, picked)
        mask = np.zeros(size, dtype=bool)
        mask[where] = True
        scattered = _core.scatter_add(new, _core.tensor(where), 0, size)
        flat = _core.where(_core.tensor(mask), scattered, flat)
    return _core.reshape(flat, x.shape)
