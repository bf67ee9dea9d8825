"""Fit a launch angle by gradient descent through a data-dependent while_loop.

A thin runner: the example lives in the package as `gradloop.examples.projectile` (so that the
installed `gradloop demo` command finds it). Usage: `python examples/projectile.py [--steps N]`
(the options of `gradloop demo`). Run from a checkout, it keeps the exported module in
`build/demo/` (git-ignored) so that `iree-run-module` can run it again afterwards.
"""

from __future__ import annotations

import pathlib
import sys

from gradloop.cli import build_parser
from gradloop.examples import projectile

EXPORT_DIR = pathlib.Path(__file__).resolve().parent.parent / "build" / "demo"

if __name__ == "__main__":
    args = build_parser().parse_args(["demo", *sys.argv[1:]])
    projectile.main(
        steps=args.steps, target=args.target, learning_rate=args.lr, export_dir=EXPORT_DIR
    )
