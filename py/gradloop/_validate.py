"""Argument validation shared by eager, graph and compiled modes.

Every check lives here once so that `cond`, `switch_case`, `while_loop` and the gradient APIs
report the same errors whichever mode runs them. A control-flow failure is an
`errors.ControlFlowError` whose message names the function, the path inside the structure, what
was expected and what was found, and the user's source line (the first stack frame outside the
gradloop package). Gradient-argument failures are `errors.GradientError`s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from . import _core, errors, nest

#: The types that stand for a Variable here (a value read with `.read()`): `variables.Variable`
#: registers itself, so that these checks need not import the module (it imports this one).
VARIABLE_TYPES: tuple[type, ...] = ()


def register_variable_type(cls: type) -> type:
    """Makes instances of `cls` count as Variables in the checks (a class decorator)."""
    global VARIABLE_TYPES
    VARIABLE_TYPES = (*VARIABLE_TYPES, cls)
    return cls


_INT_DTYPES = (_core.int32, _core.int64)


def at_user(message: str) -> str:
    """`message` with the user's `file:line` appended, as the Rust core's errors have it (the
    bindings find the line, for both)."""
    return f"{message} (at {_core.user_location()})"


def fail(fn: str, message: str) -> NoReturn:
    """Raises the ControlFlowError of `fn` (cond/switch_case/while_loop) at the user's line."""
    raise errors.ControlFlowError(at_user(f"{fn}: {message}"))


def function_location(f: Callable[..., Any]) -> str:
    """Where a user function is defined, for messages about what it returned."""
    code = getattr(f, "__code__", None)
    if code is None:
        return repr(f)
    return f"{getattr(f, '__qualname__', f.__name__)} at {code.co_filename}:{code.co_firstlineno}"


def describe(x: Any) -> str:
    """A leaf for messages: `float32[2, 3]` for a tensor, else its type (and value if short)."""
    if isinstance(x, _core.Tensor):
        return f"{x.dtype.name}{list(x.shape)}"
    if isinstance(x, (bool, int, float)) or x is None:
        return f"{type(x).__name__} {x!r}"
    return type(x).__name__


def describe_structure(x: Any) -> str:
    return nest.format_structure(x, describe)


def check_callable(fn: str, arg: str, value: Any) -> None:
    if not callable(value):
        fail(fn, f"{arg} must be callable; got {describe(value)}")


def _host_scalar(x: Any) -> Any:
    """Reads a Variable's value; a tensor stays a tensor (read on the host by the caller)."""
    return x.read() if isinstance(x, VARIABLE_TYPES) else x


def is_symbolic(x: Any) -> bool:
    """True for a tensor traced inside `@gl.function` (its value is only known at run time)."""
    return isinstance(x, _core.Tensor) and x.is_symbolic


def symbolic_scalar(fn: str, x: Any, dtypes: tuple[Any, ...], what: str, expected: str) -> Any:
    """`x` (Variables read) when it is a symbolic scalar of one of `dtypes`; None when it is not
    symbolic (the caller decides at trace time); else a ControlFlowError."""
    x = _host_scalar(x)
    if not is_symbolic(x):
        return None
    if x.dtype not in dtypes or x.shape != ():
        fail(fn, f"{what} must be {expected}; got {describe(x)}")
    return x


def check_predicate(fn: str, pred: Any, what: str = "pred") -> bool:
    """A Python bool, numpy bool or scalar bool tensor, read on the host."""
    pred = _host_scalar(pred)
    if isinstance(pred, (bool, np.bool_)):
        return bool(pred)
    if isinstance(pred, np.ndarray) and pred.dtype == np.bool_ and pred.shape == ():
        return bool(pred)
    if isinstance(pred, _core.Tensor) and pred.dtype == _core.bool_ and pred.shape == ():
        return bool(pred.item())
    fail(
        fn,
        f"{what} must be a scalar bool tensor or a Python bool; got {describe(pred)}",
    )


def check_branch_index(fn: str, index: Any) -> int:
    """A Python int, numpy integer or scalar int32/int64 tensor, read on the host."""
    index = _host_scalar(index)
    if isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_)):
        return int(index)
    if isinstance(index, _core.Tensor) and index.dtype in _INT_DTYPES and index.shape == ():
        return int(index.item())
    fail(
        fn,
        f"branch_index must be a scalar int32/int64 tensor or a Python int; got {describe(index)}",
    )


