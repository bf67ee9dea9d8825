"""The factorisations and substitutions of `gl.linalg` as loops of the op table's ops.

Each is a `fori_loop` over the matrix's rows or columns whose trip works on whole (batched)
matrices through one-hot masks, so one definition compiles everywhere (IREE has no triangular
solve or Cholesky lowering; pure StableHLO has none either), over any leading batch axes. A
trip costs O(n^2) (O(n k) for a substitution with k right-hand sides). The public functions in
`gl.linalg` wrap these with their own derivative rules; differentiated op by op (forward mode,
higher orders) the loops are exact too.

LU, its solves, triangular solves, Cholesky and QR are composites (`_composite`): the loop defines
them, and a kernel of the op table (faer's blocked algorithms) computes the same values where
nothing reads the loop itself: eagerly when no tape or tangent differentiates the operands, and
on the frame executor, which runs a traced composite call as its kernel. Compilers and
derivatives read the loop.

Conventions are LAPACK's: `lu_factor` gives `P a = L U` with L unit lower triangular packed
below U's diagonal and `piv[i]` the row swapped with row i at step i; `cholesky` the lower
factor of the symmetrised input (NaN where it is not positive definite, as JAX's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _core
from .._core import Tensor
from .._recording import perturbed
from ..loops import fori_loop
from ..reductions import argmax


def _composite(kernel: str, loop: Callable[..., Any], *inputs: Tensor) -> Any:
    """`loop(*inputs)`, computed by the kernel whose graph text is `kernel` where nothing
    differentiates the loop: eagerly when no tape records and no tangent reaches the inputs;
    traced, as a call of the loop that the frame executor runs as the kernel."""
    if _core.trace_active():
        params = _core.trace_push(kernel.split("{")[0], [(t.dtype, tuple(t.shape)) for t in inputs])
        try:
            out = loop(*params)
        except BaseException:
            _core.trace_pop([])
            raise
        several = isinstance(out, tuple)
        results = _core.emit_custom_call(
            list(inputs), params, list(out) if several else [out], kernel=kernel
        )
        return tuple(results) if several else results[0]
    if _core.any_tape_records(list(inputs)) or perturbed(list(inputs)):
        return loop(*inputs)
    results = _core.factor_kernel(kernel, list(inputs))
    return tuple(results) if len(results) > 1 else results[0]


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _iota(n: int) -> Tensor:
    return _core.arange(n, dtype="int32")


def _pick_row(m: Tensor, hot: Tensor) -> Tensor:
    """The row of `m` (..., n, k) where the one-hot `hot` (..., n) is set: (..., k)."""
    return _core.sum(_core.where(_core.expand_dims(hot, -1), m, _core.zeros_like(m)), axis=-2)


def _pick(v: Tensor, hot: Tensor) -> Tensor:
    """The element of `v` (..., n) where `hot` (..., n) is set: (...)."""
    return _core.sum(_core.where(hot, v, _core.zeros_like(v)), axis=-1)


def _column(m: Tensor, k: Tensor) -> Tensor:
    """Column `k` of `m` (..., n, n): (..., n)."""
    at = _core.equal(_iota(m.shape[-1]), k)
    return _core.sum(_core.where(at, m, _core.zeros_like(m)), axis=-1)


def lu_factor(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`(lu, piv, perm)` of the square `a` (..., n, n) with partial pivoting: `perm[i]` is the
    row of `a` that is row i of `P a`."""
    return _composite("lu_factor", _lu_factor_loop, a)


