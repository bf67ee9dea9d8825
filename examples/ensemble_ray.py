"""Fit the launch angle for many targets at once on a Ray cluster.

Each target is the flagship example's fit (`gradloop.examples.projectile`): a projectile flown
by a data-dependent `gl.while_loop` until it lands, its squared miss differentiated in reverse
mode. Every gradient step maps the compiled `value_and_grad` over all the targets with
`gl.distributed.map`: flights of different lengths (60 to 450 loop trips) go to whichever worker
is free. It prints the fitted angles, and `--plot` draws the flights (the plot extra).

    python examples/ensemble_ray.py [--targets 16] [--steps 40] [--address auto] [--plot out.png]

Without `--address` it starts a local Ray instance; `--address auto` joins a running cluster
(`ray start --head` on one machine, `ray start --address=HEAD:6379` on the others).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import gradloop as gl
from gradloop.examples import figures, projectile

LEARNING_RATE = 8e-5  # rad/m^2, as the flagship example's


def fit_all(
    targets: np.ndarray,
    steps: int,
    theta0: float = 0.3,
    address: str | None = None,
    log: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradient descent on every target's squared miss at once. Returns the fitted angles
    (rad), their squared misses and loop trips."""
    loss_and_grad = gl.jit(gl.value_and_grad(projectile.loss, has_aux=True))
    thetas = np.full(len(targets), theta0)
    for step in range(steps):
        items = [
            (gl.tensor(t, dtype=gl.float64), gl.tensor(d, dtype=gl.float64))
            for t, d in zip(thetas, targets, strict=True)
        ]
        results = gl.distributed.map(loss_and_grad, items, address=address)
        losses = np.array([float(value) for (value, _), _ in results])
        trips = np.array([int(n) for (_, n), _ in results])
        grads = np.array([float(grad) for _, grad in results])
        if log and (step % 10 == 0 or step == steps - 1):
            print(
                f"step {step:3}: worst miss {math.sqrt(losses.max()):9.4f} m, "
                f"loop trips {trips.min()} to {trips.max()}"
            )
        thetas = thetas - LEARNING_RATE * grads
    return thetas, losses, trips


def plot(targets: np.ndarray, thetas: np.ndarray, filename: str) -> None:
    """Each target's fitted flight, and the fitted angle against the target."""
    pyplot = figures.pyplot()
    figure, (flights, angles) = pyplot.subplots(1, 2, figsize=(11, 4), width_ratios=(2, 1))
    colours = pyplot.get_cmap("viridis")
    for k, (target, theta) in enumerate(zip(targets, thetas, strict=True)):
        xy = projectile.path(theta)
        colour = colours(k / max(len(targets) - 1, 1))
        flights.plot(xy[:, 0], xy[:, 1], color=colour, linewidth=1)
        flights.plot([target], [0.0], marker="v", color=colour, markersize=6)
    flights.set(xlabel="x (m)", ylabel="height (m)", title="each target's fitted flight")
    flights.set_ylim(bottom=0.0)
    angles.plot(targets, np.degrees(thetas), "o-", markersize=4)
    angles.set(xlabel="target (m)", ylabel="launch angle (deg)", title="fitted on Ray workers")
    figure.tight_layout()
    figure.savefig(filename)
    pyplot.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--address", default=None, help='"auto" or "ray://host:port"')
    parser.add_argument("--plot", default=None, help="write a plot of the angles here")
    args = parser.parse_args()
    targets = np.linspace(15.0, 40.0, args.targets)
    thetas, _, _ = fit_all(targets, args.steps, address=args.address)
    print(f"\n{'target (m)':>10}  {'angle (deg)':>11}  {'lands at (m)':>12}  {'trips':>5}")
    for target, theta in zip(targets, thetas, strict=True):
        landing, trips = projectile.simulate(gl.tensor(theta, dtype=gl.float64))
        angle = math.degrees(theta)
        print(f"{target:10.2f}  {angle:11.4f}  {float(landing):12.4f}  {int(trips):5}")
    if args.plot:
        plot(targets, thetas, args.plot)
        print(f"plot: {args.plot}")
    gl.distributed.shutdown()


if __name__ == "__main__":
    main()
