"""Jacobians and Hessians through a data-dependent loop: every row or column at once (`gl.vmap`
over the unit vectors, what `gl.jacfwd`, `gl.jacrev` and `gl.hessian` do) against one `jvp` or
one gradient per column or row (the loop they ran before), beside JAX where installed.

V4: `f: R^n -> R^n` (n = 64 by default) iterates `v <- 0.9 sin(v) + 0.05 v^2 + 0.01 x` until
`|v|` stops changing to 1e-9 (the trip count depends on `x`), then scales by `sum(x)`. Jacobian
by `jacrev` (n rows) and `jacfwd` (n columns); Hessian of `sum(f(x)^2)`. JAX's figures are its
`jit(jacrev)`, `jit(jacfwd)` and `jit(hessian)` of the same loop written with `lax.while_loop`
(its reverse mode refuses the loop, so only `jacfwd` runs there). Each figure is the median over
`--repeats` calls after three warm-up calls; ratios are per row against the one-at-a-time loop
measured in the same run. Every result is checked against the one-at-a-time loop's.

Usage: python benches/jacobians.py [--quick] [--n N] [--repeats R]
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
from _timing import median_time

import gradloop as gl


def f(x: Any) -> Any:
    def body(v: Any, _: Any) -> Any:
        return 0.9 * gl.sin(v) + 0.05 * v * v + 0.01 * x, v

    def going(v: Any, prev: Any) -> Any:
        return gl.max(gl.abs(v - prev)) > 1e-9

    v, _ = gl.while_loop(going, body, (x, x + 1.0), maximum_iterations=500)
    return v * gl.sum(x)


def scalar(x: Any) -> Any:
    return gl.sum(f(x) ** 2)


def one_at_a_time_jacrev(x: Any) -> Any:
    with gl.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = f(x)
    n = y.shape[0]
    rows = [tape.gradient(y, x, output_gradients=gl.tensor(np.eye(n)[j])) for j in range(n)]
    return gl.stack(rows, axis=0)


def one_at_a_time_jacfwd(x: Any) -> Any:
    n = x.shape[0]
    cols = [gl.jvp(f, (x,), (gl.tensor(np.eye(n)[j]),))[1] for j in range(n)]
    return gl.stack(cols, axis=1)


def one_at_a_time_hessian(x: Any) -> Any:
    n = x.shape[0]
    g = gl.grad(scalar)
    cols = [gl.jvp(g, (x,), (gl.tensor(np.eye(n)[j]),))[1] for j in range(n)]
    return gl.stack(cols, axis=1)


def jax_runs(x: np.ndarray) -> dict[str, Callable[[], Any]]:
    if importlib.util.find_spec("jax") is None:
        return {}
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)

    def jf(x: Any) -> Any:
        def body(c: Any) -> Any:
            v, _ = c
            return 0.9 * jnp.sin(v) + 0.05 * v * v + 0.01 * x, v

        v, _ = jax.lax.while_loop(lambda c: jnp.max(jnp.abs(c[0] - c[1])) > 1e-9, body, (x, x + 1))
        return v * jnp.sum(x)

    xj = jnp.asarray(x)
    fwd = jax.jit(jax.jacfwd(jf))
    return {"jacfwd": lambda: fwd(xj).block_until_ready()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    x_np = np.linspace(0.1, 0.9, args.n)
    x = gl.tensor(x_np)
    cases = [
        ("jacrev", gl.jacrev(f), one_at_a_time_jacrev),
        ("jacfwd", gl.jacfwd(f), one_at_a_time_jacfwd),
        ("hessian", gl.hessian(scalar), one_at_a_time_hessian),
    ]
    peers = jax_runs(x_np)
    print(f"V4: n = {args.n}, median ms (ratio: one at a time / all at once)")
    print(f"  {'':10} {'mode':6} {'all at once':>12} {'one at a time':>14} {'ratio':>7} {'JAX':>8}")
    for name, batched, looped in cases:
        for mode in ("eager", "graph"):
            run_b = batched if mode == "eager" else gl.function(batched)
            run_l = looped if mode == "eager" else gl.function(looped)
            np.testing.assert_allclose(
                np.asarray(run_b(x)), np.asarray(run_l(x)), rtol=1e-9, atol=1e-12
            )
            t_b = median_time(lambda run_b=run_b: np.asarray(run_b(x)), repeats)
            t_l = median_time(lambda run_l=run_l: np.asarray(run_l(x)), repeats)
            peer = peers.get(name) if mode == "graph" else None
            t_j = median_time(peer, repeats) if peer else None
            jax_cell = f"{t_j * 1e3:8.3f}" if t_j else f"{'':8}"
            print(
                f"  {name:10} {mode:6} {t_b * 1e3:12.3f} {t_l * 1e3:14.3f} "
                f"{t_l / t_b:6.1f}x {jax_cell}"
            )


if __name__ == "__main__":
    main()
