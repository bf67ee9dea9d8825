"""Batching (`gl.vmap`) over data-dependent loops, beside JAX and Equinox where installed.

V1: 1,024 Newton solves of x^3 = a to a relative tolerance, whose trip counts differ per lane
(`uniform`: a spread over four decades, trips 3-18; `heavy`: 95% of lanes start near their root, 5%
far away: trips 2-49). Value = the roots; gradient = dx*/da per lane (`vmap(grad)`). Peers: JAX's
`jit(vmap)` of `lax.while_loop` (values only: `jax.vmap(jax.grad)` refuses the loop) and Equinox's
checkpointed `while_loop` under `jit(vmap(grad))`. Each figure is the median over `--repeats`
blocks of ten calls after ten warm-up calls (tracing, compiling), every column's block in turn
within each repeat, three untimed calls first, so that the machine's drift falls on all alike;
ratios are against JAX's value and Equinox's gradient measured in the same run. Lane utilisation:
the mean trips per lane over the trips of the slowest lane (what a masked batch pays for).

Every lane's trip count is checked against the unbatched function's before timing.

Usage: python benches/vmap.py [--quick] [--lanes N] [--repeats R]
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
from _timing import medians

TOL = 1e-12
# Calls of each column before timing: graph mode compiles its frames to machine code at their
# third run, and a loop's phases each have their own frames.
WARMUPS = 10
# Per repeat and column: untimed calls, then timed ones (`_timing.medians`).
SETTLE, BLOCK = 3, 10


def problem(kind: str, lanes: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    if kind == "uniform":
        return 10.0 ** rng.uniform(-2.0, 2.0, lanes)
    a = rng.uniform(0.9, 1.1, lanes)
    far = rng.random(lanes) < 0.05
    a[far] = 10.0 ** rng.uniform(3.0, 12.0, far.sum())
    return a


def trips(a: np.ndarray) -> np.ndarray:
    """Each lane's trip count, in numpy: the loop as written, one lane at a time."""
    out = []
    for v in a:
        x, k = v, 0
        while abs(x**3 - v) > TOL * v:
            x, k = x - (x**3 - v) / (3 * x * x), k + 1
        out.append(k)
    return np.array(out)


def gradloop_runs(a: np.ndarray) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    import gradloop as gl
    from gradloop import batching

    def newton(a: Any) -> Any:
        def body(x: Any, k: Any) -> Any:
            return x - (x * x * x - a) / (3.0 * x * x), k + 1

        more = lambda x, k: gl.abs(x * x * x - a) > TOL * a  # noqa: E731
        return gl.while_loop(more, body, (a, gl.tensor(0)))

    root = lambda a: newton(a)[0]  # noqa: E731
    value, grad = gl.vmap(newton), gl.vmap(gl.grad(root))
    t = gl.tensor(a)
    k = np.asarray(gl.function(value)(t)[1])
    assert np.array_equal(k, trips(a)), "trip counts differ from the unbatched loop's"
    runs = {
        "gradloop eager": (lambda: value(t), lambda: grad(t)),
        "gradloop graph": (
            (lambda f: lambda: f(t))(gl.function(value)),
            (lambda f: lambda: f(t))(gl.function(grad)),
        ),
    }
    if importlib.util.find_spec("jax") is not None:  # the XLA backend needs jaxlib
        xv, xg = gl.jit(value, backend="xla"), gl.jit(grad, backend="xla")
        runs["gradloop jit xla"] = (lambda: xv(t), lambda: xg(t))
        # The same with the loop in buckets, as graph mode runs it (XLA's default is one loop
        # over every lane, finished lanes masked). Traced, and compiled, at the first call.
        batching.XLA_LOOP_BUCKETS = True
        try:
            bv, bg = gl.jit(value, backend="xla"), gl.jit(grad, backend="xla")
            bv(t), bg(t)
        finally:
            batching.XLA_LOOP_BUCKETS = False
        runs["gradloop jit xla, buckets"] = (lambda: bv(t), lambda: bg(t))
    return runs


def jax_runs(a: np.ndarray) -> dict[str, tuple[Callable[[], Any] | None, Callable[[], Any] | None]]:
    try:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
    except ImportError:
        return {}

    def newton(a: Any) -> Any:
        def body(s: Any) -> Any:
            x, k = s
            return x - (x**3 - a) / (3 * x * x), k + 1

        return jax.lax.while_loop(lambda s: jnp.abs(s[0] ** 3 - a) > TOL * a, body, (a, 0))

    t = jnp.asarray(a)
    value = jax.jit(jax.vmap(newton))
    runs: dict[str, Any] = {"JAX jit(vmap)": (lambda: value(t)[0].block_until_ready(), None)}
    try:
        import equinox as eqx

        def eqx_root(a: Any) -> Any:
            def body(s: Any) -> Any:
                x, k = s
                return x - (x**3 - a) / (3 * x * x), k + 1

            more = lambda s: jnp.abs(s[0] ** 3 - a) > TOL * a  # noqa: E731
            out = eqx.internal.while_loop(more, body, (a, 0), kind="checkpointed", max_steps=4096)
            return out[0]

        grad = jax.jit(jax.vmap(jax.grad(eqx_root)))
        runs["Equinox jit(vmap(grad))"] = (None, lambda: grad(t).block_until_ready())
    except ImportError:
        pass
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    repeats = 5 if args.quick else args.repeats
    for kind in ("uniform", "heavy"):
        a = problem(kind, args.lanes)
        k = trips(a)
        print(
            f"\nV1 {kind}: {args.lanes} lanes, trips {k.min()}-{k.max()} (mean {k.mean():.1f}), "
            f"lane utilisation of a masked batch {k.mean() / k.max():.2f}"
        )
        rows = {**gradloop_runs(a), **jax_runs(a)}
        columns = {
            (name, which): f
            for name, pair in rows.items()
            for which, f in zip(("value", "gradient"), pair, strict=True)
            if f is not None
        }
        measured = medians(columns, repeats, warmups=WARMUPS, settle=SETTLE, block=BLOCK)
        times = {name: [measured.get((name, w)) for w in ("value", "gradient")] for name in rows}
        jax_value = times.get("JAX jit(vmap)", [None])[0]
        eqx_grad = times.get("Equinox jit(vmap(grad))", [None, None])[1]
        print(f"  {'':26} {'value ms':>9} {'vs JAX':>7} {'gradient ms':>12} {'vs Equinox':>11}")
        for name, (value, grad) in times.items():
            cells = [
                f"{value * 1e3:9.3f}" if value else f"{'':9}",
                f"{value / jax_value:6.2f}x" if value and jax_value else f"{'':7}",
                f"{grad * 1e3:12.3f}" if grad else f"{'':12}",
                f"{grad / eqx_grad:10.2f}x" if grad and eqx_grad else f"{'':11}",
            ]
            print(f"  {name:26} {' '.join(cells)}")


if __name__ == "__main__":
    main()
