"""Frame-executor benchmarks: the same programs eagerly, on the reference interpreter, on the
frame executor and under `gl.jit` (llvm-cpu), with numpy where it applies, in one run.

Usage: python benches/executor.py [--quick] [--repeats N] [--no-jit]

W5  `while i < n: x = 0.999 x + 0.001 sin(x)` on float32[16], n passed at run time: ns/iteration,
    with the fused frame compiled to kernels on buffers (the default) and interpreted.
W6  gradient of an RNN `h = tanh(h @ W + x_t @ U)`, H = D = 64, stopping when the running sum of
    |h| passes a threshold (1000 steps; no maximum_iterations), w.r.t. W and U: us/step.
W7  steady-state call of a small function (a loop of 10 trips with a cond inside): us/call;
    and the first `gl.jit` call of it in a fresh process with an empty cache, waiting for the
    module (the default) and `tiered=True` (the frame executor runs it while IREE compiles).
W8  64 independent iterations of 4 chained 256x256 float32 matmuls, summed:
    parallel_iterations 1 vs 10 on the executor, ms and cpu time / wall time; the same with
    120x120 matmuls (each small enough to run on one thread, so only iterations overlap).
N   executor cost per node: a chain of 1000 scalar float64 ops, ns/node.

Medians over repeats, interquartile ranges beside them; ratios per repeat (benches/README.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

import gradloop as gl

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from graph_mode import ratio, stat
from run import paired, print_table


def frames(mode: str, fn: Callable) -> Callable:
    """`fn` (a `gl.function`) called with fused frames run as `mode` says: "buffers" (kernels on
    buffers, the steps one by one, no machine code) or "off" (register programs)."""

    def call(*args):
        gl._core.set_compiled_frames(mode)
        try:
            return fn(*args)
        finally:
            gl._core.set_compiled_frames("on")

    return call


def on(runner: str, fn: Callable) -> Callable:
    """`fn` (a `gl.function`) called with graphs run by `runner`."""

    def call(*args):
        gl._core.set_graph_runner(runner)
        try:
            return fn(*args)
        finally:
            gl._core.set_graph_runner("executor")

    return call


# W5 ---------------------------------------------------------------------------------------
def w5(x: gl.Tensor, n: gl.Tensor) -> gl.Tensor:
    def body(i, x):
        return i + 1, 0.999 * x + 0.001 * gl.sin(x)

    return gl.while_loop(lambda i, x: i < n, body, (gl.tensor(0, dtype=gl.int32), x))[1]


def w5_numpy(x: np.ndarray, n: int) -> np.ndarray:
    for _ in range(n):
        x = np.float32(0.999) * x + np.float32(0.001) * np.sin(x)
    return x


# W6 ---------------------------------------------------------------------------------------
H = D = 64
STEPS = 1000


def rnn_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((H, H)) * 0.1).astype(np.float32)
    u = (rng.standard_normal((D, H)) * 0.1).astype(np.float32)
    xs = rng.standard_normal((STEPS + 24, D)).astype(np.float32)
    h = np.zeros(H, np.float32)
    total = []
    acc = 0.0
    for t in range(STEPS):
        h = np.tanh(h @ w + xs[t] @ u)
        acc += float(np.sqrt(np.sum(h * h)))
        total.append(acc)
    threshold = (total[-2] + total[-1]) / 2  # passed exactly at step STEPS
    return w, u, xs, threshold


def rnn_loss(w, u, xs, threshold):
    def cond(t, h, acc):
        return acc < threshold

    def body(t, h, acc):
        h = gl.tanh(h @ w + xs[t] @ u)
        return t + 1, h, acc + gl.sqrt(gl.sum(h * h))

    h0 = gl.zeros((H,), dtype=gl.float32)
    zero = gl.tensor(0.0, dtype=gl.float32)
    _, h, _ = gl.while_loop(cond, body, (gl.tensor(0, dtype=gl.int32), h0, zero))
    return gl.sum(h)


# W7 ---------------------------------------------------------------------------------------
def w7(x: gl.Tensor) -> gl.Tensor:
    def body(i, v):
        v = gl.cond(gl.sum(v) > 0, lambda: v * 0.5 - 0.1, lambda: v + 1.0)
        return i + 1, v

    return gl.while_loop(lambda i, v: i < 10, body, (gl.tensor(0, dtype=gl.int32), x))[1]


_FIRST_CALL = """
import time, numpy as np, gradloop as gl
from executor import w7
x = gl.tensor(np.array([0.3, -0.2, 0.1]))
start = time.perf_counter()
fn = gl.jit(w7, tiered={tiered})
fn(x)
print(time.perf_counter() - start)
"""


def first_call(tiered: bool) -> float:
    """Seconds from `gl.jit(w7)` to its first result, in a fresh process with an empty compile
    cache (imports excluded): trace, compile (or, tiered, the executor) and run."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "GRADLOOP_CACHE_DIR": cache}
        here = os.path.dirname(os.path.abspath(__file__))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
        code = _FIRST_CALL.format(tiered=tiered)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
        )
        return float(out.stdout.split()[-1])


