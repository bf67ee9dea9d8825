"""`gl.linalg`: linear solves, factorisations and norms, with numpy's, scipy's and JAX's names
and conventions.

The factorisations and substitutions are loops of the op table's ops (`_loops`), so they run
in every mode, compile through IREE and emit pure StableHLO; eagerly and on the frame executor
they run as faer's blocked kernels (composites: the loop defines, the kernel computes). Each
public function is one
custom op whose reverse-mode rule is written with solves, as JAX's are, not by differentiating
the factorisation's loop: the gradient of `solve(a, b)` is one more solve with the factors of
the forward pass, Cholesky's is Murray's formula, LU's the transpose of its tangent map.
Forward mode (`jvp`, `jacfwd`, `hessian`'s outer pass) differentiates the loops op by op,
which is exact and keeps no stacks; higher orders differentiate the rules' own solves.

Shapes follow numpy and JAX: matrices are the last two axes, leading axes are a batch;
`solve`'s `b` is a vector when it is 1-D, the scipy-style solves' when it has one axis fewer
than `a`. A singular matrix (one that is not positive definite, for `cholesky`) raises
`gl.errors.LinAlgError` eagerly, as numpy's does; traced and compiled, the result holds the
infinities or NaN that LAPACK gives, as JAX's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _core, _validate, batching, errors
from .._core import Tensor
from .._custom_ops import custom_op
from ..forward import custom_jvp
from . import _loops

__all__ = [
    "cho_solve",
    "cholesky",
    "det",
    "inv",
    "lstsq",
    "lu_factor",
    "lu_solve",
    "norm",
    "qr",
    "slogdet",
    "solve",
    "solve_triangular",
]


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else _core.tensor(x)


def _mt(x: Tensor) -> Tensor:
    """The matrix transpose of the last two axes."""
    return _core.transpose(x, [*range(x.ndim - 2), x.ndim - 1, x.ndim - 2])


def _square(a: Any, op: str) -> Tensor:
    a = _tensor(a)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise errors.ShapeError(
            f"{op}: `a` must be square matrices (..., n, n), got {list(a.shape)}"
        )
    if not a.dtype.is_floating:
        raise errors.DTypeError(f"{op}: `a` must be float32 or float64, got {a.dtype}")
    return a


def _rhs(a: Tensor, b: Any, op: str, vector: bool) -> tuple[Tensor, Tensor]:
    """`a` and `b` as (..., n, n) and (..., n, k) with one batch shape."""
    b = _tensor(b)
    if b.dtype != a.dtype:
        raise errors.DTypeError(f"{op}: `a` is {a.dtype} and `b` {b.dtype}")
    if vector:
        b = _core.expand_dims(b, -1)
    n = a.shape[-1]
    if b.ndim < 2 or b.shape[-2] != n:
        raise errors.ShapeError(
            f"{op}: `b` must have {n} rows to match `a` {list(a.shape)}, got {list(b.shape)}"
        )
    batch = _broadcast(a.shape[:-2], b.shape[:-2], op)
    a = _core.broadcast_to(a, [*batch, n, n]) if list(a.shape[:-2]) != batch else a
    b = _core.broadcast_to(b, [*batch, *b.shape[-2:]]) if list(b.shape[:-2]) != batch else b
    return a, b


def _broadcast(x: Sequence[int], y: Sequence[int], op: str) -> list[int]:
    import numpy as np

    try:
        return list(np.broadcast_shapes(tuple(x), tuple(y)))
    except ValueError:
        raise errors.ShapeError(
            f"{op}: batch shapes {list(x)} and {list(y)} do not broadcast"
        ) from None


def _triangle(m: Tensor, lower: bool, unit_diagonal: bool) -> Tensor:
    """The part of `m` a triangular solve reads (zero elsewhere)."""
    import numpy as np

    n = m.shape[-1]
    k = -1 if unit_diagonal else 0
    mask = np.tri(n, n, k, dtype=bool) if lower else ~np.tri(n, n, -k - 1, dtype=bool)
    return _core.where(_core.tensor(mask), m, _core.zeros_like(m))


def _refuse_eagerly(op: str, what: str, result: Tensor, *inputs: Tensor) -> None:
    """Eagerly (numpy's behaviour), a result that is not finite from finite inputs means the
    matrix was singular (or not positive definite): a `LinAlgError`. Traced, the inf or NaN
    stays, as LAPACK's and JAX's do."""
    if _core.trace_active():
        return
    import numpy as np

    if np.isfinite(np.asarray(result)).all():
        return
    if all(np.isfinite(np.asarray(x)).all() for x in inputs):
        raise errors.LinAlgError(_validate.at_user(f"{op}: {what}"))


def _recompute() -> bool:
    """Whether a rule's ops may be differentiated again (an outer tape, a forward-mode
    accumulator, or a trace whose rules are differentiated later): then it recomputes what it
    needs from its inputs, since the forward pass it closes over was not recorded; otherwise it
    reuses the forward pass's factors."""
    return _core.trace_active() or _core.any_tape_active() or bool(_core.active_accumulators())


