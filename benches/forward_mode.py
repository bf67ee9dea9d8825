"""Forward-mode benchmarks.

Usage: python benches/forward_mode.py [--quick] [--repeats N]

(a) a Hessian-vector product of the W6 RNN loss (`compiled_mode.py` (b): 64 hidden units, a
    data-dependent stop near 1000 steps) with respect to W, three ways, each eagerly, in graph
    mode and under `gl.jit`:
    - forward over reverse: `jvp(grad(loss), (W,), (V,))`, one pass carrying tangents through
      the gradient program (its forward loop and its reverse loop, stacks included);
    - reverse over reverse: `grad(W -> <grad(loss)(W), V>)`, the gradient of the gradient;
    - two reverse passes: `(grad(W + hV) - grad(W - hV)) / 2h`, central differences of two
      gradients (approximate);
    ratios against the two reverse passes, per repeat;
(b) the Jacobian of a loop with many outputs and one input (a scalar driving a 256-element
    state through a data-dependent number of trips): `jvp` with one tangent (one forward pass
    for the whole Jacobian column) against `jacrev` (one reverse pass per output), eagerly and
    under `gl.jit`; and the jvp against the loop alone.

Every figure is a median over repeats with its interquartile range (benches/README.md); each
variant is first checked against the others.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import gradloop as gl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compiled_mode import rnn_inputs, rnn_loss
from graph_mode import ratio, stat
from run import paired, print_table

STATE = 64
STEP = 1e-2  # the finite difference step of (a), relative to V's scale


def hvp_variants(u, b, xs, limit, v):
    def loss(w):
        return rnn_loss(w, u, b, xs, limit)[0]

    grad = gl.grad(loss)

    def forward_over_reverse(w):
        return gl.jvp(grad, (w,), (v,))[1]

    def reverse_over_reverse(w):
        return gl.grad(lambda w: gl.sum(grad(w) * v))(w)

    def two_reverse_passes(w):
        return (grad(w + STEP * v) - grad(w - STEP * v)) * (0.5 / STEP)

    return {
        "fwd-over-rev": forward_over_reverse,
        "rev-over-rev": reverse_over_reverse,
        "two gradients": two_reverse_passes,
    }


def spread(x):
    """A loop from one scalar to STATE outputs: the trip count depends on x."""
    base = gl.tensor(np.linspace(0.1, 1.0, STATE))

    def body(i, h):
        return i + 1, gl.sin(h * x) * 0.9 + base * 0.1

    n = gl.cast(gl.abs(x) * 40.0, gl.int32) + 20
    return gl.while_loop(lambda i, h: i < n, body, (0, base))[1]


def column_by_jvp(x):
    return gl.jvp(spread, (x,), (gl.ones_like(x),))[1]


def column_by_jacrev(x):
    return gl.jacrev(spread)(x)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    rows = []

    w, u, b, xs, limit = rnn_inputs(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    v = gl.tensor(rng.standard_normal(tuple(w.shape)).astype(np.float32) * 0.01)
    variants = hvp_variants(u, b, xs, limit, v)
    stages = {"eager": lambda f: f, "graph": gl.function, "jit": gl.jit}
    fns = {}
    for stage, stage_fn in stages.items():
        for name, fn in variants.items():
            staged = stage_fn(fn)
            fns[f"{stage} {name}"] = lambda f=staged: f(w)
    reference = np.asarray(fns["eager fwd-over-rev"]())
    for name, fn in fns.items():
        got = np.asarray(fn())
        if not np.allclose(got, reference, rtol=0.05, atol=0.05 * np.abs(reference).max()):
            sys.exit(f"{name} disagrees with eager fwd-over-rev")
    samples = paired(fns, number=1, repeats=repeats)
    for stage in stages:
        base = samples[f"{stage} two gradients"]
        for name in variants:
            times = samples[f"{stage} {name}"]
            rows.append((f"(a) HVP {stage} {name}, ms", *stat(times, 1e3), ""))
            if name != "two gradients":
                rows.append((f"(a) {stage} {name} / two gradients", *ratio(times, base), ""))

    x = gl.tensor(np.float64(0.37))
    jit_jvp, jit_rev, jit_loop = gl.jit(column_by_jvp), gl.jit(column_by_jacrev), gl.jit(spread)
    fns = {
        "eager jvp": lambda: column_by_jvp(x),
        "eager jacrev": lambda: column_by_jacrev(x),
        "eager loop": lambda: spread(x),
        "jit jvp": lambda: jit_jvp(x),
        "jit jacrev": lambda: jit_rev(x),
        "jit loop": lambda: jit_loop(x),
    }
    want = np.asarray(fns["eager jacrev"]())
    for name in ("eager jvp", "jit jvp", "jit jacrev"):
        if not np.allclose(np.asarray(fns[name]()), want, rtol=1e-6, atol=1e-9):
            sys.exit(f"(b) {name} disagrees with eager jacrev")
    samples = paired(fns, number=1, repeats=repeats)
    for stage in ("eager", "jit"):
        for name in ("jvp", "jacrev", "loop"):
            rows.append(
                (
                    f"(b) {stage} {name} ({STATE} outputs), ms",
                    *stat(samples[f"{stage} {name}"], 1e3),
                    "",
                )
            )
        rows.append(
            (
                f"(b) {stage} jacrev / jvp",
                *ratio(samples[f"{stage} jacrev"], samples[f"{stage} jvp"]),
                "",
            )
        )
        rows.append(
            (
                f"(b) {stage} jvp / loop alone",
                *ratio(samples[f"{stage} jvp"], samples[f"{stage} loop"]),
                "",
            )
        )
    print_table(rows)


if __name__ == "__main__":
    main()
