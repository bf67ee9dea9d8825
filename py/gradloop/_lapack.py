"""JAX's LAPACK custom calls read as gradloop's own factorisations.

On CPU, JAX exports `jnp.linalg.solve`, `cholesky`, `jax.scipy.linalg.lu_factor` and
`solve_triangular` (and so Lineax's LU solves and Optimistix's Newton steps) as
`stablehlo.custom_call @lapack_?getrf_ffi`, `@lapack_?trsm_ffi`, `@lapack_?potrf_ffi` (and
`jnp.linalg.qr` as `@lapack_?geqrf_ffi` and `@lapack_?orgqr_ffi`): opaque
to the importer, to IREE and to any other StableHLO consumer. Before a module is imported
(`gl.mlir.grad`, `gl.mlir.jvp`, `gl.jax.differentiable`), each such call becomes a `func.call`
of a private function that computes what LAPACK's routine returns with the loops of
`gl.linalg` (emitted as pure StableHLO by `gl.to_mlir`), so it is read, differentiated and
compiled like any other code.

What each returns, as the routines do (logical shapes; the calls' layouts only say how LAPACK
sees memory): `getrf(a)` the packed LU factors, the 1-based row swaps and `info` (0, or 1 where
U has a zero on its diagonal); `trsm(a, b)` the solution of `op(T) x = b` (side L) or
`x op(T) = b` (side R) for the triangle `uplo` of `a`, with `op` the transpose when `trans_x` is
T or C and ones on the diagonal when `diag` is U; `potrf(a)` the Cholesky factor in the
triangle `uplo` (the other triangle of `a` kept, as LAPACK leaves it) and `info` (0, or 1 where
`a` is not positive definite: JAX only asks whether it is 0); `geqrf(a)` Householder QR packed
as LAPACK packs it (`r` above, the reflections scaled to a leading one below) and its `taus`;
`orgqr(packed, taus)` the first columns of the reflections' product. LU of a rectangular matrix
is not read: it stays an error naming the call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core, errors

_ROUTINES = ("getrf", "trsm", "potrf", "geqrf", "orgqr")
_TARGETS = {f"lapack_{p}{r}_ffi": r for p in "sd" for r in _ROUTINES}


def replace_lapack_calls(ir: Any, module: Any) -> None:
    """Replaces, in place, every LAPACK custom call of `module` that gradloop reads (within
    an active `ir.Context`)."""
    from iree.compiler.dialects import func

    calls = [op for op in _operations(module.operation) if _target(op) in _TARGETS]
    made: dict[tuple, str] = {}
    for op in calls:
        routine = _TARGETS[_target(op)]
        config = _backend_config(op)
        types = [_tensor_type(ir, v.type) for v in op.operands]
        results = [_tensor_type(ir, r.type) for r in op.results]
        key = (routine, tuple(sorted(config.items())), tuple(map(str, types)))
        name = made.get(key)
        if name is None:
            name = f"gl_lapack_{routine}_{len(made)}"
            fn = _definition(routine, config, types, results, op)
            _add_function(ir, module, name, fn, types)
            made[key] = name
        with ir.InsertionPoint(op), op.location:
            call = func.CallOp([r.type for r in op.results], name, list(op.operands))
        for old, new in zip(op.results, call.results, strict=True):
            old.replace_all_uses_with(new)
        op.erase()


def _operations(op: Any) -> list[Any]:
    found = []
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                found.append(inner.operation)
                found.extend(_operations(inner.operation))
    return found


def _target(op: Any) -> str | None:
    if op.name != "stablehlo.custom_call" or "call_target_name" not in op.attributes:
        return None
    return str(op.attributes["call_target_name"]).strip('"')


def _backend_config(op: Any) -> dict[str, str]:
    """`mhlo.backend_config`'s flags as letters (`uplo = 76 : ui8` is "L")."""
    if "mhlo.backend_config" not in op.attributes:
        return {}
    config = op.attributes["mhlo.backend_config"]
    out = {}
    for named in config:
        text = str(named.attr).split(":")[0].strip()
        out[named.name] = chr(int(text)) if text.isdigit() else text
    return out


