"""Pure StableHLO out: modules of `func` and `stablehlo` ops alone, which any StableHLO consumer
reads (XLA through JAX or any PJRT plugin, the StableHLO reference interpreter, IREE with
`--iree-input-type=stablehlo`), and their portable artifacts (versioned bytecode).

The emitter writes such a module with `pure_stablehlo` (`rust/core/src/mlir/`): rank-0 values
stay tensors, `While`/`If`/`Case` become `stablehlo.while`/`if`/`case`, shapes are static. A loop
gradient needs fixed-size state, so the function is traced with every loop gradient in it
keeping snapshots (`Function.fixed_state_function`): the loop's `checkpoints`, else one per
possible trip when `maximum_iterations` bounds the loop by at most 4096 trips
(`ALL_STATES_UP_TO` in `control/while_loop`), else `DEFAULT_CHECKPOINTS`.
What cannot be expressed (a dynamic shape, a loop gradient whose body assigns a Variable) is a
`CompileError` naming the op and the user's line.

Portable artifacts are written through jaxlib's StableHLO bindings (`gradloop[jax]`), the
StableHLO Python API this environment provides; IREE's Python package has none.
"""

from __future__ import annotations

from typing import Any

from . import _validate, errors
from .function import Function

#: Snapshots a loop gradient keeps in pure StableHLO when its loop has neither
#: `maximum_iterations` nor `checkpoints`: memory c states whatever the trip count, about
#: 5 body evaluations per trip at 10^5 trips (`_checkpoints.evaluations`).
DEFAULT_CHECKPOINTS = 100


def module(fn: Function, *args: Any, **kwargs: Any) -> str:
    """`fn` traced for these arguments as a pure StableHLO module (captured tensors embedded as
    constants), with its public function named after `fn`."""
    concrete = fn.fixed_state_function(DEFAULT_CHECKPOINTS, *args, **kwargs)
    return concrete.to_mlir(embed_captures=True, pure_stablehlo=True)


def _jax_context() -> Any:
    """An MLIR context with the dialects of JAX's own modules (func, stablehlo, ...)."""
    try:
        from jax._src.interpreters import mlir as jax_mlir
    except ImportError as e:
        raise errors.InvalidArgumentError(
            _validate.at_user(
                "a StableHLO portable artifact is written through jaxlib's StableHLO bindings: "
                f"install JAX (pip install 'gradloop[jax]'); {e}"
            )
        ) from None
    return jax_mlir.make_ir_context()


def portable_artifact(text: str) -> bytes:
    """`text` (a pure StableHLO module) as a StableHLO portable artifact: versioned bytecode
    at the version JAX's own exports use (12 weeks of forward compatibility), which StableHLO
    guarantees readable for 5 years."""
    with _jax_context():
        from jaxlib.mlir.dialects import stablehlo

        requirement = stablehlo.StablehloCompatibilityRequirement.WEEK_12
        version = stablehlo.get_version_from_compatibility_requirement(requirement)
        try:
            return stablehlo.serialize_portable_artifact_str(text, version)
        except Exception as e:  # jaxlib raises a plain ValueError naming the failed op
            raise errors.CompileError(
                _validate.at_user(f"serializing the StableHLO module failed: {e}")
            ) from None
