"""JAX interop: `jax.grad` through JAX's own data-dependent loops (`gradloop[jax]`).

JAX refuses reverse mode through a `lax.while_loop` whose trip count depends on the data
("Reverse-mode differentiation does not work for lax.while_loop ..."). gradloop differentiates
the StableHLO JAX exports and hands the result back in JAX's terms:

- `with_vjp(exported)`: a `jax.export.Exported` whose VJP (JAX's convention: the primals, then
  one cotangent per output, in; one cotangent per input out) is gradloop's reverse-mode
  derivative of its module, written as pure StableHLO (`gl.mlir.grad(..., dialect=
  "stablehlo")`; loop gradients keep checkpoints). `jax.grad(exported.call)` then works,
  eagerly and under `jax.jit`, survives `serialize(vjp_order=k)` and `jax.export.deserialize`,
  and to any order: each VJP has its own VJP, built the same way.
- `differentiable(f)`: a decorator that exports `f` per input signature (cached) and calls it
  through `with_vjp`, so that `jax.grad`, `jax.value_and_grad` and `jax.vjp` work on it.

Integer inputs get float0 cotangents, integer outputs take them, as JAX's own VJPs do.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import tree_util

from . import _stablehlo, _validate, errors
from . import mlir as _mlir

__all__ = ["differentiable", "with_vjp"]


def with_vjp(exported: jax.export.Exported, *, checkpoints: int | None = None) -> Any:
    """`exported` with gradloop's VJP: `jax.grad(result.call)` differentiates through its
    data-dependent loops. `checkpoints` is what each loop's gradient keeps (default
    `gradloop._stablehlo.DEFAULT_CHECKPOINTS`)."""
    if not isinstance(exported, jax.export.Exported):
        raise errors.InvalidArgumentTypeError(
            _validate.at_user(
                f"with_vjp takes a jax.export.Exported, got {type(exported).__name__}"
            )
        )
    if exported.uses_global_constants or len(exported.platforms) != 1:
        raise errors.InvalidArgumentError(
            _validate.at_user(
                "with_vjp needs a module exported for one platform with static shapes "
                f"(platforms {exported.platforms}, shape polymorphism "
                f"{exported.uses_global_constants})"
            )
        )
    built: list[jax.export.Exported] = []

    def get_vjp(e: jax.export.Exported) -> jax.export.Exported:
        # JAX asks for the VJP at every backward pass, and compiles each new `Exported` it
        # calls: one VJP per module, so that JAX's cache of compiled calls finds it again.
        if not built:
            built.append(_vjp(e, checkpoints))
        return built[0]

    return dataclasses.replace(exported, _get_vjp=get_vjp)


def differentiable(f: Callable[..., Any] | None = None, *, checkpoints: int | None = None) -> Any:
    """Decorator: `f` (a JAX function) exported once per input signature and called through
    `with_vjp`, so that `jax.grad`, `jax.value_and_grad` and `jax.vjp` work through its
    data-dependent `lax.while_loop`s. Usable as `@differentiable` or
    `@differentiable(checkpoints=c)`.

    `jax.vmap` works on it too, and on its gradients (`jax.vmap(jax.grad(f))`: per-example
    gradients through loops whose trip counts differ per example). JAX cannot batch a call
    of an exported module, so under `vmap` the module is exported again from `jax.vmap(f)`,
    every argument batched, and its VJP is that module's."""
    if f is None:
        return lambda g: differentiable(g, checkpoints=checkpoints)
    source = _Function(f, checkpoints)

    @functools.wraps(f)
    def call(*args: Any) -> Any:
        leaves, tree = tree_util.tree_flatten(args)
        flat = _Function(lambda *xs: f(*tree_util.tree_unflatten(tree, xs)), checkpoints)
        found = source.flats.setdefault(tree, flat)
        out_tree: list[Any] = []
        outs = _run(found, [jax.numpy.asarray(x) for x in leaves], out_tree)
        return tree_util.tree_unflatten(out_tree[0], outs)

    return call


