"""`gl.jit(backend="xla")` beside graph mode, `gl.jit` on IREE and JAX's own programs, in one run.

- W5: `x = 0.999 x + 0.001 sin(x)` on float32[16], 10^5 trips decided at run time: ns per trip;
  JAX's `lax.while_loop` beside.
- W6: the gradient of the dynamic-stop RNN (`benches/executor.py`: H = D = 64, 1,000 trips,
  no `maximum_iterations`) with respect to W and U: us per step; JAX's gradient of the same RNN
  as a static `lax.scan` of 1,000 steps beside (JAX cannot reverse the dynamic stop). Then the
  same loop under `maximum_iterations=1024`, whose pure StableHLO gradient keeps each trip's
  residuals.
- W11: the adaptive Dormand–Prince solve and its gradient (`benches/ode.py`): ms per call;
  Diffrax's `Dopri5` beside where it is installed.
- W4: the MLP training step (784-512-512-10, batch 64, float32, value_and_grad and SGD;
  `benches/run.py`): ms per call; JAX's `jax.jit` of the same step beside.
- W7: the first call of a small function (`benches/executor.py`) in a fresh process with an
  empty cache: `backend="xla"` against JAX's first `jax.jit` call of the same program.

`graph flushed` (W6) is graph mode with subnormals flushed to zero (`gl.set_flush_subnormals`),
as XLA runs its CPU code; each call sets and clears the mode, which costs a wake-up of every
worker thread (W5, which meets no subnormal, would show only that). Each gradloop column is
checked against graph mode first. Medians of `--repeats` calls after a warm-up, the columns
called in turn within each repeat; ratios are taken in the same run. W9 (checkpoints) is
`benches/checkpointed.py`'s.

Usage: python benches/xla_backend.py [--repeats R] [--no-iree]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import warnings
from collections.abc import Callable

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])

import jax
import jax.numpy as jnp
import jax_peers
from _timing import medians
from executor import STEPS, H, rnn_inputs, rnn_loss, w5
from ode import diffrax_value_and_grad, solve
from run import BATCH, LEARNING_RATE, MLP_SIZES, gl_loss, init_mlp

import gradloop as gl


def gradloop_columns(fn: Callable, args: tuple, iree: bool) -> dict[str, Callable[[], object]]:
    """`fn` in graph mode, under `backend="xla"` and (with `iree`) under `gl.jit`, each checked
    against graph mode."""
    staged = gl.function(fn)
    columns = {"graph": staged, "xla": gl.jit(fn, backend="xla")}
    if iree:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            columns["gl.jit"] = gl.jit(fn)
    want = [np.asarray(t) for t in _leaves(staged(*args))]
    for name, g in columns.items():
        got = [np.asarray(t) for t in _leaves(g(*args))]
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-3, atol=1e-5, err_msg=name)
    return {name: (lambda g=g: _block(g(*args))) for name, g in columns.items()}


def flushed(call: Callable[[], object]) -> Callable[[], object]:
    """`call` with subnormals flushed to zero (`gl.set_flush_subnormals`), as XLA runs."""

    def run() -> object:
        gl.set_flush_subnormals(True)
        try:
            return call()
        finally:
            gl.set_flush_subnormals(False)

    return run


def _leaves(x):
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in _leaves(item)]
    return [x]


def mlp_step(params, x, onehot):
    """W4: one SGD step of the MLP, as `benches/compiled_mode.py` times it."""
    loss, grads = gl.value_and_grad(gl_loss)(params, x, onehot)
    return loss, tuple(p - LEARNING_RATE * g for p, g in zip(params, grads, strict=True))


def mlp_inputs() -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    params = init_mlp(rng)
    x = rng.standard_normal((BATCH, MLP_SIZES[0])).astype(np.float32)
    onehot = np.eye(MLP_SIZES[-1], dtype=np.float32)[rng.integers(0, MLP_SIZES[-1], BATCH)]
    return params, x, onehot


def _block(out):
    return [np.asarray(t) for t in _leaves(out)]


def jax_w6():
    """W6's RNN as a static scan of STEPS steps, differentiated with respect to W and U."""

    def loss(w, u, xs):
        def step(h, x):
            h = jnp.tanh(h @ w + x @ u)
            return h, None

        h, _ = jax.lax.scan(step, jnp.zeros(H, jnp.float32), xs[:STEPS])
        return jnp.sum(h)

    return jax.jit(jax.grad(loss, argnums=(0, 1)))


BOUND = 1024


def bounded_rnn_loss(w, u, xs, threshold):
    """W6's loss with `maximum_iterations=BOUND` (the stop still comes at 1,000 trips)."""

    def body(t, h, acc):
        h = gl.tanh(h @ w + xs[t] @ u)
        return t + 1, h, acc + gl.sqrt(gl.sum(h * h))

    start = (gl.tensor(0), gl.zeros((H,), dtype=gl.float32), gl.tensor(0.0, dtype=gl.float32))
    more = lambda t, h, acc: acc < threshold  # noqa: E731
    _, h, _ = gl.while_loop(more, body, start, maximum_iterations=BOUND)
    return gl.sum(h)


FIRST_CALL = """
import time, numpy as np
start = time.perf_counter()
import {module}
{body}
print(time.perf_counter() - start)
"""

