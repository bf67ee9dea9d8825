"""Implicit differentiation: JAX's `lax.custom_root` and `lax.custom_linear_solve`.

The solver runs once, undifferentiated, and its answer `x*` is the value returned. Derivatives
come from Newton steps taken from `x*` that leave its value unchanged to first order and carry
the implicit function theorem's derivatives:

- `custom_root`: `x <- x - J(x)^-1 f(x)` with `J^-1` applied by the user's `tangent_solve` on
  the linearisation of `f` at `x` (`gl.jvp`). Started at the root, m Newton steps have the
  root's derivatives exactly up to order 2^m - 1 (the error squares each step);
- `custom_linear_solve`: `x <- x + L(b - A x)` with `L` the user's `solve` held as a linear
  operator at a zero residual: its value is zero (no solve runs on the residual), its tangent
  map `solve`, its transpose `transpose_solve`. Each step makes one more order exact, and a
  first derivative costs what JAX's does: one `solve` or one `transpose_solve`.

Nothing differentiates the solver's own iterations. The number of steps is the number of
derivatives that may be asked: the tapes and forward-mode accumulators active at the call (none
when nothing is differentiated: the answer costs one solve), and at least two in a traced
function, whose gradient may be asked later. The value returned is `x*` itself: the steps'
value is taken back out (`x* + (x - stop_gradient(x))`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _core, errors, nest
from ._core import Tensor
from ._recording import paused
from .autodiff import grad
from .forward import custom_jvp, jvp


def _steps() -> int:
    depth = len(_core.recording_tape_keys()) + len(_core.active_accumulators())
    return max(depth, 2) if _core.trace_active() else depth


def _leaves(x: Any) -> list[Tensor]:
    return [v if isinstance(v, Tensor) else _core.tensor(v) for v in nest.flatten(x)]


def _undifferentiated(run: Callable[[], Any]) -> Any:
    with paused():
        out = run()
    return nest.map_structure(_core.stop_gradient, out)


def _with_value_of(value: Any, carrier: Any) -> Any:
    """`value`'s numbers with `carrier`'s derivatives."""
    return nest.map_structure(
        lambda v, c: v + (c - _core.stop_gradient(c)), value, carrier, check_types=False
    )


def _combine(op: Callable[[Tensor, Tensor], Tensor], a: Any, b: Any) -> Any:
    return nest.map_structure(op, a, b, check_types=False)


def custom_root(
    f: Callable[[Any], Any],
    initial_guess: Any,
    solve: Callable[[Callable[[Any], Any], Any], Any],
    tangent_solve: Callable[[Callable[[Any], Any], Any], Any],
    has_aux: bool = False,
) -> Any:
    """JAX's `lax.custom_root`: `solve(f, initial_guess)` finds `x` with `f(x) = 0`, and the
    derivatives of that root (with respect to what `f` closes over) come from the implicit
    function theorem, not from `solve`'s iterations. `tangent_solve(g, y)` solves the linear
    system `g(x) = y`, where `g` is the linearisation of `f` at the root (for a scalar,
    `lambda g, y: y / g(1.0)`; in general `gl.linalg.solve(gl.jacfwd(g)(y), y)`). With
    `has_aux`, `solve` returns `(root, aux)` and aux is returned beside the root, not
    differentiated."""
    found = _undifferentiated(lambda: solve(f, initial_guess))
    root, aux = found if has_aux else (found, None)
    _check_like(root, initial_guess, "custom_root", "solve's root")
    x = root
    for _ in range(_steps()):
        fx = f(x)
        point = x

        def linearized(v: Any, point: Any = point) -> Any:
            return jvp(lambda p: f(p), (point,), (v,))[1]

        x = _combine(_core.sub, x, tangent_solve(linearized, fx))
    out = _with_value_of(root, x)
    return (out, aux) if has_aux else out


def custom_linear_solve(
    matvec: Callable[[Any], Any],
    b: Any,
    solve: Callable[[Callable[[Any], Any], Any], Any],
    transpose_solve: Callable[[Callable[[Any], Any], Any], Any] | None = None,
    symmetric: bool = False,
    has_aux: bool = False,
) -> Any:
    """JAX's `lax.custom_linear_solve`: `solve(matvec, b)` solves `matvec(x) = b`, and the
    solution is differentiated as `A^-1 b` with `A^-1` applied by `solve` (forward mode) and by
    `transpose_solve(vecmat, ct)` (reverse mode; `solve` itself when `symmetric`), never through
    `solve`'s iterations. Derivatives reach `b` and what `matvec` closes over."""
    found = _undifferentiated(lambda: solve(matvec, b))
    x_star, aux = found if has_aux else (found, None)
    _check_like(x_star, b, "custom_linear_solve", "solve's answer")
    if transpose_solve is None and symmetric:
        transpose_solve = solve
    inverse = _LinearInverse(matvec, solve, transpose_solve, has_aux)
    x = x_star
    for _ in range(_steps()):
        residual = _combine(_core.sub, b, matvec(x))
        x = _combine(_core.add, x, inverse(residual))
    out = _with_value_of(x_star, x)
    return (out, aux) if has_aux else out