# --- triangular solves -----------------------------------------------------------------------


@batching.over_leading_axes
def solve_triangular(
    a: Any,
    b: Any,
    trans: int | str = 0,
    lower: bool = False,
    unit_diagonal: bool = False,
) -> Tensor:
    """`x` with `T x = b` (`trans` 1 or "T": `T^T x = b`) for the triangle of `a` that `lower`
    names, its diagonal taken as ones when `unit_diagonal` (scipy's and JAX's
    `solve_triangular`; the other triangle is never read)."""
    a = _square(a, "solve_triangular")
    vector = _tensor(b).ndim == a.ndim - 1
    a, b = _rhs(a, b, "solve_triangular", vector)
    if trans in (1, "T", "C"):
        a, lower = _mt(a), not lower
    elif trans not in (0, "N"):
        raise errors.InvalidArgumentError(
            f"solve_triangular: trans must be 0, 1, 'N' or 'T', got {trans!r}"
        )
    x = _triangular_op(lower, unit_diagonal)(a, b)
    _refuse_eagerly("solve_triangular", "the matrix is singular (a zero on its diagonal)", x, a, b)
    return _core.squeeze(x, -1) if vector else x


def _triangular_op(lower: bool, unit: bool) -> Any:
    def fn(a: Tensor, b: Tensor) -> Any:
        x = _loops.triangular(a, b, lower, unit)

        def grad(ct: Tensor) -> tuple[Tensor, Tensor]:
            xr = _loops.triangular(a, b, lower, unit) if _recompute() else x
            ct_b = _loops.triangular(_mt(a), ct, not lower, unit)
            return -_triangle(_core.matmul(ct_b, _mt(xr)), lower, unit), ct_b

        return x, grad

    def tangent(xs: list[Tensor], ts: list[Any]) -> list[Any]:
        a, b = xs
        da, db = ts
        x = _loops.triangular(a, b, lower, unit)
        rhs = _core.matmul(_triangle(da, lower, unit), x)
        rhs = db - rhs if db is not None else -rhs
        return [_loops.triangular(a, rhs, lower, unit)]

    forward = lambda a, b: _loops.triangular(a, b, lower, unit)  # noqa: E731
    return custom_op(fn, "linalg.solve_triangular", forward_fn=forward, tangent_fn=tangent)


# --- LU ------------------------------------------------------------------------------------


