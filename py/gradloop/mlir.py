"""MLIR in, derivatives out: `gl.mlir.grad(text, function="main", wrt=(0,))` and
`gl.mlir.jvp(text, function="main", wrt=(0,))`.

The module (StableHLO, as `jax.jit(f).lower(...).as_text()` writes it, with `stablehlo.while`,
`stablehlo.if`, `stablehlo.case`, `func.call`s, and the `scf` forms `scf.while`, `scf.if`,
`scf.index_switch`, and JAX's LAPACK custom calls for LU, triangular solves and Cholesky, read
as `gl.linalg`'s loops) is parsed and verified by MLIR's own Python bindings (from
`iree-base-compiler`), printed in MLIR's generic form, and imported by the Rust core into the
graph IR, where the gradient is the same program transform as for traced Python: a loop's
gradient is a loop that runs the trip count backwards over stacks of the forward intermediates
(reverse mode through data-dependent loops, which JAX refuses). The gradient function is
emitted as MLIR and added to the module, which is printed back (without location info).
Forward mode (`jvp`) is the same import and emission around the tangent transform: a loop's
tangent is a loop carrying tangents beside its variables.

Errors: text that does not parse or verify, an op or type the importer does not support (named
with its `file:line:col`) are `CompileError`s; an integer argument in `wrt` is a
`GradientError`, an index out of range an `IndexError`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from . import _core, _validate, errors
from ._lapack import replace_lapack_calls

__all__ = ["grad", "jvp", "supported_ops"]

# `loc("-":3:5)`: where MLIR's parser puts text parsed from memory.
_MEMORY_LOC = re.compile(r'loc\("-":(\d+):(\d+)\)')


def supported_ops() -> list[str]:
    """Names of the MLIR ops the importer converts."""
    return list(_core.mlir_supported_ops())


def grad(
    mlir_text: str,
    function: str = "main",
    wrt: Sequence[int] = (0,),
    *,
    checkpoints: int | None = None,
    dialect: str = "iree",
) -> str:
    """The module `mlir_text` with a public function `@<function>_grad` added.

    `@<function>_grad` takes `@<function>`'s arguments, followed by one cotangent per result
    when `@<function>` has a non-scalar result or several results (a single scalar result is
    seeded with 1), and returns the gradients with respect to the arguments `wrt` (indices),
    in that order. The rest of the module is unchanged.

    With `checkpoints=c`, the gradient of every loop keeps c snapshots of the loop variables
    and recomputes trips from them (as `while_loop(..., checkpoints=c)`): no stacks, so its
    memory does not grow with the trip count and every shape is static.

    `dialect="stablehlo"` writes `@<function>_grad` as `func` and `stablehlo` ops alone (as
    `gl.to_mlir(..., dialect="stablehlo")`): a module exported from JAX comes back pure
    StableHLO, for XLA or any StableHLO consumer; loops keep `checkpoints` snapshots
    (`gradloop._stablehlo.DEFAULT_CHECKPOINTS` when None).
    """
    return grad_module(
        mlir_text, function, wrt, source="<mlir>", checkpoints=checkpoints, dialect=dialect
    )


def jvp(
    mlir_text: str, function: str = "main", wrt: Sequence[int] = (0,), *, dialect: str = "iree"
) -> str:
    """The module `mlir_text` with a public function `@<function>_jvp` added.

    `@<function>_jvp` takes `@<function>`'s arguments followed by one tangent per argument in
    `wrt` (each typed as its argument), and returns `@<function>`'s results followed by the
    tangent of each float result (integer results have none). Data-dependent loops are
    differentiated forward: memory does not grow with their trip count. The rest of the
    module is unchanged. `dialect="stablehlo"` writes `@<function>_jvp` as pure StableHLO.
    """
    return jvp_module(mlir_text, function, wrt, source="<mlir>", dialect=dialect)


def jvp_module(
    text: str, function: str, wrt: Sequence[int], source: str, dialect: str = "iree"
) -> str:
    """`jvp`, naming the text `source` in error locations."""
    pure = _pure("gl.mlir.jvp", dialect)

    def derive(text: str, function: str, wrt: list[int], source: str) -> str:
        return _core.mlir_jvp_module(text, function, wrt, source, pure)

    return _derived(text, function, wrt, source, derive)


def grad_module(
    text: str,
    function: str,
    wrt: Sequence[int],
    source: str,
    checkpoints: int | None = None,
    dialect: str = "iree",
) -> str:
    """`grad`, naming the text `source` in error locations (the command line passes the
    file name)."""
    c = _validate.check_checkpoints("gl.mlir.grad", checkpoints)
    pure = _pure("gl.mlir.grad", dialect)
    # pure StableHLO needs fixed-size state: without the user's checkpoints each loop picks
    # its own (a row per trip while they fit, as `gl.jit(backend="xla")` does)
    fixed = None
    if pure and c is None:
        from ._stablehlo import DEFAULT_CHECKPOINTS

        fixed = DEFAULT_CHECKPOINTS

    def derive(text: str, function: str, wrt: list[int], source: str) -> str:
        return _core.mlir_gradient_module(text, function, wrt, source, c, pure, fixed)

    return _derived(text, function, wrt, source, derive)


def _pure(fn: str, dialect: str) -> bool:
    """Whether `dialect` asks for pure StableHLO ("stablehlo") or IREE's form ("iree")."""
    if dialect not in ("iree", "stablehlo"):
        raise errors.InvalidArgumentError(
            _validate.at_user(f"{fn}: unknown dialect {dialect!r}; expected 'iree' or 'stablehlo'")
        )
    return dialect == "stablehlo"


