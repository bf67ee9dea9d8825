"""JAX programs with data-dependent `lax.while_loop`s, differentiated through
`gl.jax.differentiable`, beside the same programs written as a `lax.scan` over a static bound
(each step masked once the loop would have stopped), which JAX differentiates itself. One run.

- projectile: `examples/jax_while_grad.py`'s flight with drag until it lands (about 150 trips),
  d range / d angle; the scan runs 256 steps.
- RNN: W6's `h = tanh(h W + x_t U)` (H = D = 64, float32) until the running sum of |h| passes
  a threshold (1,000 trips), gradient with respect to W and U; the scan runs 1,024 steps.

Both columns run under `jax.jit` on XLA and are checked against each other first. The
exported loop has no bound, so gradloop's gradient is its checkpointed form (fixed-size state:
`DEFAULT_CHECKPOINTS` snapshots), against the scan's stored steps.

Usage: python benches/jax_programs.py [--repeats R]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/examples")

import jax
import jax.numpy as jnp
from executor import STEPS, rnn_inputs
from jax import lax
from jax_while_grad import SPEED, flight_range, step
from numerics import median_seconds

import gradloop as gl


def _start(theta):
    return (jnp.asarray(0.0), jnp.asarray(0.0), SPEED * jnp.cos(theta), SPEED * jnp.sin(theta))


def _landing(s):
    x, y, vx, vy = s
    return x - vx * y / vy


def flight_scan(theta, bound=256):
    def masked(s, _):
        flying = s[1] >= 0.0
        return tuple(jnp.where(flying, a, b) for a, b in zip(step(s), s, strict=True)), None

    s, _ = lax.scan(masked, _start(theta), None, length=bound)
    return _landing(s)


def rnn_while(w, u, xs, threshold):
    def body(s):
        t, h, acc = s
        h = jnp.tanh(h @ w + xs[t] @ u)
        return t + 1, h, acc + jnp.sqrt(jnp.sum(h * h))

    start = (0, jnp.zeros(w.shape[0], w.dtype), jnp.asarray(0.0, w.dtype))
    _, h, _ = lax.while_loop(lambda s: s[2] < threshold, body, start)
    return jnp.sum(h)


def rnn_scan(w, u, xs, threshold, bound=1024):
    def masked(s, x):
        h, acc = s
        running = acc < threshold
        new = jnp.tanh(h @ w + x @ u)
        h = jnp.where(running, new, h)
        return (h, jnp.where(running, acc + jnp.sqrt(jnp.sum(new * new)), acc)), None

    start = (jnp.zeros(w.shape[0], w.dtype), jnp.asarray(0.0, w.dtype))
    (h, _), _ = lax.scan(masked, start, xs[:bound])
    return jnp.sum(h)


def compare(title: str, ours, scan, args: tuple, repeats: int, per: float, unit: str) -> None:
    got = jax.tree.leaves(ours(*args))
    want = jax.tree.leaves(scan(*args))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-3, atol=1e-5)

    def block(f):
        return lambda: jax.tree.map(np.asarray, f(*args))

    t_ours = median_seconds(block(ours), repeats) / per
    t_scan = median_seconds(block(scan), repeats) / per
    print(
        f"{title}: gl.jax.differentiable {t_ours:9.3f}  lax.scan {t_scan:9.3f} {unit}"
        f"  (ratio {t_ours / t_scan:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    r = parser.parse_args().repeats
    jax.config.update("jax_enable_x64", True)
    print(f"jax {jax.__version__}; medians of {r}")

    theta = jnp.asarray(0.3)
    ours = jax.jit(jax.grad(gl.jax.differentiable(flight_range)))
    compare(
        "projectile d range/d angle", ours, jax.jit(jax.grad(flight_scan)), (theta,), r, 1e-3, "ms"
    )

    w, u, xs, threshold = rnn_inputs()
    xs = (
        xs[:1024]
        if len(xs) >= 1024
        else np.concatenate([xs, np.zeros((1024 - len(xs), xs.shape[1]), xs.dtype)])
    )
    args = (jnp.asarray(w), jnp.asarray(u), jnp.asarray(xs), jnp.float32(threshold))
    ours = jax.jit(jax.grad(gl.jax.differentiable(rnn_while), argnums=(0, 1)))
    scan = jax.jit(jax.grad(rnn_scan, argnums=(0, 1)))
    compare("RNN gradient", ours, scan, args, r, STEPS * 1e-6, "us/step")


if __name__ == "__main__":
    main()