@batching.over_leading_axes
def lu_factor(a: Any) -> tuple[Tensor, Tensor]:
    """`(lu, piv)` of the square `a` with partial pivoting (scipy's and JAX's `lu_factor`):
    `P a = L U`, L's unit lower triangle packed below U; `piv` (int32) holds LAPACK's row
    swaps. The gradient of `lu` is the transpose of its tangent map (with L^-1 and U^-1)."""
    a = _square(a, "lu_factor")

    def fn(a: Tensor) -> Any:
        lu, piv, perm = _loops.lu_factor(a)

        def grad(ct_lu: Tensor, _ct_piv: Any) -> Tensor:
            lu_r, _, perm_r = _loops.lu_factor(a) if _recompute() else (lu, piv, perm)
            low = _triangle(lu_r, True, True) + _core.tensor(_eye(a), dtype=a.dtype)
            up = _triangle(lu_r, False, False)
            ct_lau = _triangle(_core.matmul(_mt(low), ct_lu), True, True)
            ct_lau = ct_lau + _triangle(_core.matmul(ct_lu, _mt(up)), False, False)
            # a's cotangent: P^T L^-T ct_lau U^-T
            y = _loops.triangular(_mt(low), ct_lau, lower=False, unit_diagonal=True)
            y = _mt(_loops.triangular(up, _mt(y), lower=False, unit_diagonal=False))
            return _core.matmul(_mt(_loops.permutation_matrix(perm_r, a.dtype)), y)

        return (lu, piv), grad

    def forward(a: Tensor) -> tuple[Tensor, Tensor]:
        lu, piv, _ = _loops.lu_factor(a)
        return lu, piv

    def tangent(xs: list[Tensor], ts: list[Any]) -> list[Any]:
        (a,), (da,) = xs, ts
        lu, _, perm = _loops.lu_factor(a)
        low = _triangle(lu, True, True) + _core.tensor(_eye(a), dtype=a.dtype)
        up = _triangle(lu, False, False)
        pda = _core.matmul(_loops.permutation_matrix(perm, a.dtype), da)
        lau = _loops.triangular(low, pda, lower=True, unit_diagonal=True)
        lau = _mt(_loops.triangular(_mt(up), _mt(lau), lower=True, unit_diagonal=False))
        dlu = _core.matmul(low, _triangle(lau, True, True))
        return [dlu + _core.matmul(_triangle(lau, False, False), up), None]

    return custom_op(fn, "linalg.lu_factor", forward_fn=forward, tangent_fn=tangent)(a)


def _eye(a: Tensor) -> Any:
    import numpy as np

    return np.eye(a.shape[-1])


@batching.over_leading_axes
def lu_solve(lu_and_piv: tuple[Any, Any], b: Any, trans: int = 0) -> Tensor:
    """`x` with `a x = b` (`trans` 1: `a^T x = b`) from `lu_factor(a)` (scipy's and JAX's
    `lu_solve`). Differentiable in `lu` and `b` through its triangular solves."""
    lu, piv = lu_and_piv
    lu = _square(lu, "lu_solve")
    piv = _tensor(piv)
    if piv.dtype.is_floating or list(piv.shape) != [*lu.shape[:-2], lu.shape[-1]]:
        raise errors.InvalidArgumentError(
            f"lu_solve: piv must be integers shaped {[*lu.shape[:-2], lu.shape[-1]]}, got "
            f"{piv.dtype}{list(piv.shape)}"
        )
    vector = _tensor(b).ndim == lu.ndim - 1
    lu, b = _rhs(lu, b, "lu_solve", vector)
    p = _loops.permutation_matrix(_loops.permutation(piv), lu.dtype)
    if trans in (0, "N"):
        y = solve_triangular(lu, _core.matmul(p, b), lower=True, unit_diagonal=True)
        x = solve_triangular(lu, y, lower=False)
    elif trans in (1, "T", "C"):
        y = solve_triangular(lu, b, trans=1, lower=False)
        y = solve_triangular(lu, y, trans=1, lower=True, unit_diagonal=True)
        x = _core.matmul(_mt(p), y)
    else:
        raise errors.InvalidArgumentError(f"lu_solve: trans must be 0 or 1, got {trans!r}")
    return _core.squeeze(x, -1) if vector else x


