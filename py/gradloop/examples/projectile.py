"""Fit a launch angle by gradient descent through a data-dependent `gl.while_loop`.

A projectile leaves a height of 1 m at 30 m/s; quadratic air drag slows it down. Its flight is
integrated with semi-implicit Euler steps inside `gl.while_loop` until it falls below the ground, so
the number of loop trips depends on the launch angle. The landing point is interpolated linearly
within the last step, which makes it a continuous function of the angle, whose derivative reverse
mode computes through the loop. Gradient descent on the squared miss distance then finds the angle
that lands the projectile on a target. Run it with `gradloop demo`, `python -m gradloop demo` or
`python examples/projectile.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradloop as gl

GRAVITY = 9.81  # m/s^2
DRAG = 0.02  # quadratic drag coefficient divided by mass, 1/m: the deceleration is DRAG * |v| * v
SPEED = 30.0  # launch speed, m/s
HEIGHT = 1.0  # launch height, m
DT = 0.01  # integration time step, s
MAX_STEPS = 100_000  # a safety net only: every flight ends long before

DEFAULT_STEPS = 25
DEFAULT_TARGET = 35.0  # m; the drag-free range at 30 m/s would be ~92 m, drag cuts it to ~43 m
DEFAULT_THETA0 = 0.1  # rad, a flat first guess that lands at ~20 m
DEFAULT_LEARNING_RATE = 8e-5  # rad/m^2; d(landing)/d(angle) is ~40-70 m/rad over the path


def simulate(theta: gl.Tensor, dt: float = DT) -> tuple[gl.Tensor, gl.Tensor]:
    """Flies a projectile launched at angle `theta` (a float64 scalar tensor, radians).

    Returns (landing distance in m, a float64 scalar; number of Euler steps, an int32 scalar).
    """

    # Loop state: step count, position, velocity, and the position one step earlier (for the
    # interpolation at the end). A tuple of loop vars is spread into positional arguments.
    def above_ground(n, x, y, vx, vy, x_prev, y_prev):
        return y > 0.0

    def euler_step(n, x, y, vx, vy, x_prev, y_prev):
        speed = gl.sqrt(vx * vx + vy * vy)
        vx_next = vx - DRAG * speed * vx * dt
        vy_next = vy - (GRAVITY + DRAG * speed * vy) * dt
        # semi-implicit Euler: the position moves with the *new* velocity
        return n + 1, x + vx_next * dt, y + vy_next * dt, vx_next, vy_next, x, y

    x0, y0 = gl.zeros_like(theta), gl.zeros_like(theta) + HEIGHT
    vx0, vy0 = SPEED * gl.cos(theta), SPEED * gl.sin(theta)
    loop_vars = (gl.tensor(0, dtype=gl.int32), x0, y0, vx0, vy0, x0, y0)
    n, x, y, _, _, x_prev, y_prev = gl.while_loop(
        above_ground, euler_step, loop_vars, maximum_iterations=MAX_STEPS
    )
    # The ground (y = 0) was crossed between (x_prev, y_prev > 0) and (x, y <= 0): interpolate.
    # Where a change of angle moves a step across the ground the trip count jumps by one, yet
    # this landing point moves continuously (only its slope changes there, by O(dt)), so
    # gradient descent sees an almost smooth landscape.
    landing = x_prev + (x - x_prev) * y_prev / (y_prev - y)
    return landing, n


@dataclass
class Fit:
    """The result of `fit`: the fitted angle and one row per gradient step."""

    theta: float
    history: list[tuple[float, float, int]] = field(default_factory=list)  # (loss, theta, trips)


def loss(theta: gl.Tensor, target: float) -> tuple[gl.Tensor, gl.Tensor]:
    """(landing(theta) - target)^2, the scalar to differentiate, and the loop trip count."""
    landing, trips = simulate(theta)
    miss = landing - target
    return miss * miss, trips


eager_loss_and_grad = gl.value_and_grad(loss, has_aux=True)
# Graph mode: traced once per signature by @gl.function into a graph whose While node is
# differentiated symbolically (a forward loop that stacks what the gradient needs, a reverse loop
# that pops it), then run by the graph interpreter.
graph_loss_and_grad = gl.function(gl.value_and_grad(loss, has_aux=True))


def fit(
    target: float = DEFAULT_TARGET,
    theta0: float = DEFAULT_THETA0,
    steps: int = DEFAULT_STEPS,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    log: Callable[[str], None] | None = print,
    loss_and_grad: Callable[..., Any] = eager_loss_and_grad,
) -> Fit:
    """Gradient descent on (landing(theta) - target)^2; `log` gets one line per step.

    `loss_and_grad` is `eager_loss_and_grad` or `graph_loss_and_grad`.
    """
    theta = gl.tensor(theta0, dtype=gl.float64)
    result = Fit(theta=theta0)
    if log:
        log(f"{'step':>4}  {'loss (m^2)':>12}  {'angle (deg)':>11}  {'loop trips':>10}")
    for step in range(steps):
        (value, trips), grad = loss_and_grad(theta, target)
        result.history.append((float(value), float(theta), int(trips)))
        if log:
            angle = math.degrees(float(theta))
            log(f"{step:>4}  {float(value):>12.6g}  {angle:>11.4f}  {int(trips):>10}")
        theta = theta - learning_rate * grad  # a new tensor: tensors are immutable
    result.theta = float(theta)
    return result


def check_gradient(theta: float, eps: float = 1e-6) -> tuple[float, float]:
    """d(landing)/d(theta) by reverse mode through the loop, and by a central finite difference."""
    reverse = gl.grad(lambda t: simulate(t)[0])(gl.tensor(theta, dtype=gl.float64))
    plus, _ = simulate(gl.tensor(theta + eps, dtype=gl.float64))
    minus, _ = simulate(gl.tensor(theta - eps, dtype=gl.float64))
    return float(reverse), (float(plus) - float(minus)) / (2 * eps)


def main(
    steps: int = DEFAULT_STEPS,
    target: float = DEFAULT_TARGET,
    learning_rate: float = DEFAULT_LEARNING_RATE,
) -> Fit:
    """Runs the demo and prints its progress; returns the fit."""
    print(
        f"Fitting the launch angle of a projectile (speed {SPEED} m/s, drag {DRAG} 1/m,\n"
        f"launch height {HEIGHT} m, time step {DT} s) so that it lands at {target} m.\n"
        "Each loss evaluation runs an eager gl.while_loop until the projectile hits the ground;\n"
        "gl.value_and_grad differentiates through it in reverse mode.\n"
    )
    result = fit(target=target, steps=steps, learning_rate=learning_rate)
    landing, n = simulate(gl.tensor(result.theta, dtype=gl.float64))
    reverse, central = check_gradient(result.theta)
    rel = abs(reverse - central) / max(abs(central), 1e-300)
    print(
        f"\nfitted angle: {math.degrees(result.theta):.4f} deg ({result.theta:.6f} rad)\n"
        f"landing distance: {float(landing):.6f} m after {int(n)} steps "
        f"(target {target} m, miss {float(landing) - target:+.2e} m)\n"
        f"gradient check, d landing / d angle at the fitted angle:\n"
        f"  {reverse:.9f} m/rad by reverse mode through the while_loop\n"
        f"  {central:.9f} m/rad by central difference (relative difference {rel:.1e})"
    )
    compare_modes(result, target)
    return result


def compare_modes(result: Fit, target: float) -> float:
    """Re-runs the fit's angles in graph mode; prints and returns the largest relative difference
    of loss and gradient from eager mode, and the time per evaluation of each mode."""
    import time

    thetas = [gl.tensor(theta, dtype=gl.float64) for _, theta, _ in result.history]
    worst = 0.0
    timings = {}
    for name, fn in (("eager", eager_loss_and_grad), ("graph", graph_loss_and_grad)):
        fn(thetas[0], target)  # graph mode traces on its first call
        start = time.perf_counter()
        timings[name] = [fn(t, target) for t in thetas]
        timings[name + "_s"] = (time.perf_counter() - start) / len(thetas)
    for (ev, eg), (gv, gg) in zip(timings["eager"], timings["graph"], strict=True):
        for a, b in ((ev[0], gv[0]), (eg, gg)):
            worst = max(worst, abs(float(a) - float(b)) / max(abs(float(a)), 1e-300))
    print(
        f"\ngraph mode (@gl.function: traced once, symbolic gradient of the While, interpreter):\n"
        f"  same {len(thetas)} losses and gradients as eager mode, largest relative difference "
        f"{worst:.1e}\n"
        f"  {timings['eager_s'] * 1e3:.1f} ms per loss+gradient eagerly, "
        f"{timings['graph_s'] * 1e3:.1f} ms as a graph"
    )
    return worst


if __name__ == "__main__":
    main()
