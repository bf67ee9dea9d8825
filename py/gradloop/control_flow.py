"""Data-dependent control flow: `cond`, `switch_case` and `while_loop` (eager mode).

In eager mode the predicate, branch index and loop condition are read on the host, only the
chosen branch runs and the loop runs in Python. Every op a branch or body runs is recorded by
the active gradient tapes, so gradients flow through whichever path was taken, for any trip
count (zero included) and any nesting. Argument checks live in `_validate`, shared with graph
and compiled modes, so every mode reports the same errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import _validate

__all__ = ["cond", "switch_case", "while_loop"]


def cond(pred: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
    """Runs `true_fn()` if `pred` else `false_fn()`.

    Reference semantics in plain Python::

        def cond(pred, true_fn, false_fn):
            return true_fn() if pred else false_fn()

    Args:
        pred: a scalar bool tensor or a Python bool.
        true_fn, false_fn: functions of no arguments (they close over tensors) returning a tensor
            or a nested tuple/list/dict of tensors; both must return the same structure, dtypes
            and shapes (checked when both are traced; eagerly only the branch taken runs, so its
            side effects, such as Variable assignments, happen only then).

    Returns:
        The taken branch's outputs, with Python scalars and numpy arrays converted to tensors.
        Gradients flow into the tensors the taken branch used.
    """
    _validate.check_callable("cond", "true_fn", true_fn)
    _validate.check_callable("cond", "false_fn", false_fn)
    taken = _validate.check_predicate("cond", pred)
    name, branch = ("true_fn", true_fn) if taken else ("false_fn", false_fn)
    return _validate.check_branch_outputs("cond", [(name, branch())])


def switch_case(
    branch_index: Any,
    branch_fns: Sequence[Callable[[], Any]] | Mapping[int, Callable[[], Any]],
    default: Callable[[], Any] | None = None,
) -> Any:
    """Runs `branch_fns[branch_index]()`; an out-of-range index runs `default`.

    Reference semantics in plain Python::

        def switch_case(branch_index, branch_fns, default=None):
            if 0 <= branch_index < len(branch_fns):
                return branch_fns[branch_index]()
            return (default or branch_fns[-1])()

    Args:
        branch_index: a scalar int32/int64 tensor or a Python int.
        branch_fns: a list of functions of no arguments, or a dict whose keys are exactly
            0..n-1. All branches must return the same structure, dtypes and shapes.
        default: run for an index outside 0..n-1; the last branch when None.

    Returns:
        The chosen branch's outputs (only that branch runs eagerly).
    """
    branches = _validate.check_branch_fns("switch_case", branch_fns, default)
    index = _validate.check_branch_index("switch_case", branch_index)
    if 0 <= index < len(branches):
        name, branch = f"branch_fns[{index}]", branches[index]
    elif default is not None:
        name, branch = "default", default
    else:
        name, branch = f"branch_fns[{len(branches) - 1}] (the default)", branches[-1]
    return _validate.check_branch_outputs("switch_case", [(name, branch())])


def _caller(spread: bool) -> Callable[[Callable[..., Any], Any], Any]:
    """TensorFlow's convention: a tuple/list of loop vars is spread as positional arguments."""
    if spread:
        return lambda f, vs: f(*vs)
    return lambda f, vs: f(vs)


def while_loop(
    cond: Callable[..., Any],
    body: Callable[..., Any],
    loop_vars: Any,
    *,
    maximum_iterations: Any = None,
    parallel_iterations: int = 10,
) -> Any:
    """Repeats `body` while `cond` is true, starting from `loop_vars`.

    Reference semantics in plain Python (``call(f, v)`` is ``f(*v)`` when `loop_vars` is a
    tuple or list and ``f(v)`` when it is a single tensor or a dict)::

        def while_loop(cond, body, loop_vars, maximum_iterations=None):
            vals, i = loop_vars, 0
            while (maximum_iterations is None or i < maximum_iterations) and call(cond, vals):
                vals = call(body, vals)
                i += 1
            return vals

    Args:
        cond: returns a scalar bool tensor (or Python bool) from the loop variables.
        body: returns new loop variables: the structure of `loop_vars` (a list may stand for a
            tuple), with the same dtype and shape for every variable (`shape_invariants` is not
            supported). Python scalars it returns adapt to their loop variable's dtype.
        loop_vars: a tensor or a nested tuple/list/dict of tensors; Python scalars and numpy
            arrays are converted to tensors first (a Python float becomes float32).
        maximum_iterations: None, or an int or scalar int tensor >= 0 bounding the trip count;
            `cond` is not evaluated once it is reached.
        parallel_iterations: a positive int: how many iterations graph mode may run at once.
            Eager iterations run one after another.

    Returns:
        The final loop variables, with the structure of `loop_vars`. Every op of every
        iteration is recorded by the active tapes, so gradients flow for any trip count.
    """
    _validate.check_callable("while_loop", "cond", cond)
    _validate.check_callable("while_loop", "body", body)
    _validate.check_parallel_iterations("while_loop", parallel_iterations)
    limit = _validate.check_maximum_iterations("while_loop", maximum_iterations)
    loop_vars = _validate.convert_loop_vars("while_loop", loop_vars)
    call = _caller(isinstance(loop_vars, (tuple, list)))
    values, i = loop_vars, 0
    while limit is None or i < limit:
        if not _validate.check_predicate("while_loop", call(cond, values), "the result of cond"):
            break
        new_values = call(body, values)
        values = _validate.check_loop_body_output("while_loop", loop_vars, new_values, i, body)
        i += 1
    return values