# W8 ---------------------------------------------------------------------------------------
def w8(parallel: int) -> Callable:
    def run(a: gl.Tensor, b: gl.Tensor) -> gl.Tensor:
        def body(i, acc):
            x = a + gl.cast(i, gl.float32)
            for _ in range(4):
                x = x @ b
            return i + 1, acc + x

        init = (gl.tensor(0, dtype=gl.int32), gl.zeros_like(a))
        cond = lambda i, acc: i < 64  # noqa: E731
        return gl.while_loop(cond, body, init, parallel_iterations=parallel)[1]

    return run


# N ----------------------------------------------------------------------------------------
CHAIN = 1000


def scalar_chain(x: gl.Tensor) -> gl.Tensor:
    for _ in range(CHAIN // 2):
        x = x * 0.999
        x = x + 0.001
    return x


def cpu_wall(fn: Callable[[], object], repeats: int) -> tuple[list[float], list[float]]:
    fn()
    walls, ratios = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        w1, c1 = time.perf_counter(), time.process_time()
        walls.append(w1 - w0)
        ratios.append((c1 - c0) / (w1 - w0))
    return walls, ratios


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no-jit", action="store_true", help="skip the gl.jit columns")
    args = parser.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 9)
    jit = not args.no_jit
    rows: list[tuple[str, str, str, str]] = []
    print(f"executor threads: {gl._core.executor_threads()}")

    # W5
    n_iter = 20_000 if args.quick else 100_000
    x16 = np.linspace(0.1, 1.6, 16, dtype=np.float32)
    x = gl.tensor(x16)
    n = gl.tensor(n_iter, dtype=gl.int32)
    staged = gl.function(w5)
    fns = {
        "executor": lambda: staged(x, n),
        "buffers": lambda: frames("buffers", staged)(x, n),
        "programs": lambda: frames("off", staged)(x, n),
        "interpreter": lambda: on("interpreter", staged)(x, n),
        "numpy": lambda: w5_numpy(x16, n_iter // 10),
    }
    if jit:
        compiled = gl.jit(w5)
        fns["jit"] = lambda: compiled(x, n)
    np.testing.assert_allclose(
        np.asarray(staged(x, n)), np.asarray(on("interpreter", staged)(x, n))
    )
    t = paired(fns, number=1, repeats=repeats)
    per = 1e9 / n_iter
    rows.append(("W5 tiny loop, executor, ns/iteration", *stat(t["executor"], per), "target 40"))
    rows.append(("   frame stepped on buffers, ns/iteration", *stat(t["buffers"], per), ""))
    rows.append(("   stepped / machine code", *ratio(t["buffers"], t["executor"]), ""))
    rows.append(("   frame interpreted, ns/iteration", *stat(t["programs"], per), ""))
    rows.append(("   interpreted / machine code", *ratio(t["programs"], t["executor"]), ""))
    rows.append(("   interpreter, ns/iteration", *stat(t["interpreter"], per), ""))
    rows.append(("   interpreter / executor", *ratio(t["interpreter"], t["executor"]), ""))
    rows.append(("   numpy loop, ns/iteration", *stat(t["numpy"], per * 10), ""))
    if jit:
        rows.append(("   gl.jit, ns/iteration", *stat(t["jit"], per), ""))

    # W6
    w_np, u_np, xs_np, threshold = rnn_inputs()
    w, u, xs = gl.tensor(w_np), gl.tensor(u_np), gl.tensor(xs_np)
    grad = gl.grad(lambda w, u: rnn_loss(w, u, xs, threshold), argnums=(0, 1))
    staged = gl.function(grad)
    fns = {
        "executor": lambda: staged(w, u),
        "buffers": lambda: frames("buffers", staged)(w, u),
        "interpreter": lambda: on("interpreter", staged)(w, u),
        "eager": lambda: grad(w, u),
    }
    if jit:
        compiled = gl.jit(grad)
        fns["jit"] = lambda: compiled(w, u)
    want = [np.asarray(g) for g in grad(w, u)]
    for g, e in zip(staged(w, u), want, strict=True):
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-4, atol=1e-5)
    t = paired(fns, number=1, repeats=max(5, repeats))
    per = 1e6 / STEPS
    rows.append(("W6 RNN loop gradient, executor, us/step", *stat(t["executor"], per), "≤ 1.5"))
    rows.append(("   frames stepped on buffers, us/step", *stat(t["buffers"], per), ""))
    rows.append(("   interpreter, us/step", *stat(t["interpreter"], per), ""))
    rows.append(("   eager, us/step", *stat(t["eager"], per), ""))
    rows.append(("   interpreter / executor", *ratio(t["interpreter"], t["executor"]), ""))
    if jit:
        rows.append(("   gl.jit, us/step", *stat(t["jit"], per), ""))

    # W7
    x3 = gl.tensor(np.array([0.3, -0.2, 0.1]))
    staged = gl.function(w7)
    fns = {
        "executor": lambda: staged(x3),
        "interpreter": lambda: on("interpreter", staged)(x3),
        "eager": lambda: w7(x3),
    }
    if jit:
        compiled = gl.jit(w7)
        fns["jit"] = lambda: compiled(x3)
    t = paired(fns, number=50 if args.quick else 200, repeats=repeats)
    rows.append(("W7 steady call, executor, us", *stat(t["executor"], 1e6), "target 6"))
    rows.append(("   interpreter, us", *stat(t["interpreter"], 1e6), ""))
    rows.append(("   eager, us", *stat(t["eager"], 1e6), ""))
    if jit:
        rows.append(("   gl.jit, us", *stat(t["jit"], 1e6), ""))

    if jit:
        for tiered in (False, True):
            firsts = [first_call(tiered) for _ in range(max(3, repeats // 2))]
            label = "tiered=True" if tiered else "waiting (default)"
            target = "target 40" if tiered else "target 150"
            rows.append((f"   gl.jit first call, {label}, ms", *stat(firsts, 1e3), target))

    # W8
    rng = np.random.default_rng(1)
    for size in (256, 120):
        a = gl.tensor((rng.standard_normal((size, size)) * 0.05).astype(np.float32))
        b = gl.tensor((rng.standard_normal((size, size)) * 0.05).astype(np.float32))
        one, ten = gl.function(w8(1)), gl.function(w8(10))
        np.testing.assert_allclose(np.asarray(one(a, b)), np.asarray(ten(a, b)), rtol=1e-5)
        wall1, cpu1 = cpu_wall(lambda f=one, a=a, b=b: f(a, b), max(5, repeats))
        wall10, cpu10 = cpu_wall(lambda f=ten, a=a, b=b: f(a, b), max(5, repeats))
        head = "W8" if size == 256 else "  "
        rows.append((f"{head} {size}x{size}, parallel_iterations=1, ms", *stat(wall1, 1e3), ""))
        target = "target 43" if size == 256 else ""
        rows.append(("   parallel_iterations=10, ms", *stat(wall10, 1e3), target))
        rows.append(("   =1 / =10", *ratio(wall1, wall10), "target 1.7x"))
        rows.append(("   cpu / wall, =1", f"{statistics.median(cpu1):.2f}", "", ""))
        rows.append(("   cpu / wall, =10", f"{statistics.median(cpu10):.2f}", "", ""))

    # N
    s = gl.tensor(0.5, dtype=gl.float64)
    staged = gl.function(scalar_chain)
    fns = {
        "executor": lambda: staged(s),
        "programs": lambda: frames("off", staged)(s),
        "interpreter": lambda: on("interpreter", staged)(s),
    }
    for _ in range(3):  # a root is compiled to machine code at its third run
        staged(s)
    t = paired(fns, number=20 if args.quick else 100, repeats=repeats)
    rows.append(("N  executor, ns per scalar node", *stat(t["executor"], 1e9 / CHAIN), "target 15"))
    rows.append(("   frame interpreted, ns per node", *stat(t["programs"], 1e9 / CHAIN), ""))
    rows.append(("   interpreter, ns per scalar node", *stat(t["interpreter"], 1e9 / CHAIN), ""))
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
