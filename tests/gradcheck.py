"""One numerical gradient checker for every gradient test (first and second order).

`check_grads(fn, args)` compares gradloop's reverse-mode gradients of `fn` with central finite
differences computed in float64:

* first order: for L(x) = sum(fn(x) * c) with a fixed random cotangent `c` (so non-scalar outputs
  are checked in every component), dL/dx from `gl.GradientTape` and from `gl.grad` is compared
  element by element with (L(x + h e_i) - L(x - h e_i)) / 2h;
* second order: for H(x) = sum_i <dL/dx_i, v_i> with a fixed random direction `v`, dH/dx is the
  Hessian-vector product H v; it is taken by differentiating the gradient (nested tapes, and
  `gl.grad` of a function that calls `gl.grad`) and compared with the directional difference of
  the first-order gradient, (grad L(x + h v) - grad L(x - h v)) / 2h.

Mode "graph" computes the same gradients inside `@gl.function` (symbolic gradients of the traced
program, run by the graph interpreter) and also checks that the traced forward pass agrees with
eager mode; mode "compiled" does the same under `gl.jit` (the gradient program emitted as MLIR,
compiled by IREE for llvm-cpu and run by its runtime).

`fn` maps gl tensors (float64, one per arg) to a float64 gl tensor of any shape; constants such as
a `where` condition or `take` indices are closed over. Gradients must have the dtype and shape of
their argument (a size-0 argument is checked for that alone); an unconnected gradient (None) is
read as zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import gradloop as gl

Fn = Callable[..., "gl.Tensor"]
# Modes that stage the program before running it: traced into a graph, or also compiled by IREE.
STAGED: dict[str, Callable[[Fn], Fn]] = {"graph": gl.function, "compiled": gl.jit}
MODES = ("tape", "grad", "graph", "compiled")


@dataclass(frozen=True)
class Program:
    """What a check runs under `gl.jit`: `fn` on `inputs` returns a flat tuple of tensors, and
    `read` turns those results into what the check compares. A suite may run many programs as
    one module (`run_compiled`): IREE's cost is mostly per module."""

    fn: Callable[..., tuple[gl.Tensor, ...]]
    inputs: list[gl.Tensor]
    read: Callable[[Sequence[gl.Tensor]], Any]


def run_alone(program: Program) -> Any:
    """`program` compiled as its own module and run."""
    return program.read(gl.jit(program.fn)(*program.inputs))


def check_grads(
    fn: Fn,
    args: Sequence[np.ndarray | gl.Tensor],
    order: int = 2,
    *,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    eps: float = 1e-6,
    seed: int = 0,
    modes: Sequence[str] = MODES,
    run_compiled: Callable[[Program], Any] = run_alone,
) -> None:
    """Asserts that gradloop's gradients of `fn` at `args` match finite differences.

    `order` is 1 (gradients) or 2 (also Hessian-vector products); `modes` picks the
    differentiation APIs checked: "tape" (`gl.GradientTape`), "grad" (`gl.grad`), "graph"
    (`gl.grad` inside `gl.function`) and "compiled" (`gl.grad` under `gl.jit`, the program
    `gradient_program` makes, run by `run_compiled`).
    """
    if order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order}")
    xs = [_as_float64_array(a) for a in args]
    out, loss, vs = _gradient_setup(fn, xs, order, seed)
    expected = numerical_gradient(lambda *a: _scalar(loss(*_tensors(a))), xs, eps)
    # Under `gl.jit` the forward pass, the gradient and the Hessian-vector product are one
    # program (IREE compiles per module, the costly part), each output checked as the other
    # modes' are.
    compiled = run_compiled(_derivatives(fn, loss, xs, vs)) if "compiled" in modes else None
    forwards = {"graph": lambda: gl.function(fn)(*_tensors(xs))}
    if compiled is not None:
        forwards["compiled"] = lambda: compiled[0]
    # IREE's f64 kernels (vectorised polynomials, fused multiply-adds) round differently.
    for mode, rtol_forward in (("graph", 1e-12), ("compiled", 1e-10)):
        if mode in modes:
            np.testing.assert_allclose(
                np.asarray(forwards[mode]()),
                np.asarray(out),
                rtol=rtol_forward,
                atol=1e-12,
                err_msg=f"{mode} mode forward != eager forward",
            )
    for mode in modes:
        got = compiled[1] if mode == "compiled" else _first_order(loss, xs, mode)
        _compare(got, expected, xs, f"order 1 ({mode})", atol, rtol)
    if vs is None:
        return
    expected_hvp = _directional_difference(lambda *a: _first_order(loss, a, "tape"), xs, vs, eps)
    for mode in modes:
        got = compiled[2] if mode == "compiled" else _hvp(loss, xs, vs, mode)
        _compare(got, expected_hvp, xs, f"order 2 ({mode})", atol, rtol)


