"""Batching: `vmap`, JAX's transform, over the core's batching rules.

Inside `vmap(fn)`, `fn` sees one lane of each batched argument: a tensor of the lane's shape
whose value is every lane's, held by the core along a leading axis. Each op over such tensors
runs once over the whole batch (the op table's batching rule), so `fn` is traced and
differentiated as the batched program it stands for: `vmap(grad(f))` gives each lane its own
gradient, and `grad(vmap(f))` differentiates through the batch. A value the same in every lane
(an argument with `in_axes=None`, a constant, a tensor closed over) stays unbatched until an op
mixes it with a batched one.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from . import _core, _validate, errors, nest

__all__ = ["vmap"]


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", "fn")


def _fail(where: str, message: str) -> Any:
    raise errors.InvalidArgumentError(_validate.at_user(f"{where}: {message}"))


def _check_axis_spec(spec: Any, what: str, where: str) -> None:
    """`spec` is an int, None, or a tuple/list/dict of them (a pytree prefix)."""
    if spec is None or (isinstance(spec, (int, np.integer)) and not isinstance(spec, bool)):
        return
    if isinstance(spec, (tuple, list)):
        for s in spec:
            _check_axis_spec(s, what, where)
        return
    if isinstance(spec, dict):
        for s in spec.values():
            _check_axis_spec(s, what, where)
        return
    _fail(where, f"{what} must be an int, None, or a tuple/list/dict of them; got {spec!r}")


def _leaf_axes(spec: Any, tree: Any, path: str, what: str, where: str) -> list[Any]:
    """One axis (int or None) per leaf of `tree`, from `spec`, a pytree prefix of it."""
    if spec is None or isinstance(spec, (int, np.integer)):
        return [None if spec is None else int(spec)] * len(nest.flatten(tree))
    label = nest.path_str(path) or "the top"
    if isinstance(spec, (tuple, list)):
        if not isinstance(tree, (tuple, list)) or len(tree) != len(spec):
            got = nest.format_structure(tree, lambda _: "*")
            _fail(
                where,
                f"{what} at {label} is a {type(spec).__name__} of {len(spec)} but the value "
                f"there is {got}: the structures must match",
            )
        axes = []
        for i, (s, t) in enumerate(zip(spec, tree, strict=True)):
            axes += _leaf_axes(s, t, f"{path}[{i}]", what, where)
        return axes
    if not isinstance(tree, dict) or sorted(tree) != sorted(spec):
        got = nest.format_structure(tree, lambda _: "*")
        _fail(
            where,
            f"{what} at {label} is a dict with keys {sorted(spec)!r} but the value there is "
            f"{got}: the structures must match",
        )
    axes = []
    for k in sorted(spec):
        axes += _leaf_axes(spec[k], tree[k], f"{path}[{k!r}]", what, where)
    return axes


def _moved(x: _core.Tensor, source: int, dest: int) -> _core.Tensor:
    """`x` with axis `source` moved to position `dest` (numpy's moveaxis)."""
    if source == dest:
        return x
    order = [a for a in range(x.ndim) if a != source]
    order.insert(dest, source)
    return _core.transpose(x, order)


def _lanes_of(x: _core.Tensor, level: int) -> _core.Tensor:
    """`x` as lanes of `level`: itself if it is already; else the same value in every lane.
    Lanes of a `vmap` inside `level`'s stay the outer views (the order every value has)."""
    levels = _core.lanes_levels(x)
    if level in levels:
        return x
    active = _core.vmap_levels()
    if levels and levels[0] in active and active.index(levels[0]) > active.index(level):
        inner = _core.lanes_unwrap(x, levels[0])
        return _core.lanes_wrap(_lanes_of(inner, level), levels[0])
    every = _core.broadcast_to(x, (_core.vmap_lanes(level), *x.shape))
    return _core.lanes_wrap(every, level)


def lanes_everywhere(x: Any, levels: list[int] | None = None) -> Any:
    """`x` (a tensor) as lanes of every active `vmap` call (or of `levels`): what a transform
    inside `vmap` differentiates with respect to, so that each lane gets its own derivative."""
    if not isinstance(x, _core.Tensor):
        return x
    for level in _core.vmap_levels() if levels is None else levels:
        x = _lanes_of(x, level)
    return x


def physical(x: Any) -> Any:
    """`x` with every lane view taken off (what a traced function's frame holds)."""
    if not isinstance(x, _core.Tensor):
        return x
    for level in _core.lanes_levels(x):
        x = _core.lanes_unwrap(x, level)
    return x


def dressed(x: _core.Tensor, levels: list[int] | None = None) -> _core.Tensor:
    """`x`, batched over every active `vmap` call or `levels` (lanes along its leading axes,
    outermost call first), as one lane's view: the inverse of `physical` after
    `lanes_everywhere`."""
    for level in _core.vmap_levels() if levels is None else levels:
        x = _core.lanes_wrap(x, level)
    return x


def staged_call(
    name: str, inputs: list[_core.Tensor], build: Callable[[list[Any]], list[Any]]
) -> list[_core.Tensor]:
    """`build` (inputs in, flat tensors out) traced with what it closes over as inputs and run
    as one staged op (`_staged`), whose derivatives are graph mode's. Inside `vmap` the trace
    takes every lane's values: lanes come off `inputs` and off what `build` closes over as it
    is captured, the graph is traced batched (each lane its own trips and branches), and its
    results are lanes again."""
    from . import _staged

    active = _core.vmap_levels()
    held = [[level for level in active if level in _core.lanes_levels(t)] for t in inputs]

    def traced(symbols: list[Any]) -> list[Any]:
        out = build([dressed(s, h) for s, h in zip(symbols, held, strict=True)])
        return [physical(lanes_everywhere(t)) for t in out]

    flat = [physical(t) for t in inputs]
    specs = [(t.dtype, tuple(t.shape)) for t in flat]
    staged, captured = _staged.trace(name, specs, traced)
    return [dressed(t) for t in _staged.call(staged, flat + list(captured))]


def over_leading_axes(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, whose array arguments may carry leading batch axes (as `gl.linalg`'s do), run
    once over the whole batch inside `vmap`: its batched arguments and the arrays batched with
    them go in with their lanes as leading axes, and its results come out as lanes."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        leaves = nest.flatten(args)
        if not any(isinstance(x, _core.Tensor) and _core.lanes_levels(x) for x in leaves):
            return fn(*args, **kwargs)
        lanes = [
            physical(lanes_everywhere(_core.tensor(x) if isinstance(x, np.ndarray) else x))
            for x in leaves
        ]
        out = fn(*nest.pack_sequence_as(args, lanes), **kwargs)
        return nest.map_structure(
            lambda y: dressed(y) if isinstance(y, _core.Tensor) else y, out, check_types=False
        )

    return run


def match_lanes(a: _core.Tensor, b: _core.Tensor) -> tuple[_core.Tensor, _core.Tensor]:
    """`a` and `b` batched over the same `vmap` calls: each made lanes where the other is."""
    levels = set(_core.lanes_levels(a)) | set(_core.lanes_levels(b))
    for level in _core.vmap_levels():
        if level in levels:
            a = _lanes_of(a, level)
            b = _lanes_of(b, level)
    return a, b


def vmap(
    fn: Callable[..., Any],
    in_axes: Any = 0,
    out_axes: Any = 0,
    axis_size: int | None = None,
) -> Callable[..., Any]:
    """`fn` mapped over an axis of its arguments: JAX's `vmap`.

    Reference semantics in plain Python (one axis, `in_axes=0`, `out_axes=0`)::

        def vmapped(*args):
            outs = [fn(*(a[i] for a in args)) for i in range(len(args[0]))]
            return stack(outs)

    but every op runs once over the whole batch.

    Args:
        fn: the function of one lane. It may use every op, transform (`grad`, `jvp`,
            `hessian`, `vmap` itself) and mode (eager, `@gl.function`, `gl.jit`).
        in_axes: which axis of each argument holds the lanes: an int (negative counts from
            the end), None (not batched: the same in every lane), or a tuple with one entry per
            positional argument, each an int, None or a pytree prefix of that argument.
        out_axes: where the lanes go in each output: an int, or a pytree prefix of the output;
            None only for an output that is the same in every lane.
        axis_size: the number of lanes, needed only when no argument is batched.

    Returns:
        The batched function. Batched arguments must agree on the number of lanes; a mismatch,
        an axis out of range or an `in_axes` structure that does not match the arguments is an
        `InvalidArgumentError` naming the argument.
    """
    _validate.check_callable("vmap", "fn", fn)
    where = f"vmap({_name(fn)})"
    _check_axis_spec(in_axes, "in_axes", where)
    _check_axis_spec(out_axes, "out_axes", where)
    if axis_size is not None and (
        isinstance(axis_size, bool) or not isinstance(axis_size, (int, np.integer)) or axis_size < 1
    ):
        _fail(where, f"axis_size must be a positive int or None; got {axis_size!r}")

    @functools.wraps(fn)
    def batched(*args: Any, **kwargs: Any) -> Any:
        spec = in_axes
        if isinstance(spec, list):
            spec = tuple(spec)
        if isinstance(spec, tuple) and len(spec) != len(args):
            _fail(
                where,
                f"in_axes has {len(spec)} entries but the function got {len(args)} "
                "positional arguments",
            )
        # Keyword arguments are mapped over their axis 0, as JAX's are.
        tree = (tuple(args), kwargs)
        axes = _leaf_axes((spec, 0), tree, "", "in_axes", where)
        flat = nest.flatten_with_paths(tree)
        leaves: list[Any] = []
        size = None
        first = ""
        for (path, leaf), axis in zip(flat, axes, strict=True):
            label = f"argument {nest.path_str(path)}"
            if axis is None:
                leaves.append(leaf)
                continue
            x = _validate.to_tensor("vmap", leaf, path, "argument")
            if x.ndim == 0:
                _fail(where, f"{label} is a scalar: it has no axis {axis} to map over")
            if not -x.ndim <= axis < x.ndim:
                _fail(
                    where,
                    f"in_axes {axis} is out of range for {label} of shape {list(x.shape)}",
                )
            axis %= x.ndim
            n = x.shape[axis]
            if n is None:
                _fail(where, f"{label} has no static size along axis {axis}")
            if size is None:
                size, first = n, label
            elif n != size:
                _fail(
                    where,
                    f"batched arguments have different sizes: {first} has {size} lanes but "
                    f"{label} has {n} (along its axis {axis})",
                )
            leaves.append((x, axis))
        if size is None:
            if axis_size is None:
                _fail(where, "no argument is batched (every in_axes is None): give axis_size")
            size = int(axis_size)
        elif axis_size is not None and int(axis_size) != size:
            _fail(where, f"axis_size is {axis_size} but the batched arguments have {size} lanes")
        level = _core.vmap_begin(size)
        try:
            lane_args = [
                _core.lanes_wrap(_moved(leaf[0], leaf[1], 0), level)
                if isinstance(leaf, tuple)
                else leaf
                for leaf in leaves
            ]
            lane_pos, lane_kw = nest.pack_sequence_as(tree, lane_args)
            out = fn(*lane_pos, **lane_kw)
            return _unbatched_outputs(out, level, size, where)
        finally:
            _core.vmap_end(level)

    def _unbatched_outputs(out: Any, level: int, size: int, where: str) -> Any:
        axes = _leaf_axes(out_axes, out, "", "out_axes", where)
        results = []
        for (path, leaf), axis in zip(nest.flatten_with_paths(out), axes, strict=True):
            label = f"output {nest.path_str(path) or ''}".rstrip()
            if leaf is None:
                results.append(None)
                continue
            x = _validate.to_tensor("vmap", leaf, path, "output")
            physical = _core.lanes_unwrap(x, level)
            if axis is None:
                if physical is not None:
                    _fail(
                        where,
                        f"out_axes is None for {label}, but it differs per lane: give it an axis",
                    )
                results.append(x)
                continue
            if physical is None:
                physical = _core.broadcast_to(x, (size, *x.shape))
            rank = physical.ndim
            if not -rank <= axis < rank:
                _fail(
                    where,
                    f"out_axes {axis} is out of range for {label}, whose batch has shape "
                    f"{list(physical.shape)}",
                )
            results.append(_moved(physical, 0, axis % rank))
        return nest.pack_sequence_as(out, results)

    return batched


def argument_levels(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
    """The active `vmap` levels some tensor among the arguments is lanes of, outermost first
    (none, without a flatten, when no `vmap` is active)."""
    active = _core.vmap_levels()
    if not active:
        return []
    seen: set[int] = set()
    for leaf in args if _tensors_only(args, kwargs) else nest.flatten((args, kwargs)):
        if isinstance(leaf, _core.Tensor):
            seen.update(_core.lanes_levels(leaf))
    return [level for level in active if level in seen]


def _tensors_only(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the arguments are tensors passed positionally (the common call, whose leaves
    are the arguments themselves)."""
    return not kwargs and all(isinstance(x, _core.Tensor) for x in args)


def call_over_lanes(
    fn: Callable[..., Any],
    compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]],
    cache: dict[Any, Callable[..., Any] | None],
    levels: list[int],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """A graph function (`fn`'s Python, compiled by `compile_fn`: `gl.function` or `gl.jit`)
    called eagerly on lanes of the `vmap` calls `levels`. Over one call's lanes it is compiled
    with that call inside it, `compile_fn(vmap(fn))`, and run on the lanes' physical values, so
    that its loops and branches batch as traced ones do (each lane its own trips); arguments
    that are not lanes pass unbatched (`in_axes=None`). `cache` keeps one compiled function per
    structure of the arguments and which of them are lanes. Over the lanes of nested calls at
    once, or where `fn` closes over lanes, `fn` runs eagerly, as it does under a tape."""
    tree = (tuple(args), dict(kwargs))
    simple = _tensors_only(args, kwargs)
    leaves = list(args) if simple else nest.flatten(tree)
    batched = tuple(isinstance(x, _core.Tensor) and bool(_core.lanes_levels(x)) for x in leaves)
    shape = len(args) if simple else nest.format_structure(tree, lambda _: "*")
    key = (len(levels), batched, shape)
    if len(levels) > 1 or cache.get(key, False) is None:
        return fn(*args, **kwargs)
    compiled = cache.get(key)
    if compiled is None:

        def one_lane(*flat: Any) -> Any:
            lane_args, lane_kwargs = nest.pack_sequence_as(tree, list(flat))
            return fn(*lane_args, **lane_kwargs)

        mapped = vmap(one_lane, in_axes=tuple(0 if b else None for b in batched))
        compiled = cache[key] = compile_fn(functools.wraps(fn)(mapped))
    (level,) = levels
    pairs = zip(leaves, batched, strict=True)
    values = [_core.lanes_unwrap(x, level) if b else x for x, b in pairs]
    # The calls active here are set aside: the compiled function holds its own.
    _core.vmap_suspend()
    try:
        out = compiled(*values)
    except errors.InvalidArgumentError as e:
        if not closes_over_lanes(e):
            raise
        cache[key] = None
        out = _REFUSED
    finally:
        _core.vmap_resume()
    if out is _REFUSED:
        return fn(*args, **kwargs)
    wrap = lambda y: _core.lanes_wrap(y, level) if isinstance(y, _core.Tensor) else y  # noqa: E731
    if type(out) is tuple:
        return tuple(map(wrap, out))
    return nest.map_structure(wrap, out)


_REFUSED = object()


def closes_over_lanes(error: errors.InvalidArgumentError) -> bool:
    """Whether `error` is a trace's refusal of a lane view it cannot hold: a graph function
    traced while `vmap` runs eagerly, whose Python closes over lanes."""
    return "a batched value was used outside the vmap call" in str(error)


# ---- control flow over lanes (eager) ------------------------------------------------------------
#
# A predicate or branch index that differs per lane splits the lanes: each branch runs on the
# lanes that take it (the level narrowed to them, so what the branch closes over is gathered to
# its lanes when used), and the results are stitched back in lane order. A branch no lane takes
# never runs, and nothing it would compute reaches a value or a gradient. A loop narrows its
# level to the live lanes whenever some finish, so its body's cost follows the live lanes.


def lane_level(x: Any) -> int | None:
    """The innermost `vmap` level `x` (a predicate, index or loop condition) differs over."""
    if not isinstance(x, _core.Tensor):
        return None
    levels = _core.lanes_levels(x)
    return levels[0] if levels else None


def unsupported_traced(fn: str) -> Any:
    raise errors.InvalidArgumentError(
        _validate.at_user(
            f"{fn}: a predicate that differs over the lanes of nested gl.vmap calls at once, or "
            "over lanes whose number is known only at run time, is supported in eager mode; not "
            "yet inside @gl.function or gl.jit"
        )
    )


def _host_lanes(fn: str, x: _core.Tensor, level: int | None) -> np.ndarray:
    """Each lane's value of predicate or index `x` (batched at `level`, and at outer levels
    only where they are narrowed to one lane: `over_outer_lanes`), on the host."""
    physical = _core.lanes_unwrap(x, level) if lane_level(x) == level else x
    if _core.mode() == "tracing":
        unsupported_traced(fn)
    return np.asarray(_one_lane_outside(fn, physical).numpy())


def _one_lane_outside(fn: str, physical: _core.Tensor) -> _core.Tensor:
    """`physical` (a predicate over one level's lanes) off the outer levels it is batched at,
    each narrowed to one lane by `over_outer_lanes`."""
    for outer in _core.lanes_levels(physical):  # innermost first: the outermost wrapper
        if _core.vmap_lanes(outer) != 1:
            unsupported_traced(fn)
        physical = _core.lanes_unwrap(physical, outer)
        physical = _core.reshape(physical, tuple(physical.shape[1:]))
    return physical


# ---- nested levels ----------------------------------------------------------------------------
#
# A predicate that differs over the lanes of an outer `vmap` level as well as an inner one runs
# its construct once per lane of the outer level, the level narrowed to that lane (so what the
# construct reads is that lane's), and stacks the results back over the outer lanes. Each lane of
# every level takes its own branches and trips. Eagerly that costs a Python step per outer lane;
# traced, a copy of the construct per outer lane, up to `TRACED_OUTER_LANES` of them.

#: The most lanes of an outer level a traced construct is copied for (the graph grows with them).
TRACED_OUTER_LANES = 64


def outer_level(x: Any, level: int) -> int | None:
    """The innermost level past `level` over whose current lanes (more than one) predicate `x`
    also differs, or None."""
    physical = _core.lanes_unwrap(x, level)
    if physical is None:
        return None
    for outer in _core.lanes_levels(physical):
        if _core.vmap_lanes(outer) != 1:
            return outer
    return None


def over_outer_lanes(outer: int, run: Callable[[], Any]) -> Any:
    """`run()` once per lane of level `outer`, narrowed to it, the results' lanes stacked back."""
    lanes = _core.vmap_lanes(outer)
    if lanes is None or (_core.mode() == "tracing" and lanes > TRACED_OUTER_LANES):
        raise errors.InvalidArgumentError(
            _validate.at_user(
                f"vmap: a predicate differs over the lanes of nested gl.vmap calls at once; "
                f"traced, its construct is copied for each of the outer call's {lanes} lanes, "
                f"and at most {TRACED_OUTER_LANES} are: swap the vmap calls so the outer one "
                "is the smaller, or run it eagerly"
            )
        )
    if lanes == 0:
        # Each outer lane runs the construct on its own; with none, nothing gives the results'
        # structure (a single level of zero lanes runs its branches on none of them instead).
        raise errors.InvalidArgumentError(
            _validate.at_user(
                "vmap: a predicate differs over the lanes of nested gl.vmap calls at once, and "
                "the outer call has zero lanes: give it at least one, or batch the empty input "
                "with one gl.vmap"
            )
        )
    parts = []
    for lane in range(lanes):
        _core.lanes_narrow(outer, _rows(np.array([lane])))
        try:
            out = run()
            leaves = [None if x is None else _physical(x, outer, 1) for x in nest.flatten(out)]
        finally:
            _core.lanes_widen(outer)
        parts.append((out, leaves))
    stacked = []
    for i, first in enumerate(parts[0][1]):
        whole = None if first is None else _core.concatenate([p[1][i] for p in parts], 0)
        stacked.append(None if whole is None else _wrap(whole, outer))
    return nest.pack_sequence_as(parts[0][0], stacked)


_EXPECTED = {
    "pred": ((_core.bool_,), "a scalar bool tensor"),
    "branch_index": ((_core.int32, _core.int64), "a scalar int32/int64 tensor"),
    "the result of cond": ((_core.bool_,), "a scalar bool tensor"),
}


def lanes_values(
    fn: str, x: _core.Tensor, level: int, what: str, on_host: bool = True
) -> np.ndarray | None:
    """Each lane's predicate or branch index `x` (on the host, or only checked), checked to be
    one lane's scalar of the right dtype."""
    dtypes, expected = _EXPECTED[what]
    if x.dtype not in dtypes or x.shape != ():
        _fail(fn, f"{what} must be {expected} in each lane; got {_validate.describe(x)}")
    return _host_lanes(fn, x, level) if on_host else None


def _physical(leaf: Any, level: int, lanes: int, span: list[int] | None = None) -> _core.Tensor:
    """`leaf` (a branch output or loop variable) as a tensor whose axis 0 holds the level's
    current `lanes` lanes and whose next axes hold those of each level inside it in `span`
    (default: every one), outermost first, repeated over a level it does not differ over: it is
    batched only at levels outside `level`, so it stays valid when `level` is narrowed or
    widened. `_wrap` undoes it."""
    for inner in reversed(_inner_levels(level) if span is None else span):
        leaf = _over_level(leaf, inner, _core.vmap_lanes(inner))
    return _over_level(leaf, level, lanes)


def _over_level(leaf: Any, level: int, lanes: int) -> _core.Tensor:
    physical = _core.lanes_unwrap(leaf, level)
    return _core.broadcast_to(leaf, (lanes, *leaf.shape)) if physical is None else physical


def _wrap(physical: _core.Tensor, level: int, span: list[int] | None = None) -> Any:
    """One lane's view of a tensor `_physical` made."""
    value = _core.lanes_wrap(physical, level)
    for inner in _inner_levels(level) if span is None else span:
        value = _core.lanes_wrap(value, inner)
    return value


def _inner_levels(level: int) -> list[int]:
    """The active levels inside `level`, outermost first."""
    levels = _core.vmap_levels()
    return levels[levels.index(level) + 1 :]


def _span(x: Any, level: int) -> list[int]:
    """The levels inside `level` that `x` differs over, outermost first."""
    if not isinstance(x, _core.Tensor):
        return []
    levels = _core.lanes_levels(x)
    return [inner for inner in _inner_levels(level) if inner in levels]


def _run_on(
    level: int, rows: np.ndarray | _core.Tensor, run: Callable[[], Any]
) -> tuple[Any, list[Any]]:
    """`run()` on lanes `rows` of the level's current lanes: its output and output leaves,
    each with its lanes along axis 0 (the level narrowed while it runs)."""
    if isinstance(rows, np.ndarray):
        rows = _core.tensor(rows.astype(np.int64))
    _core.lanes_narrow(level, rows)
    try:
        out = run()
        return out, [
            None if leaf is None else _physical(leaf, level, rows.shape[0])
            for leaf in nest.flatten(out)
        ]
    finally:
        _core.lanes_widen(level)


def _stitch(level: int, parts: list[tuple[np.ndarray, list[Any]]]) -> list[Any]:
    """Per output leaf, the parts' lanes (rows of the current lanes) put back in lane order."""
    order = np.concatenate([rows for rows, _ in parts])
    inverse = _core.tensor(np.argsort(order, kind="stable").astype(np.int64))
    leaves = []
    for i, first in enumerate(parts[0][1]):
        if first is None:
            leaves.append(None)
            continue
        pieces = [leaves_[i] for _, leaves_ in parts]
        whole = pieces[0] if len(pieces) == 1 else _core.concatenate(pieces, 0)
        if len(pieces) > 1 or not np.array_equal(order, np.arange(len(order))):
            whole = _core.take(whole, inverse, 0)
        leaves.append(_wrap(whole, level))
    return leaves


def branches(fn: str, level: int, choice: np.ndarray, named: list[tuple[str, Any]]) -> Any:
    """`named[choice[lane]]` run on each lane: every branch once, on the lanes that take it."""
    outputs: list[tuple[str, Any]] = []
    parts = []
    for k, (name, branch) in enumerate(named):
        rows = np.flatnonzero(choice == k)
        # Over zero lanes every branch runs on none of them: that computes nothing, and gives
        # the results' structure, shapes and dtypes.
        if rows.size == 0 and choice.size:
            continue

        def run(branch: Any = branch, name: str = name) -> Any:
            return _validate.convert_outputs(fn, branch(), f"the output of {name}")

        out, leaves = _run_on(level, rows, run)
        outputs.append((name, out))
        parts.append((rows, leaves))
    first = _validate.check_branch_outputs(fn, outputs)
    return nest.pack_sequence_as(first, _stitch(level, parts))


def while_loop(
    cond: Callable[..., Any],
    body: Callable[..., Any],
    values: Any,
    call: Callable[[Callable[..., Any], Any], Any],
    limit: int | None,
    pred: Any,
    i: int,
    check_body: Callable[[Any, Any, int], Any],
) -> Any:
    """The rest of an eager `while_loop` whose condition `pred` (of `values`, after `i < limit`
    trips) differs per lane: each lane stops when its own condition fails or it reaches
    `limit`. Live lanes make their trips together; when some finish, their values are set
    aside and the level narrowed to the others, so the body runs over live lanes only."""
    level = lane_level(pred)
    outer = outer_level(pred, level)
    if outer is not None:
        args = (cond, body, values, call, limit, pred, i, check_body)
        return over_outer_lanes(outer, functools.partial(while_loop, *args))
    live = np.arange(lanes_values("while_loop", pred, level, "the result of cond").size)
    done: list[tuple[np.ndarray, list[Any]]] = []
    narrowed = 0
    try:
        while True:
            mask = _lane_mask(pred, level, live.size)
            finished = np.flatnonzero(~mask)
            if finished.size:
                done.append((live[finished], _rows_of(values, level, live.size, finished)))
            kept = np.flatnonzero(mask)
            if kept.size == 0:
                break
            if finished.size:
                _core.lanes_narrow(level, _rows(kept))
                narrowed += 1
                live = live[kept]
            values = check_body(values, call(body, values), i)
            i += 1
            if limit is not None and i >= limit:
                done.append((live, _rows_of(values, level, live.size, None)))
                break
            pred = call(cond, values)
    finally:
        for _ in range(narrowed):
            _core.lanes_widen(level)
    if not done:  # zero lanes: no trips
        return values
    return nest.pack_sequence_as(values, _stitch(level, done))


def _lane_mask(pred: Any, level: int, lanes: int) -> np.ndarray:
    """Each live lane's loop condition."""
    if lane_level(pred) is None:
        going = _validate.check_predicate("while_loop", pred, "the result of cond")
        return np.full(lanes, bool(going))
    return lanes_values("while_loop", pred, level, "the result of cond").astype(bool)


def _rows_of(values: Any, level: int, lanes: int, rows: np.ndarray | None) -> list[Any]:
    """The leaves of `values` over the level's current `lanes` lanes, at `rows` (all: None)."""
    out = []
    for leaf in nest.flatten(values):
        physical = _physical(leaf, level, lanes)
        out.append(physical if rows is None else _core.take(physical, _rows(rows), 0))
    return out


def _rows(rows: np.ndarray) -> _core.Tensor:
    return _core.tensor(rows.astype(np.int64))


# ---- control flow over lanes (traced) -----------------------------------------------------------
#
# Traced (`@gl.function`, `gl.jit`, export), shapes are static: a construct runs over every lane
# of its level, or of a bucket of them (below), on values that are safe to compute. A lane that
# does not take a branch, or whose loop is done, computes on a copy of a lane that does (its
# inputs, and what the function closes over, selected from that lane: a stand-in narrowing,
# `_core.lanes_stand_in`), and its result is discarded by a select; so no value it would
# compute, NaN, inf or an error, can reach a result, and its cotangent is an exact zero. A
# branch no lane takes does not run.


def _traced_lanes(fn: str, level: int) -> int:
    count = _core.vmap_lanes(level)
    if count is None:
        unsupported_traced(fn)
    return count


def _lanes_mask(x: _core.Tensor, level: int, lanes: int) -> _core.Tensor:
    """Predicate `x` (one lane's scalar bool) over every lane: bool[lanes]."""
    if _span(x, level):
        unsupported_traced("while_loop")  # it differs over an inner level too
    physical = _core.lanes_unwrap(x, level)
    if physical is None:
        return _core.broadcast_to(x, (lanes,))
    return _one_lane_outside("while_loop", physical)


def _select(mask: _core.Tensor, a: _core.Tensor, b: _core.Tensor) -> _core.Tensor:
    """`a` on the lanes `mask` holds, else `b` (both with lanes along axis 0)."""
    mask = _core.reshape(mask, (mask.shape[0],) + (1,) * (a.ndim - 1))
    return _core.where(mask, a, b)


def _on_stand_ins(
    level: int, mask: _core.Tensor, run: Callable[[], Any], spans: list[Any] | None = None
) -> tuple[Any, list[Any]]:
    """`run()` with each lane outside `mask` computing on a copy of the first lane inside it:
    its output, and its leaves with lanes along axis 0 (and each leaf's `spans`, as
    `_physical` takes them)."""
    lanes = mask.shape[0]
    if lanes:  # over zero lanes there is nothing to stand in for
        _core.lanes_stand_in(level, mask)
    try:
        out = run()
        flat = nest.flatten(out)
        spans = [None] * len(flat) if spans is None else spans
        leaves = [
            None if x is None else _physical(x, level, lanes, span)
            for x, span in zip(flat, spans, strict=True)
        ]
        return out, leaves
    finally:
        if lanes:
            _core.lanes_widen(level)


def traced_branches(fn: str, level: int, choice: Any, named: list[tuple[str, Any]]) -> Any:
    """Traced `named[choice]` per lane (`choice`: one lane's int32 scalar): each branch some
    lane takes runs in the smallest bucket that holds its lanes, on stand-ins for the others
    (`_traced_branch`; none runs it when no lane takes it), and each lane keeps its own
    branch's results."""
    _traced_lanes(fn, level)  # a number of lanes known now, or a clear error
    choice = _core.lanes_unwrap(choice, level)
    if choice is None:
        unsupported_traced(fn)
    choice = _one_lane_outside(fn, choice)
    outputs: list[tuple[str, Any]] = []
    results: list[tuple[Any, list[Any]]] = []
    for k, (name, branch) in enumerate(named):
        mask = _core.equal(choice, _core.tensor(k, dtype=choice.dtype))
        out, leaves = _traced_branch(fn, level, mask, name, branch)
        outputs.append((name, out))
        results.append((mask, leaves))
    first = _validate.check_branch_outputs(fn, outputs)
    stitched = list(results[-1][1])
    for mask, leaves in reversed(results[:-1]):
        stitched = [_select(mask, a, b) for a, b in zip(leaves, stitched, strict=True)]
    wrapped = iter(_wrap(x, level) for x in stitched)
    leaves = [None if x is None else next(wrapped) for x in nest.flatten(first)]
    return nest.pack_sequence_as(first, leaves)


def _traced_branch(
    fn: str, level: int, mask: _core.Tensor, name: str, branch: Callable[[], Any]
) -> tuple[Any, list[Any]]:
    """Branch `branch` traced over every lane (those `mask` excludes on stand-ins), and over
    each bucket of fewer lanes (`_buckets`), inside a `Case` that runs it only when some lane
    takes it, in the smallest bucket that holds the lanes that do: its output and result
    leaves, over every lane."""
    from .control_flow import _graph_branches
    from .reductions import any as any_

    lanes = _traced_lanes(fn, level)  # refuses lanes known only at run time
    taken: list[Any] = []
    kinds: list[tuple[tuple[int, ...], Any]] = []
    sizes = _buckets(lanes)
    outside = _core.vmap_levels()[: _core.vmap_levels().index(level)]

    def convert() -> Any:
        return _validate.convert_outputs(fn, branch(), f"the output of {name}")

    def run() -> Any:
        out, leaves = _on_stand_ins(level, mask, convert)
        taken.append(out)
        kept = tuple(leaf for leaf in leaves if leaf is not None)
        kinds[:] = [(tuple(x.shape), x.dtype) for x in kept]  # the last trace's
        return kept

    def in_bucket(size: int) -> Callable[[], Any]:
        def run_packed() -> Any:
            rows, pos, _ = _partition(mask, size)

            def packed() -> Any:
                _, leaves = _run_on(level, rows, convert)
                return tuple(leaf for leaf in leaves if leaf is not None)

            def none() -> Any:
                return tuple(_core.zeros((size, *shape[1:]), dtype=d) for shape, d in kinds)

            # The branch in a construct of its own, which a compiler does not fuse into the
            # gather that puts its lanes in order (XLA would compute it again for every lane).
            named = [(f"{name} [{size} lanes]", packed), (f"{name} (no lane)", none)]
            emit = lambda traced: _core.emit_if(any_(mask), *traced)  # noqa: E731
            leaves = _graph_branches(fn, named, emit, outside)
            return tuple(_core.take(leaf, pos, 0) for leaf in leaves)

        return run_packed

    def idle() -> Any:
        # What a branch no lane takes gives: zeros shaped as the taken branch's results.
        return tuple(_core.zeros(shape, dtype=dtype) for shape, dtype in kinds)

    named = [(name, run), *((f"{name} [{s} lanes]", in_bucket(s)) for s in sizes)]
    named.append((f"{name} (no lane)", idle))
    emit = lambda traced: _core.emit_case(_bucket_index(mask, sizes), traced)  # noqa: E731
    _BUCKETING.depth += bool(sizes)
    try:
        leaves = _graph_branches(fn, named, emit, outside)
    finally:
        _BUCKETING.depth -= bool(sizes)
    return taken[0], list(leaves)


# ---- buckets of lanes (traced) ------------------------------------------------------------------
#
# Static shapes cannot follow the lanes that take a branch, but a few sizes can: a construct
# over B lanes is traced again over B/4, B/16 and B/64 lanes, and runs in the smallest that
# holds its lanes (gathered to the front; the rest of the bucket computes on copies of the first,
# whose results are never read), so a branch that few lanes take costs about their number.
# Each bucket is another copy of the construct's graph: only the outermost construct that
# buckets does, and only over enough lanes to pay for the gathers.

#: Fewest lanes worth buckets, and fewest lanes in one.
_BUCKET_MIN_LANES = 64
_BUCKET_MIN = 16
_BUCKET_RATIO = 4
_BUCKET_COUNT = 3

#: Whether `gl.jit(backend="xla")` traces loops over lanes in buckets too. Off: XLA runs a
#: masked trip of a small body as one fused pass, and in `benches/vmap.py` (V1) the masked
#: loop's per-example gradient ran 1.1 to 2 times faster than the bucketed one, its values as
#: fast or faster but on a heavy tail (buckets 14% faster there). Branches keep their buckets.
XLA_LOOP_BUCKETS = False


class _Bucketing(threading.local):
    """How many constructs this thread is tracing in buckets now (their inner constructs do
    not bucket), and whether loops are traced masked, without buckets (`loops_masked`)."""

    depth = 0
    masked_loops = False


@contextlib.contextmanager
def loops_masked(masked: bool = True) -> Iterator[None]:
    """Within it, this thread traces loops over lanes masked, without buckets (`masked`)."""
    saved = _BUCKETING.masked_loops
    _BUCKETING.masked_loops = masked
    try:
        yield
    finally:
        _BUCKETING.masked_loops = saved


_BUCKETING = _Bucketing()


def _buckets(lanes: int) -> list[int]:
    """The smaller sizes a construct over `lanes` lanes is also traced at, largest first."""
    if _BUCKETING.depth or lanes < _BUCKET_MIN_LANES:
        return []
    sizes = []
    size = lanes
    for _ in range(_BUCKET_COUNT):
        smaller = -(-size // _BUCKET_RATIO)
        if smaller < _BUCKET_MIN or smaller == size:
            break
        size = smaller
        sizes.append(size)
    return sizes


def _bucket_index(mask: _core.Tensor, sizes: list[int]) -> _core.Tensor:
    """Which case runs the lanes `mask` holds: 0 all lanes, k the bucket `sizes[k - 1]` (the
    smallest that holds them), `len(sizes) + 1` none."""
    count = _core.sum(_core.cast(mask, "int32"))
    index = _core.tensor(0, dtype="int32")
    for size in sizes:
        index = index + _core.cast(_core.less_equal(count, size), "int32")
    none = _core.tensor(len(sizes) + 1, dtype="int32")
    return _core.where(_core.equal(count, 0), none, index)


def _partition(mask: _core.Tensor, size: int) -> tuple[_core.Tensor, _core.Tensor, _core.Tensor]:
    """The first `size` lanes that `mask` (bool[B]) holds gathered to the front: `rows`
    (int64[size]), those lanes in order, then the first of them repeated; `pos` (int64[B]),
    each lane's place in `rows` (0 for a lane not there); and `fits` (bool[B]), the lanes
    there. The op table's `pack_indices` computes it, as a composite call whose callee
    (`_pack_indices`, table ops) is what compilers read."""
    kernel = f"pack_indices{{size={size}}}"
    if not _core.trace_active():
        return tuple(_core.factor_kernel(kernel, [mask]))
    params = _core.trace_push("pack_indices", [(mask.dtype, tuple(mask.shape))])
    try:
        out = _pack_indices(params[0], size)
    except BaseException:
        _core.trace_pop([])
        raise
    return tuple(_core.emit_custom_call([mask], params, list(out), kernel=kernel))


def _pack_indices(mask: _core.Tensor, size: int) -> tuple[_core.Tensor, _core.Tensor, _core.Tensor]:
    """`_partition` in table ops, so it traces and compiles everywhere: a prefix sum by
    doubling, then one scatter."""
    lanes = mask.shape[0]
    ones = _core.cast(mask, "int64")
    count = ones  # inclusive prefix sum
    shift = 1
    while shift < lanes:
        shifted = _core.concatenate([_core.zeros((shift,), dtype="int64"), count[:-shift]])
        count = count + shifted
        shift *= 2
    place = count - 1
    fits = _core.logical_and(mask, _core.less(place, size))
    pos = _core.where(fits, place, 0)
    lane = _core.arange(lanes, dtype="int64")
    # lanes past `size` (none, when the bucket is chosen by count) land in a spare slot
    target = _core.where(fits, place, size)
    rows = _core.scatter_add(_core.where(fits, lane, 0), target, 0, size + 1)[:size]
    filled = _core.less(_core.arange(size, dtype="int64"), count[-1])
    return _core.where(filled, rows, rows[0]), pos, fits


class BatchedPredicate(Exception):
    """Raised while tracing a loop's condition that differs per lane (`level`): the loop is
    traced again as `traced_while`."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.level = level


def traced_while(
    cond: Callable[..., Any],
    body: Callable[..., Any],
    loop_vars: Any,
    call: Callable[[Callable[..., Any], Any], Any],
    limit: int | None,
    parallel_iterations: int,
    checkpoints: int | None,
    level: int,
) -> Any:
    """A traced loop whose condition differs per lane: one `While` over every lane's
    variables and a live mask. Each trip, lanes still running step; a lane that is done keeps
    its values, and computes the trip on a stand-in (a running lane's values) whose result is
    discarded. The loop ends when no lane runs, so each lane makes exactly its own trips."""

    outer = outer_level(call(cond, loop_vars), level)
    if outer is not None:
        again = (cond, body, loop_vars, call, limit, parallel_iterations, checkpoints, level)
        return over_outer_lanes(outer, functools.partial(traced_while, *again))
    options = (parallel_iterations, checkpoints)
    lanes = _traced_lanes("while_loop", level)
    # Each variable keeps the levels inside `level` it differs over (a counter stays one per
    # lane of `level`, so the condition does not come to differ over an inner level), and
    # whether it differs over a level outside; a trip that makes it differ over more traces the
    # loop again.
    leaves = nest.flatten(loop_vars)
    outside = _core.vmap_levels()[: _core.vmap_levels().index(level)]
    layout = _Layout(level, outside, [_span(t, level) for t in leaves], [False] * len(leaves))
    layout = layout.grown(leaves)
    while True:
        try:
            return _traced_while(cond, body, loop_vars, call, limit, layout, lanes, options)
        except _Widened as widened:
            layout = widened.layout


class _Layout(NamedTuple):
    """How a traced batched loop holds its variables: lanes of `level` along axis 0, of the
    levels inside it in each variable's `spans` along the next axes; batched (`outer`) or not
    over the levels `outside` it, which a loop's frame holds as leading axes (`physical`)."""

    level: int
    outside: list[int]
    spans: list[list[int]]
    outer: list[bool]

    def grown(self, values: list[Any]) -> _Layout:
        """The layout that also holds `values` (one per variable, one lane's views)."""
        order = _inner_levels(self.level)
        spans = [
            sorted(set(span) | set(_span(x, self.level)), key=order.index)
            for x, span in zip(values, self.spans, strict=True)
        ]
        outer = [
            was or any(lv in self.outside for lv in _core.lanes_levels(x))
            for x, was in zip(values, self.outer, strict=True)
        ]
        return self._replace(spans=spans, outer=outer)

    def framed(self, phys: list[Any]) -> list[Any]:
        """Explicit lanes of `level` as a loop's frame holds them: off every level."""
        return [
            physical(lanes_everywhere(p, self.outside)) if o else p
            for p, o in zip(phys, self.outer, strict=True)
        ]

    def unframed(self, params: list[Any]) -> list[Any]:
        pairs = zip(params, self.outer, strict=True)
        return [dressed(p, self.outside) if o else p for p, o in pairs]


class _Widened(Exception):
    """A trip made a loop variable differ over more levels than its layout holds."""

    def __init__(self, layout: _Layout) -> None:
        super().__init__()
        self.layout = layout


def _traced_while(
    cond: Callable[..., Any],
    body: Callable[..., Any],
    loop_vars: Any,
    call: Callable[[Callable[..., Any], Any], Any],
    limit: int | None,
    layout: _Layout,
    lanes: int,
    options: tuple[int, int | None],
) -> Any:
    """The loop over `lanes` lanes in phases: a `While` over every lane until its live lanes
    fit the next bucket (`_buckets`), then one over that bucket, the live lanes gathered to its
    front, and so on; each lane's values are put back where they were at the end."""
    level, spans = layout.level, layout.spans
    leaves = nest.flatten(loop_vars)
    flat = [_physical(t, level, lanes, span) for t, span in zip(leaves, spans, strict=True)]
    sizes = [] if _BUCKETING.masked_loops else _buckets(lanes)
    phase = _Phase(cond, body, loop_vars, call, limit, layout, options)
    live = phase.going(flat, lanes)
    trips = _core.tensor(0, dtype="int32")
    if not sizes:
        flat, _, _ = phase.run(flat, live, trips, lanes, None)
        return phase.lane_values(flat)
    history = []
    narrowed = 0
    _BUCKETING.depth += 1
    try:
        for size, smaller in zip([lanes, *sizes], [*sizes, None], strict=True):
            flat, live, trips = phase.run(flat, live, trips, size, smaller)
            if smaller is None:
                break
            rows, pos, moved = _partition(live, smaller)
            # a lane that does not fit (the loop ended at `limit`) keeps its values
            history.append((flat, moved, pos))
            count = _core.sum(_core.cast(live, "int64"))
            flat = [_core.take(v, rows, 0) for v in flat]
            live = _core.less(_core.arange(smaller, dtype="int64"), count)
            _core.lanes_narrow(level, rows)
            narrowed += 1
    finally:
        _BUCKETING.depth -= 1
        for _ in range(narrowed):
            _core.lanes_widen(level)
    for before, moved, pos in reversed(history):
        flat = [_select(moved, _core.take(v, pos, 0), b) for v, b in zip(flat, before, strict=True)]
    return phase.lane_values(flat)


class _Phase(NamedTuple):
    """One `While` of a traced batched loop, over the level's current lanes."""

    cond: Callable[..., Any]
    body: Callable[..., Any]
    loop_vars: Any
    call: Callable[[Callable[..., Any], Any], Any]
    limit: int | None
    layout: _Layout
    options: tuple[int, int | None]

    def lane_values(self, phys: list[Any]) -> Any:
        spans = self.layout.spans
        wrapped = [_wrap(v, self.layout.level, span) for v, span in zip(phys, spans, strict=True)]
        return nest.pack_sequence_as(self.loop_vars, wrapped)

    def going(self, phys: list[Any], lanes: int) -> _core.Tensor:
        """Each lane's loop condition on `phys`."""
        values = self.lane_values(phys)
        return _lanes_mask(self.call(self.cond, values), self.layout.level, lanes)

    def run(
        self, phys: list[Any], live: _core.Tensor, trips: _core.Tensor, lanes: int, stop: int | None
    ) -> tuple[list[Any], _core.Tensor, _core.Tensor]:
        """The loop from `phys` over `lanes` lanes (`live` of them running, after `trips`
        trips) until no lane runs, or (`stop`) at most `stop` do: the values, live lanes and
        trips then."""
        from .control_flow import _checked_trip, _traced
        from .reductions import any as any_

        layout, level, spans = self.layout, self.layout.level, self.layout.spans
        start = [*layout.framed(phys), live, trips]
        specs = [(t.dtype, tuple(t.shape)) for t in start]

        def run_cond(params: list[Any]) -> list[Any]:
            going = any_(params[-2])
            if stop is not None:
                count = _core.sum(_core.cast(params[-2], "int32"))
                going = _core.logical_and(going, _core.greater(count, stop))
            if self.limit is not None:  # over every phase's trips
                going = _core.logical_and(going, _core.less(params[-1], self.limit))
            return [going]

        def run_body(params: list[Any]) -> list[Any]:
            phys, live = layout.unframed(params[:-2]), params[-2]
            values = self.lane_values(phys)

            def step() -> Any:
                new = self.call(self.body, values)
                new = _checked_trip(self.loop_vars, self.body, None, new, -1)
                wider = layout.grown(nest.flatten(new))
                if wider != layout:
                    raise _Widened(wider)
                return new

            _, new = _on_stand_ins(level, live, step, spans)
            kept = [_select(live, n, v) for n, v in zip(new, phys, strict=True)]
            going = _core.logical_and(live, self.going(kept, lanes))
            return [*layout.framed(kept), going, params[-1] + 1]

        cond_fn = _traced("while_cond", specs, run_cond)
        body_fn = _traced("while_body", specs, run_body)
        out = _core.emit_while(cond_fn, body_fn, start, self.limit, *self.options)
        return layout.unframed(list(out[:-2])), out[-2], out[-1]
