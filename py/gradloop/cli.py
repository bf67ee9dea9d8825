"""The `gradloop` command line (also `python -m gradloop`).

Each subcommand is registered by one `_add_<name>` function that builds its argument parser and
binds the function that runs it; `main` dispatches. Subcommands: `demo` (the flagship example).
`grad` and `compile` (MLIR in, MLIR or `.vmfb` out) join them in later versions.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from . import errors
from .examples import projectile

__all__ = ["build_parser", "main"]


def _run_demo(args: argparse.Namespace) -> int:
    projectile.main(steps=args.steps, target=args.target, learning_rate=args.lr)
    return 0


def _add_demo(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="fit a launch angle by gradient descent through a data-dependent while_loop",
        description=projectile.__doc__.split("\n\n")[0] if projectile.__doc__ else None,
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=projectile.DEFAULT_STEPS,
        help="gradient descent steps (default: %(default)s)",
    )
    parser.add_argument(
        "--target",
        type=float,
        default=projectile.DEFAULT_TARGET,
        help="target landing distance in metres (default: %(default)s)",
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=projectile.DEFAULT_LEARNING_RATE,
        help="learning rate in rad/m^2 (default: %(default)s)",
    )
    parser.set_defaults(run=_run_demo)


# One entry per subcommand, in the order `--help` lists them.
_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (_add_demo,)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `gradloop` command with every subcommand registered."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="gradloop",
        description="Differentiable dynamic control flow for numerical Python.",
    )
    parser.add_argument("--version", action="version", version=f"gradloop {__version__}")
    commands = parser.add_subparsers(title="commands", dest="command", required=True)
    for add in _SUBCOMMANDS:
        add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the process exit status (0 on success)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except errors.GradloopError as exc:
        print(f"gradloop {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
