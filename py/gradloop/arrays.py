"""numpy's array construction and rearrangement: `eye`, `diag`, `trace`, `tril`, `triu`,
`linspace`, `tile`, `repeat`, `split` and `pad`.

Each is a composition of the op table's layout ops (slices with steps, concatenation,
broadcasts, reshapes) and `where` on constant masks, so its gradient, tangent, batching and
emission in every mode are those ops'. Shapes, counts and index patterns are static, as they
are in numpy's and JAX's signatures; a tensor argument (`linspace`'s ends, the arrays) is
differentiable.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _core, errors
from ._core import Tensor


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else _core.tensor(x)


def _axis(axis: int, ndim: int, op: str) -> int:
    if not -ndim <= axis < ndim:
        raise errors.InvalidArgumentError(f"{op}: axis {axis} is out of range for {ndim} dims")
    return axis % ndim


def _along(x: Tensor, axis: int, index: slice) -> Tensor:
    """`x[..., index, ...]` with `index` at `axis`."""
    return x[(slice(None),) * axis + (index,)]


def _mask(mask: np.ndarray, x: Tensor) -> Tensor:
    """`x` where the constant `mask` (over x's last dims) holds, zero elsewhere."""
    return _core.where(_core.tensor(mask), x, _core.zeros_like(x))


def eye(N: int, M: int | None = None, k: int = 0, dtype: Any = None) -> Tensor:
    """The `N x M` matrix with ones on diagonal `k` (numpy's `eye`; float32 by default)."""
    dt = _core.float32 if dtype is None else _core.as_dtype(dtype)
    return _core.tensor(np.eye(N, M, k), dtype=dt)


def diag(v: Any, k: int = 0) -> Tensor:
    """numpy's `diag`: a 1-D `v` becomes the square matrix with `v` on diagonal `k`; a 2-D `v`
    gives its diagonal `k`."""
    v = _tensor(v)
    if v.ndim == 1:
        n = v.shape[0] + abs(k)
        zeros = _core.zeros([abs(k)], dtype=v.dtype)
        row = _core.concatenate([zeros, v] if k > 0 else [v, zeros]) if k else v
        # row[j] sits at (j - k, j): broadcast the padded vector down the columns, keep one
        # diagonal
        return _mask(np.eye(n, n, k, dtype=bool), _core.broadcast_to(row, [n, n]))
    if v.ndim == 2:
        return diagonal(v, offset=k)
    raise errors.InvalidArgumentError(f"diag: input must be 1-D or 2-D, got {v.ndim} dims")


def diagonal(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Tensor:
    """numpy's `diagonal`: the diagonal `offset` of the planes `axis1` x `axis2`, as the last
    axis of the result."""
    a = _tensor(a)
    if a.ndim < 2:
        raise errors.InvalidArgumentError(f"diagonal: input must have 2 dims or more, got {a.ndim}")
    ax1, ax2 = _axis(axis1, a.ndim, "diagonal"), _axis(axis2, a.ndim, "diagonal")
    if ax1 == ax2:
        raise errors.InvalidArgumentError("diagonal: axis1 and axis2 must differ")
    rest = [d for d in range(a.ndim) if d not in (ax1, ax2)]
    a = _core.transpose(a, [*rest, ax1, ax2])
    rows, cols = a.shape[-2], a.shape[-1]
    # the diagonal (i, i + offset) of the plane, flattened: start, stride cols + 1
    start = offset if offset >= 0 else -offset * cols
    length = max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))
    lead = list(a.shape[:-2])
    flat = _core.reshape(a, [*lead, rows * cols])
    if length == 0:
        return _core.reshape(flat[..., :0], [*lead, 0])
    return flat[..., start : start + (length - 1) * (cols + 1) + 1 : cols + 1]


