"""W11: a user's adaptive ODE solve and its gradient, eagerly, in graph mode (compiled frames on
and off) and under `gl.jit`, in one run.

Dormand–Prince 5(4) with scipy's step-size controller (`solve_ivp(method="RK45")`'s rules:
error norm as an RMS scaled by atol + rtol·max(|y|, |y_new|), safety 0.9, factors clipped to
[0.2, 10]), accept or reject by `gl.cond` inside a `gl.while_loop` whose trip count depends on
the data. The system is a damped pendulum, y = (angle, velocity), y' = (v, -c v - sin(angle)),
from (1, 0) over [0, 5] (about 70 accepted steps); the figure is `value_and_grad` of the final
angle squared with respect to the damping c. The step-size factor is held constant for the
gradient (`stop_gradient`), as adaptive solvers' adjoints do.

Usage: python benches/ode.py [--quick] [--repeats N] [--no-jit]

Medians over repeats, interquartile ranges beside them; ratios per repeat (benches/README.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

import gradloop as gl

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from executor import frames
from graph_mode import ratio, stat
from run import paired, print_table

T1, RTOL, ATOL = 5.0, 1e-8, 1e-10
C = (0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0)
A = (
    (),
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
)
B = (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84)
# The error estimate: the 5th-order solution minus the embedded 4th-order one (scipy's E).
E = (-71 / 57600, 0.0, 71 / 16695, -71 / 1920, 17253 / 339200, -22 / 525, 1 / 40)


def pendulum(damping: gl.Tensor, y: gl.Tensor) -> gl.Tensor:
    angle, velocity = y[0], y[1]
    return gl.stack([velocity, -damping * velocity - gl.sin(angle)])


def integrate(damping: gl.Tensor) -> tuple[gl.Tensor, gl.Tensor, gl.Tensor]:
    """The pendulum's state at T1, how many steps the solver accepted and how many it tried."""

    def more(t, y, h, steps, tried):
        return t < T1

    def step(t, y, h, steps, tried):
        h = gl.minimum(h, T1 - t)
        ks = [pendulum(damping, y)]
        for a in A[1:]:
            ks.append(pendulum(damping, y + h * sum(c * k for c, k in zip(a, ks, strict=True))))
        y_new = y + h * sum(b * k for b, k in zip(B, ks, strict=True) if b != 0.0)
        ks.append(pendulum(damping, y_new))
        error = h * sum(e * k for e, k in zip(E, ks, strict=True) if e != 0.0)
        scale = ATOL + gl.maximum(gl.abs(y), gl.abs(y_new)) * RTOL
        norm = gl.stop_gradient(gl.sqrt(gl.mean((error / scale) ** 2.0)))
        safe = gl.maximum(norm, 1e-10)
        grow = gl.minimum(10.0, 0.9 * safe**-0.2)
        shrink = gl.maximum(0.2, 0.9 * safe**-0.2)
        accepted = gl.cond(
            norm < 1.0,
            lambda: (t + h, y_new, h * grow, steps + 1),
            lambda: (t, y, h * shrink, steps),
        )
        return (*accepted, tried + 1)

    y0 = gl.tensor([1.0, 0.0], dtype=gl.float64)
    start = (gl.tensor(0.0, dtype=gl.float64), y0, gl.tensor(0.01, dtype=gl.float64))
    count = gl.tensor(0, dtype=gl.int32)
    _, y, _, steps, tried = gl.while_loop(more, step, (*start, count, count))
    return y, steps, tried


def solve(damping: gl.Tensor) -> gl.Tensor:
    """The final angle squared of the pendulum with damping `damping`."""
    return integrate(damping)[0][0] ** 2.0


def diffrax_solution():
    """Diffrax's solve of the same pendulum (`Dopri5`, `PIDController` at the same tolerances,
    its default checkpointed adjoint), as a function of the damping, and `jax`; None where
    Diffrax is not installed (`pip install diffrax`: a benchmark-only dependency)."""
    try:
        import diffrax
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)

    def field(t, y, damping):
        return jnp.stack([y[1], -damping * y[1] - jnp.sin(y[0])])

    def solution(damping):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            diffrax.Dopri5(),
            t0=0.0,
            t1=T1,
            dt0=0.01,
            y0=jnp.array([1.0, 0.0]),
            args=damping,
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
            saveat=diffrax.SaveAt(t1=True),
        )

    return solution, jax


def diffrax_value_and_grad():
    """The same solve and gradient with Diffrax under `jax.jit`, or None where Diffrax is not
    installed."""
    found = diffrax_solution()
    if found is None:
        return None
    solution, jax = found
    fn = jax.jit(jax.value_and_grad(lambda damping: solution(damping).ys[-1, 0] ** 2))
    damping = jax.numpy.float64(0.3)
    return lambda: jax.block_until_ready(fn(damping))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no-jit", action="store_true", help="skip gl.jit")
    args = parser.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 9)
    damping = gl.tensor(0.3, dtype=gl.float64)
    steps = int(np.asarray(integrate(damping)[1]))

    grad = gl.value_and_grad(solve)
    staged = gl.function(grad)
    fns = {
        "graph": lambda: staged(damping),
        "buffers": lambda: frames("buffers", staged)(damping),
        "interpreted": lambda: frames("off", staged)(damping),
        "eager": lambda: grad(damping),
    }
    if not args.no_jit:
        compiled = gl.jit(grad)
        fns["jit"] = lambda: compiled(damping)
    want = [float(np.asarray(v)) for v in grad(damping)]
    for name, fn in fns.items():
        got = [float(np.asarray(v)) for v in fn()]
        np.testing.assert_allclose(got, want, rtol=1e-9, err_msg=name)
    peer = diffrax_value_and_grad()
    if peer is not None:
        # another step-size controller (PID, not scipy's): the same solution, not the same bits
        got = [float(np.asarray(v)) for v in peer()]
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg="diffrax")
        fns["diffrax"] = peer
    t = paired(fns, number=3 if args.quick else 10, repeats=repeats)
    rows = [
        (f"W11 ODE value_and_grad ({steps} accepted steps), graph, ms", *stat(t["graph"], 1e3), ""),
        ("   graph, frames stepped on buffers, ms", *stat(t["buffers"], 1e3), ""),
        ("   stepped / machine code", *ratio(t["buffers"], t["graph"]), ""),
        ("   graph, frames interpreted, ms", *stat(t["interpreted"], 1e3), ""),
        ("   interpreted / machine code", *ratio(t["interpreted"], t["graph"]), ""),
        ("   graph, us per accepted step", *stat(t["graph"], 1e6 / steps), ""),
        ("   eager, ms", *stat(t["eager"], 1e3), ""),
    ]
    if "jit" in t:
        rows.append(("   gl.jit, ms", *stat(t["jit"], 1e3), ""))
        rows.append(("   gl.jit / graph", *ratio(t["jit"], t["graph"]), ""))
    if "diffrax" in t:
        rows.append(("   Diffrax (jax.jit), ms", *stat(t["diffrax"], 1e3), ""))
        rows.append(("   graph / Diffrax", *ratio(t["graph"], t["diffrax"]), "1.5x"))
        if "jit" in t:
            rows.append(("   gl.jit / Diffrax", *ratio(t["jit"], t["diffrax"]), "1.5x"))
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