def _gradient_setup(
    fn: Fn, xs: Sequence[np.ndarray], order: int, seed: int
) -> tuple[gl.Tensor, Fn, list[np.ndarray] | None]:
    """`fn`'s eager output, the loss with its random cotangent and (second order) the random
    directions: drawn from `seed`, the same for the check and for its compiled program."""
    rng = np.random.default_rng(seed)
    out = fn(*_tensors(xs))
    assert out.dtype == gl.float64, f"fn must return a float64 tensor, got {out.dtype}"
    loss = _loss(fn, gl.tensor(rng.standard_normal(out.shape)))
    vs = [rng.standard_normal(x.shape) for x in xs] if order == 2 else None
    return out, loss, vs


def gradient_program(
    fn: Fn, args: Sequence[np.ndarray | gl.Tensor], order: int = 2, *, seed: int = 0
) -> Program:
    """The program `check_grads(fn, args, order, seed=seed)` runs under `gl.jit`."""
    xs = [_as_float64_array(a) for a in args]
    _, loss, vs = _gradient_setup(fn, xs, order, seed)
    return _derivatives(fn, loss, xs, vs)


def _derivatives(
    fn: Fn, loss: Fn, xs: Sequence[np.ndarray], vs: Sequence[np.ndarray] | None
) -> Program:
    """`fn`'s output, `loss`'s gradient and (given directions `vs`) its Hessian-vector product,
    computed by one program."""
    ts = _tensors(xs)
    n = len(ts)
    argnums = tuple(range(n))
    vts = _tensors(vs) if vs is not None else None

    def directional(*args: gl.Tensor) -> gl.Tensor:
        return _inner(gl.grad(loss, argnums=argnums)(*args), vts)

    def everything(*args: gl.Tensor) -> tuple[gl.Tensor, ...]:
        gs = tuple(gl.grad(loss, argnums=argnums)(*args))
        hs = tuple(gl.grad(directional, argnums=argnums)(*args)) if vts is not None else ()
        return (fn(*args), *gs, *hs)

    def read(results: Sequence[gl.Tensor]) -> Any:
        assert len(results) == 1 + n * (2 if vts is not None else 1)
        gs = [_to_numpy(g, x) for g, x in zip(results[1 : 1 + n], xs, strict=True)]
        if vts is None:
            return results[0], gs, None
        hs = [_to_numpy(h, x) for h, x in zip(results[1 + n :], xs, strict=True)]
        return results[0], gs, hs

    return Program(everything, ts, read)


def numerical_gradient(
    f: Callable[..., float], xs: Sequence[np.ndarray], eps: float = 1e-6
) -> list[np.ndarray]:
    """Central differences of the scalar function `f(*xs)` (numpy float64 arrays) per element."""
    grads = []
    for i, x in enumerate(xs):
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus = [a.copy() for a in xs]
            minus = [a.copy() for a in xs]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            g[idx] = (f(*plus) - f(*minus)) / (2 * eps)
        grads.append(g)
    return grads


def gradients(
    fn: Fn, args: Sequence[np.ndarray | gl.Tensor], mode: str = "tape"
) -> list[np.ndarray]:
    """First-order gradients of `sum(fn(*args))` as numpy arrays (None read as zeros)."""
    xs = [_as_float64_array(a) for a in args]
    return _first_order(lambda *t: gl.sum(fn(*t)), xs, mode)


# ---- helpers ---------------------------------------------------------------------------------


def _as_float64_array(a: np.ndarray | gl.Tensor) -> np.ndarray:
    return np.array(a, dtype=np.float64, copy=True)  # a private, writable 0-d+ array


def _tensors(xs: Sequence[np.ndarray]) -> list[gl.Tensor]:
    return [gl.tensor(np.asarray(x, dtype=np.float64)) for x in xs]


def _scalar(t: gl.Tensor) -> float:
    return float(np.asarray(t))


def _loss(fn: Fn, cotangent: gl.Tensor) -> Fn:
    def loss(*ts: gl.Tensor) -> gl.Tensor:
        return gl.sum(gl.mul(fn(*ts), cotangent))

    return loss


def _to_numpy(g: gl.Tensor | None, like: np.ndarray) -> np.ndarray:
    if g is None:
        return np.zeros_like(like)
    assert isinstance(g, gl.Tensor), f"a gradient must be a gl.Tensor, got {type(g).__name__}"
    assert g.dtype == gl.float64, f"gradient dtype {g.dtype} != float64"
    assert tuple(g.shape) == like.shape, f"gradient shape {g.shape} != argument shape {like.shape}"
    return np.array(g, dtype=np.float64)