# --- general solves, inverse, determinants ---------------------------------------------------


def solve(a: Any, b: Any) -> Tensor:
    """`x` with `a x = b` (numpy's and JAX's `solve`; `b` is a vector when 1-D). LU with
    partial pivoting; the gradient is `solve(a^T, g)` with the same factors, and `-that x^T`
    for `a`."""
    a = _square(a, "solve")
    b = _tensor(b)
    vector = b.ndim == 1  # of one lane, inside vmap
    if vector:
        b = _core.expand_dims(b, -1)
    x = _solve_matrices(a, b)
    return _core.squeeze(x, -1) if vector else x


@batching.over_leading_axes
def _solve_matrices(a: Tensor, b: Tensor) -> Tensor:
    a, b = _rhs(a, b, "solve", False)
    x = _solve_op(a, b)
    _refuse_eagerly("solve", "the matrix is singular", x, a, b)
    return x


def _solve_op(a: Tensor, b: Tensor) -> Tensor:
    def fn(a: Tensor, b: Tensor) -> Any:
        lu, _, perm = _loops.lu_factor(a)
        x = _loops.lu_solve(lu, perm, b, trans=False)

        def grad(ct: Tensor) -> tuple[Tensor, Tensor]:
            lu_r, perm_r, x_r = lu, perm, x
            if _recompute():
                lu_r, _, perm_r = _loops.lu_factor(a)
                x_r = _loops.lu_solve(lu_r, perm_r, b, trans=False)
            ct_b = _loops.lu_solve(lu_r, perm_r, ct, trans=True)
            return -_core.matmul(ct_b, _mt(x_r)), ct_b

        return x, grad

    def forward(a: Tensor, b: Tensor) -> Tensor:
        lu, _, perm = _loops.lu_factor(a)
        return _loops.lu_solve(lu, perm, b, trans=False)

    def tangent(xs: list[Tensor], ts: list[Any]) -> list[Any]:
        (a, b), (da, db) = xs, ts
        lu, _, perm = _loops.lu_factor(a)
        x = _loops.lu_solve(lu, perm, b, trans=False)
        rhs = -_core.matmul(da, x) if da is not None else _core.zeros_like(x)
        rhs = rhs + db if db is not None else rhs
        return [_loops.lu_solve(lu, perm, rhs, trans=False)]

    return custom_op(fn, "linalg.solve", forward_fn=forward, tangent_fn=tangent)(a, b)


@batching.over_leading_axes
def inv(a: Any) -> Tensor:
    """The inverse of `a` (numpy's `inv`): `solve(a, I)`."""
    a = _square(a, "inv")
    eye = _core.broadcast_to(_core.tensor(_eye(a), dtype=a.dtype), list(a.shape))
    inverse = _solve_op(a, eye)
    _refuse_eagerly("inv", "the matrix is singular", inverse, a)
    return inverse


@batching.over_leading_axes
def slogdet(a: Any) -> tuple[Tensor, Tensor]:
    """`(sign, log|det a|)` (numpy's `slogdet`) from the LU factors; the gradient of the log
    is `inv(a)^T`, the sign's is zero."""
    a = _square(a, "slogdet")

    def fn(a: Tensor) -> Any:
        lu, piv, perm = _loops.lu_factor(a)
        sign, logabs = _sign_and_log(lu, piv)

        def grad(_ct_sign: Any, ct_log: Tensor) -> Tensor:
            lu_r, _, perm_r = _loops.lu_factor(a) if _recompute() else (lu, piv, perm)
            inverse_t = _loops.lu_solve(lu_r, perm_r, _identity_like(a), trans=True)
            return _core.expand_dims(_core.expand_dims(ct_log, -1), -1) * inverse_t

        return (sign, logabs), grad

    def forward(a: Tensor) -> tuple[Tensor, Tensor]:
        lu, piv, _ = _loops.lu_factor(a)
        return _sign_and_log(lu, piv)

    def tangent(xs: list[Tensor], ts: list[Any]) -> list[Any]:
        (a,), (da,) = xs, ts
        lu, _, perm = _loops.lu_factor(a)
        return [None, _trace(_loops.lu_solve(lu, perm, da, trans=False))]

    return custom_op(fn, "linalg.slogdet", forward_fn=forward, tangent_fn=tangent)(a)


