"""The online checkpointing schedule (`gradloop._checkpoints`): simulated on integer states,
every trip is reversed in order from the right state, never more than c states are kept, and
the body evaluations stay within the documented bounds. Every runner, eagerly and in graph
mode, makes the trips this model counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradloop as gl
from gradloop import _checkpoints as ck


def simulate(n: int, c: int) -> int:
    """Runs the forward placement and the backward actions on states x_k = k; returns the
    body evaluations without a tape (forward trips and recomputations)."""
    placement = ck.Placement(c)
    for step in range(n):
        placement.keep(step)
        assert sum(s is not None for s in placement.steps) <= c
    kept = {s for s in placement.steps if s is not None}
    assert 0 in kept, "x_0 is kept"
    state, want, advances = None, n - 1, 0
    for action, k in ck.reverse(sorted(kept), n, c):
        if action == "restore":
            assert k in kept
            state = k
        elif action == "advance":
            assert state == k
            state, advances = k + 1, advances + 1
        elif action == "store":
            assert state == k and len(kept) < c
            kept.add(k)
        elif action == "drop":
            kept.remove(k)
        else:
            assert action == "reverse" and state == k == want, (action, k, state, want)
            want -= 1
    assert want == -1, "every trip reversed"
    return n + advances


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 400), c=st.integers(1, 12))
def test_every_trip_is_reversed_from_its_state_within_c_slots(n: int, c: int) -> None:
    assert simulate(n, c) == ck.evaluations(n, c)[0]


@pytest.mark.parametrize("c", [1, 2, 3, 5, 10, 100])
def test_special_trip_counts(c: int) -> None:
    u2 = (c + 1) * (c + 2) // 2
    for n in sorted({1, 2, c, c + 1, u2, u2 + 1, 5 * u2}):
        simulate(n, c)


@pytest.mark.parametrize("c", range(1, 16))
def test_within_the_binomial_range_each_state_is_recomputed_at_most_once(c: int) -> None:
    # Up to (c+1)(c+2)/2 trips Stumm and Walther's placement reaches the offline optimum,
    # whose repetition number is at most 2: at most 2n evaluations without a tape.
    for n in range(1, (c + 1) * (c + 2) // 2 + 1):
        assert ck.evaluations(n, c)[0] <= 2 * n, n


@pytest.mark.parametrize("n", [10, 100, 1000, 3000])
def test_with_log_n_slots_evaluations_grow_as_n_log_n(n: int) -> None:
    c = math.ceil(math.log2(n)) + 1
    taped_free, taped = ck.evaluations(n, c)
    assert taped == n
    assert taped_free <= n * (1 + math.log2(n))


def test_one_slot_recomputes_from_the_start() -> None:
    n = 20
    assert ck.evaluations(n, 1)[0] == n + n * (n - 1) // 2


def test_bad_slot_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ck.Placement(0)


@pytest.mark.parametrize("c", [1, 2, 3, 7, 100])
def test_every_slot_is_full_after_c_trips(c):
    # The graph placement relies on it past the binomial trips: no empty slot to look for.
    placement = ck.Placement(c)
    for step in range(c):
        placement.keep(step)
    assert None not in placement.steps


# Every runner runs a checkpointed loop's gradient as the same graph (the Rust schedule); the
# trips its loops make are the forward trips, the backward pass's recomputations and the n
# reversed trips, as the model counts them. In check mode a fused loop runs on two tiers, so
# each runner here runs one.
RUNNERS = [
    ("interpreter", "check"),
    ("frames", "check"),
    ("executor", "off"),
    ("executor", "buffers"),
    ("executor", "on"),
]


def _trips_of(fn, *args) -> int:
    before = gl._core.loop_trips()
    fn(*args)
    return gl._core.loop_trips() - before


@pytest.mark.parametrize(("n", "c"), [(1, 1), (7, 1), (9, 2), (23, 3), (40, 4), (61, 10)])
def test_every_runner_runs_the_schedule_the_model_counts(n: int, c: int) -> None:
    w = gl.tensor(np.linspace(0.5, 0.9, 4))

    def loss(x, trips):
        def body(i, h):
            return i + 1, gl.sin(h * w) + 0.1 * x

        _, h = gl.while_loop(lambda i, h: i < trips, body, (gl.tensor(0), x), checkpoints=c)
        return gl.sum(h * h)

    untaped, taped = ck.evaluations(n, c)
    x, trips = gl.tensor(np.full(4, 0.3)), gl.tensor(n)
    graph = gl.function(gl.grad(loss))
    graph(x, trips)  # traced
    runner, frames = gl._core.graph_runner(), gl._core.compiled_frames()
    try:
        counts = {}
        for name, mode in RUNNERS:
            gl._core.set_graph_runner(name)
            gl._core.set_compiled_frames(mode)
            counts[name, mode] = (_trips_of(graph, x, trips), _trips_of(gl.grad(loss), x, trips))
    finally:
        gl._core.set_graph_runner(runner)
        gl._core.set_compiled_frames(frames)
    # Graph mode runs the gradient alone; eager mode also runs the loop for its value.
    assert set(counts.values()) == {(untaped + taped, untaped + taped + n)}, counts