def _first_order(loss: Fn, xs: Sequence[np.ndarray], mode: str) -> list[np.ndarray]:
    ts = _tensors(xs)
    if mode == "tape":
        with gl.GradientTape() as tape:
            for t in ts:
                tape.watch(t)
            y = loss(*ts)
        gs = tape.gradient(y, ts)
    elif mode == "grad":
        gs = gl.grad(loss, argnums=tuple(range(len(ts))))(*ts)
    elif mode in STAGED:
        gs = STAGED[mode](gl.grad(loss, argnums=tuple(range(len(ts)))))(*ts)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    assert len(gs) == len(ts), f"{len(gs)} gradients for {len(ts)} arguments"
    return [_to_numpy(g, x) for g, x in zip(gs, xs, strict=True)]


def _inner(gs: Sequence[gl.Tensor | None], vs: Sequence[gl.Tensor]) -> gl.Tensor:
    """sum_i <gs[i], vs[i]>, skipping unconnected (None) gradients."""
    total = gl.tensor(0.0, dtype=gl.float64)
    for g, v in zip(gs, vs, strict=True):
        if g is not None:
            total = gl.add(total, gl.sum(gl.mul(g, v)))
    return total


def _hvp(
    loss: Fn, xs: Sequence[np.ndarray], vs: Sequence[np.ndarray], mode: str
) -> list[np.ndarray]:
    ts, vts = _tensors(xs), _tensors(vs)
    argnums = tuple(range(len(ts)))
    if mode == "tape":
        with gl.GradientTape() as outer:
            for t in ts:
                outer.watch(t)
            with gl.GradientTape() as inner:
                for t in ts:
                    inner.watch(t)
                y = loss(*ts)
            h = _inner(inner.gradient(y, ts), vts)
        hs = outer.gradient(h, ts)
    elif mode == "grad":

        def directional(*args: gl.Tensor) -> gl.Tensor:
            return _inner(gl.grad(loss, argnums=argnums)(*args), vts)

        hs = gl.grad(directional, argnums=argnums)(*ts)
    elif mode in STAGED:

        def directional_staged(*args: gl.Tensor) -> gl.Tensor:
            return _inner(gl.grad(loss, argnums=argnums)(*args), vts)

        hs = STAGED[mode](gl.grad(directional_staged, argnums=argnums))(*ts)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return [_to_numpy(g, x) for g, x in zip(hs, xs, strict=True)]


def _directional_difference(
    grad_fn: Callable[..., list[np.ndarray]],
    xs: Sequence[np.ndarray],
    vs: Sequence[np.ndarray],
    eps: float,
) -> list[np.ndarray]:
    plus = grad_fn(*[x + eps * v for x, v in zip(xs, vs, strict=True)])
    minus = grad_fn(*[x - eps * v for x, v in zip(xs, vs, strict=True)])
    return [(p - m) / (2 * eps) for p, m in zip(plus, minus, strict=True)]


def _compare(
    got: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    xs: Sequence[np.ndarray],
    what: str,
    atol: float,
    rtol: float,
) -> None:
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        np.testing.assert_allclose(
            g,
            e,
            rtol=rtol,
            atol=atol,
            err_msg=f"{what}: gradient of argument {i} (shape {xs[i].shape}) != finite differences",
        )


# ---- forward mode ----------------------------------------------------------------------------

TANGENT_MODES = ("eager", "graph", "compiled")


