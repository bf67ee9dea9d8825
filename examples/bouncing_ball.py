"""A bouncing ball's event-driven gradient: fit the throw so that the third bounce hits a mark.

A ball is thrown from 1 m at 40 degrees above the horizontal; quadratic air drag slows it and
each bounce keeps a fraction
`restitution` of its vertical speed. The flight is a `gl.while_loop` that runs until the third
bounce, so its trip count depends on the throw. Inside each step a `gl.cond` handles the event:
where the step would cross the floor, it locates the contact within the step, reflects the
vertical velocity there and finishes the step from the contact. The contact's position therefore
moves continuously with the throw, and its derivative flows through the loop, through the branch
taken and through the event's location. Gradient descent on the throw speed puts the third bounce
on the mark, and the derivative with respect to the restitution is checked against central
finite differences.

    python examples/bouncing_ball.py [--mark 12.0] [--steps 6] [--plot bounces.png] [--quick]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

import gradloop as gl
from gradloop.examples import figures

GRAVITY = 9.81  # m/s^2
DRAG = 0.05  # quadratic drag per unit mass, 1/m: the deceleration is DRAG * |v| * v
HEIGHT = 1.0  # m
ANGLE = 0.7  # rad above the horizontal
DT = 2e-3  # s
BOUNCES = 3
RESTITUTION = 0.8
MAX_STEPS = 100_000  # a safety net: every flight ends long before


def accelerate(vx, vy, dt):
    """The velocity after `dt` of gravity and drag (an explicit Euler step of the velocity)."""
    speed = gl.sqrt(vx * vx + vy * vy)
    return vx - dt * DRAG * speed * vx, vy - dt * (GRAVITY + DRAG * speed * vy)


def step(x, y, vx, vy, restitution, dt=DT):
    """One semi-implicit Euler step, and the contact point if the step reaches the floor:
    (x, y, vx, vy after the step, whether it bounced, the contact's x)."""
    vx_next, vy_next = accelerate(vx, vy, dt)
    x_next, y_next = x + dt * vx_next, y + dt * vy_next

    def bounce():
        # The contact after a fraction s of the step, its velocity reflected there, and the rest
        # of the step flown from it. A contact at the very end of one step and one at the very
        # start of the next give the same state, so the flight is continuous in the throw.
        s = y / (y - y_next)
        rest = (1.0 - s) * dt
        vx_out, vy_out = accelerate(
            vx + s * (vx_next - vx), -restitution * (vy + s * (vy_next - vy)), rest
        )
        contact = x + s * (x_next - x)
        return contact + rest * vx_out, rest * vy_out, vx_out, vy_out, contact

    def fly():
        return x_next, y_next, vx_next, vy_next, x_next

    hit = y_next < 0.0
    x_new, y_new, vx_new, vy_new, contact = gl.cond(hit, bounce, fly)
    return x_new, y_new, vx_new, vy_new, hit, contact


@gl.function
def third_bounce(speed, restitution):
    """Where the ball thrown at `speed` (m/s, a float64 scalar) touches the floor for the
    `BOUNCES`-th time, and the Euler steps it took."""

    def flying(n, bounces, x, y, vx, vy, contact):
        return bounces < BOUNCES

    def body(n, bounces, x, y, vx, vy, contact):
        x, y, vx, vy, hit, touched = step(x, y, vx, vy, restitution)
        return n + 1, bounces + gl.cast(hit, gl.int32), x, y, vx, vy, touched

    zero = gl.zeros_like(speed)
    vx, vy = speed * np.cos(ANGLE), speed * np.sin(ANGLE)
    start = (gl.tensor(0), gl.tensor(0), zero, zero + HEIGHT, vx, vy, zero)
    n, _, _, _, _, _, contact = gl.while_loop(flying, body, start, maximum_iterations=MAX_STEPS)
    return contact, n


def path(speed: float, restitution: float = RESTITUTION) -> np.ndarray:
    """The flight as (x, y) rows, one per step, until the last bounce: the same step, run
    eagerly (for the picture)."""
    throw = (0.0, HEIGHT, speed * np.cos(ANGLE), speed * np.sin(ANGLE))
    state = [gl.tensor(v, dtype=gl.float64) for v in throw]
    e = gl.tensor(restitution, dtype=gl.float64)
    points, bounces = [(0.0, HEIGHT)], 0
    while bounces < BOUNCES and len(points) <= MAX_STEPS:
        *state, hit, _ = step(*state, e)
        bounces += bool(hit)
        points.append((float(state[0]), float(state[1])))
    return np.array(points)


@dataclass
class Fit:
    """The fitted throw speed and one row per gradient step: (loss, speed, Euler steps)."""

    speed: float
    history: list[tuple[float, float, int]] = field(default_factory=list)


def loss(speed, restitution, mark):
    contact, n = third_bounce(speed, restitution)
    miss = contact - mark
    return miss * miss, n


loss_and_grad = gl.value_and_grad(loss, has_aux=True)


def fit(mark: float, steps: int, speed: float = 1.0, log: bool = True) -> Fit:
    """Gauss-Newton steps on the squared miss: the throw speed that puts the third
    bounce on `mark` (m)."""
    e = gl.tensor(RESTITUTION, dtype=gl.float64)
    m = gl.tensor(mark, dtype=gl.float64)
    result = Fit(speed)
    for k in range(steps):
        (value, n), grad = loss_and_grad(gl.tensor(speed, dtype=gl.float64), e, m)
        value, grad = float(value), float(grad)
        result.history.append((value, speed, int(n)))
        if log:
            print(f"step {k:2}: speed {speed:.6f} m/s, miss {np.sqrt(value):.2e} m, {int(n)} steps")
        # The loss is r^2 with r = x - mark, and dr/ds = grad / 2r: a Gauss-Newton step,
        # s - r / (dr/ds).
        if grad != 0.0:
            speed -= 2.0 * value / grad
    result.speed = speed
    return result


def restitution_derivative(speed: float, restitution: float = RESTITUTION) -> tuple[float, float]:
    """d(third bounce)/d(restitution) by reverse mode, and by central finite differences."""
    s, e = gl.tensor(speed, dtype=gl.float64), gl.tensor(restitution, dtype=gl.float64)
    exact = float(gl.grad(lambda e: third_bounce(s, e)[0])(e))
    h = 1e-6
    up = float(third_bounce(s, gl.tensor(restitution + h, dtype=gl.float64))[0])
    down = float(third_bounce(s, gl.tensor(restitution - h, dtype=gl.float64))[0])
    return exact, (up - down) / (2 * h)


def plot(result: Fit, mark: float, filename: str) -> None:
    paths = [path(speed) for _, speed, _ in result.history]
    losses = [loss for loss, _, _ in result.history]
    figures.draw_fit(
        paths, path(result.speed), mark, losses, filename, what="throw", target_label="mark"
    )


def main(argv: Sequence[str] | None = None) -> Fit:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mark", type=float, default=12.0, help="where the third bounce should land (m)"
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--plot", default=None, help="write the figure here (PNG, SVG or PDF)")
    parser.add_argument("--quick", action="store_true", help="a short run (the test suite's)")
    args = parser.parse_args(argv)
    result = fit(args.mark, 3 if args.quick else args.steps)
    exact, numeric = restitution_derivative(result.speed)
    print(f"d(third bounce)/d(restitution): {exact:.6f} m (finite differences {numeric:.6f})")
    if args.plot:
        plot(result, args.mark, args.plot)
        print(f"wrote {args.plot}")
    return result


if __name__ == "__main__":
    main()
