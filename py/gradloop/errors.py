"""The gradloop exception hierarchy.

Every error raised by gradloop is a `GradloopError`. Each class also derives from the builtin
exception a Python user would expect, so `except ValueError` keeps working: shape errors are
`ValueError`s, dtype errors `TypeError`s, out-of-range indices `IndexError`s. The Rust core's
error kinds map one-to-one onto these classes (see `rust/python/src/errors.rs`).
"""

from __future__ import annotations

__all__ = [
    "CompileError",
    "CompileTimeoutError",
    "ControlFlowError",
    "DTypeError",
    "ExecutionError",
    "FormWarning",
    "GradientError",
    "GradientTypeError",
    "GradloopError",
    "GraphError",
    "IndexError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "LinAlgError",
    "ResourceExhaustedError",
    "RetracingWarning",
    "ShapeError",
]

import builtins


class GradloopError(Exception):
    """Base class of every gradloop error."""


class ShapeError(GradloopError, ValueError):
    """Operand shapes do not fit the op (broadcasting, matmul, reshape, ...)."""


class DTypeError(GradloopError, TypeError):
    """A dtype the op does not accept, or operands whose dtypes differ."""


class IndexError(GradloopError, builtins.IndexError):  # noqa: A001 - mirrors the builtin on purpose
    """An index or axis out of range."""


class InvalidArgumentError(GradloopError, ValueError):
    """Any other bad argument value."""


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type or structure (primals or tangents that are not tuples or
    whose structures differ, an `argnums` that is not an int): also a `TypeError`, which JAX's
    users catch for the same mistakes."""


class LinAlgError(InvalidArgumentError):
    """A matrix that a factorisation cannot take, found eagerly: singular for `solve` and
    `inv`, not positive definite for `cholesky` (numpy's `LinAlgError`). Traced and compiled,
    the result holds the inf or NaN that LAPACK gives instead, as JAX's does."""


class ControlFlowError(GradloopError, ValueError, TypeError):
    """cond/switch_case/while_loop functions whose structure, dtypes or shapes disagree, or a
    predicate/index that is not a scalar of the right dtype."""


class GradientError(GradloopError, ValueError, RuntimeError):
    """A gradient that cannot be computed as asked (non-persistent tape reused, integer source,
    non-scalar output of a function passed to `grad`, ...)."""


class GradientTypeError(GradientError, TypeError):
    """A tangent whose dtype does not match its primal's (an integer tangent for a float
    primal, say): also a `TypeError`, as in JAX."""


class GraphError(GradloopError, ValueError):
    """A malformed graph or graph text."""


class CompileError(GradloopError, RuntimeError):
    """The MLIR emitter or the compiler behind it failed."""


class CompileTimeoutError(CompileError, TimeoutError):
    """The compiler did not finish within its time limit (`GRADLOOP_COMPILE_TIMEOUT_S`) and was
    stopped; no form of the module compiled in time."""


class ExecutionError(GradloopError, RuntimeError):
    """A compiled module failed while it ran (IREE's runtime reported an error)."""


class ResourceExhaustedError(GradloopError, MemoryError):
    """An allocation larger than the machine can give: the message names the op, the size
    asked and the user's line. Nothing was changed (numpy raises MemoryError here too)."""


class InternalError(GradloopError, RuntimeError):
    """A bug in gradloop itself; please report it."""


class FormWarning(RuntimeWarning):
    """A compiled module failed as it ran in one form (IREE 3.13 fails some modules in one
    lowering and runs them in another) and was compiled again in the next form, which ran it:
    the same program, so the same results; `gl.jit(...).mlir(...)` shows the form used."""


class RetracingWarning(UserWarning):
    """A `gl.function` traced again for many input signatures (each trace costs time)."""


class TieredCompileWarning(RuntimeWarning):
    """`gl.jit(fn, tiered=True)`: IREE could not compile a signature in the background, so its
    calls keep running on the frame executor (same results, not compiled); the message holds
    the `CompileError` the default `gl.jit` would raise."""
