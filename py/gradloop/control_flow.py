"""Data-dependent control flow: `cond`, `switch_case` and `while_loop`.

In eager mode the predicate, branch index and loop condition are read on the host, only the
chosen branch runs and the loop runs in Python. Every op a branch or body runs is recorded by
the active gradient tapes, so gradients flow through whichever path was taken, for any trip
count (zero included) and any nesting.

Inside `@gl.function` (graph mode), a symbolic predicate or branch index traces every branch
into a function of the graph and builds an `If`/`Case` node; a `while_loop` always traces its
cond and body and builds a `While` node. A Python bool or concrete predicate still branches at
trace time. Tensors the functions close over become their captured inputs. Argument checks live
in `_validate`, shared by every mode, so every mode reports the same errors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from . import _core, _validate, batching, nest

__all__ = ["cond", "switch_case", "while_loop"]


def cond(pred: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
    """Runs `true_fn()` if `pred` else `false_fn()`.

    Reference semantics in plain Python::

        def cond(pred, true_fn, false_fn):
            return true_fn() if pred else false_fn()

    Args:
        pred: a scalar bool tensor or a Python bool.
        true_fn: a function of no arguments (it closes over tensors) returning a tensor or a
            nested tuple/list/dict of tensors, run when `pred` is true.
        false_fn: the same, run when `pred` is false. Both must return the same structure,
            dtypes and shapes (checked when both are traced; eagerly only the branch taken runs,
            so its side effects, such as Variable assignments, happen only then).

    Returns:
        The taken branch's outputs, with Python scalars and numpy arrays converted to tensors.
        Gradients flow into the tensors the taken branch used.
    """
    _validate.check_callable("cond", "true_fn", true_fn)
    _validate.check_callable("cond", "false_fn", false_fn)
    level = batching.lane_level(pred)
    if level is not None:
        outer = batching.outer_level(pred, level)
        if outer is not None:
            return batching.over_outer_lanes(outer, lambda: cond(pred, true_fn, false_fn))
        named = [("true_fn", true_fn), ("false_fn", false_fn)]
        if _core.mode() == "tracing":
            batching.lanes_values("cond", pred, level, "pred", on_host=False)
            choice = _core.where(pred, _core.tensor(0), _core.tensor(1))
            return batching.traced_branches("cond", level, choice, named)
        taken = np.where(batching.lanes_values("cond", pred, level, "pred"), 0, 1)
        return batching.branches("cond", level, taken, named)
    expected = "a scalar bool tensor or a Python bool"
    symbolic = _validate.symbolic_scalar("cond", pred, (_core.bool_,), "pred", expected)
    if symbolic is not None:
        return _graph_branches(
            "cond",
            [("true_fn", true_fn), ("false_fn", false_fn)],
            lambda branches: _core.emit_if(symbolic, *branches),
        )
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
    level = batching.lane_level(branch_index)
    if level is not None:
        outer = batching.outer_level(branch_index, level)
        if outer is not None:
            again = lambda: switch_case(branch_index, branch_fns, default)  # noqa: E731
            return batching.over_outer_lanes(outer, again)
        n = len(branches)
        named = [(f"branch_fns[{i}]", b) for i, b in enumerate(branches)]
        if default is not None:
            named.append(("default", default))
        # An index out of range runs the default, or the last branch.
        if _core.mode() == "tracing":
            batching.lanes_values("switch_case", branch_index, level, "branch_index", False)
            inside = _core.logical_and(branch_index >= 0, branch_index < n)
            choice = _core.where(inside, branch_index, len(named) - 1)
            return batching.traced_branches("switch_case", level, choice, named)
        index = batching.lanes_values("switch_case", branch_index, level, "branch_index")
        chosen = np.where((index >= 0) & (index < n), index, len(named) - 1)
        return batching.branches("switch_case", level, chosen, named)
    expected = "a scalar int32/int64 tensor or a Python int"
    symbolic = _validate.symbolic_scalar(
        "switch_case", branch_index, (_core.int32, _core.int64), "branch_index", expected
    )
    if symbolic is not None:
        named = [(f"branch_fns[{i}]", b) for i, b in enumerate(branches)]
        if default is not None:
            named.append(("default", default))
        # Case runs its last branch for an index out of range: the default when given. The
        # index is clamped before narrowing to int32 so that no int64 value wraps into range.
        n = len(named)
        inside = _core.logical_and(symbolic >= 0, symbolic < n)
        index = _core.cast(_core.where(inside, symbolic, n - 1), _core.int32)
        return _graph_branches("switch_case", named, lambda traced: _core.emit_case(index, traced))
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
    checkpoints: int | None = None,
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
            `cond` is not evaluated once it is reached. Under `gl.jit`, an int bound also
            lets the gradient's loop stacks be allocated once, before the loop.
        parallel_iterations: a positive int: how many iterations graph mode may run at once.
            Eager iterations run one after another.
        checkpoints: None, or a positive int c: the gradient keeps at most c snapshots of the
            loop variables instead of stacks of every trip's intermediates, and runs trips
            again from the nearest snapshot (online binomial checkpointing: memory independent
            of the trip count, the same gradient, more body evaluations). The body must not
            assign a Variable (the recomputation would repeat it). Eagerly under a tape, the
            loop is recorded as one op; without a tape it only runs.

    Returns:
        The final loop variables, with the structure of `loop_vars`. Every op of every
        iteration is recorded by the active tapes (with `checkpoints`, the loop as one op), so
        gradients flow for any trip count.
    """
    _validate.check_callable("while_loop", "cond", cond)
    _validate.check_callable("while_loop", "body", body)
    _validate.check_parallel_iterations("while_loop", parallel_iterations)
    limit = _validate.check_maximum_iterations("while_loop", maximum_iterations)
    checkpoints = _validate.check_checkpoints("while_loop", checkpoints)
    loop_vars = _validate.convert_loop_vars("while_loop", loop_vars)
    call = _caller(isinstance(loop_vars, (tuple, list)))
    if _core.mode() == "tracing":
        return _graph_while(cond, body, loop_vars, call, limit, parallel_iterations, checkpoints)
    if checkpoints is not None and _core.any_tape_active():
        return _staged_while(cond, body, loop_vars, call, limit, parallel_iterations, checkpoints)
    values, i = loop_vars, 0
    while limit is None or i < limit:
        pred = call(cond, values)
        if batching.lane_level(pred) is not None:
            check = functools.partial(_checked_trip, loop_vars, body)
            return batching.while_loop(cond, body, values, call, limit, pred, i, check)
        if not _validate.check_predicate("while_loop", pred, "the result of cond"):
            break
        new_values = call(body, values)
        values = _validate.check_loop_body_output("while_loop", loop_vars, new_values, i, body)
        i += 1
    return values


