"""Fit a launch angle by gradient descent through a data-dependent while_loop.

A thin runner: the example lives in the package as `gradloop.examples.projectile` (so that the
installed `gradloop demo` command finds it). Usage: `python examples/projectile.py [--steps N]`.
"""

from __future__ import annotations

import sys

from gradloop.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["demo", *sys.argv[1:]]))
