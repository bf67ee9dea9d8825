"""`gl.custom_root` and `gl.custom_linear_solve` (JAX's implicit differentiation): the root's
and the solution's derivatives to third order against closed forms and central differences,
in reverse and forward mode, eagerly, in graph mode and compiled; solvers whose iterations have
no useful derivative (bisection) still give the implicit function theorem's; `has_aux`; a
missing transpose; bad solvers."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from gradcheck import check_grads

F64 = gl.float64


def newton(f, x0):
    def body(i, x):
        return i + 1, x - f(x) / gl.jvp(f, (x,), (gl.ones_like(x),))[1]

    return gl.while_loop(lambda i, x: i < 40, body, (gl.tensor(0), x0))[1]


def bisection(f, x0):
    """A root between 0 and 2 x0 + 2 by halving: comparisons only, no useful derivative."""

    def body(i, lo, hi):
        mid = (lo + hi) * 0.5
        below = f(mid) < 0.0
        return i + 1, gl.where(below, mid, lo), gl.where(below, hi, mid)

    zero = gl.zeros_like(x0)
    _, lo, hi = gl.while_loop(lambda i, lo, hi: i < 80, body, (gl.tensor(0), zero, x0 * 2 + 2))
    return (lo + hi) * 0.5


def scalar_tangent_solve(g, y):
    return y / g(gl.ones_like(y))


def cube_root(a, solver=newton):
    return gl.custom_root(lambda x: x**3 - a, gl.ones_like(a), solver, scalar_tangent_solve)


@pytest.mark.parametrize("solver", [newton, bisection], ids=["newton", "bisection"])
def test_derivatives_of_a_root_to_third_order(solver) -> None:
    a = gl.tensor(8.0, dtype=F64)
    fn = lambda a: cube_root(a, solver)  # noqa: E731
    np.testing.assert_allclose(float(fn(a)), 2.0, rtol=1e-12)
    # d^k/da^k of a^(1/3) at 8
    wants = [1 / 12, -2 / 9 * 8 ** (-5 / 3), 10 / 27 * 8 ** (-8 / 3)]
    g = fn
    for want in wants:
        g = gl.grad(g)
        np.testing.assert_allclose(float(g(a)), want, rtol=1e-9)
    _, tangent = gl.jvp(fn, (a,), (gl.tensor(1.0, dtype=F64),))
    np.testing.assert_allclose(float(tangent), wants[0], rtol=1e-10)
    np.testing.assert_allclose(float(gl.hessian(fn)(a)), wants[1], rtol=1e-9)
    np.testing.assert_allclose(float(gl.function(gl.grad(gl.grad(fn)))(a)), wants[1], rtol=1e-9)


@pytest.mark.slow
def test_compiled_gradients_of_a_root_and_a_linear_solve() -> None:
    a = gl.tensor(8.0, dtype=F64)
    np.testing.assert_allclose(float(gl.jit(gl.grad(cube_root))(a)), 1 / 12, rtol=1e-10)
    m, b = gl.tensor(A + np.eye(3)), gl.tensor(np.array([0.3, -1.0, 2.0]))
    loss = lambda m, b: gl.sum(linear(m, b) ** 2)  # noqa: E731
    direct = lambda m, b: gl.sum(gl.linalg.solve(m, b) ** 2)  # noqa: E731
    got = gl.jit(gl.grad(loss, argnums=(0, 1)))(m, b)
    want = gl.grad(direct, argnums=(0, 1))(m, b)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10)


A = np.array([[3.0, 0.5, 0.0], [0.2, 2.5, 0.3], [0.0, -0.4, 2.0]])


def vector_root(theta, scale):
    """x with A x + scale x^3 = theta, found by Newton's method with its Jacobian."""

    def f(x):
        return gl.matmul(A, x) + scale * x**3 - theta

    def solve(f, x0):
        def body(i, x):
            return i + 1, x - gl.linalg.solve(gl.jacfwd(f)(x), f(x))

        return gl.while_loop(lambda i, x: i < 30, body, (gl.tensor(0), x0))[1]

    def tangent_solve(g, y):
        return gl.linalg.solve(gl.jacfwd(g)(y), y)

    return gl.custom_root(f, gl.zeros_like(theta), solve, tangent_solve) ** 2


def test_a_vector_root_s_derivatives_match_finite_differences() -> None:
    theta, scale = np.array([1.0, -0.5, 0.8]), np.array(0.3)
    check_grads(vector_root, [theta, scale], order=2, modes=("tape", "grad", "graph"))


def linear(m, b, symmetric=False):
    def matvec(x):
        return gl.matmul(m, x)

    def solve(matvec, r):
        return gl.linalg.solve(m, r)

    def transpose_solve(vecmat, r):
        return gl.linalg.solve(gl.transpose(m), r)

    t = None if symmetric else transpose_solve
    return gl.custom_linear_solve(matvec, b, solve, t, symmetric=symmetric)


def test_a_linear_solve_s_derivatives_are_the_direct_solve_s() -> None:
    m, b = A + np.eye(3), np.array([0.3, -1.0, 2.0])
    check_grads(lambda m, b: linear(m, b), [m, b], order=2, modes=("tape", "grad", "graph"))
    mt, bt = gl.tensor(m), gl.tensor(b)
    for argnums in (0, 1):
        ours = gl.grad(lambda m, b: gl.sum(linear(m, b) ** 3), argnums=argnums)(mt, bt)
        direct = gl.grad(lambda m, b: gl.sum(gl.linalg.solve(m, b) ** 3), argnums=argnums)(mt, bt)
        np.testing.assert_allclose(np.asarray(ours), np.asarray(direct), rtol=1e-12)