def _checked_trip(loop_vars: Any, body: Any, _: Any, new: Any, i: int) -> Any:
    return _validate.check_loop_body_output("while_loop", loop_vars, new, i, body)


def _staged_while(
    cond: Callable[..., Any],
    body: Callable[..., Any],
    loop_vars: Any,
    call: Callable[[Callable[..., Any], Any], Any],
    limit: int | None,
    parallel_iterations: int,
    checkpoints: int,
) -> Any:
    """A checkpointed loop run eagerly under a tape: traced with what it closes over as
    inputs and run as one staged op, whose gradient is graph mode's (`batching.staged_call`:
    inside `vmap`, over every lane's values, so the gradient keeps c snapshots of all lanes,
    not every trip)."""

    def build(values: list[Any]) -> list[Any]:
        start = nest.pack_sequence_as(loop_vars, values)
        out = _graph_while(cond, body, start, call, limit, parallel_iterations, checkpoints)
        return nest.flatten(out)

    outputs = batching.staged_call("while_loop", nest.flatten(loop_vars), build)
    return nest.pack_sequence_as(loop_vars, outputs)


# ---- graph mode ---------------------------------------------------------------------------------


def _traced(name: str, params: list[Any], run: Callable[[list[Any]], list[Any]]) -> Any:
    """Traces `run(parameters)` into a new function of the active trace; returns its Branch."""
    symbols = _core.trace_push(name, params)
    try:
        results = run(symbols)
    except BaseException:
        _core.trace_pop([])  # close the frame; the unfinished function is never called
        raise
    return _core.trace_pop(results)


def _graph_branches(
    fn: str,
    named: list[tuple[str, Callable[[], Any]]],
    emit: Any,
    levels: list[int] | None = None,
) -> Any:
    """Traces every branch, checks they agree, and emits the node with `emit(branches)`.
    Batched outputs are batched over every active `vmap` level, or over `levels` (the levels
    outside one whose lanes the branches already hold explicitly)."""
    outputs, traced, seen = _trace_branches(fn, named, None, levels)
    first = _validate.check_branch_outputs(fn, outputs)
    batched = seen if any(seen) else None
    if batched and not all(_is_batched(leaf) == b for leaf, b in _pairs(outputs, batched)):
        # A value batched in one branch is made batched in all of them: trace them again.
        outputs, traced, _ = _trace_branches(fn, named, batched, levels)
    results = iter(emit(traced))
    flags = iter(batched or [])
    leaves = [
        None if leaf is None else _lanes_on(next(results), next(flags, False), levels)
        for leaf in nest.flatten(first)
    ]
    return nest.pack_sequence_as(first, leaves)


def _trace_branches(
    fn: str,
    named: list[tuple[str, Callable[[], Any]]],
    batched: list[bool] | None,
    levels: list[int] | None = None,
) -> tuple[list[tuple[str, Any]], list[Any], list[bool]]:
    """Each branch traced into a function: their outputs, functions, and which outputs are
    batched in some branch. Outputs leave batched where `batched` says (None: where each branch
    has them batched)."""
    outputs: list[tuple[str, Any]] = []
    traced = []
    seen: list[bool] = []

    def run(name: str, branch: Callable[[], Any]) -> list[Any]:
        out = _validate.convert_outputs(fn, branch(), f"the output of {name}")
        outputs.append((name, out))
        leaves = [leaf for leaf in nest.flatten(out) if leaf is not None]
        flags = [_is_batched(leaf) for leaf in leaves]
        seen[:] = [a or b for a, b in zip(seen, flags, strict=False)] or flags
        want = batched or flags
        return [_lanes_off(x, b, levels) for x, b in zip(leaves, want, strict=False)]

    for name, branch in named:
        label = f"{fn}_{name.split('[')[0]}"
        traced.append(_traced(label, [], lambda _, name=name, branch=branch: run(name, branch)))
    return outputs, traced, seen


