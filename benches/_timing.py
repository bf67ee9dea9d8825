"""The benches' shared timing: medians over repeated calls after warm-up calls, of one call
alone (`median_time`) or of several called in turn (`medians`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of `repeats` calls of `fn`, after three calls that trace and compile (graph
    mode compiles a root frame to machine code at its third run)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def medians(
    columns: dict[str, Callable[[], object]],
    repeats: int,
    warmups: int = 1,
    settle: int = 0,
    block: int = 1,
) -> dict[str, float]:
    """Each column's median seconds per call, the columns called in turn within each repeat
    (`warmups` calls each first), so that the machine's drift falls on all of them alike. In a
    repeat each column makes `settle` untimed calls, then `block` timed ones: on a machine of
    few cores, a call just after another library's finds that library's threads still spinning
    and its own caches cold."""
    for call in columns.values():
        for _ in range(warmups):
            call()
    times: dict[str, list[float]] = {k: [] for k in columns}
    for _ in range(repeats):
        for name, call in columns.items():
            for _ in range(settle):
                call()
            for _ in range(block):
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}
