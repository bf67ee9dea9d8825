"""The online checkpointing schedule (`gradloop._checkpoints`): simulated on integer states,
every trip is reversed in order from the right state, never more than c states are kept, and
the body evaluations stay within the documented bounds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
