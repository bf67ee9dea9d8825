"""A long simulation's gradient in bounded memory: `gl.while_loop(..., checkpoints=c)`.

A chain of 32 pendulums coupled by springs swings for `--trips` steps (200,000 by default, the
count passed at run time). The loss is the chain's kinetic energy at the end, and its gradient
with respect to each pendulum's initial angle runs the loop backwards. Plain reverse mode keeps
every trip's state (stacks that grow with the trip count: about 60 MB here). With `checkpoints=c`,
the gradient keeps c snapshots and recomputes the trips in between (binomial checkpointing): the
memory stops growing with the trip count, for a bounded number of extra body evaluations. The
gradients agree to rounding. The script measures the peak memory (Linux) and the time of each.

    python examples/checkpointed_sim.py [--trips 200000] [--plot memory.png] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import gradloop as gl
from gradloop.examples import figures

PENDULUMS = 32
DT = 1e-4  # s: 200,000 trips are 20 s of swinging
STIFFNESS = 4.0  # the coupling springs, 1/s^2
DAMPING = 0.05  # 1/s
# None: stacks, a row per trip. Last, so that the snapshots' peaks are measured before the
# stacks' memory has grown the process (an allocator keeps what was freed).
CHECKPOINTS = (10, 50, 200, None)


def energy_at_end(theta0, trips, checkpoints):
    """The chain's kinetic energy after `trips` semi-implicit Euler steps from rest at angles
    `theta0` (float64, one per pendulum)."""

    def running(i, theta, omega):
        return i < trips

    def step(i, theta, omega):
        left = gl.concatenate([theta[:1], theta[:-1]])
        right = gl.concatenate([theta[1:], theta[-1:]])
        springs = STIFFNESS * (left - 2.0 * theta + right)
        omega = omega + DT * (-gl.sin(theta) - DAMPING * omega + springs)
        return i + 1, theta + DT * omega, omega

    start = (gl.tensor(0), theta0, gl.zeros_like(theta0))
    _, _, omega = gl.while_loop(running, step, start, checkpoints=checkpoints)
    return 0.5 * gl.sum(omega * omega)


def gradient_function(checkpoints):
    return gl.function(gl.grad(lambda theta0, trips: energy_at_end(theta0, trips, checkpoints)))


def _peak_reset() -> bool:
    """Starts the process's peak resident size again from its current size (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


@dataclass
class Run:
    checkpoints: int | None
    gradient: np.ndarray
    seconds: float
    peak_mb: float | None  # how far the resident size rose during a gradient; None: unmeasured


def measure(checkpoints, theta0: np.ndarray, trips: int, repeats: int = 3) -> Run:
    grad = gradient_function(checkpoints)
    x, n = gl.tensor(theta0), gl.tensor(trips)
    np.asarray(grad(x, gl.tensor(10)))  # traced and compiled once
    peak = None
    if _peak_reset():
        before = _status_mb("VmRSS")
        gradient = np.asarray(grad(x, n))
        peak = _status_mb("VmHWM") - before
    else:
        gradient = np.asarray(grad(x, n))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.asarray(grad(x, n))
        times.append(time.perf_counter() - start)
    return Run(checkpoints, gradient, statistics.median(times), peak)


def plot(runs: list[Run], theta0: np.ndarray, trips: int, filename: str) -> None:
    pyplot = figures.pyplot()
    figure, (costs, gradient) = pyplot.subplots(1, 2, figsize=(11, 4))
    labels = ["stacks" if r.checkpoints is None else f"c = {r.checkpoints}" for r in runs]
    positions = np.arange(len(runs))
    if all(r.peak_mb is not None for r in runs):
        bars = costs.bar(positions - 0.2, [r.peak_mb for r in runs], 0.4, color="steelblue")
        costs.bar_label(bars, [f"{r.peak_mb:.2f} MB" for r in runs], fontsize="small")
        costs.set_ylabel("peak memory during the gradient (MB)", color="steelblue")
    seconds = costs.twinx()
    seconds.plot(positions + 0.2, [r.seconds for r in runs], "o", color="crimson")
    seconds.set_ylabel("seconds per gradient", color="crimson")
    seconds.set_ylim(bottom=0.0)
    costs.set_xticks(positions, labels)
    costs.set_title(f"{trips:,} trips: memory against recomputation")
    stacks = next(r for r in runs if r.checkpoints is None)
    gradient.plot(stacks.gradient, color="grey", linewidth=3, label="stacks")
    for r, label, marker in zip(runs, labels, "o^sx", strict=False):
        if r.checkpoints is not None:
            gradient.plot(r.gradient, marker, markersize=4, fillstyle="none", label=label)
    gradient.set(xlabel="pendulum", title="d(kinetic energy at the end)/d(initial angle)")
    gradient.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(filename)
    pyplot.close(figure)


def main(argv: Sequence[str] | None = None) -> list[Run]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trips", type=int, default=200_000)
    parser.add_argument("--plot", default=None, help="write the figure here (PNG, SVG or PDF)")
    parser.add_argument("--quick", action="store_true", help="a short run (the test suite's)")
    args = parser.parse_args(argv)
    trips = 5_000 if args.quick else args.trips
    theta0 = 0.3 * np.exp(-0.5 * ((np.arange(PENDULUMS) - 8.0) / 3.0) ** 2)
    runs = [measure(c, theta0, trips, repeats=1 if args.quick else 3) for c in CHECKPOINTS]
    stacks = next(r.gradient for r in runs if r.checkpoints is None)
    for run in runs:
        label = "stacks" if run.checkpoints is None else f"checkpoints={run.checkpoints}"
        memory = "unmeasured" if run.peak_mb is None else f"{run.peak_mb:5.1f} MB"
        spread = np.max(np.abs(run.gradient - stacks)) / np.max(np.abs(stacks))
        print(
            f"{label:>16}: {run.seconds:6.3f} s, peak {memory}, "
            f"differs from the stacks' by {spread:.1e}"
        )
    if args.plot:
        plot(runs, theta0, trips, args.plot)
        print(f"wrote {args.plot}")
    return runs


if __name__ == "__main__":
    main()
