"""Loop gradients in bounded memory: the dynamic-stop RNN with stacks and with `checkpoints=c`,
eagerly, in graph mode, under `gl.jit` and (checkpointed) under `gl.jit(backend="xla")`, beside
Equinox's checkpointed while loop (`jax.jit`) where JAX and Equinox are installed.

The RNN: h <- tanh(W h + b) with H = 64 until the running sum of |h|^2 passes a threshold set
for about `--trips` trips (10^5 by default); the figure is the gradient of sum(h) at the stop
with respect to W. Every configuration runs in a fresh process: after a warm-up call (tracing,
compiling, buffers), it reports the median seconds per gradient and how far the process's
resident memory peaked above its size before a call (Linux's peak reset, `clear_refs`). Body
evaluations are the schedule's (`_checkpoints.evaluations`), the same for every mode: forward
trips plus recomputed ones.

Usage: python benches/checkpointed.py [--quick] [--trips N] [--checkpoints C] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np

H = 64


def problem(trips: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """W, b, h0 and the threshold that stops the loop after about `trips` trips."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((H, H)) * (0.9 / np.sqrt(H))
    b = rng.standard_normal(H) * 0.1
    h = rng.standard_normal(H) * 0.1
    total = 0.0
    for _ in range(200):  # the steady state's |h|^2
        h = np.tanh(w @ h + b)
        total += float(h @ h)
    return w, b, rng.standard_normal(H) * 0.1, trips * total / 200


def gradloop_gradient(mode: str, checkpoints: int | None, b, h0):
    import gradloop as gl

    bias, start = gl.tensor(b), gl.tensor(h0)

    def loss(w, threshold):
        def body(h, total):
            h = gl.tanh(gl.matmul(w, h[:, None])[:, 0] + bias)
            return h, total + gl.sum(h * h)

        def more(h, total):
            return total < threshold

        h, _ = gl.while_loop(
            more, body, (start, gl.tensor(0.0, dtype=gl.float64)), checkpoints=checkpoints
        )
        return gl.sum(h)

    grad = gl.grad(loss)
    if mode == "graph":
        return gl.function(grad)
    if mode == "jit":
        return gl.jit(grad)
    if mode == "xla":
        return gl.jit(grad, backend="xla")
    return grad


def equinox_gradient(checkpoints: int, b, h0):
    import equinox.internal as eqxi
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    bias, start = jnp.asarray(b), jnp.asarray(h0)

    def loss(w, threshold):
        def body(state):
            h, total = state
            h = jnp.tanh(w @ h + bias)
            return h, total + jnp.sum(h * h)

        def more(state):
            return state[1] < threshold

        init = (start, jnp.asarray(0.0))
        h, _ = eqxi.while_loop(more, body, init, kind="checkpointed", checkpoints=checkpoints)
        return jnp.sum(h)

    grad = jax.jit(jax.grad(loss))
    return lambda w, threshold: grad(w, threshold).block_until_ready()


def worker(config: dict) -> dict:
    """One configuration, in this process: seconds per gradient and peak-memory growth."""
    w, b, h0, threshold = problem(config["trips"])
    c = config["checkpoints"]
    if config["mode"] == "equinox":
        import jax.numpy as jnp

        fn, arg, scalar = equinox_gradient(c, b, h0), jnp.asarray(w), jnp.asarray
    else:
        import gradloop as gl

        fn, arg = gradloop_gradient(config["mode"], c, b, h0), gl.tensor(w)
        scalar = lambda v: gl.tensor(v, dtype=gl.float64)  # noqa: E731
    # The warm-up (tracing, compiling) stops after about 100 trips: the timed calls' memory
    # grows past what it left.
    fn(arg, scalar(threshold / config["trips"] * 100))
    times, grown = [], []
    for _ in range(config["repeats"]):
        before = reset_peak()
        start = time.perf_counter()
        out = fn(arg, scalar(threshold))
        times.append(time.perf_counter() - start)
        grown.append(status_kb("VmHWM") - before)
    return {
        "seconds": statistics.median(times),
        "grown_mb": max(grown) / 1024,
        "grad": np.asarray(out).tolist(),
    }


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def reset_peak() -> int:
    """Resets the process's peak resident memory (Linux: clear_refs 5) to its current size,
    which it returns (kB): the peak after a call, less this, is what the call grew it by."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kb("VmRSS")


def run_worker(config: dict) -> dict | str:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        return out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10^4 trips, one repeat")
    parser.add_argument("--trips", type=int, default=None)
    parser.add_argument("--checkpoints", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no-eager", action="store_true", help="skip eager mode (slow)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    from gradloop import _checkpoints

    trips = args.trips or (10_000 if args.quick else 100_000)
    repeats = args.repeats or (1 if args.quick else 3)
    c = args.checkpoints
    modes = ["graph", "jit"] + ([] if args.no_eager else ["eager"])
    try:
        import equinox  # noqa: F401
        import jax  # noqa: F401

        modes.append("xla")
        peers = ["equinox"]
    except ImportError:
        peers = []
        print("Equinox is not installed (pip install jax equinox): no peer figures")
    w, b, h0, threshold = problem(trips)
    rows = []
    want = None
    for mode in modes + peers:
        # pure StableHLO keeps fixed-size state: XLA runs the checkpointed form alone
        for checkpoints in [None, c] if mode not in ("equinox", "xla") else [c]:
            config = {"mode": mode, "checkpoints": checkpoints, "trips": trips, "repeats": repeats}
            result = run_worker(config)
            label = f"{mode}, " + ("stacks" if checkpoints is None else f"checkpoints={c}")
            if isinstance(result, str):
                rows.append((label, "-", "-", result))
                continue
            grad = np.asarray(result["grad"])
            want = grad if want is None else want
            agree = np.allclose(grad, want, rtol=1e-9, atol=1e-12)
            rows.append(
                (
                    label,
                    f"{result['seconds']:.3f}",
                    f"{result['grown_mb']:.1f}",
                    "" if agree else "GRADIENT DIFFERS",
                )
            )
    untaped, taped = _checkpoints.evaluations(_trip_count(w, b, h0, threshold), c)
    n = _trip_count(w, b, h0, threshold)
    print(
        f"dynamic-stop RNN, H={H}, {n} trips; checkpoints={c}: {untaped} untaped body "
        f"evaluations ({untaped / n:.2f} per trip) and {taped} taped; stacks: {n} and {n}"
    )
    width = max(len(r[0]) for r in rows)
    print(f"{'configuration'.ljust(width)}  s/gradient  peak growth MB")
    for label, seconds, grown, note in rows:
        print(f"{label.ljust(width)}  {seconds:>10}  {grown:>14}  {note}")
    return 0


def _trip_count(w, b, h0, threshold) -> int:
    h, total, n = h0, 0.0, 0
    while total < threshold:
        h = np.tanh(w @ h + b)
        total += float(h @ h)
        n += 1
    return n


if __name__ == "__main__":
    raise SystemExit(main())
