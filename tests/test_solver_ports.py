"""Real solvers written with gradloop's numerics, against scipy's: Levenberg–Marquardt with a
Cholesky solve (`scipy.optimize.least_squares(method="lm")`), BFGS with a backtracking line
search (`scipy.optimize.minimize(method="BFGS")`), and an implicit stiff integrator (the
trapezoidal rule with Newton's method and `linalg.solve` in nested `while_loop`s, its
trajectory saved with `.at[k].set`) against `solve_ivp(method="Radau")`. Each runs eagerly and
in graph mode, and is differentiated: the fit's parameters with respect to the data through
`custom_root`, the integrator's end state with respect to its stiffness through the loops."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from gradloop.examples import stiff

scipy_optimize = pytest.importorskip("scipy.optimize", reason="scipy comes with JAX")
scipy_integrate = pytest.importorskip("scipy.integrate", reason="scipy comes with JAX")

F64 = gl.float64
T = np.linspace(0.0, 2.0, 12)
Y = 2.5 * np.exp(-1.3 * T) + 0.4 + 0.01 * np.sin(7.0 * T)  # a decay, slightly off the model


def residuals(theta, y):
    a, b, c = theta[0], theta[1], theta[2]
    return a * gl.exp(-b * gl.tensor(T)) + c - y


def levenberg_marquardt(theta0, y, iterations=60):
    """The classic damped Gauss–Newton loop: `(J^T J + lambda diag(J^T J)) step = -J^T r`,
    solved with a Cholesky factor; lambda shrinks after a step that lowers the cost and
    grows after one that does not."""

    def cost(theta):
        r = residuals(theta, y)
        return gl.sum(r * r)

    def body(i, theta, lam):
        r = residuals(theta, y)
        jac = gl.jacfwd(lambda t: residuals(t, y))(theta)
        jtj = gl.matmul(gl.transpose(jac), jac)
        damped = jtj + lam * gl.diag(gl.diag(jtj))
        factor = gl.linalg.cholesky(damped)
        step = gl.linalg.cho_solve((factor, True), -gl.matmul(gl.transpose(jac), r))
        better = cost(theta + step) < cost(theta)
        theta = gl.where(better, theta + step, theta)
        lam = gl.where(better, lam * 0.3, lam * 4.0)
        return i + 1, theta, lam

    start = (gl.tensor(0), theta0, gl.tensor(1e-2, dtype=F64))
    return gl.while_loop(lambda i, t, lam: i < iterations, body, start)[1]


def lm_fit(y):
    """The fitted parameters as the root of the cost's gradient: their derivative with
    respect to the data comes from the implicit function theorem, not the loop."""

    def gradient(theta):
        return gl.grad(lambda t: gl.sum(residuals(t, y) ** 2))(theta)

    def solve(f, theta0):
        return levenberg_marquardt(theta0, gl.stop_gradient(y))

    def tangent_solve(g, v):
        return gl.linalg.solve(gl.jacfwd(g)(v), v)

    theta0 = gl.tensor(np.array([1.0, 1.0, 0.0]))
    return gl.custom_root(gradient, theta0, solve, tangent_solve)


def scipy_fit(y):
    def r(theta):
        return theta[0] * np.exp(-theta[1] * T) + theta[2] - y

    tight = {"xtol": 1e-15, "ftol": 1e-15, "gtol": 1e-15}
    return scipy_optimize.least_squares(r, [1.0, 1.0, 0.0], method="lm", **tight).x


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_levenberg_marquardt_matches_scipy_and_its_derivative_finite_differences(mode) -> None:
    fit = lm_fit if mode == "eager" else gl.function(lm_fit)
    theta = np.asarray(fit(gl.tensor(Y)))
    np.testing.assert_allclose(theta, scipy_fit(Y), rtol=1e-8)
    # d theta / d y[3] by the implicit function theorem, against the fits moved by h (ours:
    # converged to rounding, where scipy's stop at 1e-10 and would drown the difference)
    direction = np.zeros_like(Y)
    direction[3] = 1.0
    jvp = gl.jvp(lm_fit, (gl.tensor(Y),), (gl.tensor(direction),))[1]
    h = 1e-5
    moved = [np.asarray(fit(gl.tensor(Y + s * direction))) for s in (h, -h)]
    numeric = (moved[0] - moved[1]) / (2 * h)
    np.testing.assert_allclose(np.asarray(jvp), numeric, rtol=1e-6, atol=1e-9)
    grad = gl.grad(lambda y: gl.sum(lm_fit(y) * gl.tensor(np.array([1.0, 2.0, 3.0]))))(gl.tensor(Y))
    np.testing.assert_allclose(float(grad[3]), numeric @ [1.0, 2.0, 3.0], rtol=1e-5)


def rosenbrock(x):
    return 100.0 * (x[1] - x[0] ** 2) ** 2 + (1.0 - x[0]) ** 2


def bfgs(f, x0, iterations=200):
    """BFGS with Armijo backtracking: the inverse-Hessian estimate updated each step."""
    n = x0.shape[0]
    grad = gl.grad(f)

    def line_search(x, g, direction):
        slope = gl.sum(g * direction)

        def shrink(t):
            return t * 0.5

        def too_long(t):
            return f(x + t * direction) > f(x) + 1e-4 * t * slope

        return gl.while_loop(too_long, shrink, gl.tensor(1.0, dtype=F64), maximum_iterations=60)

    def body(i, x, h, g):
        direction = -gl.matmul(h, g)
        t = line_search(x, g, direction)
        s = t * direction
        x_new = x + s
        g_new = grad(x_new)
        y = g_new - g
        sy = gl.sum(s * y)
        rho = gl.where(sy > 1e-12, 1.0 / gl.where(sy > 1e-12, sy, 1.0), 0.0)
        eye = gl.eye(n, dtype=F64)
        left = eye - rho * gl.outer(s, y)
        h_new = gl.matmul(gl.matmul(left, h), gl.transpose(left)) + rho * gl.outer(s, s)
        return i + 1, x_new, gl.where(sy > 1e-12, h_new, h), g_new

    def running(i, x, h, g):
        return gl.logical_and(i < iterations, gl.linalg.norm(g) > 1e-10)

    start = (gl.tensor(0), x0, gl.eye(n, dtype=F64), grad(x0))
    _, x, _, _ = gl.while_loop(running, body, start)
    return x


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_bfgs_finds_scipy_s_minimum(mode) -> None:
    x0 = np.array([-1.2, 1.0])
    run = (
        (lambda x: bfgs(rosenbrock, x))
        if mode == "eager"
        else gl.function(lambda x: bfgs(rosenbrock, x))
    )
    ours = np.asarray(run(gl.tensor(x0)))
    theirs = scipy_optimize.minimize(
        lambda x: rosenbrock(x), x0, method="BFGS", options={"gtol": 1e-10}
    ).x
    np.testing.assert_allclose(ours, [1.0, 1.0], atol=1e-7)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def van_der_pol(y, mu):
    return gl.stack([y[1], mu * (1.0 - y[0] ** 2) * y[1] - y[0]])


def trapezoid(y0, mu, t_end, steps):
    """The trapezoidal rule (A-stable, second order): each step solves
    `z = y + h/2 (f(y) + f(z))` by Newton's method with `linalg.solve`; every state is saved
    with `.at[k].set`."""
    h = t_end / steps

    def newton(y, fy):
        def residual(z):
            return z - y - 0.5 * h * (fy + van_der_pol(z, mu))

        def step(k, z):
            jac = gl.jacfwd(residual)(z)
            return k + 1, z - gl.linalg.solve(jac, residual(z))

        def unconverged(k, z):
            return gl.logical_and(k < 20, gl.linalg.norm(residual(z)) > 1e-13)

        return gl.while_loop(unconverged, step, (gl.tensor(0), y + h * fy))[1]

    def body(k, y, path):
        z = newton(y, van_der_pol(y, mu))
        return k + 1, z, path.at[k + 1].set(z)

    path = gl.zeros([steps + 1, 2], dtype=F64).at[0].set(y0)
    _, y, path = gl.while_loop(lambda k, y, p: k < steps, body, (gl.tensor(0), y0, path))
    return y, path


def test_a_stiff_implicit_solver_matches_radau_and_differentiates() -> None:
    y0, mu, t_end, steps = np.array([2.0, 0.0]), 5.0, 1.5, 1500
    run = gl.function(lambda y0, mu: trapezoid(y0, mu, t_end, steps))
    y, path = run(gl.tensor(y0), gl.tensor(mu, dtype=F64))

    def rhs(t, y):
        return [y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]]

    times = np.linspace(0.0, t_end, steps + 1)
    radau = scipy_integrate.solve_ivp(
        rhs, (0.0, t_end), y0, method="Radau", rtol=1e-11, atol=1e-12, t_eval=times[::300]
    )
    np.testing.assert_allclose(np.asarray(path)[::300], radau.y.T, atol=2e-4)
    np.testing.assert_allclose(np.asarray(y), radau.y[:, -1], atol=2e-4)
    # the end state's derivative with respect to mu, through both loops, against differences
    grad = gl.function(gl.grad(lambda mu: trapezoid(gl.tensor(y0), mu, t_end, steps)[0][0]))
    g = float(grad(gl.tensor(mu, dtype=F64)))
    eps = 1e-5
    ends = [float(run(gl.tensor(y0), gl.tensor(mu + s, dtype=F64))[0][0]) for s in (eps, -eps)]
    np.testing.assert_allclose(g, (ends[0] - ends[1]) / (2 * eps), rtol=1e-5)


@pytest.mark.long
@pytest.mark.parametrize("mode", ["eager", "graph", "jit"])
def test_an_adaptive_rosenbrock_solver_matches_radau_and_differentiates(mode) -> None:
    """Rodas4 (`gradloop.examples.stiff`): linearly implicit stages with one LU factor a step, an
    adaptive step in a data-dependent `while_loop`; its end state and the end state's derivative
    in the stiffness and in the initial state, in every mode, against Radau and differences."""
    y0, mu, t_end = np.array([2.0, 0.0]), 10.0, 1.5

    def end(y0, mu):
        sol = stiff.rodas4(stiff.van_der_pol, y0, t_end, mu, rtol=1e-8, atol=1e-8)
        return sol.y, sol.accepted

    stage = {"eager": lambda f: f, "graph": gl.function, "jit": gl.jit}[mode]
    y, accepted = stage(end)(gl.tensor(y0), gl.tensor(mu, dtype=F64))

    def rhs(t, y, mu):
        return [y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]]

    def radau(y0, mu):
        sol = scipy_integrate.solve_ivp(
            rhs, (0.0, t_end), y0, args=(mu,), method="Radau", rtol=1e-12, atol=1e-13
        )
        return sol.y[:, -1]

    np.testing.assert_allclose(np.asarray(y), radau(y0, mu), atol=1e-6)
    assert 10 < int(accepted) < 200  # adaptive: neither one step nor a fixed fine grid
    grad = stage(gl.grad(lambda y0, mu: end(y0, mu)[0][0], argnums=(0, 1)))
    g_y0, g_mu = grad(gl.tensor(y0), gl.tensor(mu, dtype=F64))
    eps = 1e-5
    fd_mu = (radau(y0, mu + eps)[0] - radau(y0, mu - eps)[0]) / (2 * eps)
    fd_y0 = [
        (radau(y0 + eps * e, mu)[0] - radau(y0 - eps * e, mu)[0]) / (2 * eps) for e in np.eye(2)
    ]
    np.testing.assert_allclose(float(g_mu), fd_mu, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(g_y0), fd_y0, rtol=1e-4)
