"""JAX's figures for W4, W5 and W6 on each JAX device present (CPU, and a GPU where there is one),
so that compiled-mode figures measured on another target have a peer from the same machine.

    python benches/jax_peers.py            # needs only jax and numpy

- W5: `x = 0.999 x + 0.001 sin(x)` on float32[16], a `lax.while_loop` whose trip count (10^5)
  is an argument, per iteration.
- W6: the RNN gradient (H = 64, 16 inputs), h <- tanh(W h + U x_t + b) over 1,000 steps as a
  static `lax.scan` (JAX cannot reverse a data-dependent `while_loop`), per step.
- W4: the MLP training step (784-512-512-10, batch 64, softmax cross-entropy, SGD), per call.
"""

from __future__ import annotations

import itertools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", False)

RNN_STEPS = 1000
W5_TRIPS = 100_000


def _median_seconds(fn, args, repeats: int = 7) -> float:
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


@jax.jit
def w5(x, n):
    def body(state):
        i, x = state
        return i + 1, 0.999 * x + 0.001 * jnp.sin(x)

    return jax.lax.while_loop(lambda s: s[0] < n, body, (jnp.int32(0), x))[1]


def _rnn_loss(w, u, b, xs):
    def step(carry, x):
        h, energy = carry
        h = jnp.tanh(w @ h + u @ x + b)
        return (h, energy + jnp.sum(h * h)), None

    (h, energy), _ = jax.lax.scan(step, (jnp.zeros(64, jnp.float32), jnp.float32(0.0)), xs)
    return energy + jnp.sum(h)


w6 = jax.jit(jax.grad(_rnn_loss, argnums=(0, 1, 2)))


def _mlp_loss(params, x, onehot):
    w1, b1, w2, b2, w3, b3 = params
    h = jax.nn.relu(x @ w1 + b1)
    h = jax.nn.relu(h @ w2 + b2)
    z = h @ w3 + b3
    z = z - jax.lax.stop_gradient(jnp.max(z, axis=1, keepdims=True))
    return jnp.mean(jnp.log(jnp.sum(jnp.exp(z), axis=1)) - jnp.sum(onehot * z, axis=1))


@jax.jit
def w4(params, x, onehot):
    loss, grads = jax.value_and_grad(_mlp_loss)(params, x, onehot)
    return loss, tuple(p - 0.01 * g for p, g in zip(params, grads, strict=True))


def main() -> None:
    rng = np.random.default_rng(0)
    x16 = np.linspace(-1.0, 1.0, 16, dtype=np.float32)
    w = (rng.standard_normal((64, 64)) * (0.9 / 8)).astype(np.float32)
    u = (rng.standard_normal((64, 16)) * 0.25).astype(np.float32)
    b = (rng.standard_normal(64) * 0.1).astype(np.float32)
    xs = rng.standard_normal((RNN_STEPS, 16)).astype(np.float32)
    sizes = (784, 512, 512, 10)
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        params += [
            (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2 / fan_in)).astype(np.float32),
            np.zeros(fan_out, np.float32),
        ]
    x = rng.standard_normal((64, 784)).astype(np.float32)
    onehot = np.eye(10, dtype=np.float32)[np.arange(64) % 10]
    platforms = {d.platform for d in jax.devices()} | {"cpu"}
    print(f"jax {jax.__version__}; devices: {[str(d) for d in jax.devices()]}")
    for platform in sorted(platforms):
        device = jax.devices(platform)[0]

        def put(a, device=device):
            return jax.device_put(a, device)

        t5 = _median_seconds(w5, (put(x16), put(np.int32(W5_TRIPS))))
        t6 = _median_seconds(w6, tuple(map(put, (w, u, b, xs))))
        t4 = _median_seconds(w4, (tuple(map(put, params)), put(x), put(onehot)))
        print(
            f"{platform:5} W5 {t5 / W5_TRIPS * 1e9:9.1f} ns/iteration   "
            f"W6 {t6 / RNN_STEPS * 1e6:7.2f} us/step   W4 {t4 * 1e3:7.3f} ms/call"
        )


if __name__ == "__main__":
    main()
