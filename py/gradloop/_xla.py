"""`gl.jit(fn, backend="xla")`: a function's pure StableHLO (`_stablehlo`) compiled by XLA through
jaxlib (the `gradloop[jax]` extra), on the CPU or, with `target="cuda"`, on a GPU jaxlib sees.

XLA takes a module through `jax.export`: an `Exported` of a stand-in function of the same
signature (zeros of the result types) gets the module's portable artifact in place of its own
(JAX calls the module's public `@main`), and `jax.jit(exported.call)` compiles and runs it. The
signature is the IREE backend's: the tensor arguments, then the captured tensors and the
Variables' values; the results, then the final values of the Variables the function assigns.
Calls run with JAX's 64-bit types on (gradloop's float64 stays float64), without changing the
caller's JAX configuration.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from . import _core, _stablehlo, _validate, errors

#: `gl.jit`'s targets on this backend, and the platform JAX names each.
PLATFORMS = {"llvm-cpu": "cpu", "cuda": "cuda"}


def require_jax(target: str) -> None:
    """Raises unless jaxlib is installed and sees a device for `target`."""
    if target not in PLATFORMS:
        raise errors.InvalidArgumentError(
            _validate.at_user(
                f"gl.jit(backend='xla'): unknown target {target!r}; expected one of "
                f"{list(PLATFORMS)}"
            )
        )
    try:
        import jax
    except ImportError as e:
        raise errors.InvalidArgumentError(
            _validate.at_user(
                "gl.jit(backend='xla') compiles with XLA through jaxlib, which is not installed: "
                f"pip install 'gradloop[jax]' ({e})"
            )
        ) from None
    try:
        jax.devices(PLATFORMS[target])
    except RuntimeError as e:
        raise errors.InvalidArgumentError(
            _validate.at_user(
                f"gl.jit(backend='xla', target={target!r}): jaxlib sees no "
                f"{PLATFORMS[target]} device ({str(e).splitlines()[0]})"
            )
        ) from None


def _types(text: str, name: str) -> tuple[list[Any], list[Any]]:
    """The argument and result types (`jax.ShapeDtypeStruct`s) of `text`'s function `name`."""
    import jax
    from jaxlib.mlir import ir

    with _stablehlo._jax_context():
        module = ir.Module.parse(text)
        for op in module.body.operations:
            if ir.StringAttr(op.attributes["sym_name"]).value == name:
                kind = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
                return (
                    [_spec(jax, t) for t in kind.inputs],
                    [_spec(jax, t) for t in kind.results],
                )
    raise errors.InternalError(f"gl.jit(backend='xla'): the module has no function {name}")


_ELEMENTS = {"f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64", "i1": "bool"}


def _spec(jax: Any, t: Any) -> Any:
    from jaxlib.mlir import ir

    ranked = ir.RankedTensorType(t)
    element = _ELEMENTS.get(str(ranked.element_type))
    if element is None:
        raise errors.InternalError(f"gl.jit(backend='xla'): element type {ranked.element_type}")
    return jax.ShapeDtypeStruct(tuple(ranked.shape), np.dtype(element))


def _as_main(text: str, name: str) -> str:
    """`text` with its public function `name` renamed `main` (what JAX calls), and the calls
    of it; a private function already named `main` is renamed out of the way."""
    quoted = re.escape(name)
    text = re.sub(r"@main\b(?=\()", "@gradloop_main_", text)
    return re.sub(rf'@"?{quoted}"?(?=\()', "@main", text)


def _executable(text: str, name: str, target: str) -> Any:
    """`text`'s public function `name` compiled by XLA for `target`: a callable on numpy arrays
    (run under JAX's 64-bit types)."""
    import jax
    import jax.numpy as jnp

    ins, outs = _types(text, name)
    artifact = _stablehlo.portable_artifact(_as_main(text, name))

    def stand_in(*args: Any) -> tuple[Any, ...]:
        return tuple(jnp.zeros(o.shape, o.dtype) for o in outs)

    with jax.enable_x64(True):
        exported = jax.export.export(jax.jit(stand_in), platforms=[PLATFORMS[target]])(*ins)
        exported = dataclasses.replace(
            exported, mlir_module_serialized=artifact, module_kept_var_idx=tuple(range(len(ins)))
        )
        try:
            return jax.jit(exported.call).lower(*ins).compile()
        except Exception as e:  # XLA's failures are jaxlib's own types
            raise errors.CompileError(
                _validate.at_user(f"compiling {name} with XLA ({target}): {_first_line(e)}")
            ) from None


def load(artifact: bytes, target: str = "llvm-cpu") -> Any:
    """A StableHLO portable artifact (`gl.export(..., format="stablehlo")`) compiled by XLA: a
    callable on numpy arrays, in the artifact's signature, returning numpy arrays."""
    import jax
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    require_jax(target)
    with _stablehlo._jax_context() as context:
        module = stablehlo.deserialize_portable_artifact(context, artifact)
        public = [
            ir.StringAttr(op.attributes["sym_name"]).value
            for op in module.body.operations
            if "sym_visibility" not in op.attributes
            or ir.StringAttr(op.attributes["sym_visibility"]).value == "public"
        ]
        text = str(module)
    if len(public) != 1:
        raise errors.InvalidArgumentError(
            _validate.at_user(f"a StableHLO artifact with one public function; found {public}")
        )
    run = _executable(text, public[0], target)

    def call(*args: Any) -> list[np.ndarray]:
        with jax.enable_x64(True):
            return [np.asarray(r) for r in run(*args)]

    return call


class Compiled:
    """One signature of a function compiled by XLA."""

    def __init__(self, concrete: Any, target: str) -> None:
        self.concrete = concrete
        self.target = target
        self.captured = concrete.captured_inputs
        self.assigned = [self.captured[k] for k in concrete.assigned_variables]
        self.mlir = concrete.to_mlir(embed_captures=False, pure_stablehlo=True)
        self._call = _executable(self.mlir, concrete.graph.entry, target)

    def __call__(self, tensors: list[_core.Tensor]) -> list[_core.Tensor]:
        import jax

        inputs = [np.asarray(t) for t in tensors]
        inputs += [
            np.asarray(c.read() if isinstance(c, _core.VariableHandle) else c)
            for c in self.captured
        ]
        try:
            with jax.enable_x64(True):
                outputs = [np.asarray(r) for r in self._call(*inputs)]
        except Exception as e:  # XLA's failures are jaxlib's own types
            raise errors.ExecutionError(
                _validate.at_user(
                    f"compiled function {self.concrete.graph.entry} (XLA, {self.target}) "
                    f"failed: {_first_line(e)}"
                )
            ) from None
        results = [_core.tensor(r) for r in outputs]
        n = len(results) - len(self.assigned)
        for handle, value in zip(self.assigned, results[n:], strict=True):
            handle.assign(value)
        return results[:n]


def _first_line(e: Exception) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
