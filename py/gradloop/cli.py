"""The `gradloop` command line (also `python -m gradloop`).

Each subcommand is registered by one `_add_<name>` function that builds its argument parser and
binds the function that runs it; `main` dispatches. Subcommands: `demo` (the flagship example),
`grad` and `jvp` (an MLIR module in, the module with its gradient or forward-mode function
added out) and `compile` (an MLIR module in, an IREE `.vmfb` out).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Callable, Sequence

from . import errors
from .examples import projectile

__all__ = ["build_parser", "main"]


def _run_demo(args: argparse.Namespace) -> int:
    projectile.main(steps=args.steps, target=args.target, learning_rate=args.lr, plot_to=args.plot)
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
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help="draw each step's flight and the loss per step into FILE (.png, .svg or .pdf; "
        "needs matplotlib: pip install 'gradloop[plot]')",
    )
    parser.set_defaults(run=_run_demo)


def _read(path: str) -> str:
    try:
        return pathlib.Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise errors.InvalidArgumentError(f"cannot read {path}: {e}") from None


def _write(path: str, data: str | bytes) -> None:
    try:
        out = pathlib.Path(path)
        if isinstance(data, bytes):
            out.write_bytes(data)
        else:
            out.write_text(data)
    except OSError as e:
        raise errors.InvalidArgumentError(f"cannot write {path}: {e}") from None


def _indices(text: str) -> tuple[int, ...]:
    try:
        indices = tuple(int(part) for part in text.split(","))
    except ValueError:
        indices = ()
    if not indices or any(i < 0 for i in indices):
        raise argparse.ArgumentTypeError(f"expected argument indices such as 0,1, got {text!r}")
    return indices


def _run_grad(args: argparse.Namespace) -> int:
    from . import mlir

    text = mlir.grad_module(
        _read(args.input),
        args.function,
        args.wrt,
        source=args.input,
        checkpoints=args.checkpoints,
        dialect=args.format,
    )
    _write(args.output, text)
    return 0


def _run_jvp(args: argparse.Namespace) -> int:
    from . import mlir

    text = mlir.jvp_module(
        _read(args.input), args.function, args.wrt, source=args.input, dialect=args.format
    )
    _write(args.output, text)
    return 0


def _derivative_parser(
    commands: argparse._SubParsersAction, name: str, help_text: str, description: str
) -> argparse.ArgumentParser:
    """A subcommand reading IN.mlir and writing OUT.mlir with a derived function added."""
    parser = commands.add_parser(name, help=help_text, description=description)
    parser.add_argument("input", metavar="IN.mlir", help="the module to differentiate")
    parser.add_argument(
        "-o", dest="output", metavar="OUT.mlir", required=True, help="where to write the module"
    )
    parser.add_argument(
        "--function", default="main", help="the function to differentiate (default: %(default)s)"
    )
    parser.add_argument(
        "--wrt",
        type=_indices,
        default=(0,),
        help="comma-separated indices of the arguments to differentiate with respect to "
        "(default: 0)",
    )
    parser.add_argument(
        "--format",
        choices=("iree", "stablehlo"),
        default="iree",
        help="how the added function is written: StableHLO inside scf, as IREE compiles it, "
        "or pure StableHLO (func and stablehlo ops, static shapes, loop gradients in "
        "fixed-size state) for any StableHLO consumer (default: %(default)s)",
    )
    return parser


def _add_grad(commands: argparse._SubParsersAction) -> None:
    parser = _derivative_parser(
        commands,
        "grad",
        "add the gradient function @<function>_grad to a StableHLO module",
        "Reads a StableHLO module (for example one exported from JAX) and writes it "
        "with a public function @<function>_grad added: it takes <function>'s arguments (then "
        "one cotangent per result when there are several results or a non-scalar one) and "
        "returns the gradients with respect to the --wrt arguments.",
    )
    parser.add_argument(
        "--checkpoints",
        type=int,
        default=None,
        metavar="C",
        help="keep C snapshots of each loop's variables instead of stacks: the gradient's "
        "memory does not grow with the trip count (default: stacks)",
    )
    parser.set_defaults(run=_run_grad)


def _add_jvp(commands: argparse._SubParsersAction) -> None:
    parser = _derivative_parser(
        commands,
        "jvp",
        "add the forward-mode function @<function>_jvp to a StableHLO module",
        "Reads a StableHLO module and writes it with a public function @<function>_jvp "
        "added: it takes <function>'s arguments, then one tangent per --wrt argument, and "
        "returns <function>'s results, then the tangent of each float result.",
    )
    parser.set_defaults(run=_run_jvp)


def _run_compile(args: argparse.Namespace) -> int:
    from . import _iree_build

    vmfb = _iree_build.compile_mlir(_read(args.input), args.target, portable=True)
    _write(args.output, vmfb)
    return 0


def _add_compile(commands: argparse._SubParsersAction) -> None:
    from ._iree_build import TARGETS

    parser = commands.add_parser(
        "compile",
        help="compile a StableHLO module into an IREE .vmfb",
        description="Compiles a StableHLO module with IREE into a .vmfb that iree-run-module "
        "runs (for llvm-cpu, for a generic CPU of this architecture; float64 is kept).",
    )
    parser.add_argument("input", metavar="IN.mlir", help="the module to compile")
    parser.add_argument(
        "-o", dest="output", metavar="OUT.vmfb", required=True, help="where to write the .vmfb"
    )
    parser.add_argument(
        "--target",
        default="llvm-cpu",
        choices=sorted(TARGETS),
        help="IREE target backend (default: %(default)s)",
    )
    parser.set_defaults(run=_run_compile)


# One entry per subcommand, in the order `--help` lists them.
_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_demo,
    _add_grad,
    _add_jvp,
    _add_compile,
)


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
