"""Eager constructs run as staged graphs, so that their derivatives have one implementation.

`while_loop(..., checkpoints=c)` run eagerly while tapes record is traced into a graph function
whose inputs are the loop variables and every tensor and Variable its cond and body close over
(scalars and values computed from them included: `trace_begin(closed_over_inputs=True)`). The
function runs on the frame executor and the tapes record it as one op. That op's gradient is
the function's vector-Jacobian product (`ConcreteFunction.vjp`: the Rust transform that graph
mode and `gl.jit` use, with the same checkpoint schedule), run as a staged op in turn, so
gradients of any order follow; its inputs carry tangents through the function's
Jacobian-vector product (`ConcreteFunction.jvp`). Memory: the checkpointed gradient's, c
states plus one trip.

Traces are cached by their graph's text: a loop run again with new values reuses the
function, its executor and its derivatives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from . import _core, _recording

__all__ = ["Staged", "call", "trace"]

#: Staged functions kept, by graph text (least recently used dropped first).
CACHE_SIZE = 64

#: Functions over lanes each staged function keeps, by pattern of levels and lane counts.
LANE_PATTERNS = 16

_cache: OrderedDict[str, Staged] = OrderedDict()


class Staged:
    """A graph function taking every input as an argument, with its derivatives made once."""

    __slots__ = ("_jvps", "_lanes", "_vjps", "fn", "name", "result_floats")

    def __init__(self, fn: Any, name: str, result_floats: list[bool]) -> None:
        self.fn = fn
        self.name = name
        self.result_floats = result_floats
        self._vjps: dict[tuple[int, ...], Staged] = {}
        self._jvps: dict[tuple[int, ...], Staged] = {}
        self._lanes: OrderedDict[tuple[tuple[tuple[bool, ...], int], ...], Staged] = OrderedDict()

    def over_lanes(self, levels: tuple[tuple[tuple[bool, ...], int], ...]) -> Staged:
        """This function over lanes of nested `vmap` levels, innermost first: each level's
        (which arguments hold its lanes, how many lanes). The `LANE_PATTERNS` last used are
        kept (the lanes of a branch narrow to any count)."""
        found = self._lanes.get(levels)
        if found is None:
            fn = self.fn
            for batched, lanes in levels:
                fn = fn.over_lanes(list(batched), lanes)
            found = Staged(fn, f"{self.name}_lanes", self.result_floats)
            self._lanes[levels] = found
            if len(self._lanes) > LANE_PATTERNS:
                self._lanes.popitem(last=False)
        else:
            self._lanes.move_to_end(levels)
        return found

    def vjp(self, wrt: tuple[int, ...]) -> Staged:
        """Arguments, then one cotangent per result -> the gradients of arguments `wrt`."""
        found = self._vjps.get(wrt)
        if found is None:
            found = Staged(self.fn.vjp(list(wrt)), f"{self.name}_vjp", [True] * len(wrt))
            self._vjps[wrt] = found
        return found

    def jvp(self, wrt: tuple[int, ...]) -> Staged:
        """Arguments, then one tangent per argument `wrt` -> the results, then one tangent
        per float result."""
        found = self._jvps.get(wrt)
        if found is None:
            floats = self.result_floats + [True] * sum(self.result_floats)
            found = Staged(self.fn.jvp(list(wrt)), f"{self.name}_jvp", floats)
            self._jvps[wrt] = found
        return found


def trace(
    name: str, specs: list[tuple[Any, tuple]], build: Callable[[list[Any]], list[Any]]
) -> tuple[Staged, list[Any]]:
    """`build(parameters)` traced with nothing recorded: the staged function (taking the
    parameters, then the captured inputs) and the captured inputs (tensors and variable
    handles) to pass it after the parameters' values."""
    with _recording.paused():
        symbols = _core.trace_begin(name, specs, closed_over_inputs=True)
        try:
            outputs = build(symbols)
            concrete = _core.trace_finish(outputs)
        except BaseException:
            _core.trace_abort()
            raise
    text = str(concrete.graph)
    staged = _cache.get(text)
    if staged is None:
        floats = [t.dtype.is_floating for t in outputs]
        staged = Staged(concrete.explicit(), name, floats)
        _cache[text] = staged
        if len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    else:
        _cache.move_to_end(text)
    return staged, concrete.captured_inputs


def _differentiable(arg: Any) -> Any:
    """What a tape links for `arg`: a float tensor itself, a trainable float Variable's value
    (read now, so that tapes note the read); None for anything without a gradient."""
    if isinstance(arg, _core.Tensor):
        return arg if arg.dtype.is_floating else None
    from .variables import live_variable

    variable = live_variable(arg)
    if variable is not None and variable.trainable and variable.dtype.is_floating:
        return variable.read()
    return None


