"""Compiled-mode benchmarks: the same programs eager, in graph mode (the frame executor) and under
`gl.jit`.

Usage: python benches/compiled_mode.py [--quick] [--repeats N]

(a) a data-dependent while loop with a tiny body (i += 1; x = x * a + 1e-3 on scalars): ns per
    iteration compiled (llvm-cpu), in graph mode and eagerly, as (t(n) - t(n/10)) /
    (0.9 n) per repeat, and the time of a compiled call with zero trips;
(b) the gradient of a dynamic-length RNN (64 hidden units, tanh, stopping when the accumulated
    energy of the state passes a threshold, about 1000 steps): time per gradient;
(c) an MLP training step (784-512-512-10, batch 64, float32; value_and_grad + SGD update);
(d) the compiled gradient of the loop of (a) at 10^3, 10^4 and 10^5 iterations: the forward
    loop pushes onto growable stacks, the reverse loop pops; the slope between sizes (ns per
    extra iteration) stays flat when the cost is linear (amortised O(1) per iteration);
(e) compile times: trace + emit + iree-compile of each program on a cold cache.

Every figure is a median over repeats with its interquartile range (see benches/README.md); each
program's three modes are first checked to agree.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np

import gradloop as gl
from gradloop import _iree_build

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from graph_mode import ratio, stat, tiny_loop
from run import BATCH, LEARNING_RATE, MLP_SIZES, gl_loss, init_mlp, paired, print_table

HIDDEN = 64
RNN_STEPS = 1000


def rnn_loss(w: gl.Tensor, u: gl.Tensor, b: gl.Tensor, xs: gl.Tensor, limit: gl.Tensor):
    """Runs h <- tanh(W h + U x_t + b) until the energy sum_t |h_t|^2 reaches `limit` (or the
    sequence ends); the loss is that energy plus the sum of the last state."""

    def cond(t, h, energy):
        return gl.logical_and(t < xs.shape[0], energy < limit)

    def body(t, h, energy):
        h = gl.tanh(gl.matmul(w, h) + gl.matmul(u, xs[t]) + b)
        return t + 1, h, energy + gl.sum(h * h)

    h0 = gl.zeros((HIDDEN,), dtype=gl.float32)
    init = (0, h0, gl.tensor(0.0, dtype=gl.float32))
    # the bound lets compiled code allocate the gradient's stacks once (docs/compiled-mode.md)
    steps, h, energy = gl.while_loop(cond, body, init, maximum_iterations=xs.shape[0])
    return energy + gl.sum(h), steps


def rnn_inputs(rng: np.random.Generator) -> tuple[gl.Tensor, ...]:
    w = rng.standard_normal((HIDDEN, HIDDEN)) * (0.9 / np.sqrt(HIDDEN))
    u = rng.standard_normal((HIDDEN, 16)) * 0.25
    b = rng.standard_normal(HIDDEN) * 0.1
    xs = rng.standard_normal((2 * RNN_STEPS, 16))
    w, u, b, xs = (gl.tensor(a.astype(np.float32)) for a in (w, u, b, xs))
    # the energy after RNN_STEPS steps: with it as the threshold the loop stops near there
    energy, _ = rnn_loss(w, u, b, xs[:RNN_STEPS], gl.tensor(np.float32(np.inf)))
    return w, u, b, xs, gl.tensor(np.float32(float(energy)))


def rnn_grad(w, u, b, xs, limit):
    return gl.grad(lambda w, u, b: rnn_loss(w, u, b, xs, limit)[0], argnums=(0, 1, 2))(w, u, b)


def mlp_step(params, x, onehot):
    loss, grads = gl.value_and_grad(gl_loss)(params, x, onehot)
    return loss, tuple(p - LEARNING_RATE * g for p, g in zip(params, grads, strict=True))


def agree(name: str, results: dict[str, object], rtol: float) -> None:
    flat = {mode: [np.asarray(v) for v in _leaves(r)] for mode, r in results.items()}
    reference = flat.pop("eager")
    for mode, values in flat.items():
        for got, want in zip(values, reference, strict=True):
            if not np.allclose(got, want, rtol=rtol, atol=rtol):
                sys.exit(
                    f"{name}: {mode} disagrees with eager (max |diff| {np.abs(got - want).max()})"
                )


def _leaves(x: object) -> list[object]:
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in _leaves(item)]
    return [x]


def compile_seconds(fn: Callable, *args) -> float:
    """Seconds for the first `gl.jit` call on a cold cache: trace, emit, iree-compile, run."""
    saved = os.environ.get("GRADLOOP_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cold:
        os.environ["GRADLOOP_CACHE_DIR"] = cold
        _iree_build._memory_cache.clear()
        try:
            start = time.perf_counter()
            gl.jit(fn)(*args)
            return time.perf_counter() - start
        finally:
            if saved is None:
                del os.environ["GRADLOOP_CACHE_DIR"]
            else:
                os.environ["GRADLOOP_CACHE_DIR"] = saved


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    rows: list[tuple[str, str, str, str]] = []

    # (a) tiny loop: per iteration is (t(n) - t(n / 10)) / (0.9 n) in each repeat, leaving out
    # what a call costs once (transfers, the VM call, a first trip), reported on its own
    n_iter = 2_000 if args.quick else 10_000
    x0, n = gl.tensor(0.5, dtype=gl.float64), gl.tensor(n_iter, dtype=gl.int32)
    tenth, zero = gl.tensor(n_iter // 10, dtype=gl.int32), gl.tensor(0, dtype=gl.int32)
    modes = {"compiled": gl.jit(tiny_loop), "graph": gl.function(tiny_loop), "eager": tiny_loop}
    agree("tiny loop", {m: f(x0, n) for m, f in modes.items()}, 1e-12)
    calls = {}
    for mode, f in modes.items():
        calls[mode] = lambda f=f: f(x0, n)
        calls[f"{mode}/10"] = lambda f=f: f(x0, tenth)
    calls["compiled/0"] = lambda: modes["compiled"](x0, zero)
    t = paired(calls, 1, repeats)
    trips = n_iter - n_iter // 10
    per_iteration = {
        m: [(a - b) / trips for a, b in zip(t[m], t[f"{m}/10"], strict=True)] for m in modes
    }
    for mode in modes:
        rows.append((f"(a) tiny loop, {mode}, ns/iteration", *stat(per_iteration[mode], 1e9), ""))
    rows.append(
        ("    graph / compiled", *ratio(per_iteration["graph"], per_iteration["compiled"]), "")
    )
    rows.append(
        ("    eager / compiled", *ratio(per_iteration["eager"], per_iteration["compiled"]), "")
    )
    rows.append(("    compiled, a call with zero trips, us", *stat(t["compiled/0"], 1e6), ""))

    # (b) RNN gradient
    rnn_args = rnn_inputs(np.random.default_rng(0))
    steps = int(rnn_loss(*rnn_args)[1])
    modes = {"compiled": gl.jit(rnn_grad), "graph": gl.function(rnn_grad), "eager": rnn_grad}
    agree("RNN gradient", {m: f(*rnn_args) for m, f in modes.items()}, 1e-3)
    t = paired({m: (lambda f=f: f(*rnn_args)) for m, f in modes.items()}, 1, repeats)
    for mode in modes:
        rows.append((f"(b) RNN gradient ({steps} steps), {mode}, ms", *stat(t[mode], 1e3), ""))
    rows.append(("    graph / compiled", *ratio(t["graph"], t["compiled"]), ""))
    rows.append(("    eager / compiled", *ratio(t["eager"], t["compiled"]), ""))

    # (c) MLP training step
    rng = np.random.default_rng(0)
    params = tuple(gl.tensor(p) for p in init_mlp(rng))
    x = gl.tensor(rng.standard_normal((BATCH, MLP_SIZES[0])).astype(np.float32))
    onehot = gl.tensor(
        np.eye(MLP_SIZES[-1], dtype=np.float32)[rng.integers(0, MLP_SIZES[-1], BATCH)]
    )
    modes = {"compiled": gl.jit(mlp_step), "graph": gl.function(mlp_step), "eager": mlp_step}
    agree("MLP step", {m: f(params, x, onehot) for m, f in modes.items()}, 1e-3)
    number = 2 if args.quick else 5
    t = paired({m: (lambda f=f: f(params, x, onehot)) for m, f in modes.items()}, number, repeats)
    for mode in modes:
        rows.append((f"(c) MLP training step, {mode}, ms", *stat(t[mode], 1e3), ""))
    rows.append(("    graph / compiled", *ratio(t["graph"], t["compiled"]), ""))
    rows.append(("    eager / compiled", *ratio(t["eager"], t["compiled"]), ""))

    # (d) compiled loop gradient at growing trip counts: time per iteration of the whole call,
    # and the slope between consecutive sizes (flat slopes: linear cost, O(1) per iteration)
    compiled_grad = gl.jit(gl.grad(tiny_loop))
    sizes = (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000)
    calls = {}
    for size in sizes:
        m = gl.tensor(size, dtype=gl.int32)
        agree(
            "loop gradient", {"eager": gl.grad(tiny_loop)(x0, m), "c": compiled_grad(x0, m)}, 1e-9
        )
        calls[size] = lambda m=m: compiled_grad(x0, m)
    t = paired(calls, 1, max(5, repeats))
    for size in sizes:
        per = [x / size for x in t[size]]
        rows.append(
            (
                f"(d) loop gradient, compiled, {size:>7} iterations, ns/iteration",
                *stat(per, 1e9),
                "",
            )
        )
    for small, large in itertools.pairwise(sizes):
        slope = [(b - a) / (large - small) for a, b in zip(t[small], t[large], strict=True)]
        rows.append(
            (f"    slope from {small} to {large} iterations, ns/iteration", *stat(slope, 1e9), "")
        )

    # (e) compile times, cold cache
    for name, fn, fn_args in (
        ("tiny loop", tiny_loop, (x0, n)),
        ("tiny loop gradient", gl.grad(tiny_loop), (x0, n)),
        ("RNN gradient", rnn_grad, rnn_args),
        ("MLP training step", mlp_step, (params, x, onehot)),
    ):
        seconds = [compile_seconds(fn, *fn_args) for _ in range(3)]
        rows.append((f"(e) compile {name} (cold cache), s", *stat(seconds), ""))
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
