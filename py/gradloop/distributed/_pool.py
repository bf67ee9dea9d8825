"""The actors on the cluster and the loop that hands them items: chunks of items go to
whichever actor has room (dynamic balancing), each actor holds at most `IN_FLIGHT` chunks, and
a chunk whose actor died runs again on another."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import _worker

#: Chunks an actor holds at once: one running, one waiting, so it never idles on a round trip.
IN_FLIGHT = 2

#: How often a chunk runs again after its worker died.
RETRIES = 3

#: Seconds a map waits for a worker to start when it has none left (its cluster lost nodes).
START_TIMEOUT = 60.0

# Ray does not restart actors itself: a restart that cannot be placed (its node gone, the
# other CPUs taken) waits forever, and so would the chunks sent to it. A dead actor's chunks
# run again on the live ones, and a new actor joins once it answers.
_ACTOR_OPTIONS = {"num_cpus": 1, "max_restarts": 0, "max_task_retries": 0}


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
        for _ in range(self.size):
            self.start_actor()
        self.payloads: dict[str, Any] = {}  # key -> the payload's object reference

    def start_actor(self) -> None:
        actor = self._actor_class.remote(1)
        self.starting[actor.ping.remote()] = actor

    def started(self, ref: Any) -> None:
        """`ref`, an actor's first answer, arrived: it joins (or, dead at birth, is dropped)."""
        actor = self.starting.pop(ref)
        try:
            _ray().get(ref)
        except Exception:  # it died starting; the others go on
            return
        self.live.append(actor)

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
#: trips), the last ones single items, so that no worker idles while another ends a long chunk.
GUIDED = 2

#: The most items in one chunk.
MAX_CHUNK = 64


def chunks(
    staged: list[tuple[int, str, list[np.ndarray]]], workers: int, chunk_size: int | None
) -> Iterator[Chunk]:
    """Items in input order, in chunks of one signature: `chunk_size` items each, or by
    default guided (OpenMP's schedule): a chunk takes 1/(GUIDED * workers) of the items left."""
    left = len(staged)
    current: Chunk | None = None
    size = 0
    for index, key, inputs in staged:
        if current is None or current.key != key or len(current.indices) == size:
            if current is not None:
                yield current
            size = chunk_size or max(1, min(MAX_CHUNK, -(-left // (GUIDED * workers))))
            current = Chunk(key, [], [])
        current.indices.append(index)
        current.inputs.append(inputs)
        left -= 1
    if current is not None:
        yield current


def run(
    pool: Pool,
    work: list[Chunk],
    payloads: dict[str, Any],
    done: Callable[[int, Any], bool],
    progress: Any,
) -> None:
    """Runs every chunk of `work` on the pool's actors; `done(index, flat result or
    ItemError)` takes each item's result as it arrives and returns False to stop the map."""
    ray = _ray()
    queue = collections.deque(work)
    in_flight: dict[Any, tuple[Any, Chunk]] = {}
    load: collections.Counter[Any] = collections.Counter()

    def send(actor: Any, chunk: Chunk) -> None:
        boxed = [pool.payload_ref(chunk.key, payloads[chunk.key])]
        count = len(chunk.indices)
        ref = actor.run.remote(chunk.key, boxed, count, _worker.stack(chunk.inputs))
        in_flight[ref] = (actor, chunk)
        load[actor] += 1

    while queue or in_flight:
        for actor in list(pool.live):
            while queue and load[actor] < IN_FLIGHT:
                send(actor, queue.popleft())
        waiting = [*in_flight, *pool.starting]
        idle = not in_flight  # no live actor: only a starting one can take the work
        timeout = START_TIMEOUT if idle else None
        ready = ray.wait(waiting, num_returns=1, timeout=timeout)[0] if waiting else []
        if not ready:
            from .. import errors

            raise errors.ExecutionError(
                f"gl.distributed.map: no worker is left, and none started in {START_TIMEOUT:g} "
                f"s ({len(queue)} chunks not run; did the cluster lose its nodes?)"
            )
        ref = ready[0]
        if ref in pool.starting:
            pool.started(ref)
            continue
        actor, chunk = in_flight.pop(ref)
        load[actor] -= 1
        try:
            results = ray.get(ref)
            if isinstance(results, tuple):
                results = _worker.unstack(results, len(chunk.indices))
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
            if actor in pool.live:
                pool.lost(actor)
            chunk.attempts += 1
            if chunk.attempts <= RETRIES:
                queue.appendleft(chunk)
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