class _Function:
    """A JAX function of flat arrays whose calls run its exported module (`with_vjp`), with
    the same function over a leading batch axis of every argument (`batched`) and its VJP
    (`vjp`) built alike: what `_run` needs to batch and differentiate the calls."""

    def __init__(self, fn: Callable[..., Any], checkpoints: int | None) -> None:
        self.fn, self.checkpoints = fn, checkpoints
        self.flats: dict[Any, _Function] = {}
        self._exported: dict[Any, jax.export.Exported] = {}
        self._batched: _Function | None = None
        self._vjps: dict[int, _Vjp] = {}

    def exported(self, args: list[Any]) -> jax.export.Exported:
        return self.for_specs(tuple(jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in args))

    def for_specs(self, specs: tuple[Any, ...]) -> jax.export.Exported:
        found = self._exported.get(specs)
        if found is None:
            found = self._export(specs)
            self._exported[specs] = found
        return found

    def _export(self, specs: tuple[Any, ...]) -> jax.export.Exported:
        return with_vjp(jax.export.export(jax.jit(self.fn))(*specs), checkpoints=self.checkpoints)

    def batched(self) -> _Function:
        if self._batched is None:
            self._batched = _Function(jax.vmap(self.fn), self.checkpoints)
        return self._batched

    def vjp(self, arity: int) -> _Vjp:
        """The VJP of calls with `arity` arguments."""
        found = self._vjps.get(arity)
        if found is None:
            found = self._vjps[arity] = _Vjp(self, arity)
        return found


class _Vjp(_Function):
    """The VJP of `primal`'s calls with `arity` arguments (those arguments, then one cotangent
    per output -> one cotangent per argument): the VJP module of `primal`'s module (built once
    per module: `with_vjp`'s). Over a batch axis of every argument it is the VJP of `primal`
    batched, each lane's own."""

    def __init__(self, primal: _Function, arity: int) -> None:
        super().__init__(primal.fn, primal.checkpoints)
        self.primal, self.arity = primal, arity

    def _export(self, specs: tuple[Any, ...]) -> jax.export.Exported:
        module = self.primal.for_specs(specs[: self.arity])
        return module._get_vjp(module)  # the VJP `with_vjp` gave it, built once

    def batched(self) -> _Function:
        if self._batched is None:
            self._batched = self.primal.batched().vjp(self.arity)
        return self._batched


def _run(source: _Function, args: list[Any], out_tree: list[Any] | None = None) -> list[Any]:
    """`source` called on `args` through its exported module: batched by exporting
    `source.batched()` (`custom_vmap`), differentiated by `source.vjp()` (`custom_vjp`), each
    of which is called the same way, to any depth."""
    exported = source.exported(args)
    if out_tree is not None:
        out_tree.append(exported.out_tree)

    @jax.custom_vjp
    @jax.custom_batching.custom_vmap
    def run(*xs: Any) -> Any:
        return tuple(tree_util.tree_leaves(exported.call(*xs)))

    @run.def_vmap
    def run_over_lanes(axis_size: int, in_batched: list[bool], *xs: Any) -> Any:
        lanes = [x if b else _broadcast(x, axis_size) for x, b in zip(xs, in_batched, strict=True)]
        outs = tuple(_run(source.batched(), lanes))
        return outs, (True,) * len(outs)

    def forward(*xs: Any) -> Any:
        return run(*xs), xs

    def backward(xs: Any, cotangents: Any) -> Any:
        return tuple(_run(source.vjp(len(xs)), [*xs, *cotangents]))

    run.defvjp(forward, backward)
    return list(run(*args))


def _broadcast(x: Any, n: int) -> Any:
    if x.dtype == jax.dtypes.float0:
        return np.zeros((n, *np.shape(x)), jax.dtypes.float0)
    return jax.numpy.broadcast_to(x, (n, *np.shape(x)))


def _vjp(exported: jax.export.Exported, checkpoints: int | None) -> jax.export.Exported:
    """The VJP of `exported` as an `Exported`: a module whose `@main` takes every primal input
    and the float outputs' cotangents and returns one cotangent per input (float0 as `i1`
    false for integer inputs), calling gradloop's `@main_grad` of the primal module."""
    ins, outs = exported.in_avals, exported.out_avals
    kept = list(exported.module_kept_var_idx)
    floats = [k for k in kept if _is_float(ins[k])]
    text = exported.mlir_module()
    grad = _mlir.grad(
        text,
        function="main",
        wrt=[kept.index(k) for k in floats],
        checkpoints=checkpoints,
        dialect="stablehlo",
    )
    module = _wrap(grad, ins, outs, kept, floats)
    ct_avals = [a.to_tangent_aval() for a in outs]
    vjp_ins = (*ins, *ct_avals)
    vjp_outs = tuple(a.to_tangent_aval() for a in ins)
    vjp_kept = tuple(k for k, a in enumerate(vjp_ins) if a.dtype != jax.dtypes.float0)
    nothing = (None,) * len(vjp_ins), (None,) * len(vjp_outs)
    vjp = dataclasses.replace(
        exported,
        fun_name=f"{exported.fun_name}_vjp",
        in_tree=tree_util.tree_structure((tuple(range(len(vjp_ins))), {})),
        out_tree=tree_util.tree_structure(tuple(range(len(vjp_outs)))),
        in_avals=vjp_ins,
        out_avals=vjp_outs,
        in_shardings_hlo=nothing[0],
        out_shardings_hlo=nothing[1],
        _in_named_shardings=nothing[0],
        _out_named_shardings=nothing[1],
        mlir_module_serialized=_stablehlo.portable_artifact(module),
        module_kept_var_idx=vjp_kept,
        _get_vjp=None,
    )
    return with_vjp(vjp, checkpoints=checkpoints)