def _pairs(outputs: list[tuple[str, Any]], batched: list[bool]) -> list[tuple[Any, bool]]:
    """Every branch's output leaves beside whether that output is batched in some branch."""
    pairs = []
    for _, out in outputs:
        leaves = [leaf for leaf in nest.flatten(out) if leaf is not None]
        pairs += list(zip(leaves, batched, strict=False))
    return pairs


# Inside gl.vmap, a traced branch or loop works on the batch: a value it passes out is taken off
# its lanes at the function's boundary (batched over every active vmap call where it is batched
# at all, so that all branches, and a loop's trips, agree) and the node's results are put back
# on. Functions are traced again where a branch or a trip makes batched what was not.


def _is_batched(x: Any) -> bool:
    return isinstance(x, _core.Tensor) and bool(_core.lanes_levels(x))


def _lanes_off(x: Any, batched: bool, levels: list[int] | None = None) -> Any:
    if not batched:
        return batching.physical(x)
    return batching.physical(batching.lanes_everywhere(x, levels))


def _lanes_on(x: Any, batched: bool, levels: list[int] | None = None) -> Any:
    return batching.dressed(x, levels) if batched else x


def _graph_while(
    cond: Callable[..., Any],
    body: Callable[..., Any],
    loop_vars: Any,
    call: Callable[[Callable[..., Any], Any], Any],
    limit: int | None,
    parallel_iterations: int,
    checkpoints: int | None = None,
) -> Any:
    """Traces cond and body over symbolic loop variables and emits a `While` node."""
    batched = [_is_batched(t) for t in nest.flatten(loop_vars)]
    while True:
        loop = _TracedLoop(cond, body, loop_vars, call, batched)
        body_fn = _traced("while_body", loop.specs, loop.run_body)
        if not any(loop.grown):
            break
        # A trip makes a loop variable batched: it is batched from the start.
        batched = [b or g for b, g in zip(batched, loop.grown, strict=True)]
    try:
        cond_fn = _traced("while_cond", loop.specs, loop.run_cond)
    except batching.BatchedPredicate as lanes:
        return batching.traced_while(
            cond, body, loop_vars, call, limit, parallel_iterations, checkpoints, lanes.level
        )
    outputs = _core.emit_while(cond_fn, body_fn, loop.flat, limit, parallel_iterations, checkpoints)
    on = [_lanes_on(t, b) for t, b in zip(outputs, batched, strict=True)]
    return nest.pack_sequence_as(loop_vars, on)


class _TracedLoop:
    """A loop's cond and body as functions of its variables, taken off their lanes where
    `batched` says (inside vmap); `grown` tells which a trip made batched."""

    def __init__(
        self,
        cond: Callable[..., Any],
        body: Callable[..., Any],
        loop_vars: Any,
        call: Callable[[Callable[..., Any], Any], Any],
        batched: list[bool],
    ) -> None:
        self.cond, self.body, self.loop_vars, self.call = cond, body, loop_vars, call
        self.batched = batched
        leaves = nest.flatten(loop_vars)
        self.flat = [_lanes_off(t, b) for t, b in zip(leaves, batched, strict=True)]
        self.specs = [(t.dtype, tuple(t.shape)) for t in self.flat]
        self.grown = [False] * len(leaves)

    def _lanes_on(self, params: list[Any]) -> Any:
        on = [_lanes_on(p, b) for p, b in zip(params, self.batched, strict=True)]
        return nest.pack_sequence_as(self.loop_vars, on)

    def run_cond(self, params: list[Any]) -> list[Any]:
        pred = self.call(self.cond, self._lanes_on(params))
        expected = "a scalar bool tensor or a Python bool"
        what = "the result of cond"
        level = batching.lane_level(pred)
        if level is not None:
            raise batching.BatchedPredicate(level)
        symbolic = _validate.symbolic_scalar("while_loop", pred, (_core.bool_,), what, expected)
        if symbolic is not None:
            return [symbolic]
        return [_core.tensor(_validate.check_predicate("while_loop", pred, what))]

    def run_body(self, params: list[Any]) -> list[Any]:
        new = self.call(self.body, self._lanes_on(params))
        new = _validate.check_loop_body_output("while_loop", self.loop_vars, new, None, self.body)
        out = nest.flatten(new)
        pairs = zip(out, self.batched, strict=True)
        self.grown = [_is_batched(t) and not b for t, b in pairs]
        return [
            _lanes_off(t, b or g) for t, b, g in zip(out, self.batched, self.grown, strict=True)
        ]