def _derived(text: str, function: str, wrt: Sequence[int], source: str, derive: Any) -> str:
    """`text` with the function `derive` (a core transform over the generic form) adds."""
    if not isinstance(text, str):
        raise errors.InvalidArgumentError(
            _validate.at_user(f"mlir_text must be a str, got {type(text).__name__}")
        )
    if not isinstance(function, str):
        raise errors.InvalidArgumentError(
            _validate.at_user(f"function must be a str, got {type(function).__name__}")
        )
    indices = _wrt_indices(wrt)
    ir = _bindings()
    with ir.Context() as context:
        # JAX's exports annotate custom calls with Shardy's attributes (`sdy`), a dialect the
        # bindings lack: kept opaque (the importer still refuses any unknown op by name)
        context.allow_unregistered_dialects = True
        module = _parse(ir, text, source)
        # LAPACK's custom calls become calls of gl.linalg's loops (`_lapack`)
        replace_lapack_calls(ir, module)
        generic = module.operation.get_asm(
            print_generic_op_form=True, use_local_scope=True, enable_debug_info=True
        )
    combined = derive(generic, function, indices, source)
    with ir.Context():
        # The core's output is parsed and verified again: a malformed gradient is our bug.
        module = _parse(ir, combined, "the derived module", internal=True)
        return str(module.operation.get_asm(assume_verified=True))


def _wrt_indices(wrt: Sequence[int]) -> list[int]:
    items = (wrt,) if isinstance(wrt, int) else wrt
    try:
        indices = list(items)
    except TypeError:
        indices = None
    if indices is None or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices
    ):
        raise errors.InvalidArgumentError(
            _validate.at_user(f"wrt must be argument indices (ints >= 0), got {wrt!r}")
        )
    return indices


def _bindings() -> Any:
    try:
        from iree.compiler import ir
    except ImportError as e:  # pragma: no cover - a dependency of compiled mode
        raise errors.CompileError(
            "gl.mlir needs the MLIR bindings of iree-base-compiler (pip install "
            f"iree-base-compiler): {e}"
        ) from None
    return ir


def _parse(ir: Any, text: str, source: str, internal: bool = False) -> Any:
    """The parsed and verified module; MLIR's diagnostics become a CompileError."""
    try:
        module = ir.Module.parse(text)
        module.operation.verify()
    except ir.MLIRError as e:
        where = [_diagnostic(d, source) for d in e.error_diagnostics] or [str(e)]
        if internal:
            raise errors.InternalError(
                "the derived module does not verify (please report):\n" + "\n".join(where)
            ) from None
        raise errors.CompileError(_validate.at_user("invalid MLIR:\n" + "\n".join(where))) from None
    return module


def _diagnostic(d: Any, source: str) -> str:
    """`source:line:col: message` for one MLIR diagnostic (notes indented below it)."""
    loc = _MEMORY_LOC.sub(lambda m: f"{source}:{m[1]}:{m[2]}", str(d.location))
    loc = loc.removeprefix("loc(").removesuffix(")") if loc.startswith("loc(") else loc
    lines = [f"  {loc}: {d.message}"]
    lines += ["  " + _diagnostic(n, source) for n in getattr(d, "notes", ())]
    return "\n".join(lines)