def _frozen(arg: Any, linked: Any) -> Any:
    """`arg` as the derivatives of a call read it: a variable handle becomes a handle of the
    value read now (a later assignment must not change a gradient taken of this call)."""
    if isinstance(arg, _core.Tensor):
        return arg
    return _core.VariableHandle(arg.read() if linked is None else linked)


def call(staged: Staged, args: list[Any], linked: list[Any] | None = None) -> list[_core.Tensor]:
    """Runs `staged` on `args` (one tensor or variable handle per input) on the executor;
    the active tapes record it as one op and the active accumulators give its results
    tangents (see the module's doc). `linked[i]` is what the tapes link for argument i (None
    for none): a Variable's value read now, by default."""
    if linked is None:
        linked = [_differentiable(a) for a in args]
    levels = _lane_levels(args)
    if levels:
        return _over_lanes(staged, args, linked, levels)
    accumulators = _recording.perturbed([t for t in linked if t is not None])
    if accumulators:
        return _tangents(staged, args, linked, accumulators[-1])
    outputs = staged.fn(args)
    if not _core.any_tape_active():
        return outputs
    # New identities: a result may be an argument itself (a loop of no trips returns it).
    outputs = [_core.identity(t) for t in outputs]
    inputs = [i for i, t in enumerate(linked) if t is not None]
    floats = [k for k, is_float in enumerate(staged.result_floats) if is_float]
    if not inputs or not floats:
        return outputs
    frozen = [_frozen(a, t) for a, t in zip(args, linked, strict=True)]

    def backward(*cotangents: _core.Tensor, needs: tuple[bool, ...]) -> list[Any]:
        wrt = tuple(i for i, need in zip(inputs, needs, strict=True) if need)
        if not wrt:
            return [None] * len(inputs)
        seeds = list(map(_core.zeros_like, outputs))
        for k, ct in zip(floats, cotangents, strict=True):
            seeds[k] = ct
        grads = iter(call(staged.vjp(wrt), frozen + seeds, linked + seeds))
        return [next(grads) if need else None for need in needs]

    _core.record_custom_gradient(
        staged.name,
        [linked[i] for i in inputs],
        [outputs[k] for k in floats],
        backward,
        takes_needs=True,
    )
    return outputs


def _lane_levels(args: list[Any]) -> list[int]:
    """The active `vmap` levels (outermost first) that some tensor argument holds lanes of."""
    active = _core.vmap_levels()
    if not active:
        return []
    held: set[int] = set()
    for a in args:
        if isinstance(a, _core.Tensor):
            held.update(_core.lanes_levels(a))
    return [level for level in active if level in held]


def _over_lanes(staged: Staged, args: list[Any], linked: list[Any], levels: list[int]) -> Any:
    """`staged` called on arguments that hold lanes of `levels` (inside `vmap`, or a
    derivative run inside a later one, `jacrev`'s): its function over those lanes runs once on
    every lane's values, recorded as any staged call, and its results are lanes again. Each
    lane makes its own trips (the loop's batching rule), so the checkpointed gradient keeps
    its c snapshots for all lanes at once, not every trip."""
    values, tied = list(args), list(linked)
    plan = []
    for level in reversed(levels):
        held = [isinstance(a, _core.Tensor) and level in _core.lanes_levels(a) for a in values]
        for i, h in enumerate(held):
            if h:
                same = tied[i] is values[i]
                values[i] = _core.lanes_unwrap(values[i], level)
                tied[i] = values[i] if same else tied[i]
        plan.append((tuple(held), _core.vmap_lanes(level)))
    outputs = call(staged.over_lanes(tuple(plan)), values, tied)
    dressed = []
    for t in outputs:
        for level in levels:
            t = _core.lanes_wrap(t, level)
        dressed.append(t)
    return dressed


def _tangents(staged: Staged, args: list[Any], linked: list[Any], acc: Any) -> list[Any]:
    """`staged` under accumulator `acc` (the innermost that perturbs an input): its
    Jacobian-vector product runs outside `acc` (as a staged op: outer accumulators and tapes
    see it), and the results get its tangents."""
    wrt = tuple(
        i
        for i, (a, t) in enumerate(zip(args, linked, strict=True))
        if isinstance(a, _core.Tensor) and t is not None and acc.tangent(t) is not None
    )
    tangents = [acc.tangent(args[i]) for i in wrt]
    frozen = [_frozen(a, t) for a, t in zip(args, linked, strict=True)]
    place = acc.pop()
    try:
        outputs = call(staged.jvp(wrt), frozen + tangents, linked + tangents)
    finally:
        if place is not None:
            acc.push_at(place)
    n = len(staged.result_floats)
    values, given = [_core.identity(t) for t in outputs[:n]], iter(outputs[n:])
    for v, is_float in zip(values, staged.result_floats, strict=True):
        if is_float:
            acc.watch(v, next(given))
    return values
