"""Custom ops: a function recorded as one op whose gradient (and tangent) is a rule of the
user's or the library's (`custom_gradient`, `recompute_grad`, the factorisations of `linalg`).
Eagerly the forward pass runs unrecorded and the tapes record the op; traced, the function and
its rules are traced into functions of their own, called through one node.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from . import _core, _validate, batching, errors, nest
from ._recording import paused, perturbed


def fresh_outputs(y: Any, where: str) -> list[_core.Tensor]:
    """New identities for `y`'s tensors, so the tape sees the custom op's outputs as new values."""
    for path, leaf in nest.flatten_with_paths(y):
        if not isinstance(leaf, _core.Tensor):
            raise errors.GradientError(
                _validate.at_user(
                    f"{where}: output at {nest.path_str(path)} must be a Tensor; "
                    f"got {type(leaf).__name__}"
                )
            )
    return [_core.identity(t) for t in nest.flatten(y)]


def _run_forward(
    fn: Callable[..., Any], inputs: list[Any], kwargs: dict[str, Any], where: str
) -> tuple[Any, list[_core.Tensor], Callable[..., Any]]:
    """Runs a custom op's forward pass unrecorded: `(y, y's tensors as new values, grad_fn)`."""
    with paused():  # the forward pass records nothing: the op stands for it
        result = fn(*inputs, **kwargs)
        if not (isinstance(result, tuple) and len(result) == 2 and callable(result[1])):
            raise errors.GradientError(
                _validate.at_user(f"{where}: the function must return (outputs, grad_fn)")
            )
        y, grad_fn = result
        outs = fresh_outputs(y, where)
        levels = batching.argument_levels(tuple(inputs), {})
        if levels:
            # Inside vmap an output is lanes wherever an input is, though its value may be the
            # same in every lane (a linear map's zeros): each lane's cotangent is its own, not
            # the sum over lanes that a value shared by every lane receives.
            outs = [batching.lanes_everywhere(t, levels) for t in outs]
        return y, outs, grad_fn


def _call_grad_fn(
    grad_fn: Callable[..., Any], y: Any, out_grads: list[Any], inputs: list[Any], where: str
) -> list[Any]:
    """`grad_fn` on the cotangents in `y`'s structure (spread for a tuple/list `y`), checked."""
    dys = nest.pack_sequence_as(y, out_grads)
    grads = grad_fn(*dys) if isinstance(y, (tuple, list)) else grad_fn(dys)
    return _validate.check_custom_gradients(grads, inputs, where)


#: `tangent_fn(inputs, tangents, **kwargs)`: the flat tangents of a custom op's outputs (None
#: for zeros), from its inputs and their tangents (None for integer and bool inputs).
TangentFn = Callable[..., list[Any]]


def custom_op(
    fn: Callable[..., Any],
    where: str,
    forward_fn: Callable[..., Any] | None = None,
    tangent_fn: TangentFn | None = None,
) -> Callable[..., Any]:
    """`fn(*tensors) -> (y, grad_fn)` as one recorded op whose gradient is `grad_fn`. Under
    forward mode (inputs with tangents) `forward_fn` runs instead, op by op; without one it is
    an error: a custom gradient says nothing of tangents. Traced, the op's node carries
    `grad_fn` and `tangent_fn` traced, for the tangents asked of it later (in a loop body or a
    branch, say)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        inputs = [_validate.input_tensor(a, i, where) for i, a in enumerate(args)]
        if _core.trace_active() and tangent_fn is not None:
            # a node: its tangent is `tangent_fn` traced, wherever its tangents are built
            return _traced_custom_op(fn, inputs, kwargs, where, tangent_fn)
        if perturbed(inputs):
            if forward_fn is None:
                raise errors.GradientError(
                    _validate.at_user(
                        f"{where} has no forward-mode rule, and jvp, jacfwd and hessian need "
                        "one: define the function with gl.custom_jvp (its rule gives the "
                        "tangents)"
                    )
                )
            return forward_fn(*inputs, **kwargs)
        if _core.trace_active():
            return _traced_custom_op(fn, inputs, kwargs, where, tangent_fn)
        y, outs, grad_fn = _run_forward(fn, inputs, kwargs, where)

        def backward(*out_grads: _core.Tensor) -> list[Any]:
            return _call_grad_fn(grad_fn, y, list(out_grads), inputs, where)

        if _core.any_tape_active():
            _core.record_custom_gradient(where, inputs, outs, backward)
        return nest.pack_sequence_as(y, outs)

    return wrapper


def _traced_custom_op(
    fn: Callable[..., Any],
    inputs: list[_core.Tensor],
    kwargs: dict[str, Any],
    where: str,
    tangent_fn: TangentFn | None,
) -> Any:
    """Graph mode: `fn` traced into a function of its own, called through a node whose gradient
    is `grad_fn` traced too (and whose tangent is `tangent_fn` traced, where there is one), so
    that the custom rules hold wherever the node ends up (a branch or loop body differentiated
    later, a compiled module). A rule that fails as it is traced does not fail the call: the
    node keeps the failure and raises it when a derivative is asked (as eagerly, where a rule
    runs only then)."""
    name = getattr(fn, "__name__", "custom_gradient")
    # Inside vmap the function and its rules are traced as one lane's (the levels set aside),
    # and the call node is batched with its rules (the core's rule for calls).
    _core.vmap_suspend()
    params = _core.trace_push(name, [(t.dtype, tuple(t.shape)) for t in inputs])
    try:
        y, outs, grad_fn = _run_forward(fn, params, kwargs, where)
        rules: dict[str, Any] = {}
        failures: list[str] = []

        def traced(kind: str, build: Callable[[], Any]) -> None:
            # Each rule on its own: a tangent rule that fails (a recompute_grad function
            # calling a custom_gradient one) leaves the gradient rule in force.
            try:
                rules[kind] = build()
            except Exception as e:
                what = "is malformed" if isinstance(e, TypeError) else "failed"
                failures.append(f"its rule {what}: {_described(e, where)}")

        traced(
            "grad",
            lambda: _traced_rule(
                f"{name}_grad",
                outs,
                lambda cts: _call_grad_fn(grad_fn, y, cts, params, where),
                params,
            ),
        )
        if tangent_fn is not None:
            traced(
                "tangent",
                lambda: _traced_rule(
                    f"{name}_jvp",
                    params,
                    lambda ts: tangent_fn(
                        params,
                        [
                            t if p.dtype.is_floating else None
                            for t, p in zip(ts, params, strict=True)
                        ],
                    ),
                    outs,
                ),
            )
        if failures:
            # the core names the user's line where a derivative is asked
            rules["refused"] = f"{where}: {failures[0]}"
    except BaseException:
        _core.trace_pop([])  # close the frame; the unfinished function is never called
        raise
    finally:
        _core.vmap_resume()
    # emit_custom_call closes the function's frame itself
    outputs = _core.emit_custom_call(inputs, params, outs, **rules)
    return nest.pack_sequence_as(y, outputs)


def _traced_rule(
    name: str,
    takes: list[_core.Tensor],
    rule: Callable[[list[_core.Tensor]], list[Any]],
    gives: list[_core.Tensor],
) -> Any:
    """`rule` traced as a function of values typed like `takes`, in a frame above the current
    one, returning one value typed like each of `gives` (zeros for None)."""
    values = _core.trace_push(name, [(t.dtype, tuple(t.shape)) for t in takes])
    try:
        with paused():
            out = rule(values)
            if len(out) != len(gives):
                raise errors.GradientTypeError(
                    f"the rule gives {len(out)} values for {len(gives)} outputs"
                )
            out = [_core.zeros_like(g) if o is None else o for o, g in zip(out, gives, strict=True)]
            for k, (o, g) in enumerate(zip(out, gives, strict=True)):
                o = _core.tensor(o, dtype=g.dtype) if not isinstance(o, _core.Tensor) else o
                if (o.dtype, tuple(o.shape)) != (g.dtype, tuple(g.shape)):
                    raise errors.GradientTypeError(
                        f"the rule's value {k} is {o.dtype.name}{list(o.shape)} where "
                        f"{g.dtype.name}{list(g.shape)} is expected"
                    )
    except BaseException:
        _core.trace_pop([])
        raise
    return _core.trace_pop(out)


def _described(e: Exception, where: str) -> str:
    """A rule's failure for a message that names `where` and the user's line itself."""
    if not isinstance(e, errors.GradloopError):
        return f"{type(e).__name__}: {e}"
    text = re.sub(r" \(at [^()]*\)$", "", str(e))
    return text.removeprefix(f"{where}: ")