def conjugate_gradient(matvec, b):
    """n conjugate-gradient steps (exact for n x n in exact arithmetic): what a user would pass
    for a symmetric system."""

    def body(i, x, r, p):
        ap = matvec(p)
        alpha = gl.sum(r * r) / gl.sum(p * ap)
        x, r_next = x + alpha * p, r - alpha * ap
        beta = gl.sum(r_next * r_next) / gl.sum(r * r)
        return i + 1, x, r_next, r_next + beta * p

    x0 = gl.zeros_like(b)
    return gl.while_loop(lambda i, *_: i < b.shape[0], body, (gl.tensor(0), x0, b, b))[1]


def test_a_symmetric_system_uses_solve_both_ways() -> None:
    spd = A @ A.T + np.eye(3)

    def fn(s, b):
        s = (s + gl.transpose(s)) * 0.5  # every perturbation keeps it symmetric
        x = gl.custom_linear_solve(lambda x: gl.matmul(s, x), b, conjugate_gradient, symmetric=True)
        return gl.sum(x * x)

    check_grads(fn, [spd, np.array([1.0, 2.0, -0.5])], order=2, modes=("tape", "grad"))


def test_reverse_mode_without_a_transpose_says_so_and_forward_mode_works() -> None:
    m, b = gl.tensor(A + np.eye(3)), gl.tensor(np.array([0.3, -1.0, 2.0]))

    def fn(b):
        solve = lambda mv, r: gl.linalg.solve(m, r)  # noqa: E731
        return gl.custom_linear_solve(lambda x: gl.matmul(m, x), b, solve)

    _, tangent = gl.jvp(fn, (b,), (gl.ones_like(b),))
    np.testing.assert_allclose(np.asarray(tangent), np.linalg.solve(A + np.eye(3), np.ones(3)))
    with pytest.raises(gl.errors.GradientError, match="transpose_solve"):
        gl.grad(lambda b: gl.sum(fn(b)))(b)


def test_has_aux_returns_the_solver_s_extra_output_undifferentiated() -> None:
    a = gl.tensor(27.0, dtype=F64)

    def counted(f, x0):
        return newton(f, x0), gl.tensor(40)

    def fn(a):
        root, trips = gl.custom_root(
            lambda x: x**3 - a, gl.ones_like(a), counted, scalar_tangent_solve, has_aux=True
        )
        return root, trips

    root, trips = fn(a)
    assert float(root) == pytest.approx(3.0) and int(trips) == 40
    np.testing.assert_allclose(float(gl.grad(lambda a: fn(a)[0])(a)), 1 / 27, rtol=1e-10)


def test_nothing_to_differentiate_costs_one_solve() -> None:
    calls = []

    def solve(f, x0):
        calls.append(1)
        return newton(f, x0)

    a = gl.tensor(8.0, dtype=F64)
    gl.custom_root(lambda x: x**3 - a, gl.ones_like(a), solve, scalar_tangent_solve)
    assert len(calls) == 1


def test_a_solver_of_the_wrong_shape_is_refused() -> None:
    a = gl.tensor([8.0, 27.0], dtype=F64)
    with pytest.raises(gl.errors.InvalidArgumentError, match="custom_root"):
        gl.custom_root(lambda x: x**3 - a, gl.ones_like(a), lambda f, x: x[0], scalar_tangent_solve)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_linear_solve_s_second_derivatives_in_every_order(mode) -> None:
    # Reverse over forward differentiates the operator held at zero as the solve it stands
    # for (its value is zeros: as computed, it had no derivative), and jacrev's vmap over
    # cotangents keeps each row's lanes through the custom op's gradient.
    m, b = gl.tensor(A + np.eye(3)), np.array([0.3, -1.0, 0.8])

    def loss(b):
        return gl.sum(linear(m, b * b) * gl.sin(b))

    grad = lambda b: np.asarray(gl.grad(loss)(gl.tensor(b)))  # noqa: E731
    # the Hessian by central differences of the gradient, column by column
    want = np.stack([(grad(b + 1e-6 * e) - grad(b - 1e-6 * e)) / 2e-6 for e in np.eye(3)], 1)
    run = (lambda f: f) if mode == "eager" else gl.function
    d = gl.tensor(np.array([1.0, -2.0, 0.5]))
    for name, got in [
        ("hessian", run(gl.hessian(loss))(gl.tensor(b))),
        ("jacrev of jacfwd", run(gl.jacrev(gl.jacfwd(loss)))(gl.tensor(b))),
        ("jacfwd of jacrev", run(gl.jacfwd(gl.jacrev(loss)))(gl.tensor(b))),
    ]:
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-8, err_msg=name)
    grad_of_jvp = run(gl.grad(lambda b: gl.jvp(loss, (b,), (d,))[1]))(gl.tensor(b))
    np.testing.assert_allclose(np.asarray(grad_of_jvp), want @ np.asarray(d), rtol=1e-6)
    jvp_of_jvp = run(lambda b: gl.jvp(lambda b: gl.jvp(loss, (b,), (d,))[1], (b,), (d,))[1])
    np.testing.assert_allclose(
        float(np.asarray(jvp_of_jvp(gl.tensor(b)))), np.asarray(d) @ want @ np.asarray(d), rtol=1e-6
    )
