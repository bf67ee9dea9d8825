"""An adaptive stiff ODE solver written with gradloop: Rodas4, a Rosenbrock method of order 4.

Rosenbrock methods are linearly implicit: each step factors `I / (h gamma) - J` once (`J` the
Jacobian of the vector field, by `gl.jacfwd`) and solves with that factor once per stage, with no
Newton iteration. That makes a step a fixed sequence of operations, which reverse mode
differentiates without any inner loop. The step size is chosen by the usual controller on the
embedded third-order solution's error (`atol + rtol * max(|y0|, |y1|)` in the RMS norm), inside a
`gl.while_loop` whose trip count depends on the data.

The coefficients are Hairer and Wanner's RODAS (order 4, embedded order 3, stiffly accurate), in
the form `(I / (h gamma) - J) u_i = f(y0 + sum_j a_ij u_j) + sum_j (c_ij / h) u_j`,
`y1 = y0 + sum_i m_i u_i`, error `u_6` (E. Hairer, G. Wanner, Solving Ordinary Differential
Equations II, Springer 1996, section IV.7). Autonomous problems only: `f(y, args)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

import gradloop as gl

GAMMA = 0.25
A = (
    (),
    (1.544,),
    (0.9466785280815826, 0.2557011698983284),
    (3.314825187068521, 2.896124015972201, 0.9986419139977817),
    (1.221224509226641, 6.019134481288629, 12.53708332932087, -0.6878860361058950),
    (1.221224509226641, 6.019134481288629, 12.53708332932087, -0.6878860361058950, 1.0),
)
C = (
    (),
    (-5.6688,),
    (-2.430093356833875, -0.2063599157091915),
    (-0.1073529058151375, -9.594562251023355, -20.47028614809616),
    (7.496443313967647, -10.24680431464352, -33.99990352819905, 11.70890893206160),
    (
        8.083246795921522,
        -7.981132988064893,
        -31.52159432874371,
        16.31930543123136,
        -6.058818238834054,
    ),
)
# The solution is the last stage's input plus u_6 (stiffly accurate); the error estimate is u_6.
M = (*A[5], 1.0)
ERROR_ORDER = 4  # the embedded solution's local error is O(h^4)


class Solution(NamedTuple):
    y: gl.Tensor  # the state at t_end
    steps: gl.Tensor  # steps tried (int32)
    accepted: gl.Tensor  # steps accepted (int32)


def rodas4(
    f: Callable[[gl.Tensor, Any], gl.Tensor],
    y0: Any,
    t_end: float,
    args: Any = None,
    *,
    rtol: float = 1e-6,
    atol: float = 1e-6,
    dt0: float = 0.01,
    max_steps: int = 100_000,
) -> Solution:
    """Integrates `dy/dt = f(y, args)` from t = 0 to `t_end`; differentiable in `y0` and in the
    tensors `args` holds (or `f` closes over), in every mode."""
    y0 = y0 if isinstance(y0, gl.Tensor) else gl.tensor(y0)
    eye = gl.eye(y0.shape[0], dtype=y0.dtype)

    def step(t, h, y, steps, accepted):
        h = gl.minimum(h, t_end - t)
        jac = gl.jacfwd(lambda z: f(z, args))(y)
        factor = gl.linalg.lu_factor(eye / (h * GAMMA) - jac)
        us: list[gl.Tensor] = []
        for a_row, c_row in zip(A, C, strict=True):
            z = y
            b = 0.0
            for a, c, u in zip(a_row, c_row, us, strict=True):
                z = z + a * u
                b = b + (c / h) * u
            us.append(gl.linalg.lu_solve(factor, f(z, args) + b))
        y1 = y
        for m, u in zip(M, us, strict=True):
            y1 = y1 + m * u
        scale = atol + rtol * gl.maximum(gl.abs(y), gl.abs(y1))
        error = gl.stop_gradient(gl.sqrt(gl.mean((us[-1] / scale) ** 2)))
        ok = error <= 1.0
        grow = gl.clip(0.9 * gl.maximum(error, 1e-10) ** (-1.0 / ERROR_ORDER), 0.2, 5.0)
        return (
            gl.where(ok, t + h, t),
            h * grow,
            gl.where(ok, y1, y),
            steps + 1,
            accepted + gl.where(ok, 1, 0),
        )

    def running(t, h, y, steps, accepted):
        return gl.logical_and(t < t_end * (1.0 - 1e-12), steps < max_steps)

    start = (
        gl.tensor(0.0, dtype=y0.dtype),
        gl.tensor(float(dt0), dtype=y0.dtype),
        y0,
        gl.tensor(0),
        gl.tensor(0),
    )
    _, _, y, steps, accepted = gl.while_loop(running, step, start)
    return Solution(y, steps, accepted)


def van_der_pol(y: gl.Tensor, mu: Any) -> gl.Tensor:
    """Van der Pol's oscillator, stiff for large `mu`."""
    return gl.stack([y[1], mu * (1.0 - y[0] ** 2) * y[1] - y[0]])


if __name__ == "__main__":
    mu = gl.tensor(10.0, dtype=gl.float64)
    y0 = np.array([2.0, 0.0])
    sol = gl.function(lambda mu: rodas4(van_der_pol, y0, 1.5, mu))(mu)
    grad = gl.function(gl.grad(lambda mu: rodas4(van_der_pol, y0, 1.5, mu).y[0]))(mu)
    print(
        f"y(1.5) = {np.asarray(sol.y)}, {int(sol.accepted)} steps; d y0(1.5) / d mu = {float(grad)}"
    )