def check_tangents(
    fn: Fn,
    args: Sequence[np.ndarray | gl.Tensor],
    order: int = 2,
    *,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    eps: float = 1e-6,
    seed: int = 0,
    modes: Sequence[str] = TANGENT_MODES,
    second_order_modes: Sequence[str] = ("eager", "graph"),
    run_compiled: Callable[[Program], Any] = run_alone,
) -> None:
    """Asserts that gradloop's forward-mode derivatives of `fn` at `args` match finite
    differences, the way `check_grads` does for gradients.

    * first order: `gl.jvp(fn, xs, vs)` for a fixed random direction `vs` against
      (fn(x + h v) - fn(x - h v)) / 2h, in every component of the output; in `modes` ("eager",
      "graph": inside `gl.function`, "compiled": under `gl.jit`), with the jvp's primal output
      equal to `fn`'s;
    * second order (in `second_order_modes`): forward over forward, the jvp of `x -> jvp(fn, x,
      vs)[1]` in a second direction `ws`, against the directional difference of the first-order
      tangent; and forward over reverse, the jvp of the gradient of `sum(fn * c)` in direction
      `vs` (a Hessian-vector product), against the directional difference of the gradient.
    """
    xs = [_as_float64_array(a) for a in args]
    rng = np.random.default_rng(seed)
    vs = [rng.standard_normal(x.shape) for x in xs]  # tangent_program's
    out = np.asarray(fn(*_tensors(xs)))

    def tangent(mode: str, *points: np.ndarray) -> np.ndarray:
        return _jvp(fn, points, vs, mode)[1]

    expected = _directional_difference(lambda *a: [np.asarray(fn(*_tensors(a)))], xs, vs, eps)[0]
    for mode in modes:
        if mode == "compiled":
            primal, got = run_compiled(_jvp_program(fn, xs, vs))
        else:
            primal, got = _jvp(fn, xs, vs, mode)
        np.testing.assert_allclose(
            primal, out, rtol=1e-10, atol=1e-12, err_msg=f"jvp primal ({mode})"
        )
        np.testing.assert_allclose(
            got,
            expected,
            rtol=rtol,
            atol=atol,
            err_msg=f"order 1 ({mode}): jvp != finite differences",
        )
    if order == 1:
        return
    ws = [rng.standard_normal(x.shape) for x in xs]
    expected2 = _directional_difference(lambda *a: [tangent("eager", *a)], xs, ws, eps)[0]
    loss = _loss(fn, gl.tensor(rng.standard_normal(out.shape)))
    expected_hvp = _directional_difference(lambda *a: _first_order(loss, a, "tape"), xs, vs, eps)
    argnums = tuple(range(len(xs)))

    def first(*ts: gl.Tensor) -> gl.Tensor:
        return gl.jvp(fn, ts, tuple(_tensors(vs)))[1]

    def gradient(*ts: gl.Tensor) -> tuple[gl.Tensor, ...]:
        return tuple(gl.grad(loss, argnums=argnums)(*ts))

    for mode in second_order_modes:
        got2 = _jvp(first, xs, ws, mode)[1]
        np.testing.assert_allclose(
            got2, expected2, rtol=rtol, atol=atol, err_msg=f"order 2 ({mode}): jvp of jvp"
        )
        hvp = _jvp(gradient, xs, vs, mode)[1]
        _compare(
            [np.asarray(h) for h in hvp],
            expected_hvp,
            xs,
            f"order 2 ({mode}): jvp of grad",
            atol,
            rtol,
        )


def tangent_program(fn: Fn, args: Sequence[np.ndarray | gl.Tensor], *, seed: int = 0) -> Program:
    """The program `check_tangents(fn, args, seed=seed)` runs under `gl.jit`."""
    xs = [_as_float64_array(a) for a in args]
    rng = np.random.default_rng(seed)
    return _jvp_program(fn, xs, [rng.standard_normal(x.shape) for x in xs])


def _jvp_program(fn: Fn, xs: Sequence[np.ndarray], vs: Sequence[np.ndarray]) -> Program:
    """`gl.jvp(fn, xs, vs)` as a program: its primal and tangent outputs, flat."""
    n = len(xs)
    shape: list[bool] = []  # whether each part (primal, tangent) is a tuple, and its length

    def run(*args: gl.Tensor) -> tuple[gl.Tensor, ...]:
        parts = gl.jvp(fn, args[:n], args[n:])
        flat: list[gl.Tensor] = []
        shape.clear()
        for part in parts:
            many = not isinstance(part, gl.Tensor)
            shape.append(many)
            flat.extend(part if many else (part,))
        return tuple(flat)

    def read(results: Sequence[gl.Tensor]) -> tuple[Any, Any]:
        (primal_many, tangent_many) = shape
        k = (len(results) // 2) if primal_many else 1
        as_np = lambda ts, many: tuple(np.asarray(t) for t in ts) if many else np.asarray(ts[0])  # noqa: E731
        return as_np(results[:k], primal_many), as_np(results[k:], tangent_many)

    return Program(run, [*_tensors(xs), *_tensors(vs)], read)


def _jvp(fn: Fn, xs: Sequence[np.ndarray], vs: Sequence[np.ndarray], mode: str) -> tuple[Any, Any]:
    """`gl.jvp(fn, xs, vs)` run eagerly, inside `gl.function` or under `gl.jit`, as numpy."""

    def run(*args: gl.Tensor) -> Any:
        n = len(args) // 2
        return gl.jvp(fn, args[:n], args[n:])

    if mode == "eager":
        primal, tangent = run(*_tensors(xs), *_tensors(vs))
    elif mode in ("graph", "compiled"):
        primal, tangent = {"graph": gl.function, "compiled": gl.jit}[mode](run)(
            *_tensors(xs), *_tensors(vs)
        )
    else:
        raise ValueError(f"unknown mode {mode!r}")
    as_np = lambda t: np.asarray(t) if isinstance(t, gl.Tensor) else tuple(np.asarray(u) for u in t)  # noqa: E731
    return as_np(primal), as_np(tangent)