GRADLOOP_FIRST = """
import gradloop as gl
def w7(x):
    def body(i, v):
        v = gl.cond(gl.sum(v) > 0.0, lambda: v * 0.9 + 0.1, lambda: gl.sin(v))
        return i + 1, v
    return gl.while_loop(lambda i, v: i < 10, body, (gl.tensor(0), x))[1]
np.asarray(gl.jit(w7, backend="xla")(gl.tensor(np.array([0.3, -0.2, 0.1]))))
"""

JAX_FIRST = """
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
def w7(x):
    def body(s):
        i, v = s
        v = jax.lax.cond(jnp.sum(v) > 0.0, lambda v: v * 0.9 + 0.1, jnp.sin, v)
        return i + 1, v
    return jax.lax.while_loop(lambda s: s[0] < 10, body, (0, x))[1]
np.asarray(jax.jit(w7)(np.array([0.3, -0.2, 0.1])))
"""


def first_call(module: str, body: str) -> float:
    """Seconds to `body`'s first result in a fresh process, imports included, with an empty
    gradloop cache. Modules load from bytecode, as from an installed wheel (pip compiles it):
    PYTHONDONTWRITEBYTECODE is dropped, else gradloop's sources, which an editable install
    leaves uncompiled, would be compiled on every import (40 ms)."""
    import os

    code = FIRST_CALL.format(module=module, body=body)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["GRADLOOP_CACHE_DIR"] = subprocess.check_output(["mktemp", "-d"]).decode().strip()
    out = subprocess.check_output([sys.executable, "-c", code], env=env)
    return float(out.decode().split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-iree", action="store_true", help="skip gl.jit on IREE")
    args = parser.parse_args()
    iree, r = not args.no_iree, args.repeats
    print(f"jax {jax.__version__}; medians of {r}")

    trips = 100_000
    x16 = np.linspace(-1.0, 1.0, 16, dtype=np.float32)
    columns = gradloop_columns(w5, (gl.tensor(x16), gl.tensor(trips)), iree)
    run = jax_peers.w5
    columns["JAX"] = lambda: np.asarray(run(x16, np.int32(trips)))
    times = {k: v / trips * 1e9 for k, v in medians(columns, r).items()}
    report("W5 ns/trip", times)

    w, u, xs, threshold = rnn_inputs()
    grad = gl.grad(lambda w, u: rnn_loss(w, u, gl.tensor(xs), threshold), argnums=(0, 1))
    columns = gradloop_columns(grad, (gl.tensor(w), gl.tensor(u)), iree)
    columns["graph flushed"] = flushed(columns["graph"])
    scan = jax_w6()
    columns["JAX scan"] = lambda: [np.asarray(g) for g in scan(w, u, xs)]
    times = {k: v / STEPS * 1e6 for k, v in medians(columns, r).items()}
    report("W6 us/step", times, peer="JAX scan")
    # the same loop under maximum_iterations: its pure StableHLO gradient keeps residual rows
    grad = gl.grad(lambda w, u: bounded_rnn_loss(w, u, gl.tensor(xs), threshold), argnums=(0, 1))
    columns = gradloop_columns(grad, (gl.tensor(w), gl.tensor(u)), iree)
    columns["JAX scan"] = lambda: [np.asarray(g) for g in scan(w, u, xs)]
    times = {k: v / STEPS * 1e6 for k, v in medians(columns, r).items()}
    report(f"W6 under maximum_iterations={BOUND} us/step", times, peer="JAX scan")

    damping = gl.tensor(0.3, dtype=gl.float64)
    columns = gradloop_columns(gl.value_and_grad(solve), (damping,), iree)
    diffrax = diffrax_value_and_grad()
    if diffrax is not None:
        columns["Diffrax"] = diffrax
    times = {k: v * 1e3 for k, v in medians(columns, r).items()}
    report("W11 ms", times, peer="Diffrax" if diffrax is not None else None)

    params, x, onehot = mlp_inputs()
    gl_params = tuple(gl.tensor(p) for p in params)
    columns = gradloop_columns(mlp_step, (gl_params, gl.tensor(x), gl.tensor(onehot)), iree)
    jax_params = tuple(jnp.asarray(p) for p in params)
    columns["JAX"] = lambda: _block(jax_peers.w4(jax_params, x, onehot))
    times = {k: v * 1e3 for k, v in medians(columns, r).items()}
    report("W4 ms/step", times)

    first_call("gradloop", GRADLOOP_FIRST)  # writes gradloop's bytecode
    firsts = {
        "xla": statistics.median(first_call("gradloop", GRADLOOP_FIRST) for _ in range(5)),
        "JAX": statistics.median(first_call("jax", JAX_FIRST) for _ in range(5)),
    }
    report("W7 first call, s (fresh process, imports included)", firsts)


def report(title: str, times: dict[str, float], peer: str | None = "JAX") -> None:
    cells = "  ".join(f"{k} {v:9.3f}" for k, v in times.items())
    ratios = ", ".join(
        f"{k} / {peer} {times[k] / times[peer]:.2f}"
        for k in ("xla", "graph", "graph flushed")
        if k in times and peer in times
    )
    print(f"{title}: {cells}" + (f"  ({ratios})" if ratios else ""))


if __name__ == "__main__":
    main()
