"""V2: 1,024 damped pendulums batched with `gl.vmap`, beside Diffrax's `jit(vmap)` where installed.

Each lane is W11's solve (`ode.py`: adaptive Dormand–Prince 5(4) with scipy's step-size
controller, accept or reject by `gl.cond` inside a `gl.while_loop`) with its own damping, spread
over [0.05, 2]; the figure is `vmap(value_and_grad)` of the final angle squared with respect to
the damping. Each lane accepts and rejects its own steps: its accepted steps are checked against
the unbatched solve's, and its value and gradient against the unbatched ones, before timing.

The peer is Diffrax (`Dopri5`, `PIDController` at the same tolerances, its checkpointed adjoint)
under `jax.jit(jax.vmap(jax.value_and_grad(...)))`; its controller is not scipy's, so its step
counts are its own (printed beside ours). Lane utilisation: mean loop trips (accepted and
rejected steps) over the slowest lane's, what a masked batch pays for.

Usage: python benches/vmap_ode.py [--quick] [--lanes N] [--repeats R]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
from _timing import median_time

import gradloop as gl

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from ode import diffrax_solution, integrate, solve


def dampings(lanes: int) -> np.ndarray:
    return np.random.default_rng(2).uniform(0.05, 2.0, lanes)


def diffrax_runs(c: np.ndarray) -> tuple[Any, np.ndarray] | None:
    """Diffrax's `jit(vmap(value_and_grad))` and each lane's accepted steps, or None where it is
    not installed (a benchmark-only dependency)."""
    found = diffrax_solution()
    if found is None:
        return None
    solution, jax = found
    final_angle_squared = lambda damping: solution(damping).ys[-1, 0] ** 2  # noqa: E731
    fn = jax.jit(jax.vmap(jax.value_and_grad(final_angle_squared)))
    steps = jax.jit(jax.vmap(lambda d: solution(d).stats["num_accepted_steps"]))
    t = jax.numpy.asarray(c)
    return (lambda: jax.block_until_ready(fn(t))), np.asarray(steps(t))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    c = dampings(args.lanes)
    t = gl.tensor(c)

    # Each lane's accepted steps, value and gradient, one lane at a time.
    one = gl.function(lambda d: (*integrate(d)[1:], *gl.value_and_grad(solve)(d)))
    alone = [[float(np.asarray(v)) for v in one(gl.tensor(d))] for d in c]
    steps, tried, value, grad = (np.array(col) for col in zip(*alone, strict=True))

    batched = gl.function(gl.vmap(lambda d: integrate(d)[1]))(t)
    assert np.array_equal(np.asarray(batched), steps), "accepted steps differ from unbatched"

    runs = {}
    fn = gl.vmap(gl.value_and_grad(solve))
    runs["gradloop graph"] = (lambda f: lambda: f(t))(gl.function(fn))
    runs["gradloop jit xla"] = (lambda f: lambda: f(t))(gl.jit(fn, backend="xla"))
    for name, run in runs.items():
        v, g = (np.asarray(x) for x in run())
        np.testing.assert_allclose(v, value, rtol=1e-10, err_msg=name)
        np.testing.assert_allclose(g, grad, rtol=1e-8, atol=1e-12, err_msg=name)
    peer = diffrax_runs(c)
    print(
        f"\nV2: {args.lanes} damped pendulums, damping {c.min():.2f}-{c.max():.2f}; "
        f"accepted steps per lane {steps.min():.0f}-{steps.max():.0f} (mean {steps.mean():.1f}), "
        f"each equal to the unbatched solve's; lane utilisation of a masked batch "
        f"{tried.mean() / tried.max():.2f}"
    )
    if peer is not None:
        runs["Diffrax jit(vmap)"], peer_steps = peer
        print(
            f"    Diffrax (PID controller) accepted steps {peer_steps.min()}-{peer_steps.max()} "
            f"(mean {peer_steps.mean():.1f})"
        )
    times = {name: median_time(run, repeats) for name, run in runs.items()}
    base = times.get("Diffrax jit(vmap)")
    print(f"  {'value_and_grad':26} {'ms':>9} {'vs Diffrax':>11}")
    for name, s in times.items():
        vs = f"{s / base:10.2f}x" if base else ""
        print(f"  {name:26} {s * 1e3:9.2f} {vs}")


if __name__ == "__main__":
    main()
