"""How far a fresh process's resident memory peaks: the memory tests' common runner."""

from __future__ import annotations

import subprocess
import sys


def peak_growth_mb(program: str, *args: str, timeout: float) -> tuple[float, float]:
    """Runs `program` (Python source) in a fresh interpreter with `args`. It prints how far its
    peak resident size grew, in kB (after resetting the peak with Linux's
    `/proc/self/clear_refs`), and a number it computed: returns the growth in MB and that
    number."""
    out = subprocess.run(
        [sys.executable, "-c", program, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    grown_kb, value = out.stdout.split()
    return int(grown_kb) / 1024, float(value)
