"""An RNN that reads each sequence until it meets a stop marker, trained through its loop.

Each sequence holds values in [0, 0.9) and, somewhere between positions 4 and 28, a stop marker
(1.0). The RNN `h <- tanh(W h + u x + b)` reads one value per trip of a `gl.while_loop` until it
reads the marker, so every sequence makes its own number of trips. From its last state it
predicts how many of the values it read were above 0.45. `gl.vmap` batches the loss over 64
sequences, each lane making its own trips (no lane waits for the longest), and `gl.grad`
differentiates the batch's mean loss through every loop and every stop; `@gl.function` runs the
whole step as one graph. Adam then trains the weights.

    python examples/rnn_stop.py [--steps 800] [--plot rnn.png] [--quick]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

import gradloop as gl
from gradloop.examples import figures

HIDDEN = 16
LENGTH = 32
BATCH = 64
MARKER = 1.0


def make_batch(rng: np.random.Generator, size: int = BATCH) -> tuple[np.ndarray, np.ndarray]:
    """Sequences (size, LENGTH) with a marker at a random position in 4..28, and the count of
    values above 0.45 before it (the target, scaled by 1/10)."""
    xs = rng.uniform(0.0, 0.9, (size, LENGTH))
    stops = rng.integers(4, 29, size)
    xs[np.arange(size), stops] = MARKER
    counts = np.array([(row[:stop] > 0.45).sum() for row, stop in zip(xs, stops, strict=True)])
    return xs, counts / 10.0


def init_params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "w": rng.standard_normal((HIDDEN, HIDDEN)) * 0.5 / np.sqrt(HIDDEN),
        "u": rng.standard_normal(HIDDEN),
        "b": np.zeros(HIDDEN),
        "v": rng.standard_normal(HIDDEN) / np.sqrt(HIDDEN),
    }


def read(params, xs):
    """The RNN run over one sequence until the marker: (prediction, trips made)."""

    def not_stopped(t, h):
        return xs[t] < MARKER

    def trip(t, h):
        return t + 1, gl.tanh(gl.matmul(params["w"], h) + params["u"] * xs[t] + params["b"])

    start = (gl.tensor(0), gl.zeros((HIDDEN,), dtype=gl.float64))
    trips, h = gl.while_loop(not_stopped, trip, start, maximum_iterations=LENGTH)
    return gl.sum(params["v"] * h), trips


def batch_loss(params, xs, targets):
    predictions, trips = gl.vmap(read, in_axes=(None, 0))(params, xs)
    miss = predictions - targets
    return gl.mean(miss * miss), trips


train_step = gl.function(gl.value_and_grad(batch_loss, has_aux=True))


@dataclass
class Training:
    params: dict[str, np.ndarray]
    history: list[tuple[float, float]] = field(default_factory=list)  # (loss, mean trips)


def train(steps: int, seed: int = 0, rate: float = 0.005, log: bool = True) -> Training:
    """Adam on fresh batches."""
    rng = np.random.default_rng(seed)
    params = init_params(rng)
    moments = {k: (np.zeros_like(p), np.zeros_like(p)) for k, p in params.items()}
    result = Training(params)
    for k in range(1, steps + 1):
        xs, targets = make_batch(rng)
        tensors = {name: gl.tensor(p) for name, p in params.items()}
        (value, trips), grads = train_step(tensors, gl.tensor(xs), gl.tensor(targets))
        result.history.append((float(value), float(np.mean(np.asarray(trips)))))
        for name, g in grads.items():
            g = np.asarray(g)
            m, s = moments[name]
            m = 0.9 * m + 0.1 * g
            s = 0.999 * s + 0.001 * g * g
            moments[name] = (m, s)
            step = rate * (m / (1 - 0.9**k)) / (np.sqrt(s / (1 - 0.999**k)) + 1e-8)
            params[name] = params[name] - step
        if log and (k == 1 or k % 50 == 0 or k == steps):
            mean_trips = np.asarray(trips).mean()
            print(f"step {k:4}: loss {float(value):.5f}, trips per sequence {mean_trips:.1f}")
    result.params = params
    return result


def per_example_gradient_check(params: dict[str, np.ndarray]) -> tuple[float, float]:
    """One sequence's d(prediction)/d(u[0]) by reverse mode, and by central finite differences."""
    xs, _ = make_batch(np.random.default_rng(1), 1)
    x = gl.tensor(xs[0])

    def prediction(u0):
        p = {name: gl.tensor(v) for name, v in params.items()}
        p["u"] = gl.concatenate([gl.reshape(u0, (1,)), p["u"][1:]])
        return read(p, x)[0]

    u0 = params["u"][0]
    exact = float(gl.grad(prediction)(gl.tensor(u0)))
    h = 1e-6
    numeric = (float(prediction(gl.tensor(u0 + h))) - float(prediction(gl.tensor(u0 - h)))) / (
        2 * h
    )
    return exact, numeric


def plot(result: Training, filename: str) -> None:
    pyplot = figures.pyplot()
    figure, (losses, fit) = pyplot.subplots(1, 2, figsize=(11, 4))
    values = np.array([v for v, _ in result.history])
    losses.semilogy(values, linewidth=0.8, color="steelblue", label="batch loss")
    window = min(20, len(values))
    smooth = np.convolve(values, np.ones(window) / window, mode="valid")
    losses.semilogy(np.arange(window - 1, len(values)), smooth, color="crimson", label="mean of 20")
    losses.set(xlabel="Adam step", ylabel="mean squared error", title="training through the stops")
    losses.legend()
    xs, targets = make_batch(np.random.default_rng(7), 256)
    params = {name: gl.tensor(p) for name, p in result.params.items()}
    predictions, trips = gl.vmap(read, in_axes=(None, 0))(params, gl.tensor(xs))
    scatter = fit.scatter(
        10 * targets, 10 * np.asarray(predictions), c=np.asarray(trips), s=12, cmap="viridis"
    )
    top = 10 * targets.max()
    fit.plot([0, top], [0, top], color="grey", linewidth=1)
    fit.set(
        xlabel="values above 0.45 before the marker", ylabel="the RNN's count", title="held out"
    )
    figure.colorbar(scatter, ax=fit, label="trips (the marker's position)")
    figure.tight_layout()
    figure.savefig(filename)
    pyplot.close(figure)


def main(argv: Sequence[str] | None = None) -> Training:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--plot", default=None, help="write the figure here (PNG, SVG or PDF)")
    parser.add_argument("--quick", action="store_true", help="a short run (the test suite's)")
    args = parser.parse_args(argv)
    result = train(20 if args.quick else args.steps)
    exact, numeric = per_example_gradient_check(result.params)
    print(f"one sequence's d(prediction)/d(u[0]): {exact:.8f} (finite differences {numeric:.8f})")
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}")
    return result


if __name__ == "__main__":
    main()
