"""The actors on the cluster and the loop that hands them items: chunks of items go to
whichever actor has room (dynamic balancing), each actor holds at most `IN_FLIGHT` chunks, and
a chunk whose actor died runs again on another."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from . import _worker

#: Chunks an actor holds at once: one running, one waiting, so it never idles on a round trip.
IN_FLIGHT = 2

#: How often a chunk runs again after its worker died.
RETRIES = 3

#: Seconds a map waits for a worker to start when it has none left (its cluster lost nodes).
#: Generous: on a loaded machine a worker process takes tens of seconds to start.
START_TIMEOUT = 120.0

# Ray does not restart actors itself: a restart that cannot be placed (its node gone, the
# other CPUs taken) waits forever, and so would the chunks sent to it. A dead actor's chunks
# run again on the live ones, and a new actor joins once it answers.
_ACTOR_OPTIONS = {"num_cpus": 1, "max_restarts": 0, "max_task_retries": 0}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours in Ray's error messages


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:  # pragma: no cover - the extra is installed in the tests
        from .. import errors

        raise errors.InvalidArgumentError(
            "gl.distributed needs Ray: pip install 'gradloop[ray]'"
        ) from e
    return ray


@dataclasses.dataclass
class Chunk:
    """Items of one signature sent together: their indices and flat inputs."""

    key: str
    indices: list[int]
    inputs: list[list[np.ndarray]]
    attempts: int = 0


class Pool:
    """Actors serving staged functions on one Ray cluster; kept between maps, so that payloads
    are loaded once per actor. An actor serves items once it has answered (`starting` until
    then): one that cannot be placed never holds a chunk."""

    def __init__(self, workers: int | None) -> None:
        ray = _ray()
        from ray import cloudpickle

        # The actor's module travels by value: workers need no gradloop for compiled modules.
        cloudpickle.register_pickle_by_value(_worker)
        self._actor_class = ray.remote(**_ACTOR_OPTIONS)(_worker.Worker)
        self.job = ray.get_runtime_context().get_job_id()
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.size = workers if workers is not None else max(1, cpus)
        self.live: list[Any] = []
        self.starting: dict[Any, Any] = {}  # the actor's first answer -> the actor
        self.failed_starts = 0
        self.last_death = ""  # why the last actor died, as Ray said it: for the map's error
        for _ in range(self.size):
            self.start_actor()
        self.payloads: dict[str, Any] = {}  # key -> the payload's object reference
        # What the chunks of each signature measured, kept between maps: a later map of the
        # same function cuts even its first chunks by it.
        self.paces: collections.defaultdict[str, Pace] = collections.defaultdict(Pace)

    def start_actor(self) -> None:
        actor = self._actor_class.remote(1)
        self.starting[actor.ping.remote()] = actor

    def started(self, ref: Any) -> None:
        """`ref`, an actor's first answer, arrived: it joins (or, dead at birth, is dropped)."""
        actor = self.starting.pop(ref)
        try:
            _ray().get(ref)
        except Exception as e:  # it died starting: another takes its place, a few times
            self.failed_starts += 1
            self.record_death(e)
            if self.failed_starts <= RETRIES * self.size:
                self.start_actor()
            return
        self.live.append(actor)

    def record_death(self, error: Exception) -> None:
        # Ray's message names the cause: a process death (killed, out of memory) at its start,
        # an exception raised while the actor started at its end.
        message = " ".join(_ANSI.sub("", str(error)).split())
        self.last_death = (
            message if len(message) <= 400 else f"{message[:200]} ... {message[-200:]}"
        )

    def describe(self) -> str:
        """The cluster as the map saw it when it gave up: for its error."""
        ray = _ray()
        try:
            alive = sum(1 for node in ray.nodes() if node.get("Alive"))
            cpus = ray.available_resources().get("CPU", 0), ray.cluster_resources().get("CPU", 0)
            cluster = f"{alive} nodes alive, {cpus[0]:g} of {cpus[1]:g} CPUs free"
        except Exception as e:  # the cluster itself is gone
            cluster = f"the cluster does not answer ({type(e).__name__})"
        death = f"; the last worker died: {self.last_death}" if self.last_death else ""
        return cluster + death

    def payload_ref(self, key: str, payload: Any) -> Any:
        found = self.payloads.get(key)
        if found is None:
            found = self.payloads[key] = _ray().put(payload)
        return found

    def lost(self, actor: Any) -> None:
        """`actor` died: it leaves, and a new one starts in its place."""
        if actor in self.live:
            self.live.remove(actor)
        with contextlib.suppress(Exception):  # it is gone already
            _ray().kill(actor, no_restart=True)
        self.start_actor()

    def close(self) -> None:
        ray = _ray()
        for actor in [*self.live, *self.starting.values()]:
            with contextlib.suppress(Exception):  # Ray already shut down
                ray.kill(actor)
        self.live, self.starting = [], {}