def _tensor_type(ir: Any, t: Any) -> tuple[str, tuple[int, ...]]:
    ranked = ir.RankedTensorType(t)
    dtype = {"f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64"}.get(
        str(ranked.element_type)
    )
    if dtype is None:
        raise errors.CompileError(f"a LAPACK call on {t}: only f32 and f64 are read")
    return dtype, tuple(ranked.shape)


def _definition(routine: str, config: dict[str, str], types: list, results: list, op: Any) -> Any:
    """The routine as a gradloop function of the call's operands."""
    from .linalg import _loops

    def mt(x: Any) -> Any:
        return _core.transpose(x, [*range(x.ndim - 2), x.ndim - 1, x.ndim - 2])

    def typed_as(value: Any, result: tuple[str, tuple[int, ...]]) -> Any:
        return _core.cast(value, result[0])

    if routine == "getrf":
        ((_, shape),) = types
        if shape[-1] != shape[-2]:
            raise errors.CompileError(
                f"{_target(op)}: only square matrices are read, got {list(shape)}"
            )

        def getrf(a: Any) -> Any:
            lu, piv, _ = _loops.lu_factor(a)
            n = shape[-1]
            eye = _core.tensor(np.eye(n, dtype=bool))
            diagonal = _core.sum(_core.where(eye, lu, 0.0), axis=-1)
            zero = _core.max(_core.cast(_core.equal(diagonal, 0.0), "int32"), axis=-1)
            return lu, typed_as(piv + 1, results[1]), typed_as(zero, results[2])

        return getrf

    if routine == "geqrf":
        return _loops.householder_packed
    if routine == "orgqr":
        return _loops.householder_product
    if routine == "potrf":
        lower = config.get("uplo", "L") == "L"
        ((_, shape),) = types
        n = shape[-1]

        def potrf(a: Any) -> Any:
            low = _loops.cholesky(a if lower else mt(a))
            factor = low if lower else mt(low)
            mask = np.tri(n, n, 0, dtype=bool) if lower else ~np.tri(n, n, -1, dtype=bool)
            out = _core.where(_core.tensor(mask), factor, a)
            # the factor is NaN throughout where `a` is not positive definite
            diagonal = _core.sum(
                _core.where(_core.tensor(np.eye(n, dtype=bool)), low, 0.0), axis=-1
            )
            good = _core.min(_core.cast(_core.greater(diagonal, 0.0), "int32"), axis=-1)
            return out, typed_as(1 - good, results[1])

        return potrf

    lower = config.get("uplo", "L") == "L"
    unit = config.get("diag", "N") == "U"
    transposed = config.get("trans_x", "N") in ("T", "C")
    left = config.get("side", "L") == "L"

    def trsm(a: Any, b: Any) -> Any:
        # op(T) x = b: with op the transpose, T^T is lower where T is upper
        t, low = (mt(a), not lower) if transposed else (a, lower)
        if left:
            return _loops.triangular(t, b, low, unit)
        # x op(T) = b  <=>  op(T)^T x^T = b^T
        return mt(_loops.triangular(mt(t), mt(b), not low, unit))

    return trsm


def _add_function(ir: Any, module: Any, name: str, fn: Any, types: list) -> None:
    """`fn` on zeros of `types`, emitted as pure StableHLO, added to `module` as the private
    function `name`."""
    from .compiled import to_mlir

    examples = [_core.zeros(list(shape), dtype=dtype) for dtype, shape in types]
    emitted = ir.Module.parse(to_mlir(fn, *examples, dialect="stablehlo"))
    functions = [op.operation for op in emitted.body.operations]
    if len(functions) != 1:
        raise errors.InternalError(f"{name}: the routine emitted {len(functions)} functions")
    (definition,) = functions
    definition.attributes["sym_name"] = ir.StringAttr.get(name)
    definition.attributes["sym_visibility"] = ir.StringAttr.get("private")
    definition.detach_from_parent()
    module.body.append(definition)
