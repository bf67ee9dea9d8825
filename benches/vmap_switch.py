"""V3: a skewed batched `switch_case`, each branch run on its own lanes, against select-all.

Every lane holds 64 values and an index; branch j is 10^j chained products (1, 10, 100 or 1,000
multiplies by the lane's 64 values: powers, which no compiler folds), taken by 90%, 9%, 0.9% and
0.1% of the lanes. `gl.vmap` of `gl.switch_case` runs each branch that some lane takes: eagerly
on its lanes only (the level narrowed to them); traced (graph mode, and `gl.jit` on XLA where
jaxlib is installed), at static shapes, in the smallest bucket of a quarter, a sixteenth or a
sixty-fourth of the lanes that holds its lanes (gathered to the front; the rest of the bucket on
stand-ins, a select keeping each lane's own). Select-all is every branch on every lane then a
select by index, written by hand (what JAX's batched `switch` does), in graph mode; JAX's
`jit(vmap(switch))` where installed (XLA fuses each branch's chain into one pass). Each figure
is the median over `--repeats` calls after a warm-up; every result is checked against
select-all's.

Usage: python benches/vmap_switch.py [--quick] [--lanes N] [--repeats R]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
from _timing import median_time

import gradloop as gl

WIDTH = 64
CHAINS = (1, 10, 100, 1000)
SHARES = (0.9, 0.09, 0.009, 0.001)


def problem(lanes: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.uniform(0.9995, 1.0005, (lanes, WIDTH))
    k = rng.choice(len(CHAINS), size=lanes, p=SHARES).astype(np.int32)
    return x, k


def chain(n: int) -> Callable[[Any], Any]:
    def branch(x: Any) -> Any:
        y = x
        for _ in range(n):
            y = y * x
        return y

    return branch


BRANCHES = [chain(n) for n in CHAINS]


def per_lane(x: Any, k: Any) -> Any:
    return gl.switch_case(k, [functools.partial(b, x) for b in BRANCHES])


def select_all(x: Any, k: Any) -> Any:
    out = BRANCHES[-1](x)
    for j in range(len(BRANCHES) - 2, -1, -1):
        out = gl.where(gl.reshape(k == j, (-1, 1)), BRANCHES[j](x), out)
    return out


def jax_run(x: np.ndarray, k: np.ndarray) -> Callable[[], Any] | None:
    if importlib.util.find_spec("jax") is None:
        return None
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)

    fn = jax.jit(jax.vmap(lambda x, k: jax.lax.switch(k, BRANCHES, x)))
    xj, kj = jnp.asarray(x), jnp.asarray(k)
    return lambda: fn(xj, kj).block_until_ready()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    x_np, k_np = problem(args.lanes)
    x, k = gl.tensor(x_np), gl.tensor(k_np)
    counts = np.bincount(k_np, minlength=len(CHAINS))
    work = (counts * np.array(CHAINS)).sum() / (sum(CHAINS) * args.lanes)
    print(
        f"V3: {args.lanes} lanes x {WIDTH}, branches of {CHAINS} products taken by "
        f"{counts.tolist()} lanes; each branch on its own lanes: {work:.4f} of select-all's work"
    )
    baseline = gl.function(select_all)
    want = np.asarray(baseline(x, k))
    runs = {
        "select-all, graph": lambda: baseline(x, k),
        "vmap(switch_case) eager": (lambda f: lambda: f(x, k))(gl.vmap(per_lane)),
        "vmap(switch_case) graph": (lambda f: lambda: f(x, k))(gl.function(gl.vmap(per_lane))),
    }
    if importlib.util.find_spec("jax") is not None:  # the XLA backend needs jaxlib
        compiled = gl.jit(gl.vmap(per_lane), backend="xla")
        runs["vmap(switch_case) jit xla"] = lambda: compiled(x, k)
    for name, run in runs.items():
        np.testing.assert_allclose(np.asarray(run()), want, rtol=1e-12, err_msg=name)
    peer = jax_run(x_np, k_np)
    if peer is not None:
        runs["JAX jit(vmap(switch))"] = peer
    times = {name: median_time(run, repeats) for name, run in runs.items()}
    base = times["select-all, graph"]
    print(f"  {'':26} {'ms':>9} {'select-all / this':>18}")
    for name, t in times.items():
        print(f"  {name:26} {t * 1e3:9.2f} {base / t:17.1f}x")


if __name__ == "__main__":
    main()