#: Chunks per worker the remaining items are cut into: the first chunks are large (few round
#: trips), the last ones small, so that no worker idles while another ends a long chunk.
GUIDED = 2

#: The most items in one chunk.
MAX_CHUNK = 64

#: A chunk's work is at least this many times a round trip's cost, once both are measured:
#: a round trip of Ray's actor calls costs milliseconds on a small machine (more than many items),
#: and a queued chunk does not hide it: a trace shows an actor idle that long between chunks.
WORK_PER_ROUND_TRIP = 8.0


class Pace:
    """What the chunks that came back measured: the seconds an item computes and the seconds a
    chunk costs besides (Ray's call, the transfers, the actor's idle time between chunks);
    `floor()` is the fewest items a chunk should hold so that its work outweighs that cost."""

    def __init__(self) -> None:
        # The last chunks' (items, compute seconds) and overheads: kept between maps, so the
        # recent ones, which follow a function whose items grew costlier.
        self.chunks: collections.deque[tuple[int, float]] = collections.deque(maxlen=16)
        self.overheads: collections.deque[float] = collections.deque(maxlen=16)

    def record(self, items: int, compute: float, busy: float) -> None:
        """A chunk of `items` computed for `compute` seconds on an actor that was busy with it
        (or waiting for it) for `busy` seconds."""
        self.chunks.append((items, compute))
        self.overheads.append(max(0.0, busy - compute))

    def floor(self) -> int:
        items = sum(n for n, _ in self.chunks)
        compute = sum(seconds for _, seconds in self.chunks)
        if not items or not self.overheads or compute <= 0.0:
            return 1
        per_item = compute / items
        overhead = sorted(self.overheads)[len(self.overheads) // 2]
        return max(1, min(MAX_CHUNK, math.ceil(WORK_PER_ROUND_TRIP * overhead / per_item)))


def spread(count: int) -> list[int]:
    """`range(count)` in bit-reversed order (van der Corput's sequence): every run of it samples
    the whole range evenly, so that chunks cut from it cost about the same when an item's cost
    follows its place in the input (a sweep over a parameter, trip counts rising with it)."""
    bits = max(1, (count - 1).bit_length())
    order = (int(format(i, f"0{bits}b")[::-1], 2) for i in range(1 << bits))
    return [i for i in order if i < count]


def chunks(
    staged: list[tuple[int, str, list[np.ndarray]]],
    workers: int,
    chunk_size: int | None,
    floor: Callable[[str], int] = lambda key: 1,
    wanted: Callable[[int], bool] = lambda index: True,
) -> Iterator[Chunk]:
    """Chunks of one signature each, signatures in the order they first appear, and within one
    the items in `spread` order: `chunk_size` items each, or by default cut a round (one chunk
    per worker) at a time. A round's chunks are guided (OpenMP's schedule): each takes
    1/(GUIDED * workers) of the items left when the round began, at least `floor(key)` items
    (asked as each chunk is cut: cut lazily, chunks follow what the map has measured so far)
    and at most a fair share, 1/workers of them: a floor above the fair share cuts the items
    left evenly, in one round. An item that is no longer `wanted(index)` when its chunk is cut
    is left out."""
    groups: dict[str, list[tuple[int, list[np.ndarray]]]] = {}
    for index, key, inputs in staged:
        groups.setdefault(key, []).append((index, inputs))
    ordered = [(key, members[i]) for key, members in groups.items() for i in spread(len(members))]
    left = len(ordered)
    current: Chunk | None = None
    size = guided = fair = round_left = 0
    for key, (index, inputs) in ordered:
        if not wanted(index):
            left -= 1
            continue
        if current is None or current.key != key or len(current.indices) == size:
            if current is not None:
                yield current
            if round_left == 0:
                guided = -(-left // (GUIDED * workers))
                fair, round_left = -(-left // workers), workers
            round_left -= 1
            size = chunk_size or max(1, min(MAX_CHUNK, fair, max(guided, floor(key))))
            current = Chunk(key, [], [])
        current.indices.append(index)
        current.inputs.append(inputs)
        left -= 1
    if current is not None:
        yield current


def run(
    pool: Pool,
    work: Iterable[Chunk],
    payloads: dict[str, Any],
    done: Callable[[int, Any], bool],
    progress: Any,
    paces: collections.defaultdict[str, Pace] | None = None,
) -> None:
    """Runs every chunk of `work` (an iterable read as actors have room, so that a lazy one
    can size later chunks by `paces`) on the pool's actors; `done(index, flat result or
    ItemError)` takes each item's result as it arrives and returns False to stop the map.
    Each chunk that comes back is recorded in `paces`, by its signature's key."""
    ray = _ray()
    fresh = iter(work)
    retries: collections.deque[Chunk] = collections.deque()
    in_flight: dict[Any, tuple[Any, Chunk, float]] = {}
    load: collections.Counter[Any] = collections.Counter()
    last_back: dict[Any, float] = {}  # actor -> when its last chunk came back
    paces = collections.defaultdict(Pace) if paces is None else paces

    def next_chunk() -> Chunk | None:
        return retries.popleft() if retries else next(fresh, None)

    def send(actor: Any, chunk: Chunk) -> None:
        boxed = [pool.payload_ref(chunk.key, payloads[chunk.key])]
        count = len(chunk.indices)
        ref = actor.run.remote(chunk.key, boxed, count, _worker.stack(chunk.inputs))
        in_flight[ref] = (actor, chunk, time.perf_counter())
        load[actor] += 1

    pending = next_chunk()
    while pending is not None or in_flight:
        # Round-robin: every actor's first slot is filled before any actor's second.
        for slot in range(IN_FLIGHT):
            for actor in list(pool.live):
                if pending is not None and load[actor] <= slot:
                    send(actor, pending)
                    pending = next_chunk()
        waiting = [*in_flight, *pool.starting]
        idle = not in_flight  # no live actor: only a starting one can take the work
        timeout = START_TIMEOUT if idle else None
        ready = ray.wait(waiting, num_returns=1, timeout=timeout)[0] if waiting else []
        if not ready:
            from .. import errors

            unsent = (pending is not None) + len(retries) + sum(1 for _ in fresh)
            waited = f", and none started in {START_TIMEOUT:g} s" if waiting else ""
            raise errors.ExecutionError(
                f"gl.distributed.map: no worker is left{waited} ({unsent} chunks not run; "
                f"{pool.describe()})"
            )
        ref = ready[0]
        if ref in pool.starting:
            pool.started(ref)
            continue
        actor, chunk, sent = in_flight.pop(ref)
        load[actor] -= 1
        try:
            results, seconds = ray.get(ref)
            back = time.perf_counter()
            # The actor worked on this chunk, or waited for it, since it was sent or since
            # its previous chunk came back, whichever is later.
            busy = back - max(sent, last_back.get(actor, 0))
            paces[chunk.key].record(len(chunk.indices), seconds, busy)
            last_back[actor] = back
            if isinstance(results, tuple):
                results = _worker.unstack(results, len(chunk.indices))
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
            # An actor Ray could not reach for a moment (a loaded machine starves its
            # process) is alive: it keeps serving, and a dead one fails its next chunk. Killing
            # it would leave replacements to start on that same loaded machine.
            if not isinstance(e, ray.exceptions.ActorUnavailableError):
                pool.record_death(e)
                if actor in pool.live:
                    pool.lost(actor)
            chunk.attempts += 1
            if chunk.attempts <= RETRIES:
                if pending is not None:
                    retries.appendleft(pending)
                pending = chunk
                continue
            failure = _worker.ItemError(
                "gradloop.errors",
                "ExecutionError",
                f"its worker died {chunk.attempts} times ({type(e).__name__})",
            )
            results = [failure] * len(chunk.indices)
        for index, result in zip(chunk.indices, results, strict=True):
            if not done(index, result):
                _cancel(ray, in_flight)
                return
        if progress is not None:
            progress.update(len(chunk.indices))


def _cancel(ray: Any, refs: dict[Any, Any]) -> None:
    for ref in refs:
        with contextlib.suppress(Exception):  # running or done: it finishes alone
            ray.cancel(ref)


def progress_bar(total: int, name: str, show: bool | None) -> Any:
    """tqdm's bar on stderr, shown once a map has run for 2 seconds, and only on a terminal
    unless `show` is True; None when off or tqdm is missing."""
    if show is False or (show is None and not sys.stderr.isatty()):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=f"gl.distributed.map {name}", unit="item", delay=2.0)
