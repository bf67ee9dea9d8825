"""Online checkpointing schedules for loop gradients in bounded memory: the Python model of
the schedule that `while_loop(..., checkpoints=c)` runs in every mode (the Rust transform in
`control/while_loop/schedule.rs`), kept to count body evaluations for benchmarks and to test
the schedule's properties on integer states. Nothing runs it at run time.

A loop's states are x_0 (its initial variables), x_{k+1} = body(x_k), n trips; n is unknown
until the loop stops. Its gradient needs x_k for k = n-1, ..., 0, in that order (to run trip k
again under a tape). With c slots for states the forward pass keeps some of them (`Placement`)
and the backward pass recomputes the others from the nearest kept one below (`reverse`).

- Forward placement: for the first (c+1)(c+2)/2 - 1 trips, Algorithm I of Stumm and Walther,
  "New algorithms for optimal online checkpointing" (SIAM J. Sci. Comput. 32(2), 2010), whose
  placement is that of the offline binomial schedule for every trip count up to
  (c+1)(c+2)/2; past it, the dynamic checkpointing of Wang, Moin and Iaccarino, "Minimal
  repetition dynamic checkpointing algorithm for unsteady adjoint calculation" (SIAM J. Sci.
  Comput. 31(4), 2009): each kept state has a level, a new state takes the slot of the latest
  dispensable one (below a later state of a higher level) at level 0, or, when none is, the
  slot of the latest state one level up, which makes the states below it of lower level
  dispensable. Slot 0 holds x_0 for good.
- Backward: treeverse (Griewank, "Achieving logarithmic growth of temporal and spatial
  complexity in reverse automatic differentiation", Optim. Methods Softw. 1, 1992): from the
  latest kept state below the trip to reverse, advance, keeping a state halfway to it while a
  slot is free, or every state when the free slots cover the gap, then reverse the trip just
  below, and repeat.

Memory is c states whatever n is. Body evaluations (forward trips plus recomputations) grow as
n log n for fixed c; `evaluations` counts them for a given (n, c), and the tests bound them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Placement", "evaluations", "reverse"]


def _u2_minus_1(c: int) -> int:
    """The last trip Stumm and Walther's placement serves: (c+1)(c+2)/2 - 1, their (2.2)."""
    return (c + 1) * (c + 2) // 2 - 1


@dataclass
class Placement:
    """Which slot, if any, keeps the state before each forward trip (`keep`, called for trips
    0, 1, 2, ... in order). `steps[slot]` is the trip whose state the slot holds (None: empty).
    """

    c: int
    steps: list[int | None] = field(init=False)
    # Stumm and Walther, Algorithm I: (next slot, checkpoints left, next pivot, saving).
    _sw: tuple[int, int, int, bool] = field(init=False)
    # Wang, Moin and Iaccarino: each slot's level, and whether it may be given up.
    _levels: list[int] = field(init=False)
    _dispensable: list[bool] = field(init=False)

    def __post_init__(self) -> None:
        if self.c < 1:
            raise ValueError("checkpoints must be at least 1")
        self.steps = [None] * self.c
        self._sw = (0, self.c, self.c, True)
        self._levels = [1 << 62] + [0] * (self.c - 1)  # x_0's slot is never given up
        self._dispensable = [False] * self.c

    def keep(self, step: int) -> int | None:
        """The slot that keeps x_step, or None; records it in `steps`."""
        slot = self._stumm_walther(step) if step < _u2_minus_1(self.c) else self._wang_moin()
        if slot is not None:
            self.steps[slot] = step
        return slot

    def _stumm_walther(self, step: int) -> int | None:
        i, o, p, s = self._sw
        slot = i if s else None
        if s:
            i += 1
            if i > o:
                i = 1
        if step + 1 == p:
            s = False
        if step == p:
            p, o = p + o, o - 1
            i, s = o, o > 0
        self._sw = (i, o, p, s)
        return slot

    def _wang_moin(self) -> int | None:
        if self.c == 1:
            return None  # the one slot holds x_0
        empty = [k for k, s in enumerate(self.steps) if s is None]
        filled = [(s, k) for k, s in enumerate(self.steps) if s is not None]
        dispensable = [(s, k) for s, k in filled if self._dispensable[k]]
        if empty:
            slot = empty[0]
            self._levels[slot] = 0
        elif dispensable:
            _, slot = max(dispensable)
            self._dispensable[slot] = False
            self._levels[slot] = 0
        else:
            _, slot = max(filled)
            level = self._levels[slot]
            for k in range(self.c):
                if self._levels[k] < level:
                    self._dispensable[k] = True
            self._levels[slot] = level + 1
        return slot


def _next_keep(at: int, grad: int, free: int) -> int | None:
    """Where treeverse keeps its next state, advancing from x_at toward trip `grad - 1` with
    `free` slots: every state when they cover the gap, else halfway; none within two trips."""
    if free <= 0 or grad - at <= 2:
        return None
    if grad - at - 2 <= free:
        return at + 1
    return at + (grad - at) // 2


def reverse(kept: list[int], n: int, c: int) -> Iterator[tuple[str, int]]:
    """The backward pass over n trips from the forward pass's kept trips (`Placement.steps`,
    x_0 among them), as actions: ("restore", k) loads x_k from its slot, ("advance", k) runs
    trip k (x_k to x_{k+1}) without a tape, ("store", k) keeps x_k in a free slot, ("drop", k)
    frees x_k's slot, ("reverse", k) runs trip k under a tape and pulls the cotangent of
    x_{k+1} back to x_k. Never more than c states are kept. Yielded one at a time: there are
    about n log n of them, and the memory is to stay independent of n."""
    stack = sorted(k for k in kept if k < n)
    if 0 not in stack:
        raise ValueError("x_0 must be kept")
    grad = n
    while grad > 0:
        at = stack[-1]
        yield ("restore", at)
        target = _next_keep(at, grad, c - len(stack))
        while at + 1 < grad:
            yield ("advance", at)
            at += 1
            if at == target:
                stack.append(at)
                yield ("store", at)
                target = _next_keep(at, grad, c - len(stack))
        yield ("reverse", at)
        grad -= 1
        while stack and stack[-1] >= grad and grad > 0:
            yield ("drop", stack.pop())


def evaluations(n: int, c: int) -> tuple[int, int]:
    """(body evaluations without a tape, with a tape) for n trips and c slots: the forward
    trips plus the backward pass's recomputations, and the n taped ones."""
    placement = Placement(c)
    for step in range(n):
        placement.keep(step)
    kept = [s for s in placement.steps if s is not None]
    counts = {"advance": 0, "reverse": 0}
    for action, _ in reverse(kept, n, c):
        if action in counts:
            counts[action] += 1
    return n + counts["advance"], counts["reverse"]
