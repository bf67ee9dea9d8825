"""numpy's products of arrays: `einsum`, `tensordot`, `outer` and `cross`.

`einsum` and `tensordot` become the op table's batched `matmul` between transposes and
reshapes (one product per pair of operands, left to right), so they run at matmul's speed and
their gradients are matmuls too. Repeated labels in one operand take its diagonal; labels that
only one operand has and the output lacks are summed first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _core, errors
from ._core import Tensor
from .arrays import diagonal


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else _core.tensor(x)


def tensordot(a: Any, b: Any, axes: int | Sequence[Any] = 2) -> Tensor:
    """The sum of products over `axes` (numpy's `tensordot`): an int takes the last `axes` of
    `a` with the first of `b`; a pair of sequences names them."""
    a, b = _tensor(a), _tensor(b)
    if isinstance(axes, int):
        if not 0 <= axes <= min(a.ndim, b.ndim):
            raise errors.InvalidArgumentError(
                f"tensordot: cannot contract {axes} axes of {a.ndim}- and {b.ndim}-dim arrays"
            )
        axes_a, axes_b = list(range(a.ndim - axes, a.ndim)), list(range(axes))
    else:
        axes_a, axes_b = ([x] if isinstance(x, int) else list(x) for x in axes)
    if len(axes_a) != len(axes_b):
        raise errors.InvalidArgumentError(
            f"tensordot: {len(axes_a)} axes of `a` against {len(axes_b)} of `b`"
        )
    axes_a = [_axis(x, a.ndim) for x in axes_a]
    axes_b = [_axis(x, b.ndim) for x in axes_b]
    for x, y in zip(axes_a, axes_b, strict=False):
        if a.shape[x] != b.shape[y]:
            raise errors.ShapeError(
                f"tensordot: axis {x} of `a` has {a.shape[x]} elements and axis {y} of `b` "
                f"{b.shape[y]}"
            )
    labels_a = [f"a{i}" for i in range(a.ndim)]
    labels_b = [f"b{i}" for i in range(b.ndim)]
    for x, y in zip(axes_a, axes_b, strict=False):
        labels_b[y] = labels_a[x]
    out = [lab for lab in labels_a if lab not in labels_b] + [
        lab for lab in labels_b if lab not in labels_a
    ]
    return _contract([(a, labels_a), (b, labels_b)], out)


def outer(a: Any, b: Any) -> Tensor:
    """`a` and `b` flattened, every product (numpy's `outer`)."""
    a, b = _core.reshape(_tensor(a), [-1, 1]), _core.reshape(_tensor(b), [1, -1])
    return a * b


def cross(
    a: Any, b: Any, axisa: int = -1, axisb: int = -1, axisc: int = -1, axis: int | None = None
) -> Tensor:
    """The cross product of 3-vectors (or the z component of 2-vectors) along the given axes,
    broadcast over the others (numpy's `cross`)."""
    a, b = _tensor(a), _tensor(b)
    if axis is not None:
        axisa = axisb = axisc = axis
    a = _core.transpose(a, _last(_axis(axisa, a.ndim), a.ndim))
    b = _core.transpose(b, _last(_axis(axisb, b.ndim), b.ndim))
    na, nb = a.shape[-1], b.shape[-1]
    if na not in (2, 3) or nb not in (2, 3):
        raise errors.ShapeError(f"cross: vectors must have 2 or 3 components, got {na} and {nb}")
    ax = [a[..., i] for i in range(na)] + [None] * (3 - na)
    bx = [b[..., i] for i in range(nb)] + [None] * (3 - nb)

    def term(p: Tensor | None, q: Tensor | None) -> Tensor | None:
        return None if p is None or q is None else p * q

    def minus(p: Tensor | None, q: Tensor | None, like: Tensor) -> Tensor:
        if p is None and q is None:
            return _core.zeros_like(like)
        return -q if p is None else p if q is None else p - q

    z = minus(term(ax[0], bx[1]), term(ax[1], bx[0]), ax[0])
    if na == nb == 2:
        return z
    x = minus(term(ax[1], bx[2]), term(ax[2], bx[1]), z)
    y = minus(term(ax[2], bx[0]), term(ax[0], bx[2]), z)
    shape = list(np.broadcast_shapes(tuple(x.shape), tuple(y.shape), tuple(z.shape)))
    out = _core.stack([_core.broadcast_to(c, shape) for c in (x, y, z)], axis=-1)
    return _core.transpose(out, _from_last(_axis(axisc, out.ndim), out.ndim))


def _axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise errors.InvalidArgumentError(f"axis {axis} is out of range for {ndim} dims")
    return axis % ndim


def _last(axis: int, ndim: int) -> list[int]:
    return [d for d in range(ndim) if d != axis] + [axis]


def _from_last(axis: int, ndim: int) -> list[int]:
    order = list(range(ndim - 1))
    order.insert(axis, ndim - 1)
    return order


def einsum(subscripts: str, *operands: Any) -> Tensor:
    """numpy's `einsum` (implicit and explicit output, `...`, repeated labels for diagonals and
    traces), computed as batched matrix products."""
    tensors = [_tensor(x) for x in operands]
    inputs, output = _parse(subscripts, tensors)
    terms = []
    for x, labels in zip(tensors, inputs, strict=False):
        x, labels = _diagonals(x, labels)
        terms.append((x, labels))
    return _contract(terms, output)


def _parse(subscripts: str, tensors: list[Tensor]) -> tuple[list[list[str]], list[str]]:
    spec = subscripts.replace(" ", "")
    if "->" in spec:
        lhs, rhs = spec.split("->")
    else:
        lhs, rhs = spec, None
    terms = lhs.split(",")
    if len(terms) != len(tensors):
        raise errors.InvalidArgumentError(
            f"einsum: {subscripts!r} names {len(terms)} operands, {len(tensors)} given"
        )
    named_terms = [term.replace("...", "") for term in terms]
    for named in named_terms:
        if not all(c.isalpha() for c in named):
            raise errors.InvalidArgumentError(f"einsum: invalid subscripts {subscripts!r}")
    extras = [
        x.ndim - len(named) if "..." in term else 0
        for term, named, x in zip(terms, named_terms, tensors, strict=False)
    ]
    ellipsis_dims = max(extras, default=0)
    inputs = []
    for term, x, extra in zip(terms, tensors, extras, strict=False):
        if extra < 0:
            raise errors.ShapeError(f"einsum: {term!r} has more labels than its {x.ndim} dims")
        if "..." in term:
            # ellipsis dims, right-aligned across operands as numpy broadcasts them
            head, tail = term.split("...")
            dots = [f"...{ellipsis_dims - extra + i}" for i in range(extra)]
            labels = [*head, *dots, *tail]
        else:
            labels = list(term)
        if len(labels) != x.ndim:
            raise errors.ShapeError(
                f"einsum: {term!r} labels {len(labels)} dims of a {x.ndim}-dim operand"
            )
        inputs.append(labels)
    dots = [f"...{i}" for i in range(ellipsis_dims)]
    if rhs is None:
        counts: dict[str, int] = {}
        for labels in inputs:
            for lab in labels:
                counts[lab] = counts.get(lab, 0) + 1
        output = dots + sorted(
            lab for lab, c in counts.items() if c == 1 and not lab.startswith(".")
        )
    else:
        if not all(c.isalpha() for c in rhs.replace("...", "")):
            raise errors.InvalidArgumentError(f"einsum: invalid output {rhs!r}")
        head, _, tail = rhs.partition("...")
        output = [*head, *(dots if "..." in rhs else []), *tail]
        if len(set(output)) != len(output):
            raise errors.InvalidArgumentError(f"einsum: output {rhs!r} repeats a label")
        known = {lab for labels in inputs for lab in labels}
        missing = [lab for lab in output if lab not in known]
        if missing:
            raise errors.InvalidArgumentError(f"einsum: output label {missing[0]!r} is in no input")
    return inputs, output


def _diagonals(x: Tensor, labels: list[str]) -> tuple[Tensor, list[str]]:
    """A label repeated within one operand: keep its diagonal (numpy's `einsum("ii->i")`)."""
    while len(set(labels)) != len(labels):
        first = next(lab for lab in labels if labels.count(lab) > 1)
        i = labels.index(first)
        j = labels.index(first, i + 1)
        if x.shape[i] != x.shape[j]:
            raise errors.ShapeError(
                f"einsum: label {first!r} has {x.shape[i]} and {x.shape[j]} elements"
            )
        x = diagonal(x, 0, i, j)
        labels = [lab for k, lab in enumerate(labels) if k not in (i, j)] + [first]
    return x, labels


def _contract(terms: list[tuple[Tensor, list[str]]], output: list[str]) -> Tensor:
    sizes: dict[str, int] = {}
    for x, labels in terms:
        for lab, n in zip(labels, x.shape, strict=False):
            if sizes.get(lab, 1) != 1 and n != 1 and sizes[lab] != n:
                raise errors.ShapeError(f"einsum: label {lab!r} has {sizes[lab]} and {n} elements")
            sizes[lab] = max(sizes.get(lab, n), n)
    terms = [_sum_private(x, labels, terms, k, output) for k, (x, labels) in enumerate(terms)]
    x, labels = terms[0]
    for k in range(1, len(terms)):
        keep = set(output).union(*(set(lab) for _, lab in terms[k + 1 :]))
        x, labels = _pair(x, labels, *terms[k], keep, sizes)
    extra = [d for d, lab in enumerate(labels) if lab not in output]
    if extra:
        x = _core.sum(x, axis=extra)
        labels = [lab for lab in labels if lab in output]
    x = _core.transpose(x, [labels.index(lab) for lab in output]) if labels != output else x
    return x


def _sum_private(
    x: Tensor, labels: list[str], terms: list[Any], k: int, output: list[str]
) -> tuple[Tensor, list[str]]:
    """Sums the labels that no other operand and not the output has."""
    others = set(output).union(*(set(lab) for j, (_, lab) in enumerate(terms) if j != k))
    private = [d for d, lab in enumerate(labels) if lab not in others]
    if not private or len(terms) == 1:
        return x, labels
    return _core.sum(x, axis=private), [lab for lab in labels if lab in others]


def _pair(
    a: Tensor, la: list[str], b: Tensor, lb: list[str], keep: set[str], sizes: dict[str, int]
) -> tuple[Tensor, list[str]]:
    """One product: batch labels (both, kept), contracted (both, not kept), each side's own."""
    batch = [lab for lab in la if lab in lb and lab in keep]
    summed = [lab for lab in la if lab in lb and lab not in keep]
    left = [lab for lab in la if lab not in lb]
    right = [lab for lab in lb if lab not in la]
    a = _arrange(a, la, batch + left + summed, sizes, broadcast=batch + summed)
    b = _arrange(b, lb, batch + summed + right, sizes, broadcast=batch + summed)

    def size(ls: list[str]) -> int:
        return math.prod(sizes[lab] for lab in ls)

    nb, nl, nk, nr = size(batch), size(left), size(summed), size(right)
    a = _core.reshape(a, [nb, nl, nk])
    b = _core.reshape(b, [nb, nk, nr])
    out = _core.matmul(a, b)
    labels = batch + left + right
    return _core.reshape(out, [sizes[lab] for lab in labels]), labels


def _arrange(
    x: Tensor, labels: list[str], order: list[str], sizes: dict[str, int], broadcast: list[str]
) -> Tensor:
    """`x` transposed to `order`, its size-1 dims of `broadcast` labels spread to full size."""
    perm = [labels.index(lab) for lab in order]
    if perm != list(range(len(perm))):
        x = _core.transpose(x, perm)
    shape = [sizes[lab] if lab in broadcast else n for lab, n in zip(order, x.shape, strict=False)]
    if shape != list(x.shape):
        x = _core.broadcast_to(x, shape)
    return x
