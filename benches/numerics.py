"""The numerics solvers call, beside their peers in one run.

- The ring-buffer write loop: `buf.at[k].set(row)` in a `while_loop` of `n` trips writing one
  row of a `[n, 64]` float64 buffer per trip (ODE solvers' saved steps, L-BFGS's history).
  Written in place, a trip costs the row, not the buffer: the time per trip stays flat as `n`
  grows. Peers: numpy's in-place `buf[k] = row` in a Python loop, and JAX's `lax.fori_loop`
  under `jax.jit` where JAX is installed.
- Elementwise math: `arcsinh`, `arctan2`, `log1p` on 10^6 float64 elements against numpy.
- Linear algebra: `solve`, `cholesky` and `qr`, and the gradient of a loss through each, of
  n x n float64 matrices (n = 8, 64, 512), eagerly, in graph mode and under `gl.jit`, against
  numpy (LAPACK) and JAX's `jit`; each row ends with graph mode's ratio to its peers.

Medians of `--repeats` calls after a warm-up; ratios are measured in the same run.

Usage: python benches/numerics.py [--quick] [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import numpy as np

import gradloop as gl


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ring_buffer(n: int, repeats: int, with_jit: bool) -> dict[str, float]:
    row = np.linspace(0.0, 1.0, 64)

    def loop(buf, row):
        def body(k, buf):
            return k + 1, buf.at[k].set(row * gl.cast(k, gl.float64))

        return gl.while_loop(lambda k, b: k < n, body, (gl.tensor(0), buf))[1]

    def numpy_loop():
        buf = np.zeros((n, 64))
        for k in range(n):
            buf[k] = row * k
        return buf

    buf_t, row_t = gl.zeros((n, 64), dtype=gl.float64), gl.tensor(row)
    graph = gl.function(loop)
    out = {
        "numpy": median_seconds(numpy_loop, repeats) / n,
        "graph": median_seconds(lambda: graph(buf_t, row_t), repeats) / n,
    }
    if with_jit:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            jitted = gl.jit(loop)
            out["gl.jit (IREE)"] = median_seconds(lambda: jitted(buf_t, row_t), repeats) / n
    try:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)

        @jax.jit
        def jax_loop(buf, row):
            return jax.lax.fori_loop(0, n, lambda k, b: b.at[k].set(row * k), buf)

        b, r = jnp.zeros((n, 64)), jnp.asarray(row)
        out["JAX jit"] = median_seconds(lambda: jax_loop(b, r).block_until_ready(), repeats) / n
    except ImportError:
        pass
    return out


def elementwise(repeats: int) -> dict[str, tuple[float, float]]:
    x = np.random.default_rng(0).uniform(-3.0, 3.0, 1_000_000)
    y = np.random.default_rng(1).uniform(0.5, 3.0, 1_000_000)
    xt, yt = gl.tensor(x), gl.tensor(y)
    cases = {
        "arcsinh": (lambda: gl.arcsinh(xt), lambda: np.arcsinh(x)),
        "arctan2": (lambda: gl.arctan2(xt, yt), lambda: np.arctan2(x, y)),
        "log1p": (lambda: gl.log1p(yt), lambda: np.log1p(y)),
    }
    return {
        name: (median_seconds(ours, repeats), median_seconds(peer, repeats))
        for name, (ours, peer) in cases.items()
    }


def linear_algebra(n: int, repeats: int, with_jit: bool) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)) + n * np.eye(n)
    b = rng.standard_normal((n, 4))
    spd = a @ a.T
    at, bt, st = gl.tensor(a), gl.tensor(b), gl.tensor(spd)

    def loss(a, b):
        return gl.sum(gl.linalg.solve(a, b) ** 2)

    def cholesky_loss(s):
        return gl.sum(gl.linalg.cholesky(s) ** 2)

    def qr_loss(a):
        return gl.sum(gl.linalg.qr(a)[1] ** 2)

    ours = {
        "solve": (lambda a, b: gl.linalg.solve(a, b), (at, bt)),
        "grad of solve": (gl.grad(loss), (at, bt)),
        "cholesky": (gl.linalg.cholesky, (st,)),
        "grad of chol": (gl.grad(cholesky_loss), (st,)),
        "qr": (gl.linalg.qr, (at,)),
        "grad of qr": (gl.grad(qr_loss), (at,)),
    }
    out: dict[str, dict[str, float]] = {}
    for name, (fn, args) in ours.items():
        row = {"eager": median_seconds(lambda fn=fn, args=args: fn(*args), repeats)}
        graph = gl.function(fn)
        graph(*args)  # traced once, outside the timing
        row["graph"] = median_seconds(lambda g=graph, args=args: g(*args), repeats)
        if with_jit:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                jitted = gl.jit(fn)
                row["gl.jit"] = median_seconds(lambda j=jitted, args=args: j(*args), repeats)
        out[name] = row
    out["solve"]["numpy"] = median_seconds(lambda: np.linalg.solve(a, b), repeats)
    out["cholesky"]["numpy"] = median_seconds(lambda: np.linalg.cholesky(spd), repeats)
    out["qr"]["numpy"] = median_seconds(lambda: np.linalg.qr(a), repeats)
    try:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        ja, jb, js = jnp.asarray(a), jnp.asarray(b), jnp.asarray(spd)
        peers = {
            "solve": (jax.jit(jnp.linalg.solve), (ja, jb)),
            "grad of solve": (
                jax.jit(jax.grad(lambda a, b: jnp.sum(jnp.linalg.solve(a, b) ** 2))),
                (ja, jb),
            ),
            "cholesky": (jax.jit(jnp.linalg.cholesky), (js,)),
            "grad of chol": (
                jax.jit(jax.grad(lambda s: jnp.sum(jnp.linalg.cholesky(s) ** 2))),
                (js,),
            ),
            "qr": (jax.jit(jnp.linalg.qr), (ja,)),
            "grad of qr": (jax.jit(jax.grad(lambda a: jnp.sum(jnp.linalg.qr(a)[1] ** 2))), (ja,)),
        }
        for name, (fn, args) in peers.items():
            fn(*args)  # compiled once, outside the timing
            out[name]["JAX jit"] = median_seconds(
                lambda fn=fn, args=args: jax.block_until_ready(fn(*args)), repeats
            )
    except ImportError:
        pass
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for the test suite")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes = (200, 1000) if args.quick else (1000, 10_000)
    print("ring-buffer write loop, microseconds per trip (median)")
    for n in sizes:
        row = ring_buffer(n, args.repeats, with_jit=not args.quick)
        cells = "  ".join(f"{k} {v * 1e6:8.3f}" for k, v in row.items())
        print(f"  n = {n:6d}: {cells}  (graph / numpy {row['graph'] / row['numpy']:.2f}x)")
    print("elementwise on 10^6 float64, milliseconds (median)")
    for name, (ours, peer) in elementwise(args.repeats).items():
        print(
            f"  {name:8s} gradloop {ours * 1e3:7.2f}  numpy {peer * 1e3:7.2f}  {ours / peer:.2f}x"
        )
    print("linear algebra, float64, milliseconds (median)")
    for n in (8, 32) if args.quick else (8, 64, 512):
        repeats = args.repeats if n < 512 else max(3, args.repeats // 4)
        for name, row in linear_algebra(n, repeats, with_jit=not args.quick).items():
            cells = "  ".join(f"{k} {v * 1e3:8.3f}" for k, v in row.items())
            ratios = "  ".join(
                f"graph/{peer} {row['graph'] / row[peer]:.2f}x"
                for peer in ("numpy", "JAX jit")
                if peer in row
            )
            print(f"  n = {n:4d} {name:14s} {cells}  {ratios}")


if __name__ == "__main__":
    main()