@batching.over_leading_axes
def det(a: Any) -> Tensor:
    """The determinant of `a` (numpy's `det`) from the LU factors; its gradient is
    `det(a) inv(a)^T`."""
    a = _square(a, "det")

    def fn(a: Tensor) -> Any:
        lu, piv, perm = _loops.lu_factor(a)
        d = _det(lu, piv)

        def grad(ct: Tensor) -> Tensor:
            lu_r, piv_r, perm_r, d_r = lu, piv, perm, d
            if _recompute():
                lu_r, piv_r, perm_r = _loops.lu_factor(a)
                d_r = _det(lu_r, piv_r)
            inverse_t = _loops.lu_solve(lu_r, perm_r, _identity_like(a), trans=True)
            return _core.expand_dims(_core.expand_dims(ct * d_r, -1), -1) * inverse_t

        return d, grad

    def forward(a: Tensor) -> Tensor:
        lu, piv, _ = _loops.lu_factor(a)
        return _det(lu, piv)

    def tangent(xs: list[Tensor], ts: list[Any]) -> list[Any]:
        (a,), (da,) = xs, ts
        lu, piv, perm = _loops.lu_factor(a)
        return [_det(lu, piv) * _trace(_loops.lu_solve(lu, perm, da, trans=False))]

    return custom_op(fn, "linalg.det", forward_fn=forward, tangent_fn=tangent)(a)


def _identity_like(a: Tensor) -> Tensor:
    return _core.broadcast_to(_core.tensor(_eye(a), dtype=a.dtype), list(a.shape))


def _diagonal(m: Tensor) -> Tensor:
    from ..arrays import diagonal

    return diagonal(m, 0, -2, -1)


def _trace(m: Tensor) -> Tensor:
    return _core.sum(_diagonal(m), axis=-1)


def _swaps_sign(lu: Tensor, piv: Tensor) -> Tensor:
    """(-1) to the number of rows that were swapped."""
    swapped = _core.not_equal(piv, _core.arange(piv.shape[-1], dtype="int32"))
    odd = _core.rem(_core.sum(_core.cast(swapped, "int32"), axis=-1), 2)
    return 1.0 - 2.0 * _core.cast(odd, lu.dtype)


def _det(lu: Tensor, piv: Tensor) -> Tensor:
    from ..reductions import prod

    return _swaps_sign(lu, piv) * prod(_diagonal(lu), axis=-1)


def _sign_and_log(lu: Tensor, piv: Tensor) -> tuple[Tensor, Tensor]:
    diag = _diagonal(lu)
    negative = _core.sum(_core.cast(_core.less(diag, 0.0), "int32"), axis=-1)
    sign = _swaps_sign(lu, piv) * (1.0 - 2.0 * _core.cast(_core.rem(negative, 2), lu.dtype))
    zero = _core.greater(_core.sum(_core.cast(_core.equal(diag, 0.0), "int32"), axis=-1), 0)
    sign = _core.where(zero, _core.zeros_like(sign), sign)
    return sign, _core.sum(_core.log(_core.abs(diag)), axis=-1)


# --- Cholesky ------------------------------------------------------------------------------