def trace(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Tensor:
    """The sum of `diagonal(a, offset, axis1, axis2)` (numpy's `trace`)."""
    return _core.sum(diagonal(a, offset, axis1, axis2), axis=-1)


def tril(m: Any, k: int = 0) -> Tensor:
    """`m` with the elements above diagonal `k` of its last two axes zeroed (numpy's `tril`)."""
    m = _tensor(m)
    if m.ndim < 2:
        raise errors.InvalidArgumentError(f"tril: input must have 2 dims or more, got {m.ndim}")
    return _mask(np.tri(m.shape[-2], m.shape[-1], k, dtype=bool), m)


def triu(m: Any, k: int = 0) -> Tensor:
    """`m` with the elements below diagonal `k` of its last two axes zeroed (numpy's `triu`)."""
    m = _tensor(m)
    if m.ndim < 2:
        raise errors.InvalidArgumentError(f"triu: input must have 2 dims or more, got {m.ndim}")
    return _mask(~np.tri(m.shape[-2], m.shape[-1], k - 1, dtype=bool), m)


def linspace(
    start: Any,
    stop: Any,
    num: int = 50,
    endpoint: bool = True,
    retstep: bool = False,
    dtype: Any = None,
    axis: int = 0,
) -> Tensor | tuple[Tensor, Tensor]:
    """`num` evenly spaced values from `start` to `stop` (numpy's `linspace`). Tensor ends are
    differentiable (and may be arrays: the samples run along `axis`); float32 by default, as
    every gradloop float."""
    if num < 0:
        raise errors.InvalidArgumentError(f"linspace: num must be non-negative, got {num}")
    div = (num - 1) if endpoint else num
    if not isinstance(start, Tensor) and not isinstance(stop, Tensor):
        dt = _core.float32 if dtype is None else _core.as_dtype(dtype)
        values = np.linspace(start, stop, num, endpoint=endpoint, axis=axis)
        out = _core.tensor(values, dtype=dt)
        step = (np.asarray(stop) - np.asarray(start)) / div if div > 0 else np.nan
        return (out, _core.tensor(step, dtype=dt)) if retstep else out
    like = start if isinstance(start, Tensor) else stop
    dt = like.dtype if dtype is None else _core.as_dtype(dtype)
    start, stop = _core.cast(_tensor(start), dt), _core.cast(_tensor(stop), dt)
    shape = list(np.broadcast_shapes(tuple(start.shape), tuple(stop.shape)))
    start, stop = _core.broadcast_to(start, shape), _core.broadcast_to(stop, shape)
    ax = _axis(axis, len(shape) + 1, "linspace")
    fractions = np.arange(num) / div if div > 0 else np.zeros(num)
    t = _core.reshape(_core.tensor(fractions, dtype=dt), [num] + [1] * (len(shape) - ax))
    start, stop = _core.expand_dims(start, ax), _core.expand_dims(stop, ax)
    delta = stop - start
    out = start + t * delta
    if endpoint and num > 1:  # the last sample is `stop` exactly, as numpy's
        last = np.arange(num) == num - 1
        out = _core.where(
            _core.reshape(_core.tensor(last), [num] + [1] * (len(shape) - ax)),
            _core.broadcast_to(stop, out.shape),
            out,
        )
    if not retstep:
        return out
    return out, (_core.squeeze(delta, ax) / div if div > 0 else _core.squeeze(delta, ax) * np.nan)


def tile(A: Any, reps: int | Sequence[int]) -> Tensor:
    """`A` repeated `reps` times along each axis (numpy's `tile`)."""
    A = _tensor(A)
    reps = [reps] if isinstance(reps, int) else list(reps)
    if any(r < 0 for r in reps):
        raise errors.InvalidArgumentError(f"tile: reps must be non-negative, got {reps}")
    ndim = max(A.ndim, len(reps))
    shape = [1] * (ndim - A.ndim) + list(A.shape)
    reps = [1] * (ndim - len(reps)) + reps
    # (1, n0, 1, n1, ...) broadcast to (r0, n0, r1, n1, ...), then merged pairwise
    spread = _core.reshape(A, [d for n in shape for d in (1, n)])
    spread = _core.broadcast_to(
        spread, [d for r, n in zip(reps, shape, strict=False) for d in (r, n)]
    )
    return _core.reshape(spread, [r * n for r, n in zip(reps, shape, strict=False)])


def repeat(a: Any, repeats: int | Sequence[int], axis: int | None = None) -> Tensor:
    """Each element of `a` repeated `repeats` times along `axis` (flattened when None;
    numpy's `repeat`); `repeats` may give one count per element."""
    a = _tensor(a)
    if axis is None:
        a, axis = _core.reshape(a, [-1]), 0
    ax = _axis(axis, a.ndim, "repeat")
    n = a.shape[ax]
    counts = np.asarray(repeats, dtype=np.int64)
    if (counts < 0).any():
        raise errors.InvalidArgumentError("repeat: repeats must be non-negative")
    if counts.ndim == 0:
        r = int(counts)
        spread = _core.expand_dims(a, ax + 1)
        shape = list(a.shape)
        spread = _core.broadcast_to(spread, [*shape[: ax + 1], r, *shape[ax + 1 :]])
        return _core.reshape(spread, [*shape[:ax], n * r, *shape[ax + 1 :]])
    if counts.shape != (n,):
        raise errors.InvalidArgumentError(f"repeat: {counts.size} counts for an axis of length {n}")
    return _core.take(a, _core.tensor(np.repeat(np.arange(n), counts), dtype="int32"), axis=ax)


def split(ary: Any, indices_or_sections: int | Sequence[int], axis: int = 0) -> list[Tensor]:
    """numpy's `split`: `ary` cut into equal sections, or at the given indices, along `axis`."""
    ary = _tensor(ary)
    ax = _axis(axis, ary.ndim, "split")
    n = ary.shape[ax]
    if isinstance(indices_or_sections, int):
        sections = indices_or_sections
        if sections <= 0 or n % sections:
            raise errors.InvalidArgumentError(
                f"split: an axis of length {n} does not split into {sections} equal sections"
            )
        cuts = [n // sections * i for i in range(1, sections)]
    else:
        cuts = [int(i) for i in indices_or_sections]
    bounds = [0, *cuts, n]
    return [
        _along(ary, ax, slice(min(lo, n), max(min(hi, n), min(lo, n))))
        for lo, hi in itertools.pairwise(bounds)
    ]


_PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def pad(array: Any, pad_width: Any, mode: str = "constant", constant_values: Any = 0) -> Tensor:
    """numpy's `pad` in its modes `constant` (with `constant_values`), `edge`, `reflect`,
    `symmetric` and `wrap`. The gradient of a padded value flows to the element it copies."""
    x = _tensor(array)
    if mode not in _PAD_MODES:
        raise errors.InvalidArgumentError(f"pad: mode {mode!r} is not one of {_PAD_MODES}")
    widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (x.ndim, 2))
    if (widths < 0).any():
        raise errors.InvalidArgumentError("pad: pad widths must be non-negative")
    values = np.broadcast_to(np.asarray(constant_values), (x.ndim, 2))
    for ax, (before, after) in enumerate(widths.tolist()):
        if before == after == 0:
            continue
        n = x.shape[ax]
        if n == 0 and mode != "constant":
            raise errors.InvalidArgumentError(f"pad: mode {mode!r} cannot pad an empty axis")
        parts = [_pad_side(x, ax, before, mode, values[ax][0], first=True), x]
        parts.append(_pad_side(x, ax, after, mode, values[ax][1], first=False))
        x = _core.concatenate([p for p in parts if p is not None], axis=ax)
    return x


def _pad_side(
    x: Tensor, ax: int, width: int, mode: str, value: Any, *, first: bool
) -> Tensor | None:
    if width == 0:
        return None
    n = x.shape[ax]
    if mode == "constant":
        shape = list(x.shape)
        shape[ax] = width
        return _core.full(shape, float(value), dtype=x.dtype)
    if mode == "edge":
        edge = _along(x, ax, slice(0, 1) if first else slice(n - 1, n))
        shape = list(x.shape)
        shape[ax] = width
        return _core.broadcast_to(edge, shape)
    # reflect / symmetric / wrap: the source positions of the padded elements, in numpy's order
    positions = np.arange(-width, 0) if first else np.arange(n, n + width)
    return _core.take(x, _core.tensor(_source(positions, n, mode), dtype="int32"), axis=ax)


def _source(positions: np.ndarray, n: int, mode: str) -> np.ndarray:
    """Where each out-of-range position reads from, for numpy's periodic pad modes."""
    if mode == "wrap":
        return positions % n
    if mode == "symmetric":  # edges repeated: period 2n
        p = positions % (2 * n)
        return np.where(p < n, p, 2 * n - 1 - p)
    if n == 1:  # reflect of one element is that element
        return np.zeros_like(positions)
    p = positions % (2 * n - 2)  # reflect: edges not repeated, period 2n - 2
    return np.where(p < n, p, 2 * n - 2 - p)
