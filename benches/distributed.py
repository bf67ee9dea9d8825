"""W10: the flagship projectile's `value_and_grad` for 64 launch angles (64 to about 440 loop
trips: a data-dependent `gl.while_loop` each), mapped over a local Ray instance.

    python benches/distributed.py [--repeats 15] [--items 64]

For `gl.jit` and `gl.function` it prints the median seconds of the 64 items run as a
sequential loop in this process, with `gl.distributed.map` on one Ray worker and on two, and
the speed-ups; the cost a padded batch would pay (every lane run to the longest trip count, as
a vmapped loop does), computed from the trip counts; and the map's overhead per item for a
function that does nothing (1,000 items). Ray is started here with `num_cpus=2`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import gradloop as gl
from gradloop.examples import projectile

#: Seconds of calls before timing: actors start, payloads load, modules compile, and Ray's
#: freshly started worker processes finish importing (they take CPU for a few seconds).
WARM_UP = 3.0


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < WARM_UP:
        run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def paired_medians(
    first: Callable[[], object], second: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Median seconds of `first` and `second` timed in turn, so that both see the same
    machine: a shared one's speed drifts by more than the ratios measured here."""
    start = time.perf_counter()
    while time.perf_counter() - start < WARM_UP:
        first()
        second()
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for run, times in zip((first, second), samples, strict=True):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
    return statistics.median(samples[0]), statistics.median(samples[1])


def items(count: int) -> list[tuple[gl.Tensor, gl.Tensor]]:
    thetas = np.linspace(0.04, 1.35, count)
    targets = np.linspace(15.0, 40.0, count)
    pairs = zip(thetas, targets, strict=True)
    return [(gl.tensor(t, dtype=gl.float64), gl.tensor(d, dtype=gl.float64)) for t, d in pairs]


def main() -> None:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--items", type=int, default=64)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    work = items(args.items)
    value_and_grad = gl.value_and_grad(projectile.loss, has_aux=True)
    trips = [int(value_and_grad(*item)[0][1]) for item in work]
    padded = len(trips) * max(trips) / sum(trips)
    print(
        f"W10: {len(work)} items, loop trips {min(trips)} to {max(trips)} (sum {sum(trips)}); "
        f"a padded batch runs {padded:.2f}x the trips\n"
    )
    print(
        "each map timed in turn with the sequential loop (a shared machine's speed drifts);\n"
        "the ratios are those pairs'\n"
    )
    print(
        f"{'':12} {'sequential':>11} {'1 worker':>10} {'2 workers':>10} "
        f"{'1 vs seq':>9} {'2 vs seq':>9}"
    )
    for name, fn in (
        ("gl.jit", gl.jit(value_and_grad)),
        ("gl.function", gl.function(value_and_grad)),
    ):
        sequential, mapped = [], {}
        for workers in (1, 2):
            seq, mapped[workers] = paired_medians(
                lambda fn=fn: [fn(*item) for item in work],
                lambda fn=fn, w=workers: gl.distributed.map(fn, work, workers=w),
                args.repeats,
            )
            sequential.append(seq)
            gl.distributed.shutdown()  # its actors hold the CPUs the next pool needs
        print(
            f"{name:12} {statistics.median(sequential) * 1e3:9.1f}ms {mapped[1] * 1e3:8.1f}ms "
            f"{mapped[2] * 1e3:8.1f}ms {sequential[0] / mapped[1]:8.2f}x "
            f"{sequential[1] / mapped[2]:8.2f}x"
        )
        print(
            f"{'':12} padded batch, estimated from the sequential time: "
            f"{statistics.median(sequential) * padded * 1e3:.1f}ms"
        )
    nothing = gl.jit(lambda x: x)
    noop = [(np.zeros(1),) for _ in range(1000)]
    for chunk in (None, 1):
        seconds = median_seconds(
            lambda c=chunk: gl.distributed.map(nothing, noop, workers=2, chunk_size=c), 3
        )
        what = "auto chunks" if chunk is None else "one item per round trip"
        print(
            f"\nmap overhead per item (a function that does nothing, {what}): "
            f"{seconds / len(noop) * 1e6:.0f} us"
        )
    gl.distributed.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