@batching.over_leading_axes
def cholesky(a: Any) -> Tensor:
    """The lower triangular `L` with `L L^T = a` (numpy's and JAX's `cholesky`; the input is
    symmetrised first, as JAX's, and a matrix that is not positive definite gives NaN). The
    gradient is Murray's: `sym(L^-T Phi(L^T G) L^-1)`, Phi the lower triangle with half its
    diagonal."""
    a = _square(a, "cholesky")

    def fn(a: Tensor) -> Any:
        low = _loops.cholesky(_symmetrised(a))

        def grad(ct: Tensor) -> Tensor:
            low_r = _loops.cholesky(_symmetrised(a)) if _recompute() else low
            phi = _half_diagonal(_triangle(_core.matmul(_mt(low_r), ct), True, False))
            y = _loops.triangular(_mt(low_r), phi, lower=False, unit_diagonal=False)
            s = _mt(_loops.triangular(_mt(low_r), _mt(y), lower=False, unit_diagonal=False))
            return _symmetrised(s)

        return low, grad

    def forward(a: Tensor) -> Tensor:
        return _loops.cholesky(_symmetrised(a))

    def tangent(xs: list[Tensor], ts: list[Any]) -> list[Any]:
        (a,), (da,) = xs, ts
        low = _loops.cholesky(_symmetrised(a))
        y = _loops.triangular(low, _symmetrised(da), lower=True, unit_diagonal=False)
        z = _mt(_loops.triangular(low, _mt(y), lower=True, unit_diagonal=False))
        return [_core.matmul(low, _half_diagonal(_triangle(z, True, False)))]

    low = custom_op(fn, "linalg.cholesky", forward_fn=forward, tangent_fn=tangent)(a)
    _refuse_eagerly("cholesky", "the matrix is not positive definite", low, a)
    return low


def _symmetrised(m: Tensor) -> Tensor:
    return (m + _mt(m)) * 0.5


def _half_diagonal(m: Tensor) -> Tensor:
    import numpy as np

    weights = 1.0 - 0.5 * np.eye(m.shape[-1])
    return m * _core.tensor(weights, dtype=m.dtype)


@batching.over_leading_axes
def cho_solve(c_and_lower: tuple[Any, bool], b: Any) -> Tensor:
    """`x` with `a x = b` from `cholesky`'s factor `c` of `a` (scipy's and JAX's
    `cho_solve`): two triangular solves, differentiable in `c` and `b`."""
    c, lower = c_and_lower
    c = _square(c, "cho_solve")
    y = solve_triangular(c, b, trans=0 if lower else 1, lower=lower)
    return solve_triangular(c, y, trans=1 if lower else 0, lower=lower)


# --- QR ------------------------------------------------------------------------------------


@batching.over_leading_axes
def qr(a: Any, mode: str = "reduced") -> Any:
    """numpy's `qr`: `(q, r)` with `a = q r`, `q` orthonormal columns and `r` upper triangular,
    by Householder reflections (LAPACK's signs, so numpy's answer). `mode` "reduced" (q m x k,
    r k x n, k = min(m, n)), "complete" (q m x m, r m x n) or "r" (r alone, k x n). For
    `m >= n` in the reduced modes the derivative is JAX's rule (triangular solves with r);
    otherwise the reflections are differentiated as written."""
    a = _tensor(a)
    if a.ndim < 2 or not a.dtype.is_floating:
        raise errors.InvalidArgumentError(
            f"qr: `a` must be float matrices (..., m, n), got {a.dtype}{list(a.shape)}"
        )
    if mode not in ("reduced", "complete", "r"):
        raise errors.InvalidArgumentError(
            f"qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}"
        )
    m, n = a.shape[-2], a.shape[-1]
    if mode == "complete" or m < n:
        q, r = _loops.householder_qr(a)
        k = m if mode == "complete" else min(m, n)
        q, r = q[..., :, :k], r[..., :k, :]
    else:
        q, r = _reduced_qr(a)
    return r if mode == "r" else (q, r)


@custom_jvp
def _reduced_qr(a: Tensor) -> tuple[Tensor, Tensor]:
    n = a.shape[-1]
    q, r = _loops.householder_qr(a)
    return q[..., :, :n], r[..., :n, :]