def _is_float(aval: Any) -> bool:
    return np.issubdtype(aval.dtype, np.floating)


def _type(aval: Any) -> str:
    dtype = "i1" if aval.dtype == jax.dtypes.float0 else _ELEMENT[np.dtype(aval.dtype).name]
    return f"tensor<{''.join(f'{d}x' for d in aval.shape)}{dtype}>"


_ELEMENT = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "ui8",
    "uint32": "ui32",
    "uint64": "ui64",
    "bool": "i1",
}


def _wrap(grad: str, ins: Any, outs: Any, kept: list[int], floats: list[int]) -> str:
    """`grad` (the primal module with `@main_grad`) with a new public `@main` in JAX's VJP
    convention; the primal `@main` and `@main_grad` become private."""
    # each order of derivative wraps the last: its own names
    level = grad.count("func.func private @gradloop_primal")
    primal, derivative = f"gradloop_primal{level}", f"gradloop_grad{level}"
    body = grad.replace("func.func public @main(", f"func.func private @{primal}(")
    body = body.replace("func.func @main(", f"func.func private @{primal}(")
    body = body.replace("@main_grad(", f"@{derivative}(").replace(
        f"func.func @{derivative}(", f"func.func private @{derivative}("
    )
    body = body.replace("call @main(", f"call @{primal}(")
    scalar_seed = len(outs) == 1 and outs[0].shape == () and _is_float(outs[0])
    params, grad_args, lines = [], [], []
    for k, a in enumerate(ins):
        if a.dtype != jax.dtypes.float0:  # JAX passes no float0 argument (`vjp_kept`)
            params.append(f"%p{k}: {_type(a)}")
    grad_args += [f"%p{k}" for k in kept]
    cts = []
    for j, a in enumerate(outs):
        if a.to_tangent_aval().dtype == jax.dtypes.float0:
            cts.append(None)
        else:
            params.append(f"%c{j}: {_type(a.to_tangent_aval())}")
            cts.append(f"%c{j}")
    if not scalar_seed:
        for j, a in enumerate(outs):
            if cts[j] is None:  # an integer result's cotangent: unused by the gradient
                lines.append(f"%z{j} = stablehlo.constant dense<0> : {_type(a)}")
                grad_args.append(f"%z{j}")
            else:
                grad_args.append(cts[j])
    grad_types = [_type(ins[k]) for k in floats]
    arg_types = [_type(ins[k]) for k in kept]
    if not scalar_seed:
        arg_types += [_type(a) for a in outs]
    call = f"call @{derivative}({', '.join(grad_args)}) : ({', '.join(arg_types)}) -> "
    call += f"({', '.join(grad_types)})"
    if grad_types:
        lines.append(f"%g:{len(grad_types)} = {call}" if len(grad_types) > 1 else f"%g = {call}")
    results, types = [], []
    for k, a in enumerate(ins):
        t = _type(a.to_tangent_aval())
        if k in floats:
            i = floats.index(k)
            g = f"%g#{i}" if len(grad_types) > 1 else "%g"
            if scalar_seed:
                lines.append(
                    f"%s{k} = stablehlo.broadcast_in_dim %c0, dims = [] : ({_type(outs[0])}) -> {t}"
                )
                lines.append(f"%r{k} = stablehlo.multiply {g}, %s{k} : {t}")
                g = f"%r{k}"
            results.append(g)
        elif a.dtype == jax.dtypes.float0 or not _is_float(a):
            lines.append(f"%r{k} = stablehlo.constant dense<false> : {t}")
            results.append(f"%r{k}")
        else:  # a float input the primal module does not use
            lines.append(f"%r{k} = stablehlo.constant dense<0.0> : {t}")
            results.append(f"%r{k}")
        types.append(t)
    main = [f"  func.func public @main({', '.join(params)}) -> ({', '.join(types)}) {{"]
    main += [f"    {line}" for line in lines]
    main.append(f"    return {', '.join(results)} : {', '.join(types)}")
    main.append("  }")
    at = body.rstrip().rfind("}")
    return body[:at] + "\n".join(main) + "\n" + body[at:]