def check_branch_fns(fn: str, branch_fns: Any, default: Any) -> list[Callable[[], Any]]:
    """The branches as a list indexed 0..n-1 (a dict's keys must be exactly those ints)."""
    if isinstance(branch_fns, dict):
        keys = list(branch_fns)
        if any(not isinstance(k, int) or isinstance(k, bool) for k in keys):
            fail(fn, f"branch_fns dict keys must be ints; got {keys!r}")
        if sorted(keys) != list(range(len(keys))):
            fail(
                fn,
                f"branch_fns dict keys must be 0..{len(keys) - 1} without gaps; "
                f"got {sorted(keys)!r}",
            )
        branches = [branch_fns[k] for k in range(len(keys))]
    elif isinstance(branch_fns, (list, tuple)):
        branches = list(branch_fns)
    else:
        fail(
            fn,
            "branch_fns must be a list of callables or a dict int -> callable; "
            f"got {describe(branch_fns)}",
        )
    if not branches:
        fail(fn, "branch_fns must not be empty")
    for i, b in enumerate(branches):
        check_callable(fn, f"branch_fns[{i}]", b)
    if default is not None:
        check_callable(fn, "default", default)
    return branches


def to_tensor(fn: str, x: Any, path: str, what: str, like: Any = None) -> Any:
    """A leaf as a tensor: Python scalars adapt to `like`'s dtype; Variables are read."""
    x = _host_scalar(x)
    if isinstance(x, _core.Tensor):
        return x
    if not isinstance(x, (bool, int, float, np.ndarray, np.generic)):
        fail(fn, f"{what} at {nest.path_str(path)} must be a tensor; got {describe(x)}")
    try:
        return _core.tensor_like(x, like) if isinstance(like, _core.Tensor) else _core.tensor(x)
    except (errors.GradloopError, TypeError, ValueError) as e:
        fail(fn, f"{what} at {nest.path_str(path)} cannot be converted to a tensor: {e}")


def _leaf_mismatch(expected: Any, actual: Any) -> tuple[str, str] | None:
    """(what `actual` has, what `expected` has) where they differ, or None."""
    if expected is None or actual is None:
        return None if expected is actual else (describe(actual), describe(expected))
    if expected.dtype != actual.dtype:
        return f"dtype {actual.dtype.name}", f"dtype {expected.dtype.name}"
    if tuple(expected.shape) != tuple(actual.shape):
        return f"shape {list(actual.shape)}", f"shape {list(expected.shape)}"
    return None


def convert_outputs(fn: str, structure: Any, what: str) -> Any:
    flat = [
        None if leaf is None else to_tensor(fn, leaf, path, what)
        for path, leaf in nest.flatten_with_paths(structure)
    ]
    return nest.pack_sequence_as(structure, flat)


def check_branch_outputs(fn: str, results_per_branch: Sequence[tuple[str, Any]]) -> Any:
    """Converts every branch's outputs to tensors and checks they agree with the first branch.

    `results_per_branch` holds `(branch name, outputs)`; eager mode passes only the branch that
    ran. Outputs may hold None leaves (a branch run only for its side effects) where every branch
    returns None. Returns the first branch's converted outputs.
    """
    converted = [
        (name, convert_outputs(fn, out, f"the output of {name}"))
        for name, out in results_per_branch
    ]
    first_name, first = converted[0]
    for name, out in converted[1:]:
        found = nest.structure_difference(first, out)
        if found is not None:
            path, in_first, in_out = found
            fail(
                fn,
                f"{name} and {first_name} return different structures: at {nest.path_str(path)} "
                f"{name} returns {in_out} but {first_name} returns {in_first} "
                f"({describe_structure(out)} vs {describe_structure(first)})",
            )
        for (path, a), b in zip(nest.flatten_with_paths(first), nest.flatten(out), strict=True):
            bad = _leaf_mismatch(a, b)
            if bad is not None:
                fail(
                    fn,
                    f"the output of {name} at {nest.path_str(path)} has {bad[0]} "
                    f"but the output of {first_name} has {bad[1]}",
                )
    return first