@_reduced_qr.defjvp
def _reduced_qr_jvp(primals: tuple[Tensor], tangents: tuple[Tensor]) -> Any:
    """JAX's `qr_jvp_rule` (m >= n): with `B = Q^T dA R^-1` and `W = tril(B, -1) - its
    transpose`, `dQ = Q (W - B) + dA R^-1`, `dR = (B - W) R`."""
    (a,), (da,) = primals, tangents
    q, r = _reduced_qr(a)
    # dA R^-1: solve R^T X^T = dA^T (R^T lower triangular), through the solve's own rules, so
    # that reverse mode (which transposes this rule) solves with the kernels, not the loop
    da_rinv = _mt(_triangular_op(True, False)(_mt(r), _mt(da)))
    b = _core.matmul(_mt(q), da_rinv)
    lower = _triangle(b, True, True)
    w = lower - _mt(lower)
    dq = _core.matmul(q, w - b) + da_rinv
    dr = _core.matmul(b - w, r)
    return (q, r), (dq, dr)


@batching.over_leading_axes
def lstsq(a: Any, b: Any, rcond: float | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """numpy's `lstsq` for a matrix of full rank: `(x, residuals, rank, s)` with `x`
    minimising `|a x - b|` (the least-norm one when `a` is wide), `residuals` the squared
    residual per column of `b` when `a` is tall (empty otherwise), `rank` the number of singular
    values above `rcond * s[0]` (int32; `rcond` None is numpy's `eps * max(m, n)`) and `s` the
    singular values, largest first (one-sided Jacobi). `x` comes from a QR factorisation, so
    its derivative is QR's and the triangular solves'. A rank-deficient `a` raises
    `LinAlgError` eagerly; traced, its `x` holds inf or NaN."""
    a, b = _tensor(a), _tensor(b)
    if a.ndim != 2 or not a.dtype.is_floating:
        raise errors.InvalidArgumentError(
            f"lstsq: `a` must be a float matrix, got {a.dtype}{list(a.shape)}"
        )
    m, n = a.shape
    vector = b.ndim == 1
    if b.dtype != a.dtype:
        raise errors.DTypeError(f"lstsq: `a` is {a.dtype} and `b` {b.dtype}")
    if b.ndim not in (1, 2) or b.shape[0] != m:
        raise errors.ShapeError(f"lstsq: `b` must have {m} rows, got {list(b.shape)}")
    rhs = _core.expand_dims(b, -1) if vector else b
    s = _loops.singular_values(a)
    import numpy as np

    cutoff = float(np.finfo(np.dtype(a.dtype.name)).eps) * max(m, n) if rcond is None else rcond
    rank = _core.sum(_core.cast(_core.greater(s, s[..., :1] * cutoff), "int32"), axis=-1)
    if not _core.trace_active() and int(rank) < min(m, n):
        raise errors.LinAlgError(
            _validate.at_user(
                f"lstsq: `a` is rank-deficient (rank {int(rank)} of {min(m, n)}); "
                "gl.linalg.lstsq solves systems of full rank"
            )
        )
    if m >= n:
        q, r = qr(a)
        x = solve_triangular(r, _core.matmul(_mt(q), rhs))
        fit = _core.matmul(a, x) - rhs
        residuals = _core.sum(fit * fit, axis=0) if m > n else _core.zeros([0], dtype=a.dtype)
    else:
        q, r = qr(_mt(a))
        x = _core.matmul(q, solve_triangular(r, rhs, trans=1))
        residuals = _core.zeros([0], dtype=a.dtype)
    if vector:
        x = _core.squeeze(x, -1)
    return x, residuals, rank, s


# --- norms ---------------------------------------------------------------------------------


def norm(
    x: Any,
    ord: Any = None,  # noqa: A002 (numpy's name)
    axis: int | tuple[int, int] | None = None,
    keepdims: bool = False,
) -> Tensor:
    """numpy's `norm`: vector norms (`ord` None or 2, 1, inf, -inf, 0, any p) over one axis and
    matrix norms (`ord` None or "fro", 1, -1, inf, -inf, 2, -2, "nuc": the last three from
    singular values) over two; `axis` None is the 2-norm of
    everything for `ord` None, else the vector or matrix norm by `x`'s rank. The gradient of a
    2-norm (and of "fro") at zero is zero, not NaN."""
    x = _tensor(x)
    if axis is None:
        if ord is None:
            return _two_norm(x, list(range(x.ndim)), keepdims)
        if x.ndim not in (1, 2):
            raise errors.InvalidArgumentError(
                "norm: give `axis` for an `ord` of an array of rank > 2"
            )
        axis = 0 if x.ndim == 1 else (0, 1)
    axes = [axis] if isinstance(axis, int) else list(axis)
    axes = [a % x.ndim if -x.ndim <= a < x.ndim else _bad_axis(a, x.ndim) for a in axes]
    if len(axes) == 1:
        return _vector_norm(x, ord, axes[0], keepdims)
    if len(axes) == 2 and axes[0] != axes[1]:
        return _matrix_norm(x, ord, axes, keepdims)
    raise errors.InvalidArgumentError(
        f"norm: axis must be one axis or two distinct ones, got {axis}"
    )


def _bad_axis(a: int, ndim: int) -> int:
    raise errors.InvalidArgumentError(f"norm: axis {a} is out of range for {ndim} dims")


def _two_norm(x: Tensor, axes: list[int], keepdims: bool) -> Tensor:
    squares = _core.sum(x * x, axis=axes, keepdims=keepdims)
    zero = _core.equal(squares, 0.0)
    safe = _core.where(zero, _core.ones_like(squares), squares)
    return _core.where(zero, _core.zeros_like(squares), _core.sqrt(safe))


def _vector_norm(x: Tensor, order: Any, axis: int, keepdims: bool) -> Tensor:
    inf = float("inf")
    if order is None or order == 2:
        return _two_norm(x, [axis], keepdims)
    if order == inf:
        return _core.max(_core.abs(x), axis=axis, keepdims=keepdims)
    if order == -inf:
        return _core.min(_core.abs(x), axis=axis, keepdims=keepdims)
    if order == 0:
        nonzero = _core.cast(_core.not_equal(x, 0.0), x.dtype)
        return _core.sum(nonzero, axis=axis, keepdims=keepdims)
    if order == 1:
        return _core.sum(_core.abs(x), axis=axis, keepdims=keepdims)
    if isinstance(order, str):
        raise errors.InvalidArgumentError(f"norm: {order!r} is not a vector norm")
    p = float(order)
    total = _core.sum(_core.abs(x) ** p, axis=axis, keepdims=keepdims)
    return total ** (1.0 / p)


def _matrix_norm(x: Tensor, order: Any, axes: list[int], keepdims: bool) -> Tensor:
    inf = float("inf")
    row, col = axes
    if order is None or order == "fro":
        return _two_norm(x, axes, keepdims)
    if order in (1, -1, inf, -inf):
        # 1: the largest column sum; inf: the largest row sum
        summed, across = (row, col) if order in (1, -1) else (col, row)
        sums = _core.sum(_core.abs(x), axis=summed, keepdims=True)
        pick = _core.max if order in (1, inf) else _core.min
        out = pick(sums, axis=across, keepdims=True)
        return out if keepdims else _core.squeeze(out, sorted(axes))
    if order in (2, -2, "nuc"):
        moved = _core.transpose(x, [d for d in range(x.ndim) if d not in axes] + axes)
        s = _loops.singular_values(moved)
        out = _core.sum(s, axis=-1) if order == "nuc" else s[..., 0] if order == 2 else s[..., -1]
        if keepdims:
            for ax in sorted(axes):
                out = _core.expand_dims(out, ax)
        return out
    raise errors.InvalidArgumentError(f"norm: {order!r} is not a matrix norm")
