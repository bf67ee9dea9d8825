"""Data-parallel training on Ray with `gl.distributed.mean_gradient`, beside the same training
in one process.

The model's prediction for a row x is the fixed point of h = tanh(w.x + b + a h), found by a
`gl.while_loop` that iterates until h stops changing: how many trips depends on the data and on
the parameters, and reverse mode differentiates through them. Each step averages the shards'
`value_and_grad` on the workers; the single-process run takes the gradient of the mean loss
over all rows. Both descend alike.

    python examples/train_ray.py [--steps 60] [--shards 4] [--address auto]
"""

from __future__ import annotations

import argparse

import numpy as np

import gradloop as gl

TRUE_W, TRUE_A, TRUE_B = np.array([0.8, -0.5, 0.3]), 0.5, 0.1
LEARNING_RATE = 0.5
TOLERANCE = 1e-12


def loss(params, xs, ys):
    """Mean squared error of the fixed-point predictions over the rows of `xs`."""
    w, a, b = params
    drive = gl.matmul(xs, w) + b

    def unsettled(trip, h, change):
        return change > TOLERANCE

    def iterate(trip, h, change):
        new = gl.tanh(drive + a * h)
        return trip + 1, new, gl.max(gl.abs(new - h))

    start = (gl.tensor(0), gl.zeros_like(drive), gl.tensor(np.inf, dtype=gl.float64))
    _, h, _ = gl.while_loop(unsettled, iterate, start, maximum_iterations=1000)
    return gl.mean((h - ys) * (h - ys))


def data(rows: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows and targets made by the model itself with the true parameters, plus noise."""
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((rows, 3))
    h = np.zeros(rows)
    for _ in range(200):
        h = np.tanh(xs @ TRUE_W + TRUE_B + TRUE_A * h)
    return xs, h + 0.01 * rng.standard_normal(rows)


def initial_params() -> tuple[gl.Tensor, gl.Tensor, gl.Tensor]:
    return gl.tensor(np.zeros(3)), gl.tensor(0.0, dtype=gl.float64), gl.tensor(0.0, gl.float64)


def train(
    steps: int, shards: int | None, address: str | None = None, log: bool = True
) -> tuple[tuple[gl.Tensor, ...], list[float]]:
    """Gradient descent for `steps` steps: on Ray over `shards` equal shards, or in this
    process when `shards` is None. Returns the parameters and the loss at each step."""
    xs, ys = data()
    step = gl.jit(gl.value_and_grad(loss))
    params = initial_params()
    losses = []
    for k in range(steps):
        if shards is None:
            value, grads = step(params, gl.tensor(xs), gl.tensor(ys))
        else:
            parts = zip(np.split(xs, shards), np.split(ys, shards), strict=True)
            value, grads = gl.distributed.mean_gradient(step, params, list(parts), address=address)
        losses.append(float(value))
        if log and (k % 10 == 0 or k == steps - 1):
            print(f"step {k:3}: loss {float(value):.8f}")
        params = tuple(p - LEARNING_RATE * g for p, g in zip(params, grads, strict=True))
    return params, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--address", default=None, help='"auto" or "ray://host:port"')
    args = parser.parse_args()
    print(f"on Ray, {args.shards} shards:")
    ray_params, ray_losses = train(args.steps, args.shards, args.address)
    print("\nin one process:")
    _, one_losses = train(args.steps, None)
    w, a, b = (np.asarray(p) for p in ray_params)
    gap = max(abs(x - y) for x, y in zip(ray_losses, one_losses, strict=True))
    print(
        f"\nfitted w {np.round(w, 4)}, a {float(a):.4f}, b {float(b):.4f} "
        f"(true {TRUE_W}, {TRUE_A}, {TRUE_B})\n"
        f"largest difference between the two loss curves: {gap:.1e}"
    )
    gl.distributed.shutdown()


if __name__ == "__main__":
    main()
