"""A stiff solver's gradient beside Diffrax's `Kvaerno5` in one run.

The problem: Van der Pol with mu = 10 over t in [0, 1.5], y0 = (2, 0); the quantity is the end
state's first component and its derivative with respect to mu.

- gradloop, adaptive: Rodas4 (`gradloop.examples.stiff.rodas4`, a Rosenbrock method of order 4:
  one Jacobian by `gl.jacfwd` and one LU factor a step, six solves with it, the step size
  controlled on the embedded error in a data-dependent `while_loop`), at the tolerances Diffrax
  is given; the gradient by `gl.grad`, in graph mode (`@gl.function`) and under `gl.jit`.
- gradloop, fixed step: the trapezoidal rule (A-stable, second order) with Newton's method and
  `gl.linalg.solve` inside nested `while_loop`s, its states saved with `.at[k].set` (the solver
  of `tests/test_solver_ports.py`).
- Diffrax: `Kvaerno5` (an ESDIRK method of order 5) with a `PIDController`, under `jax.jit`,
  its gradient by `jax.grad` (Diffrax's default checkpointed adjoint).

The table gives each one's gradient error against central differences of scipy's Radau at
rtol 1e-12, its steps and its median time. Methods differ, so compare time at the error each
reaches; the ratio column is graph mode's time over Diffrax's at the same tolerance.

Usage: python benches/stiff.py [--repeats R] [--no-jit]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import numpy as np
from scipy import integrate

import gradloop as gl
from gradloop.examples import stiff

MU, T_END, Y0 = 10.0, 1.5, (2.0, 0.0)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def van_der_pol(y, mu):
    return gl.stack([y[1], mu * (1.0 - y[0] ** 2) * y[1] - y[0]])


def trapezoid(y0, mu, steps):
    h = T_END / steps

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

    path = gl.zeros([steps + 1, 2], dtype=gl.float64).at[0].set(y0)
    _, y, path = gl.while_loop(lambda k, y, p: k < steps, body, (gl.tensor(0), y0, path))
    return y[0]


def reference() -> float:
    """The end value's derivative in mu (central differences of Radau at rtol 1e-12)."""

    def end(mu: float) -> float:
        def rhs(t, y):
            return [y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]]

        sol = integrate.solve_ivp(rhs, (0, T_END), Y0, method="Radau", rtol=1e-12, atol=1e-13)
        return float(sol.y[0, -1])

    eps = 1e-5
    return (end(MU + eps) - end(MU - eps)) / (2 * eps)


def timed(grad_fn, mu, repeats: int, with_jit: bool) -> dict[str, float]:
    """`grad_fn(mu)`'s value and its median time in graph mode and (with `with_jit`) under
    `gl.jit`."""
    graph = gl.function(grad_fn)
    row = {"grad": float(graph(mu))}
    row["graph"] = median_seconds(lambda: graph(mu), repeats)
    if with_jit:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            jitted = gl.jit(grad_fn)
            row["gl.jit"] = median_seconds(lambda: jitted(mu), repeats)
    return row


def ours(steps: int, repeats: int, with_jit: bool) -> dict[str, float]:
    mu = gl.tensor(MU, dtype=gl.float64)

    def grad_fn(mu):
        return gl.grad(lambda mu: trapezoid(gl.tensor(np.array(Y0)), mu, steps))(mu)

    return timed(grad_fn, mu, repeats, with_jit)


def rodas_row(tolerance: float, repeats: int, with_jit: bool) -> dict[str, float]:
    mu = gl.tensor(MU, dtype=gl.float64)
    y0 = np.array(Y0)

    def solve(mu):
        return stiff.rodas4(stiff.van_der_pol, y0, T_END, mu, rtol=tolerance, atol=tolerance)

    def grad_fn(mu):
        return gl.grad(lambda mu: solve(mu).y[0])(mu)

    row = timed(grad_fn, mu, repeats, with_jit)
    row["steps"] = int(gl.function(solve)(mu).accepted)
    return row


def diffrax_row(tolerance: float, repeats: int) -> dict[str, float] | None:
    try:
        import diffrax
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)

    def end(mu):
        term = diffrax.ODETerm(
            lambda t, y, mu: jnp.stack([y[1], mu * (1.0 - y[0] ** 2) * y[1] - y[0]])
        )
        sol = diffrax.diffeqsolve(
            term,
            diffrax.Kvaerno5(),
            t0=0.0,
            t1=T_END,
            dt0=0.01,
            y0=jnp.asarray(Y0),
            args=mu,
            stepsize_controller=diffrax.PIDController(rtol=tolerance, atol=tolerance),
            max_steps=100_000,
        )
        return sol.ys[-1, 0], sol.stats["num_accepted_steps"]

    grad = jax.jit(jax.grad(lambda mu: end(mu)[0]))
    value, steps = jax.jit(end)(jnp.asarray(MU))
    mu = jnp.asarray(MU)
    return {
        "grad": float(grad(mu)),
        "value": float(value),
        "steps": int(steps),
        "jax.jit": median_seconds(lambda: grad(mu).block_until_ready(), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--no-jit", action="store_true", help="skip gl.jit (its compile)")
    args = parser.parse_args()
    derivative = reference()
    print(f"Van der Pol, mu = {MU}, t in [0, {T_END}]: d y(T)[0] / d mu, milliseconds (median)")
    for steps in (300, 1500):
        row = ours(steps, args.repeats, with_jit=not args.no_jit)
        error = abs(row["grad"] - derivative) / abs(derivative)
        times = "  ".join(f"{k} {row[k] * 1e3:9.2f}" for k in ("graph", "gl.jit") if k in row)
        print(f"  gradloop trapezoid {steps:5d} steps: {times}  gradient error {error:.1e}")
    for tolerance in (1e-6, 1e-9):
        row = rodas_row(tolerance, args.repeats, with_jit=not args.no_jit)
        error = abs(row["grad"] - derivative) / abs(derivative)
        times = "  ".join(f"{k} {row[k] * 1e3:9.2f}" for k in ("graph", "gl.jit") if k in row)
        print(
            f"  gradloop Rodas4 rtol {tolerance:.0e} ({row['steps']} steps): {times}  "
            f"gradient error {error:.1e}"
        )
        theirs = diffrax_row(tolerance, args.repeats)
        if theirs is None:
            print("  Diffrax: not installed")
            continue
        error = abs(theirs["grad"] - derivative) / abs(derivative)
        print(
            f"  Diffrax Kvaerno5 rtol {tolerance:.0e} ({theirs['steps']} steps): "
            f"jax.jit {theirs['jax.jit'] * 1e3:9.2f}  gradient error {error:.1e}  "
            f"(graph / Diffrax {row['graph'] / theirs['jax.jit']:.2f})"
        )


if __name__ == "__main__":
    main()
