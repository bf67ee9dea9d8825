"""Newton and BFGS with implicit derivatives: solvers whose iterations are never differentiated.

Two solvers run to a tolerance in data-dependent `gl.while_loop`s, and `gl.custom_root` gives
their answers' derivatives by the implicit function theorem instead of through their iterations:

- **Newton on Kepler's equation** `E - e sin E = M`: the eccentric anomaly of an orbit. The
  derivatives `dE/dM = 1 / (1 - e cos E)` and `dE/de = sin E / (1 - e cos E)` come out to
  rounding, whatever the number of Newton steps taken.
- **BFGS on a ridge regression**, inside a bilevel fit: the inner problem finds the weights
  `w*(lam)` that minimise the training loss plus `lam |w|^2` (BFGS with a backtracking line
  search, both loops stopping on a tolerance); the outer one descends on `log lam` to minimise
  the validation loss of `w*(lam)`. Its hypergradient is the implicit derivative of the
  minimiser, `-H^-1 d(grad)/d(lam)`, with `H` the Hessian `gl.jacfwd` builds at the optimum.

    python examples/newton_bfgs.py [--steps 15] [--plot solvers.png] [--quick]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

import gradloop as gl
import gradloop.linalg as L
from gradloop.examples import figures

TOLERANCE = 1e-12  # Newton's, on |f(x)|
GRADIENT_TOLERANCE = 1e-9  # BFGS's, on |grad|: about where rounding stops the descent
MAX_ITERATIONS = 200


def f64(x) -> gl.Tensor:
    return gl.tensor(np.asarray(x, dtype=np.float64))


# ---- Newton on Kepler's equation -----------------------------------------------------------


def newton(f: Callable, x0: gl.Tensor) -> gl.Tensor:
    """Newton's method on the scalar equation `f(x) = 0`, to `TOLERANCE`: a loop whose trip count
    depends on the starting point and the equation."""

    def unsolved(k, x):
        return gl.logical_and(gl.abs(f(x)) > TOLERANCE, k < MAX_ITERATIONS)

    def newton_step(k, x):
        fx, slope = gl.jvp(f, (x,), (gl.ones_like(x),))
        return k + 1, x - fx / slope

    return gl.while_loop(unsolved, newton_step, (gl.tensor(0), x0))[1]


def eccentric_anomaly(mean_anomaly: gl.Tensor, eccentricity: gl.Tensor) -> gl.Tensor:
    """E with E - e sin E = M, differentiable in M and e by the implicit function theorem."""

    def kepler(e_anomaly):
        return e_anomaly - eccentricity * gl.sin(e_anomaly) - mean_anomaly

    return gl.custom_root(
        kepler,
        mean_anomaly,  # a first guess
        newton,
        lambda linear, y: y / linear(gl.ones_like(y)),  # a scalar's tangent solve
    )


def kepler_derivatives(m: float, e: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """(dE/dM, dE/de) by the implicit derivative, and from the closed forms."""
    grads = gl.grad(eccentric_anomaly, argnums=(0, 1))(f64(m), f64(e))
    big_e = float(eccentric_anomaly(f64(m), f64(e)))
    denominator = 1.0 - e * np.cos(big_e)
    return (float(grads[0]), float(grads[1])), (1.0 / denominator, np.sin(big_e) / denominator)


# ---- BFGS inside a bilevel fit ------------------------------------------------------------


def bfgs(gradient: Callable, w0: gl.Tensor, objective: Callable) -> gl.Tensor:
    """Minimises `objective` from `w0` with BFGS until the gradient's norm is below
    `GRADIENT_TOLERANCE`: an inverse-Hessian estimate updated each step, a backtracking line
    search (a loop nested in the loop) that halves the step until the objective decreases
    enough."""
    n = w0.shape[0]
    eye = gl.eye(n, dtype=w0.dtype)

    def unconverged(k, w, g, h):
        return gl.logical_and(gl.sqrt(gl.sum(g * g)) > GRADIENT_TOLERANCE, k < MAX_ITERATIONS)

    def bfgs_step(k, w, g, h):
        p = -gl.matmul(h, g)
        f0, slope = objective(w), gl.sum(g * p)

        def too_long(t):
            armijo = objective(w + t * p) > f0 + 1e-4 * t * slope
            return gl.logical_and(armijo, t > 1e-10)

        t = gl.while_loop(too_long, lambda t: (t * 0.5,), (gl.ones_like(f0),))[0]
        s = t * p
        w_new = w + s
        g_new = gradient(w_new)
        y = g_new - g
        rho = 1.0 / gl.sum(y * s)
        left = eye - rho * gl.outer(s, y)
        h_new = gl.matmul(gl.matmul(left, h), gl.transpose(left)) + rho * gl.outer(s, s)
        return k + 1, w_new, g_new, h_new

    start = (gl.tensor(0), w0, gradient(w0), eye)
    return gl.while_loop(unconverged, bfgs_step, start)[1]


@dataclass
class Data:
    train_x: np.ndarray
    train_y: np.ndarray
    valid_x: np.ndarray
    valid_y: np.ndarray


def make_data(features: int = 6, rows: int = 24, seed: int = 0) -> Data:
    """A small noisy regression whose training set is too short for its features, so that the
    ridge penalty's size matters on the validation set."""
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(features)
    x = rng.standard_normal((2 * rows, features))
    y = x @ w_true + 1.5 * rng.standard_normal(2 * rows)
    return Data(x[:rows], y[:rows], x[rows:], y[rows:])


