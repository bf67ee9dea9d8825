"""Graph-mode benchmarks: trace time, graph-mode loops (on the frame executor) against eager
loops, loop gradients.

Usage: python benches/graph_mode.py [--quick] [--repeats N]

(a) trace time of a 1000-op function (`f.graph(x)` on a fresh `gl.function`), next to running the
    same ops eagerly once;
(b) trace time of a while loop whose body holds a cond;
(c) a data-dependent while loop with a tiny body (i += 1; x = x * a + 1 on scalars): ns per
    iteration in graph mode and eagerly;
(d) the gradient of that loop (graph mode: a forward loop that stacks, a reverse loop that pops)
    at 10^3, 10^4 and 10^5 iterations: time per iteration stays flat when the cost is linear.

Every figure is a median over repeats with its interquartile range (see benches/README.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence

import numpy as np

import gradloop as gl

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from run import chain, paired, print_table

CHAIN_OPS = 1000


def stat(samples: Sequence[float], scale: float = 1.0) -> tuple[str, str]:
    q = statistics.quantiles([s * scale for s in samples], n=4)
    return f"{statistics.median(samples) * scale:,.1f}", f"{q[0]:,.1f}-{q[2]:,.1f}"


def ratio(a: Sequence[float], b: Sequence[float]) -> tuple[str, str]:
    r = [x / y for x, y in zip(a, b, strict=True)]
    q = statistics.quantiles(r, n=4)
    return f"{statistics.median(r):.2f}x", f"{q[0]:.2f}-{q[2]:.2f}"


def chain_fn(x: gl.Tensor) -> gl.Tensor:
    c_add = gl.tensor(np.full(4, 0.5, dtype=np.float32))
    c_mul = gl.tensor(np.full(4, 0.999, dtype=np.float32))
    return chain(x, c_add, c_mul, gl.add, gl.mul, gl.sin)


def loop_with_cond(x: gl.Tensor) -> gl.Tensor:
    def body(i: gl.Tensor, v: gl.Tensor) -> tuple:
        v = gl.cond(v.sum() > 0, lambda: v * 0.5 - 1.0, lambda: gl.sin(v) + 2.0)
        return i + 1, v

    return gl.while_loop(lambda i, v: i < 100, body, (0, x))[1]


def tiny_loop(x: gl.Tensor, n: gl.Tensor) -> gl.Tensor:
    a = gl.tensor(1.0 - 1e-6, dtype=gl.float64)
    _, y = gl.while_loop(lambda i, v: i < n, lambda i, v: (i + 1, v * a + 1e-3), (0, x))
    return y


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 11)
    rows: list[tuple[str, str, str, str]] = []

    x4 = gl.tensor(np.linspace(0.1, 0.4, 4, dtype=np.float32))
    t = paired(
        {
            "trace": lambda: gl.function(chain_fn).graph(x4),
            "eager": lambda: chain_fn(x4),
        },
        number=2 if args.quick else 5,
        repeats=repeats,
    )
    rows.append(("(a) trace a 1000-op function, us/op", *stat(t["trace"], 1e6 / CHAIN_OPS), ""))
    rows.append(("    trace / eager run of the same ops", *ratio(t["trace"], t["eager"]), ""))

    x2 = gl.tensor(np.array([0.3, -0.2]))
    t = paired(
        {"trace": lambda: gl.function(loop_with_cond).graph(x2)},
        number=5 if args.quick else 20,
        repeats=repeats,
    )
    rows.append(("(b) trace a while loop with a cond inside, us", *stat(t["trace"], 1e6), ""))

    n_iter = 2_000 if args.quick else 10_000
    x0 = gl.tensor(0.5, dtype=gl.float64)
    n = gl.tensor(n_iter, dtype=gl.int32)
    graph_loop = gl.function(tiny_loop)
    graph_loop(x0, n)
    np.testing.assert_allclose(float(graph_loop(x0, n)), float(tiny_loop(x0, n)), rtol=1e-12)
    t = paired(
        {"graph": lambda: graph_loop(x0, n), "eager": lambda: tiny_loop(x0, n)},
        number=1,
        repeats=repeats,
    )
    rows.append(
        (f"(c) tiny loop, graph, ns/iteration ({n_iter})", *stat(t["graph"], 1e9 / n_iter), "")
    )
    rows.append(("    tiny loop, eager, ns/iteration", *stat(t["eager"], 1e9 / n_iter), ""))
    rows.append(("    eager / graph", *ratio(t["eager"], t["graph"]), ""))

    graph_grad = gl.function(gl.grad(tiny_loop))
    sizes = (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000)
    for size in sizes:
        m = gl.tensor(size, dtype=gl.int32)
        graph_grad(x0, m)
        t = paired({"grad": lambda m=m: graph_grad(x0, m)}, number=1, repeats=max(3, repeats // 2))
        rows.append(
            (
                f"(d) loop gradient, graph, {size:>7} iterations, ns/iteration",
                *stat(t["grad"], 1e9 / size),
                "",
            )
        )
    m = gl.tensor(sizes[1], dtype=gl.int32)
    eager_grad = gl.grad(tiny_loop)
    t = paired(
        {"graph": lambda: graph_grad(x0, m), "eager": lambda: eager_grad(x0, m)},
        number=1,
        repeats=max(3, repeats // 2),
    )
    rows.append(
        (
            f"    loop gradient, eager, {sizes[1]:>7} iterations, ns/iteration",
            *stat(t["eager"], 1e9 / sizes[1]),
            "",
        )
    )
    rows.append(("    eager / graph gradient", *ratio(t["eager"], t["graph"]), ""))
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