def _lu_factor_loop(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    n = a.shape[-1]
    batch = list(a.shape[:-2])
    iota = _iota(n)
    rows, cols = _core.reshape(iota, [n, 1]), _core.reshape(iota, [1, n])
    piv = _core.zeros([*batch, n], dtype="int32")
    perm = _core.broadcast_to(iota, [*batch, n])

    def step(k: Tensor, carry: Any) -> Any:
        lu, piv, perm = carry
        ek = _core.equal(iota, k)
        col = _column(lu, k)
        # the largest magnitude at or below the diagonal (the first of ties, as LAPACK's)
        candidates = _core.where(
            _core.greater_equal(iota, k), _core.abs(col), -_core.ones_like(col)
        )
        p = argmax(candidates, axis=-1)
        ep = _core.equal(iota, _core.expand_dims(p, -1))
        row_k, row_p = _pick_row(lu, ek), _pick_row(lu, ep)
        swap = _core.cast(ek, lu.dtype) - _core.cast(ep, lu.dtype)
        lu = lu + _core.expand_dims(swap, -1) * _core.expand_dims(row_p - row_k, -2)
        piv = _core.where(ek, _core.expand_dims(p, -1), piv)
        at_k, at_p = _pick(perm, ek), _pick(perm, ep)
        perm = _core.where(
            ek, _core.expand_dims(at_p, -1), _core.where(ep, _core.expand_dims(at_k, -1), perm)
        )
        # eliminate below the pivot: the multipliers go where the zeros would be
        pivot = _pick(row_p, ek)
        below = _core.greater(iota, k)
        multipliers = _core.where(
            below, _column(lu, k) / _core.expand_dims(pivot, -1), _core.zeros_like(col)
        )
        right = _core.where(_core.greater(cols, k), _core.expand_dims(row_p, -2), 0.0)
        lu = lu - _core.expand_dims(multipliers, -1) * right
        lu = _core.where(
            _core.logical_and(_core.greater(rows, k), _core.equal(cols, k)),
            _core.expand_dims(multipliers, -1),
            lu,
        )
        return lu, piv, perm

    return fori_loop(0, n, step, (a, piv, perm))


def permutation(piv: Tensor) -> Tensor:
    """The row order `perm` that LAPACK's swaps `piv` make, applied in turn."""
    return _composite("lu_permutation", _permutation_loop, piv)


def _permutation_loop(piv: Tensor) -> Tensor:
    n = piv.shape[-1]
    iota = _iota(n)
    perm = _core.broadcast_to(iota, list(piv.shape))

    def step(i: Tensor, perm: Tensor) -> Tensor:
        ei = _core.equal(iota, i)
        ep = _core.equal(iota, _core.expand_dims(_pick(piv, ei), -1))
        at_i, at_p = _pick(perm, ei), _pick(perm, ep)
        return _core.where(
            ei, _core.expand_dims(at_p, -1), _core.where(ep, _core.expand_dims(at_i, -1), perm)
        )

    return fori_loop(0, n, step, perm)


def permutation_matrix(perm: Tensor, dtype: Any) -> Tensor:
    """P with `(P b)[i] = b[perm[i]]`."""
    n = perm.shape[-1]
    return _core.cast(_core.equal(_core.expand_dims(perm, -1), _iota(n)), dtype)


def triangular(a: Tensor, b: Tensor, lower: bool, unit_diagonal: bool) -> Tensor:
    """`x` with `T x = b` for the triangle of `a` (..., n, n) named by `lower` (the other
    triangle is never read), `b` (..., n, k): substitution, one row per trip."""
    kernel = f"triangular_solve{{lower={_flag(lower)}, unit_diagonal={_flag(unit_diagonal)}}}"
    return _composite(kernel, lambda a, b: _triangular_loop(a, b, lower, unit_diagonal), a, b)


def _triangular_loop(a: Tensor, b: Tensor, lower: bool, unit_diagonal: bool) -> Tensor:
    n = a.shape[-1]
    iota = _iota(n)

    def step(t: Tensor, x: Tensor) -> Tensor:
        i = t if lower else (n - 1) - t
        ei = _core.equal(iota, i)
        row = _pick_row(a, ei)
        # the solved part of the row only: the other triangle may hold anything (LU's U)
        solved = _core.less(iota, i) if lower else _core.greater(iota, i)
        row = _core.where(solved, row, _core.zeros_like(row))
        rhs = _pick_row(b, ei) - _core.sum(_core.expand_dims(row, -1) * x, axis=-2)
        xi = rhs if unit_diagonal else rhs / _core.expand_dims(_pick(_pick_row(a, ei), ei), -1)
        return _core.where(_core.expand_dims(ei, -1), _core.expand_dims(xi, -2), x)

    return fori_loop(0, n, step, _core.zeros_like(b))


def lu_solve(lu: Tensor, perm: Tensor, b: Tensor, trans: bool) -> Tensor:
    """`x` with `a x = b` (or `a^T x = b`) from `a`'s LU factors, `b` (..., n, k)."""
    return _composite(
        f"lu_solve{{trans={_flag(trans)}}}",
        lambda lu, perm, b: _lu_solve_loop(lu, perm, b, trans),
        lu,
        perm,
        b,
    )


def _lu_solve_loop(lu: Tensor, perm: Tensor, b: Tensor, trans: bool) -> Tensor:
    p = permutation_matrix(perm, lu.dtype)
    if not trans:
        y = triangular(lu, _core.matmul(p, b), lower=True, unit_diagonal=True)
        return triangular(lu, y, lower=False, unit_diagonal=False)
    lu_t = _core.transpose(lu, [*range(lu.ndim - 2), lu.ndim - 1, lu.ndim - 2])
    y = triangular(lu_t, b, lower=True, unit_diagonal=False)
    y = triangular(lu_t, y, lower=False, unit_diagonal=True)
    return _core.matmul(_core.transpose(p, [*range(p.ndim - 2), p.ndim - 1, p.ndim - 2]), y)


def cholesky(a: Tensor) -> Tensor:
    """The lower triangular `L` with `L L^T = a` (symmetric), one column per trip; all NaN
    where `a` is not positive definite."""
    return _composite("cholesky", _cholesky_loop, a)


def _cholesky_loop(a: Tensor) -> Tensor:
    n = a.shape[-1]
    iota = _iota(n)
    cols = _core.reshape(iota, [1, n])

    def step(k: Tensor, carry: Any) -> Any:
        w, low = carry
        ek = _core.equal(iota, k)
        col = _column(w, k)
        d = _core.sqrt(_pick(col, ek))
        c = _core.where(_core.greater_equal(iota, k), col / _core.expand_dims(d, -1), 0.0)
        low = _core.where(_core.equal(cols, k), _core.expand_dims(c, -1), low)
        below = _core.where(_core.greater(iota, k), c, 0.0)
        w = w - _core.expand_dims(below, -1) * _core.expand_dims(below, -2)
        return w, low

    low = fori_loop(0, n, step, (a, _core.zeros_like(a)))[1]
    # not positive definite (a pivot not above zero, or NaN): NaN throughout, as the kernel's
    # and JAX's. Compared, not tested with `x != x`, which compilers may fold away.
    diagonal = _core.sum(
        _core.where(_core.equal(_core.reshape(iota, [n, 1]), iota), low, 0.0), axis=-1
    )
    ok = _core.min(_core.cast(_core.greater(diagonal, 0.0), "int32"), axis=-1, keepdims=True)
    return _core.where(_core.expand_dims(_core.equal(ok, 0), -1), float("nan"), low)


def householder_qr(a: Tensor) -> tuple[Tensor, Tensor]:
    """`(q, r)` of `a` (..., m, n) with `q` (..., m, m) orthogonal and `r` (..., m, n) upper
    triangular, by Householder reflections (LAPACK's signs: `r`'s diagonal is `-sign(x_j)
    |x|`), one column per trip."""
    return _composite("householder_qr", _householder_qr_loop, a)


def _householder_qr_loop(a: Tensor) -> tuple[Tensor, Tensor]:
    m, n = a.shape[-2], a.shape[-1]
    rows = _iota(m)
    batch = list(a.shape[:-2])
    eye = _core.broadcast_to(
        _core.cast(_core.equal(_core.reshape(rows, [m, 1]), rows), a.dtype), [*batch, m, m]
    )

    def step(j: Tensor, carry: Any) -> Any:
        q, r = carry
        ej = _core.equal(rows, j)
        x = _core.where(_core.greater_equal(rows, j), _column(r, j), 0.0)
        norm = _core.sqrt(_core.sum(x * x, axis=-1))
        head = _pick(x, ej)
        alpha = _core.where(_core.greater_equal(head, 0.0), -norm, norm)
        v = x - _core.cast(ej, a.dtype) * _core.expand_dims(alpha, -1)
        vv = _core.sum(v * v, axis=-1)
        # nothing below the diagonal: no reflection (LAPACK's `dlarfg`, tau = 0). The part
        # below is summed on its own: `|x|^2 - head^2` is not zero when a compiler contracts
        # it into a fused multiply-add (XLA's CPU code does).
        tail = _core.where(_core.greater(rows, j), x, 0.0)
        zero = _core.equal(_core.sum(tail * tail, axis=-1), 0.0)
        zero = _core.logical_or(zero, _core.equal(vv, 0.0))
        beta = _core.where(
            zero, _core.zeros_like(vv), 2.0 / _core.where(zero, _core.ones_like(vv), vv)
        )
        beta = _core.expand_dims(_core.expand_dims(beta, -1), -1)
        col, row = _core.expand_dims(v, -1), _core.expand_dims(v, -2)
        r = r - beta * col * _core.matmul(row, r)
        q = q - beta * _core.matmul(q, col) * row
        return q, r

    q, r = fori_loop(0, min(m, n), step, (eye, a))
    below = _core.greater(_core.reshape(rows, [m, 1]), _iota(n))
    return q, _core.where(below, _core.zeros_like(r), r)


def householder_packed(a: Tensor) -> tuple[Tensor, Tensor]:
    """LAPACK's `geqrf` of `a` (..., m, n): `(packed, taus)`, `r` on and above the diagonal and
    below it each reflection's vector scaled to a leading one (`H_j = I - tau_j v_j v_j^T`),
    the reflections those of `householder_qr`."""
    m, n = a.shape[-2], a.shape[-1]
    rows = _iota(m)
    k = min(m, n)
    cols = _core.reshape(_iota(n), [1, n])
    taus = _core.zeros([*a.shape[:-2], k], dtype=a.dtype)

    def step(j: Tensor, carry: Any) -> Any:
        r, packed, taus = carry
        ej = _core.equal(rows, j)
        x = _core.where(_core.greater_equal(rows, j), _column(r, j), 0.0)
        norm = _core.sqrt(_core.sum(x * x, axis=-1))
        head = _pick(x, ej)
        beta = _core.where(_core.greater_equal(head, 0.0), -norm, norm)
        v = x - _core.cast(ej, a.dtype) * _core.expand_dims(beta, -1)
        vv = _core.sum(v * v, axis=-1)
        tail = _core.where(_core.greater(rows, j), x, 0.0)  # as in householder_qr
        zero = _core.equal(_core.sum(tail * tail, axis=-1), 0.0)
        zero = _core.logical_or(zero, _core.equal(vv, 0.0))
        safe = _core.where(zero, _core.ones_like(vv), vv)
        scale = _core.expand_dims(_core.expand_dims(2.0 / safe, -1), -1)
        scale = _core.where(_core.expand_dims(_core.expand_dims(zero, -1), -1), 0.0, scale)
        col, row = _core.expand_dims(v, -1), _core.expand_dims(v, -2)
        r = r - scale * col * _core.matmul(row, r)
        # LAPACK's form: v / v[j] below the diagonal, tau = (beta - alpha) / beta
        lead = _core.where(zero, _core.ones_like(head), head - beta)
        below = _core.where(_core.greater(rows, j), v / _core.expand_dims(lead, -1), 0.0)
        below = _core.where(_core.expand_dims(zero, -1), 0.0, below)
        packed = _core.where(_core.equal(cols, j), _core.expand_dims(below, -1), packed)
        tau = _core.where(
            zero, _core.zeros_like(head), (beta - head) / _core.where(zero, 1.0, beta)
        )
        taus = _core.where(_core.equal(_iota(k), j), _core.expand_dims(tau, -1), taus)
        return r, packed, taus

    r, packed, taus = fori_loop(0, k, step, (a, _core.zeros_like(a), taus))
    on_or_above = _core.less_equal(_core.reshape(rows, [m, 1]), _core.reshape(_iota(n), [1, n]))
    return _core.where(on_or_above, r, packed), taus


def householder_product(packed: Tensor, taus: Tensor) -> Tensor:
    """LAPACK's `orgqr`: the first n columns of `H_0 H_1 ... H_(k-1)` from `geqrf`'s packed
    reflections (..., m, n) and their `taus` (..., k)."""
    m, n = packed.shape[-2], packed.shape[-1]
    k = taus.shape[-1]
    rows = _iota(m)
    eye = _core.cast(
        _core.equal(_core.reshape(rows, [m, 1]), _core.reshape(_iota(n), [1, n])), packed.dtype
    )
    q = _core.broadcast_to(eye, list(packed.shape))

    def step(t: Tensor, q: Tensor) -> Tensor:
        j = (k - 1) - t
        ej = _core.equal(rows, j)
        v = _core.where(_core.greater(rows, j), _column(packed, j), 0.0)
        v = v + _core.cast(ej, packed.dtype)
        tau = _pick(taus, _core.equal(_iota(k), j))
        tau = _core.expand_dims(_core.expand_dims(tau, -1), -1)
        col, row = _core.expand_dims(v, -1), _core.expand_dims(v, -2)
        return q - tau * col * _core.matmul(row, q)

    return fori_loop(0, k, step, q)


def singular_values(a: Tensor, sweeps: int = 12) -> Tensor:
    """The singular values of `a` (..., m, n), largest first, by one-sided Jacobi rotations
    (Hestenes): each trip rotates one pair of columns until they are orthogonal; after
    `sweeps` passes over every pair the column norms are the singular values (the method
    converges quadratically: 12 sweeps reach rounding for the sizes solvers use)."""
    import numpy as np

    from ..reductions import sort

    if a.shape[-2] < a.shape[-1]:
        a = _core.transpose(a, [*range(a.ndim - 2), a.ndim - 1, a.ndim - 2])
    n = a.shape[-1]
    pairs = [(p, q) for p in range(n) for q in range(p + 1, n)]
    if not pairs:
        return _core.sqrt(_core.sum(a * a, axis=-2))
    first = _core.tensor(np.array([p for p, _ in pairs], dtype=np.int32))
    second = _core.tensor(np.array([q for _, q in pairs], dtype=np.int32))
    cols = _iota(n)
    tiny = float(np.finfo(np.dtype(a.dtype.name)).eps)

    def step(k: Tensor, w: Tensor) -> Tensor:
        at = _core.rem(k, len(pairs))
        ep = _core.equal(cols, _core.take(first, at))
        eq = _core.equal(cols, _core.take(second, at))
        wp = _core.sum(_core.where(ep, w, 0.0), axis=-1)
        wq = _core.sum(_core.where(eq, w, 0.0), axis=-1)
        alpha, beta = _core.sum(wp * wp, axis=-1), _core.sum(wq * wq, axis=-1)
        gamma = _core.sum(wp * wq, axis=-1)
        # already orthogonal (to rounding): no rotation
        still = _core.greater(_core.abs(gamma), tiny * _core.sqrt(alpha * beta))
        safe = _core.where(still, gamma, _core.ones_like(gamma))
        zeta = (beta - alpha) / (2.0 * safe)
        one = _core.ones_like(zeta)
        sign = _core.where(_core.greater_equal(zeta, 0.0), one, -one)
        t = sign / (_core.abs(zeta) + _core.sqrt(1.0 + zeta * zeta))
        t = _core.where(still, t, _core.zeros_like(t))
        c = 1.0 / _core.sqrt(1.0 + t * t)
        s = c * t
        c, s = _core.expand_dims(c, -1), _core.expand_dims(s, -1)
        new_p, new_q = c * wp - s * wq, s * wp + c * wq
        w = _core.where(ep, _core.expand_dims(new_p, -1), w)
        return _core.where(eq, _core.expand_dims(new_q, -1), w)

    w = fori_loop(0, sweeps * len(pairs), step, a)
    norms = _core.sqrt(_core.sum(w * w, axis=-2))
    return -sort(-norms, axis=-1)
