"""gradloop benchmarks: eager per-op overhead, an MLP training step and the elementwise math
kernels, each against numpy.

Usage: python benches/run.py [--quick] [--repeats N]

Prints one table. Every figure is a median over repeats with its interquartile range; each repeat
times gradloop and its numpy reference back to back, so the ratios compare runs that shared the
machine's state at that moment. See benches/README.md for what each line means.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

import gradloop as gl

CHAIN_OPS = 1000  # (a): ops per chain, alternating add, mul, sin
KERNEL_ELEMENTS = 1 << 20  # (c): float32 elements per elementwise kernel call
MLP_SIZES = (784, 512, 512, 10)  # (b)
BATCH = 64
LEARNING_RATE = 0.01


# --- timing ----------------------------------------------------------------------------------


def time_calls(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of `fn`, averaged over `number` calls (garbage collector off, as timeit)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - start) / number
    finally:
        if enabled:
            gc.enable()


def paired(
    fns: dict[str, Callable[[], object]], number: int, repeats: int
) -> dict[str, list[float]]:
    """Times every function once per repeat, interleaved, after one warm-up call of each."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(time_calls(fn, number))
        gc.collect()
    return samples


@dataclass
class Stat:
    median: float
    q1: float
    q3: float

    @classmethod
    def of(cls, xs: Sequence[float]) -> Stat:
        if len(xs) < 2:
            return cls(xs[0], xs[0], xs[0])
        q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        return cls(q2, q1, q3)


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-repeat ratios a[i] / b[i]: both measured in the same repeat."""
    return [x / y for x, y in zip(a, b, strict=True)]


# --- (a) a chain of small elementwise ops ------------------------------------------------------


def chain(x, c_add, c_mul, add, mul, sin):
    """CHAIN_OPS ops alternating add, mul, sin; unrolled by three to keep loop overhead low."""
    for _ in range(CHAIN_OPS // 3):
        x = sin(mul(add(x, c_add), c_mul))
    for op, c in ((add, c_add), (mul, c_mul))[: CHAIN_OPS % 3]:
        x = op(x, c)
    return x


def bench_chain(number: int, repeats: int) -> dict[str, list[float]]:
    values = np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    c_add_np = np.array([0.5, -0.25, 0.125, 1.0], dtype=np.float32)
    c_mul_np = np.array([0.9, 1.1, -0.7, 0.3], dtype=np.float32)
    x, c_add, c_mul = gl.tensor(values), gl.tensor(c_add_np), gl.tensor(c_mul_np)
    seed = gl.ones_like(x)

    def numpy_chain():
        chain(values, c_add_np, c_mul_np, np.add, np.multiply, np.sin)

    def tape_off():
        chain(x, c_add, c_mul, gl.add, gl.mul, gl.sin)

    def tape_on():
        with gl.GradientTape() as tape:
            tape.watch(x)
            y = chain(x, c_add, c_mul, gl.add, gl.mul, gl.sin)
        tape.gradient(y, x, output_gradients=seed)

    fns = {"numpy": numpy_chain, "tape_off": tape_off, "tape_on": tape_on}
    samples = paired(fns, number, repeats)
    return {name: [t / CHAIN_OPS for t in ts] for name, ts in samples.items()}


# --- (b) an MLP training step ------------------------------------------------------------------


def init_mlp(rng: np.random.Generator) -> list[np.ndarray]:
    """He-initialised float32 weights and zero biases: [W1, b1, W2, b2, W3, b3]."""
    params = []
    for fan_in, fan_out in itertools.pairwise(MLP_SIZES):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        params += [w.astype(np.float32), np.zeros(fan_out, dtype=np.float32)]
    return params


def gl_loss(params, x, onehot):
    """Softmax cross-entropy of the MLP, averaged over the batch, written with gradloop ops."""
    w1, b1, w2, b2, w3, b3 = params
    h = gl.relu(gl.matmul(x, w1) + b1)
    h = gl.relu(gl.matmul(h, w2) + b2)
    logits = gl.matmul(h, w3) + b3
    # log-sum-exp after subtracting the row max m (held constant: stop_gradient); as the onehot
    # rows sum to 1, logsumexp(logits) - <onehot, logits> = log(sum(exp(z))) - <onehot, z>
    z = logits - gl.stop_gradient(gl.max(logits, axis=1, keepdims=True))
    return gl.mean(gl.log(gl.sum(gl.exp(z), axis=1)) - gl.sum(onehot * z, axis=1))


def np_loss(params, x, onehot):
    """The same forward pass in numpy (float32 throughout)."""
    w1, b1, w2, b2, w3, b3 = params
    h = np.maximum(x @ w1 + b1, 0)
    h = np.maximum(h @ w2 + b2, 0)
    logits = h @ w3 + b3
    z = logits - logits.max(axis=1, keepdims=True)
    return np.mean(np.log(np.exp(z).sum(axis=1)) - (onehot * z).sum(axis=1))


def np_train_step(params: list[np.ndarray], x: np.ndarray, onehot: np.ndarray) -> None:
    """The training step written by hand in numpy: forward, backward and SGD, in place."""
    w1, b1, w2, b2, w3, b3 = params
    a1 = x @ w1 + b1
    h1 = np.maximum(a1, 0)
    a2 = h1 @ w2 + b2
    h2 = np.maximum(a2, 0)
    logits = h2 @ w3 + b3
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    dlogits = (e / e.sum(axis=1, keepdims=True) - onehot) / np.float32(len(x))
    dh2 = dlogits @ w3.T
    dh2 *= a2 > 0
    dh1 = dh2 @ w2.T
    dh1 *= a1 > 0
    grads = (x.T @ dh1, dh1.sum(0), h1.T @ dh2, dh2.sum(0), h2.T @ dlogits, dlogits.sum(0))
    for p, g in zip(params, grads, strict=True):
        p -= np.float32(LEARNING_RATE) * g


def torch_train_step(
    params_np: list[np.ndarray], x_np: np.ndarray, onehot_np: np.ndarray
) -> Callable[[], None] | None:
    """The training step as PyTorch's users write it (autograd, SGD in place), where PyTorch is
    installed (a benchmark-only dependency); else None."""
    try:
        import torch
    except ImportError:
        return None
    params = [torch.tensor(p, requires_grad=True) for p in params_np]
    x, onehot = torch.from_numpy(x_np), torch.from_numpy(onehot_np)

    def step() -> None:
        w1, b1, w2, b2, w3, b3 = params
        h = torch.relu(x @ w1 + b1)
        h = torch.relu(h @ w2 + b2)
        logits = h @ w3 + b3
        z = logits - logits.max(dim=1, keepdim=True).values.detach()
        loss = (torch.log(torch.exp(z).sum(dim=1)) - (onehot * z).sum(dim=1)).mean()
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.sub_(LEARNING_RATE * g)

    return step


def bench_mlp(number: int, repeats: int) -> tuple[dict[str, list[float]], float, float]:
    rng = np.random.default_rng(0)
    params_np = init_mlp(rng)
    x_np = rng.standard_normal((BATCH, MLP_SIZES[0])).astype(np.float32)
    onehot_np = np.eye(MLP_SIZES[-1], dtype=np.float32)[rng.integers(0, MLP_SIZES[-1], BATCH)]
    x, onehot = gl.tensor(x_np), gl.tensor(onehot_np)
    state = {"params": tuple(gl.tensor(p) for p in params_np)}
    loss_and_grad = gl.value_and_grad(gl_loss)  # argnums=0: grads has the structure of params

    # the two implementations agree before anything is timed
    np_value, gl_value = (
        float(np_loss(params_np, x_np, onehot_np)),
        float(gl_loss(state["params"], x, onehot)),
    )
    if not np.isclose(np_value, gl_value, rtol=1e-4):
        sys.exit(f"MLP loss mismatch: numpy {np_value} vs gradloop {gl_value}")

    def numpy_forward():
        np_loss(params_np, x_np, onehot_np)

    def gl_forward():
        gl_loss(state["params"], x, onehot)

    def train_step():
        _, grads = loss_and_grad(state["params"], x, onehot)
        state["params"] = tuple(
            p - LEARNING_RATE * g for p, g in zip(state["params"], grads, strict=True)
        )

    np_params = [p.copy() for p in params_np]
    fns = {
        "numpy_forward": numpy_forward,
        "gl_forward": gl_forward,
        "train_step": train_step,
        "numpy_step": lambda: np_train_step(np_params, x_np, onehot_np),
    }
    torch_step = torch_train_step([p.copy() for p in params_np], x_np, onehot_np)
    if torch_step is not None:
        fns["torch_step"] = torch_step
    samples = paired(fns, number, repeats)
    final = float(gl_loss(state["params"], x, onehot))
    return samples, gl_value, final


# --- report ------------------------------------------------------------------------------------


def _torch_rows(mlp_s: dict[str, list[float]]) -> list[tuple[str, str, str, str]]:
    if "torch_step" not in mlp_s:
        return [("PyTorch training step", "not installed", "", "")]
    import torch

    vs = Stat.of(ratios(mlp_s["train_step"], mlp_s["torch_step"]))
    return [
        (f"PyTorch {torch.__version__} training step", *fmt_ms(Stat.of(mlp_s["torch_step"])), ""),
        ("training step / PyTorch step", *fmt_x(vs), f"<= 1.0x  {verdict(vs.median, 1.0)}"),
    ]


def math_kernels() -> dict[str, tuple[Callable, Callable]]:
    """(c): each transcendental kernel as (gradloop, numpy) calls on one float32 input."""
    sigmoid = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    return {
        "exp": (gl.exp, np.exp),
        "log": (gl.log, np.log),
        "tanh": (gl.tanh, np.tanh),
        "sin": (gl.sin, np.sin),
        "cos": (gl.cos, np.cos),
        "sigmoid": (gl.sigmoid, sigmoid),
        "sqrt": (gl.sqrt, np.sqrt),
        "pow": (lambda v: gl.pow(v, v), lambda v: np.power(v, v)),
    }


def bench_kernels(number: int, repeats: int) -> dict[str, tuple[list[float], list[float]]]:
    """Seconds per call of each math kernel on KERNEL_ELEMENTS float32 values in (0.1, 2),
    gradloop and numpy interleaved; values checked against numpy first."""
    x = np.linspace(0.1, 2.0, KERNEL_ELEMENTS, dtype=np.float32)
    t = gl.tensor(x)
    out = {}
    for name, (ours, theirs) in math_kernels().items():
        np.testing.assert_allclose(np.asarray(ours(t)), theirs(x), rtol=2e-6, err_msg=name)
        times = paired({"gl": lambda f=ours: f(t), "np": lambda f=theirs: f(x)}, number, repeats)
        out[name] = (times["gl"], times["np"])
    return out


def fmt_ns(s: Stat) -> tuple[str, str]:
    return f"{s.median * 1e9:,.0f} ns", f"{s.q1 * 1e9:,.0f} - {s.q3 * 1e9:,.0f}"


def fmt_ns_fine(s: Stat) -> tuple[str, str]:
    return f"{s.median * 1e9:.2f} ns", f"{s.q1 * 1e9:.2f} - {s.q3 * 1e9:.2f}"


def fmt_ms(s: Stat) -> tuple[str, str]:
    return f"{s.median * 1e3:.3f} ms", f"{s.q1 * 1e3:.3f} - {s.q3 * 1e3:.3f}"


def fmt_x(s: Stat) -> tuple[str, str]:
    return f"{s.median:.2f}x", f"{s.q1:.2f} - {s.q3:.2f}"


def verdict(value: float, limit: float) -> str:
    return "meets" if value <= limit else "MISSES"


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    """Columns: measure (left-aligned), median and IQR (right-aligned), target (left-aligned)."""
    header = ("measure", "median", "IQR", "target")
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(4)]
    rule = "  ".join("-" * w for w in widths)

    def fmt(row: tuple[str, str, str, str]) -> str:
        name, median, iqr, target = row
        cells = [name.ljust(widths[0]), median.rjust(widths[1]), iqr.rjust(widths[2]), target]
        return "  ".join(cells).rstrip()

    print("\n".join([rule, fmt(header), rule, *map(fmt, rows), rule]))


_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")


#: Idle threads that spin take the cores the next function timed needs: OpenBLAS's spin after
#: each call of numpy's (its timeout is 2^n cycles), PyTorch's OpenMP threads after each step.
#: With them spinning, the interleaved MLP step measured 1.92x the numpy step by hand on two
#: cores; with short spins 1.16x, as each measured alone (1.30x).
_QUIET_POOLS = {"OPENBLAS_THREAD_TIMEOUT": "4", "OMP_WAIT_POLICY": "PASSIVE"}


def _reexec_with(threads: int | None, argv: list[str]) -> None:
    """Thread pools read their size and their idle policy when they start, so the process
    restarts with them set (`_QUIET_POOLS` unless set otherwise; `threads` for every pool)."""
    wanted = {var: value for var, value in _QUIET_POOLS.items() if var not in os.environ}
    if threads is not None:
        wanted |= {var: str(threads) for var in _THREAD_VARS if os.environ.get(var) != str(threads)}
    if not wanted:
        return
    env = {**os.environ, **wanted}
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv], env)


def _threads_note() -> str:
    set_vars = [
        f"{var}={os.environ[var]}" for var in (*_THREAD_VARS, *_QUIET_POOLS) if var in os.environ
    ]
    return ", ".join(set_vars) if set_vars else "thread pools at their defaults"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls per repeat (a smoke run)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats (default 15; 5 quick)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads for numpy's BLAS and gradloop's pool alike (default: all cores)",
    )
    args = parser.parse_args(argv)
    _reexec_with(args.threads, sys.argv[1:] if argv is None else list(argv))
    repeats = args.repeats or (5 if args.quick else 15)
    chain_number, mlp_number = (3, 2) if args.quick else (20, 10)

    print(
        f"gradloop {gl.__version__} benchmarks: {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}; "
        f"{_threads_note()}; load average {os.getloadavg()[0]:.2f} (1 min)\n"
        f"{repeats} repeats; medians and interquartile ranges over them; ratios are per repeat\n"
    )

    chain_s = bench_chain(chain_number, repeats)
    numpy_op, off_op, on_op = (Stat.of(chain_s[k]) for k in ("numpy", "tape_off", "tape_on"))
    off_vs_np = Stat.of(ratios(chain_s["tape_off"], chain_s["numpy"]))
    on_vs_off = Stat.of(ratios(chain_s["tape_on"], chain_s["tape_off"]))
    print(
        f"(a) a chain of {CHAIN_OPS} elementwise ops (add, mul, sin) on a float32[4] tensor, per op"
    )
    print_table(
        [
            ("numpy, per op (reference)", *fmt_ns(numpy_op), ""),
            (
                "gradloop, tape off, per op",
                *fmt_ns(off_op),
                f"<= 1,000 ns  {verdict(off_op.median, 1e-6)}",
            ),
            (
                "gradloop, tape on + backward, per op",
                *fmt_ns(on_op),
                f"<= 3,000 ns  {verdict(on_op.median, 3e-6)}",
            ),
            ("tape off / numpy", *fmt_x(off_vs_np), ""),
            ("tape on + backward / tape off", *fmt_x(on_vs_off), ""),
        ]
    )

    mlp_s, first_loss, last_loss = bench_mlp(mlp_number, repeats)
    step_vs_np = Stat.of(ratios(mlp_s["train_step"], mlp_s["numpy_forward"]))
    fwd_vs_np = Stat.of(ratios(mlp_s["gl_forward"], mlp_s["numpy_forward"]))
    sizes = "-".join(map(str, MLP_SIZES))
    print(
        f"\n(b) MLP {sizes} (ReLU, softmax cross-entropy), batch {BATCH}, float32, eager SGD step\n"
        f"    (loss {first_loss:.4f} -> {last_loss:.4f} over the timed steps)"
    )
    print_table(
        [
            ("numpy forward (reference)", *fmt_ms(Stat.of(mlp_s["numpy_forward"])), ""),
            ("gradloop forward, tape off", *fmt_ms(Stat.of(mlp_s["gl_forward"])), ""),
            ("gradloop training step", *fmt_ms(Stat.of(mlp_s["train_step"])), ""),
            ("numpy training step, by hand", *fmt_ms(Stat.of(mlp_s["numpy_step"])), ""),
            ("gradloop forward / numpy forward", *fmt_x(fwd_vs_np), ""),
            (
                "training step / numpy forward",
                *fmt_x(step_vs_np),
                f"<= 3.5x  {verdict(step_vs_np.median, 3.5)}",
            ),
            (
                "training step / numpy step by hand",
                *fmt_x(Stat.of(ratios(mlp_s["train_step"], mlp_s["numpy_step"]))),
                "",
            ),
            *_torch_rows(mlp_s),
        ]
    )

    kernels = bench_kernels(2 if args.quick else 10, repeats)
    print(f"\n(c) elementwise math on float32[{KERNEL_ELEMENTS}] in (0.1, 2), ns per element")
    rows = []
    per = lambda xs: [v / KERNEL_ELEMENTS for v in xs]  # noqa: E731
    for name, (ours, theirs) in kernels.items():
        rows.append((f"{name}: gradloop", *fmt_ns_fine(Stat.of(per(ours))), ""))
        rows.append((f"{name}: numpy", *fmt_ns_fine(Stat.of(per(theirs))), ""))
        rows.append((f"{name}: gradloop / numpy", *fmt_x(Stat.of(ratios(ours, theirs))), ""))
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