def _check_like(got: Any, like: Any, op: str, what: str) -> None:
    a, b = _leaves(got), _leaves(like)
    types = lambda ts: [(t.dtype, tuple(t.shape)) for t in ts]  # noqa: E731
    if types(a) != types(b):
        raise errors.InvalidArgumentError(
            f"{op}: {what} has leaves {types(a)}, where {types(b)} were expected"
        )


class _LinearInverse:
    """`r -> solve(matvec, r)` as a linear operator of `r` alone, at a residual `r` that is
    zero: its value is zero, its tangent `solve` of the tangent, its transpose
    `transpose_solve` of the cotangent (the operator's own dependence on what `matvec` closes
    over is the caller's steps' business)."""

    def __init__(
        self,
        matvec: Callable[[Any], Any],
        solve: Callable[..., Any],
        transpose_solve: Callable[..., Any] | None,
        has_aux: bool,
    ) -> None:
        self.matvec, self.solve, self.transpose_solve = matvec, solve, transpose_solve
        self.has_aux = has_aux

    def __call__(self, residual: Any) -> Any:
        leaves = _leaves(residual)
        structure = residual

        def apply(*rs: Tensor) -> Any:
            out = self.solve(self.matvec, nest.pack_sequence_as(structure, list(rs)))
            flat = _leaves(out[0] if self.has_aux else out)
            return flat[0] if len(flat) == 1 else tuple(flat)

        def zeros(*rs: Tensor) -> Any:
            # The residual is zero to rounding and the steps' value is taken back out: no solve
            # runs on it (a solver may divide by the residual's norm).
            flat = [_core.zeros_like(r) for r in rs]
            return flat[0] if len(flat) == 1 else tuple(flat)

        op = _Transposable(zeros, self._transposed(structure))

        @op.defjvp
        def rule(primals: tuple[Tensor, ...], tangents: tuple[Any, ...]) -> Any:
            ts = [
                t if t is not None else _core.zeros_like(p)
                for p, t in zip(primals, tangents, strict=True)
            ]
            return zeros(*primals), apply(*ts)

        out = op(*leaves)
        flat = [out] if isinstance(out, Tensor) else list(out)
        return nest.pack_sequence_as(structure, flat)

    def _transposed(self, structure: Any) -> Callable[[list[Any]], list[Any]]:
        def transpose(cotangents: list[Any]) -> list[Any]:
            if self.transpose_solve is None:
                raise errors.GradientError(
                    "custom_linear_solve: reverse mode needs transpose_solve (or symmetric=True)"
                )
            ct = nest.pack_sequence_as(structure, cotangents)
            out = self.transpose_solve(self._vecmat(structure), ct)
            out = out[0] if self.has_aux else out
            return _leaves(out)

        return transpose

    def _vecmat(self, structure: Any) -> Callable[[Any], Any]:
        """`u -> A^T u`: the gradient of `<u, A v>` with respect to `v`."""

        def vecmat(u: Any) -> Any:
            zeros = nest.map_structure(_core.zeros_like, structure)

            def inner(v: Any) -> Tensor:
                sums = [_core.sum(p) for p in nest.flatten(_combine(_core.mul, u, self.matvec(v)))]
                return sum(sums[1:], sums[0])

            return grad(inner)(zeros)

        return vecmat


class _Transposable(custom_jvp):
    """A `custom_jvp` of a linear function whose reverse mode is an explicit transpose, not
    the transposed rule."""

    _value_from_rule = False

    def __init__(self, fn: Callable[..., Any], transpose: Callable[[list[Any]], list[Any]]):
        super().__init__(fn)
        self._transpose = transpose

    def _transposed(
        self, xs: list[Any], kwargs: dict[str, Any], where: str, cotangents: list[Any]
    ) -> list[Any]:
        return self._transpose(cotangents)
