"""Per-iteration cost of a data-dependent loop on IREE's CPU drivers: why `gl.jit` runs
llvm-cpu modules on `local-sync` (see `TARGETS` in gradloop/compiled.py).

Usage: python benches/driver_overhead.py [--iterations N] [--repeats R]

The loop is `while i < n: v = v * 0.999 + sin(v) * 1e-3` on 16 float32s, traced and compiled
once by gradloop; each driver runs it with n = 0 and n = N. Per iteration is
(median time at N - median time at 0) / N, so the fixed cost of a call is left out.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import gradloop as gl
from gradloop import _runtime, compiled

DRIVERS = ("local-sync", "local-task")


def loop(x, n):
    body = lambda i, v: (i + 1, v * 0.999 + gl.sin(v) * 1e-3)  # noqa: E731
    return gl.while_loop(lambda i, v: i < n, body, (0, x))[1]


def median_seconds(fn, args, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    opts = parser.parse_args()
    x = np.full(16, 0.5, np.float32)
    mlir = gl.to_mlir(loop, gl.tensor(x), gl.tensor(0))
    vmfb = compiled.compile_mlir(mlir, "llvm-cpu")
    print(f"{'driver':12s} {'call (n=0)':>12s} {'per iteration':>15s}")
    for driver in DRIVERS:
        fn = _runtime.Function(vmfb, driver, "loop")
        fn(x, np.int32(opts.iterations))  # warm up
        fixed = median_seconds(fn, (x, np.int32(0)), 3 * opts.repeats)
        total = median_seconds(fn, (x, np.int32(opts.iterations)), opts.repeats)
        per = (total - fixed) / opts.iterations
        print(f"{driver:12s} {fixed * 1e6:9.1f} us {per * 1e9:12.0f} ns")


if __name__ == "__main__":
    main()
