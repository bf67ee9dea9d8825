"""`while_loop(..., checkpoints=c)` run eagerly while tapes record.

The tapes record the loop as one op: its inputs are the float loop variables, the float tensors
cond and body close over and the values of the trainable Variables they read (found by tracing
them once, without running anything); its outputs are the final loop variables. The forward
loop runs with recording paused and keeps at most c states (`_checkpoints.Placement`). The
op's gradient walks `_checkpoints.reverse`: a state it lacks is recomputed from the nearest kept
one with recording paused, and each trip is run again under a fresh tape (and under the outer
tapes, so that the gradient differentiates again) to pull the cotangents back by one trip, as
`recompute_grad` does for a function. Memory: c states plus one trip's tape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _checkpoints, _core, _validate, autodiff, nest

__all__ = ["run", "stats"]

#: Body evaluations of the last checkpointed loops run eagerly (forward trips, recomputed
#: trips, trips run under a tape), for tests that hold the schedule to its bound.
stats = {"forward": 0, "advance": 0, "reverse": 0}


def run(
    cond: Callable[..., Any],
    body: Callable[..., Any],
    loop_vars: Any,
    call: Callable[[Callable[..., Any], Any], Any],
    limit: int | None,
    checkpoints: int,
    traced_while: Callable[[Any], Any],
) -> Any:
    """Runs the loop and records it on the active tapes as one op (see the module's doc).
    `traced_while(values)` builds the loop's `While` in a trace: it finds what cond and body
    close over."""
    flat = nest.flatten(loop_vars)
    closed = _closed_over(flat, traced_while)
    pack = lambda values: nest.pack_sequence_as(loop_vars, list(values))  # noqa: E731

    def checked(values: list[Any], i: int | None) -> list[Any]:
        new = call(body, pack(values))
        return nest.flatten(_validate.check_loop_body_output("while_loop", loop_vars, new, i, body))

    def trip(values: list[Any], i: int | None) -> list[Any]:
        """A trip run again: the body returned valid tensors for these values before, so only
        a result that needs converting (a Python number) goes through the checks (they were
        most of an eager recomputation's time)."""
        new = nest.flatten(call(body, pack(values)))
        if len(new) == len(flat) and all(isinstance(t, _core.Tensor) for t in new):
            return new
        return checked(values, i)

    def forward(trips: int | None) -> tuple[list[Any], int, dict[int, list[Any]]]:
        """The loop from `flat` (for `trips` trips, else until cond says stop): the final
        values, the trip count and the kept states by trip."""
        placement = _checkpoints.Placement(checkpoints)
        by_slot: dict[int, list[Any]] = {}
        values, n = flat, 0
        while (trips is None or n < trips) and (limit is None or n < limit):
            if trips is None:
                predicate = call(cond, pack(values))
                if not _validate.check_predicate("while_loop", predicate, "the result of cond"):
                    break
            slot = placement.keep(n)
            if slot is not None:
                by_slot[slot] = values
            values = checked(values, n)
            n += 1
        stats["forward"] += n
        steps = enumerate(placement.steps)
        return values, n, {step: by_slot[s] for s, step in steps if step is not None}

    with autodiff._paused():
        values, n, kept = forward(None)
    floats = [i for i, x in enumerate(flat) if x.dtype.is_floating]
    outputs = [_core.identity(x) for x in values]
    inputs = [flat[i] for i in floats] + closed

    def backward(*cotangents: _core.Tensor) -> list[Any]:
        # Tapes recording now differentiate this gradient again: the states it starts from
        # must then be connected to the inputs, so the forward trips are recorded once more.
        connected = _core.any_tape_active()
        states = forward(n)[2] if connected else kept
        return _reverse(trip, states, n, checkpoints, floats, closed, list(cotangents), connected)

    _core.record_custom_gradient(
        f"while_loop(checkpoints={checkpoints})",
        inputs,
        [outputs[i] for i in floats],
        backward,
    )
    return pack(outputs)


def _closed_over(flat: list[Any], traced_while: Callable[[Any], Any]) -> list[Any]:
    """The float tensors cond and body close over, and the values of the trainable float
    Variables they read (read now, so that the tapes note the read)."""
    from .variables import live_variable

    with autodiff._paused():
        symbols = _core.trace_begin("while_loop_probe", [(x.dtype, tuple(x.shape)) for x in flat])
        try:
            outputs = traced_while(symbols)
            concrete = _core.trace_finish(nest.flatten(outputs))
        except BaseException:
            _core.trace_abort()
            raise
    closed: list[Any] = []
    for captured in concrete.captured_inputs:
        if isinstance(captured, _core.Tensor):
            if captured.dtype.is_floating:
                closed.append(captured)
            continue
        variable = live_variable(captured)
        if variable is not None and variable.trainable and variable.dtype.is_floating:
            closed.append(variable.read())
    return closed


def _reverse(
    trip: Callable[[list[Any], int | None], list[Any]],
    kept: dict[int, list[Any]],
    n: int,
    checkpoints: int,
    floats: list[int],
    closed: list[Any],
    cotangents: list[Any],
    connected: bool,
) -> list[Any]:
    """The gradients of the loop op's inputs (float loop variables, then `closed`), from the
    cotangents of its float outputs, by `_checkpoints.reverse`; recomputed trips are recorded
    by the active tapes when `connected`."""
    states = dict(kept)
    current: list[Any] = []
    at = 0
    totals: list[Any] = [None] * len(closed)
    actions = _checkpoints.reverse(sorted(kept), n, checkpoints) if n else []
    for action, k in actions:
        if action == "restore":
            current, at = states[k], k
        elif action == "advance":
            if connected:
                current = trip(current, at)
            else:
                with autodiff._paused():
                    current = trip(current, at)
            at += 1
            stats["advance"] += 1
        elif action == "store":
            states[k] = current
        elif action == "drop":
            states.pop(k, None)
        else:
            stats["reverse"] += 1
            cotangents, pulled = _pull_back(trip, current, at, floats, closed, cotangents)
            totals = [
                p if t is None else t if p is None else _core.add(t, p)
                for t, p in zip(totals, pulled, strict=True)
            ]
    zeros = [_core.zeros(x.shape, dtype=x.dtype) for x in closed]
    return cotangents + [z if t is None else t for t, z in zip(totals, zeros, strict=True)]


def _pull_back(
    trip: Callable[[list[Any], int | None], list[Any]],
    state: list[Any],
    at: int,
    floats: list[int],
    closed: list[Any],
    cotangents: list[Any],
) -> tuple[list[Any], list[Any]]:
    """Trip `at` run again under a fresh tape: the cotangents of its float inputs and the
    gradients of `closed`, from the cotangents of its float outputs."""
    fresh = [_core.identity(x) if i in floats else x for i, x in enumerate(state)]
    sources = [fresh[i] for i in floats]
    with autodiff.GradientTape() as tape:
        tape.watch(sources + closed)
        out = trip(fresh, at)
    targets = [out[i] for i in floats]
    grads = tape.gradient(targets, sources + closed, output_gradients=cotangents)
    pulled = [
        _core.zeros(x.shape, dtype=x.dtype) if g is None else g
        for g, x in zip(grads[: len(sources)], sources, strict=True)
    ]
    return pulled, grads[len(sources) :]