def check_maximum_iterations(fn: str, value: Any) -> int | None:
    """None, or an int >= 0 (a Python int, numpy integer or scalar int tensor)."""
    if value is None:
        return None
    value = _host_scalar(value)
    n: int | None = None
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        n = int(value)
    elif isinstance(value, _core.Tensor) and value.dtype in _INT_DTYPES and value.shape == ():
        n = int(value.item())
    if n is None:
        fail(
            fn,
            "maximum_iterations must be None, an int or a scalar int tensor; "
            f"got {describe(value)}",
        )
    if n < 0:
        fail(fn, f"maximum_iterations must be >= 0; got {n}")
    return n


def check_parallel_iterations(fn: str, value: Any) -> int:
    """A positive Python int (a static attribute: how many iterations graph mode may overlap)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        fail(fn, f"parallel_iterations must be a positive int; got {describe(value)}")
    if value <= 0:
        fail(fn, f"parallel_iterations must be a positive int; got {int(value)}")
    return int(value)


def check_checkpoints(fn: str, value: Any) -> int | None:
    """None (stacks), or a positive Python int: how many loop states the gradient keeps. A
    static attribute, so a tensor is refused even when it holds an int."""
    if value is None:
        return None
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        fail(fn, f"checkpoints must be None or a positive int; got {describe(value)}")
    if not 1 <= value < 2**31:
        fail(fn, f"checkpoints must be None or a positive int (below 2**31); got {int(value)}")
    return int(value)


def convert_loop_vars(fn: str, loop_vars: Any) -> Any:
    """Loop variables as a structure of tensors (Python scalars and numpy arrays converted)."""
    flat = nest.flatten_with_paths(loop_vars)
    if not flat:
        fail(fn, "loop_vars must hold at least one tensor")
    tensors = [to_tensor(fn, leaf, path, "loop variable") for path, leaf in flat]
    return nest.pack_sequence_as(loop_vars, tensors)


def check_loop_body_output(
    fn: str, loop_vars: Any, new_vars: Any, iteration: int | None = None, body: Any = None
) -> Any:
    """The body's result converted and packed as `loop_vars`; same structure, dtypes and shapes.

    Sequences may change kind (a body may return a list for a tuple of loop variables), and the
    body of a single loop variable given in a tuple/list may return the bare value. `iteration`
    and `body` (the function) only enrich the messages.
    """
    when = "" if iteration is None else f" (iteration {iteration})"
    when += "" if body is None else f" (body: {function_location(body)})"
    if (
        isinstance(loop_vars, (tuple, list))
        and len(loop_vars) == 1
        and not nest.is_nested(new_vars)
    ):
        new_vars = (new_vars,)
    found = nest.structure_difference(loop_vars, new_vars, check_types=False)
    if found is not None:
        path, expected, got = found
        fail(
            fn,
            f"body must return the structure of loop_vars{when}: at {nest.path_str(path)} expected "
            f"{expected}, got {got} (loop_vars {describe_structure(loop_vars)}, body returned "
            f"{describe_structure(new_vars)})",
        )
    out = []
    for (path, old), new in zip(
        nest.flatten_with_paths(loop_vars), nest.flatten(new_vars), strict=True
    ):
        new = to_tensor(fn, new, path, "body output", like=old)
        bad = _leaf_mismatch(old, new)
        if bad is not None:
            fail(
                fn,
                f"body output at {nest.path_str(path)} has {bad[0]} but the loop variable has "
                f"{bad[1]}{when}; loop variables must keep their dtype and shape "
                "(shape_invariants is not supported)",
            )
        out.append(new)
    return nest.pack_sequence_as(loop_vars, out)


# ---- gradient APIs ----------------------------------------------------------------------------


def check_gradient_source(x: Any, path: str, where: str) -> Any:
    """A gradient source must be a float tensor or Variable (integers have no gradient)."""
    if not isinstance(x, (_core.Tensor, *VARIABLE_TYPES)):
        raise errors.GradientError(
            at_user(
                f"{where}: source at {nest.path_str(path)} must be a Tensor or a Variable; "
                f"got {type(x).__name__}"
            )
        )
    if not x.dtype.is_floating:
        raise errors.GradientError(
            at_user(
                f"{where}: source at {nest.path_str(path)} has dtype {x.dtype.name}; only "
                "float32 and float64 values have gradients (cast it to a float dtype)"
            )
        )
    return x


def convert_number(leaf: Any) -> Any:
    """Python numbers and numpy values as tensors (a float becomes float32; numpy keeps dtype)."""
    if isinstance(leaf, (np.ndarray, np.generic)):
        return _core.tensor(leaf)
    if isinstance(leaf, float):
        return _core.tensor(leaf, dtype=_core.float32)
    return _core.tensor(leaf) if isinstance(leaf, int) else leaf


def differentiable_args(args: tuple[Any, ...], nums: tuple[int, ...], where: str) -> list[Any]:
    """`args` with those at `nums` as structures of float tensors or Variables, each tensor leaf
    a value of its own (`identity`): a function transform differentiates with respect to
    argument positions and pytree leaves, not tensor identities, so `f(x, x)` has one gradient
    per position, as in JAX (a tape watching `x` would give both the sum). Outer tapes and
    accumulators see through the identity, so higher orders are unchanged."""
    out = list(args)
    for i in dict.fromkeys(n % len(args) if -len(args) <= n < len(args) else n for n in nums):
        if not 0 <= i < len(args):
            raise errors.InvalidArgumentError(
                at_user(f"{where}: argnums {i} is out of range for {len(args)} arguments")
            )
        flat = [
            check_gradient_source(convert_number(leaf), path, f"{where}, argument {i}")
            for path, leaf in nest.flatten_with_paths(args[i])
        ]
        fresh = [_core.identity(t) if isinstance(t, _core.Tensor) else t for t in flat]
        out[i] = nest.pack_sequence_as(args[i], fresh)
    return out


def check_argnums(argnums: Any) -> tuple[int, ...]:
    """`argnums` of grad/value_and_grad: an int or a non-empty tuple of ints."""
    nums = (argnums,) if isinstance(argnums, int) else argnums
    ok = isinstance(nums, tuple) and nums
    if not ok or not all(isinstance(i, int) and not isinstance(i, bool) for i in nums):
        raise errors.InvalidArgumentTypeError(
            at_user(f"argnums must be an int or a non-empty tuple of ints; got {argnums!r}")
        )
    return nums


def check_scalar_output(out: Any, where: str) -> _core.Tensor:
    """What a function passed to `grad` returns: a scalar float tensor (or a Python float)."""
    if isinstance(out, float):
        out = _core.tensor(out, dtype=_core.float32)
    if not isinstance(out, _core.Tensor):
        raise errors.GradientError(
            at_user(
                f"{where}: the function must return a scalar float tensor; got {type(out).__name__}"
            )
        )
    if out.shape != () or not out.dtype.is_floating:
        raise errors.GradientError(
            at_user(
                f"{where}: the function must return a scalar float tensor; got {out.dtype.name} of "
                f"shape {tuple(out.shape)}"
            )
        )
    return out


def input_tensor(x: Any, i: int, where: str) -> _core.Tensor:
    """A positional argument of a custom_gradient/recompute_grad function, as a tensor."""
    x = x.read() if isinstance(x, VARIABLE_TYPES) else convert_number(x)
    if not isinstance(x, _core.Tensor):
        raise errors.InvalidArgumentError(
            at_user(f"{where}: argument {i} must be a tensor; got {type(x).__name__}")
        )
    return x


def check_custom_gradients(grads: Any, inputs: list[_core.Tensor], where: str) -> list[Any]:
    """What a custom grad_fn returned: one gradient (or None) per input, of its dtype and shape."""
    grads = list(grads) if isinstance(grads, (tuple, list)) else [grads]
    if len(grads) != len(inputs):
        raise errors.GradientError(
            at_user(
                f"{where}: grad_fn returned {len(grads)} gradients for {len(inputs)} tensor "
                "arguments"
            )
        )
    for i, (g, x) in enumerate(zip(grads, inputs, strict=True)):
        if g is not None and not isinstance(g, _core.Tensor):
            grads[i] = g = _core.tensor(g, dtype=x.dtype)
        if g is not None and (g.dtype != x.dtype or tuple(g.shape) != tuple(x.shape)):
            raise errors.GradientError(
                at_user(
                    f"{where}: grad_fn returned a {g.dtype.name}{list(g.shape)} gradient for "
                    f"argument {i}, which is {x.dtype.name}{list(x.shape)}"
                )
            )
    return grads