def ridge_weights(log_lam: gl.Tensor, data: Data) -> gl.Tensor:
    """w*(lam): the minimiser of the penalised training loss, found by BFGS, differentiated
    implicitly through the optimality condition grad = 0."""
    x, y = f64(data.train_x), f64(data.train_y)
    lam = gl.exp(log_lam)

    def objective(w):
        r = gl.matmul(x, w) - y
        return gl.mean(r * r) + lam * gl.sum(w * w)

    def stationary(w):
        return gl.grad(objective)(w)

    def tangent_solve(linear, v):
        return L.solve(gl.jacfwd(linear)(v), v)

    return gl.custom_root(
        stationary,
        gl.zeros((x.shape[1],), dtype=gl.float64),
        lambda g, w0: bfgs(g, w0, objective),
        tangent_solve,
    )


def validation_loss(log_lam: gl.Tensor, data: Data) -> gl.Tensor:
    w = ridge_weights(log_lam, data)
    r = gl.matmul(f64(data.valid_x), w) - f64(data.valid_y)
    return gl.mean(r * r)


@dataclass
class Fit:
    """The fitted log-penalty and one row per step: (validation loss, log lam)."""

    log_lam: float
    history: list[tuple[float, float]] = field(default_factory=list)


def fit_penalty(data: Data, steps: int, log_lam: float = 2.0, rate: float = 4.0) -> Fit:
    """Gradient descent on log lam through BFGS's answer."""
    loss_and_grad = gl.value_and_grad(validation_loss)
    result = Fit(log_lam)
    for k in range(steps):
        value, grad = loss_and_grad(f64(log_lam), data)
        result.history.append((float(value), log_lam))
        if k % 5 == 0 or k == steps - 1:
            print(f"step {k:2}: lam {np.exp(log_lam):.4f}, validation loss {float(value):.5f}")
        log_lam -= rate * float(grad)
    result.log_lam = log_lam
    return result


def hypergradient_check(data: Data, log_lam: float) -> tuple[float, float]:
    """d(validation loss)/d(log lam) through BFGS, and from the ridge's closed form:
    w* = A^-1 X'y / n with A = X'X / n + lam I, so dw*/d(lam) = -A^-1 w*."""
    exact = float(gl.grad(validation_loss)(f64(log_lam), data))
    x, y, lam = data.train_x, data.train_y, np.exp(log_lam)
    a = x.T @ x / len(y) + lam * np.eye(x.shape[1])
    w = np.linalg.solve(a, x.T @ y / len(y))
    residual = data.valid_x @ w - data.valid_y
    dw = -np.linalg.solve(a, w) * lam  # per unit of log lam
    closed_form = 2.0 * residual @ (data.valid_x @ dw) / len(residual)
    return exact, float(closed_form)


def plot(data: Data, result: Fit, filename: str) -> None:
    pyplot = figures.pyplot()
    figure, (kepler, outer) = pyplot.subplots(1, 2, figsize=(11, 4))
    m = np.linspace(0.0, 2 * np.pi, 121)
    for e in (0.2, 0.6, 0.9):
        anomalies, slopes = [], []
        for mk in m:
            big_e, slope = gl.value_and_grad(eccentric_anomaly)(f64(mk), f64(e))
            anomalies.append(float(big_e))
            slopes.append(float(slope))
        (line,) = kepler.plot(m, anomalies, label=f"E(M), e = {e}")
        kepler.plot(m, slopes, linestyle="--", color=line.get_color(), linewidth=1)
    kepler.set(xlabel="mean anomaly M", title="Newton on Kepler's equation: E and dE/dM (dashed)")
    kepler.legend()
    grid = np.linspace(-4.0, 3.0, 29)
    loss = [float(validation_loss(f64(g), data)) for g in grid]
    outer.plot(grid, loss, color="grey", label="validation loss")
    outer.plot(
        [g for _, g in result.history],
        [v for v, _ in result.history],
        "o-",
        color="crimson",
        markersize=3,
        label="descent on log lam",
    )
    outer.set(xlabel="log lam", title="BFGS's minimiser, differentiated implicitly")
    outer.legend()
    figure.tight_layout()
    figure.savefig(filename)
    pyplot.close(figure)


def main(argv: Sequence[str] | None = None) -> Fit:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--plot", default=None, help="write the figure here (PNG, SVG or PDF)")
    parser.add_argument("--quick", action="store_true", help="a short run (the test suite's)")
    args = parser.parse_args(argv)
    (dm, de), (dm_exact, de_exact) = kepler_derivatives(1.0, 0.6)
    print(f"Kepler, M = 1, e = 0.6: dE/dM {dm:.12f} (closed form {dm_exact:.12f})")
    print(f"                       dE/de {de:.12f} (closed form {de_exact:.12f})")
    data = make_data()
    exact, closed_form = hypergradient_check(data, 0.0)
    print(f"ridge: d(validation)/d(log lam) {exact:.10f} (closed form {closed_form:.10f})")
    result = fit_penalty(data, 3 if args.quick else args.steps)
    if args.plot:
        plot(data, result, args.plot)
        print(f"wrote {args.plot}")
    return result


if __name__ == "__main__":
    main()
