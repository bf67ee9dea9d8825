"""`gl.distributed`: a staged function run on many items on a Ray cluster (the optional extra
`gradloop[ray]`).

    fit = gl.jit(gl.value_and_grad(loss))
    results = gl.distributed.map(fit, [(theta, target) for target in targets])

Data-dependent loops take a different number of trips per item, so items are handed out
dynamically to actors as they finish, never padded to the slowest (as a batched loop would be).

- **Staging, on the driver.** The function is traced once per input signature. A `gl.jit`
  function is compiled for a generic CPU, and checked on its first item against the reference
  interpreter (as `gl.jit` checks its first call). It travels as its `.vmfb` bytes, so a
  worker needs only IREE's runtime and numpy. A `gl.function` travels as its graph (text and
  captured values), so a worker needs gradloop.
- **Workers.** Each is a Ray actor holding one CPU. It loads each payload once (from Ray's
  object store) and serves chunks of items; payloads are kept between maps.
- **Faults.** An actor whose process died is replaced by a fresh one, and its chunks run
  again on the live actors, up to `_pool.RETRIES` times each. Functions
  are pure (Variables may be read, not assigned), so running an item again gives the same
  result.
- **Errors.** Bad arguments, or a function that is not staged, are typed errors raised before
  anything is sent. An item whose call fails: with `errors="raise"` the map raises the error
  of the failing item of lowest index (its `gl.errors` class) naming that index; with
  `errors="return"` that item's slot holds the exception and the other items' results come
  back.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import _core, _validate, errors, nest
from . import _pool, _staging, _worker

__all__ = ["map", "mean_gradient", "shutdown"]

_pools: dict[int | None, _pool.Pool] = {}
_started_ray = False

ERRORS = ("raise", "return")


def _connect(address: str | None) -> None:
    """Joins Ray: `address` None starts or joins a local instance (`ray.init()`), "auto" or
    "ray://host:port" an existing cluster. A connection already made is kept."""
    global _started_ray
    ray = _pool._ray()
    if ray.is_initialized():
        return
    if address is None:
        ray.init(log_to_driver=False, configure_logging=False)
        _started_ray = True
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)


def _pool_for(address: str | None, workers: int | None) -> _pool.Pool:
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)):
        raise errors.InvalidArgumentError(
            _validate.at_user(f"workers must be a positive int or None, not {workers!r}")
        )
    if workers is not None and workers < 1:
        raise errors.InvalidArgumentError(
            _validate.at_user(f"workers must be a positive int or None, not {workers}")
        )
    _connect(address)
    pool = _pools.get(workers)
    if pool is not None and pool.job != _pool._ray().get_runtime_context().get_job_id():
        pool = None  # Ray was shut down and started again: the old actors are gone
    if pool is None:
        pool = _pools[workers] = _pool.Pool(workers)
    return pool


def shutdown() -> None:
    """Ends the actors of earlier maps, and the local Ray instance if `map` started it."""
    global _started_ray
    for pool in _pools.values():
        pool.close()
    _pools.clear()
    if _started_ray:
        _pool._ray().shutdown()
        _started_ray = False


def _exception(failure: _worker.ItemError, index: int) -> Exception:
    """The item's error as the class it was raised as where gradloop knows it, else an
    `ExecutionError`, its message led by the item's index."""
    cls = getattr(errors, failure.name, None) if failure.module == "gradloop.errors" else None
    if not (isinstance(cls, type) and issubclass(cls, errors.GradloopError)):
        cls = errors.ExecutionError
    return cls(f"item {index}: {failure.message}")


def _with_index(e: errors.GradloopError, index: int) -> errors.GradloopError:
    return type(e)(f"item {index}: {e}")


def map(  # noqa: A001 - DESIGN's name
    fn: Any,
    items: Iterable[Any],
    *,
    address: str | None = None,
    workers: int | None = None,
    errors: str = "raise",
    chunk_size: int | None = None,
    progress: bool | None = None,
) -> list[Any]:
    """`fn(*item)` for every item on a Ray cluster, the results in input order.

    `fn` is a `gl.jit` or `gl.function` function; each item a tuple of its arguments (or one
    tensor or array: the single argument), every leaf a tensor or numpy array. `address`:
    None starts or joins a local Ray instance, "auto" or "ray://host:port" joins a cluster.
    `workers`: actors to run (one CPU each), by default one per CPU of the cluster.
    `errors`: "raise" (the error of the failing item of lowest index, naming that index: items
    after it are not run further) or "return" (its slot holds the exception). `chunk_size`:
    items per round trip; by default items are taken in an order that spreads each chunk over
    the whole input, and a chunk takes a quarter of each worker's share of the items left (at
    most 64), more where the items measured so far are cheap against a round trip (up to the
    share itself: one round trip per worker), so that chunks shrink towards single items at
    the end only where the items are costly. `progress`: tqdm's bar on stderr for maps longer
    than 2 s, by default only on a terminal.
    """
    mode = errors
    from .. import errors as gl_errors

    if mode not in ERRORS:
        raise gl_errors.InvalidArgumentError(
            _validate.at_user(f"errors must be one of {list(ERRORS)}, not {mode!r}")
        )
    _staging.function_of(fn)
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise gl_errors.InvalidArgumentError(
            _validate.at_user(f"chunk_size must be a positive int or None, not {chunk_size!r}")
        )
    arguments = [_staging.arguments(item, i) for i, item in enumerate(items)]
    results: list[Any] = [None] * len(arguments)
    if not arguments:
        return results
    staged, signatures, pending = [], {}, []
    for index, args in enumerate(arguments):
        try:
            signature, inputs, checked = _staging.signature(fn, args)
        except _staging.Refused as e:
            raise e.error from None
        except gl_errors.GradloopError as e:
            if mode == "raise":
                raise _with_index(e, index) from e
            results[index] = _with_index(e, index)
            continue
        signatures[signature.key] = signature
        if checked is not None:
            results[index] = checked
        else:
            staged.append((index, signature.key, inputs))
            pending.append(index)
    if not staged:
        return results
    pool = _pool_for(address, workers)
    keys = {key for _, key, _ in staged}
    payloads = {key: signatures[key].payload for key in keys}
    entries = {index: signatures[key].entry for index, key, _ in staged}
    # With errors="raise", the lowest failing index: items past it are not sent any more, those
    # before it all run, so the error raised is that of the first item that fails, whatever
    # order the chunks come back in.
    failure: dict[int, Exception] = {}

    def done(index: int, result: Any) -> bool:
        if isinstance(result, _worker.ItemError):
            error = _exception(result, index)
            if mode == "raise":
                failure[index] = error
                return True
            results[index] = error
            return True
        results[index] = entries[index].outputs([_core.tensor(r) for r in result])
        return True

    def wanted(index: int) -> bool:
        return not failure or index < min(failure)

    name = next(iter(signatures.values())).entry.fn.graph.entry
    bar = _pool.progress_bar(len(staged), name, progress)
    try:
        floor = lambda key: pool.paces[key].floor()  # noqa: E731
        work = _pool.chunks(staged, pool.size, chunk_size, floor, wanted)
        _pool.run(pool, work, payloads, done, bar, pool.paces)
    finally:
        if bar is not None:
            bar.close()
    if failure:
        raise failure[min(failure)]
    return results


def mean_gradient(
    step: Any,
    params: Any,
    shards: Iterable[Any],
    *,
    weights: Iterable[float] | None = None,
    address: str | None = None,
    workers: int | None = None,
    progress: bool | None = None,
) -> tuple[Any, Any]:
    """Data-parallel `value_and_grad`: `step(params, *shard)` on every shard on the cluster
    (`step` a `gl.jit` or `gl.function` of `gl.value_and_grad(loss)`), returning its value and
    gradients averaged over the shards, leaf by leaf, in float64 where they are float64.

    With equal-sized shards and a loss that is a mean over its shard, that is the gradient
    of the mean loss over all the data; otherwise pass `weights` (say, the shards' sizes): the
    average is weighted by them. Errors raise, naming the shard."""
    shards = [s if isinstance(s, tuple) else (s,) for s in shards]
    if not shards:
        raise errors.InvalidArgumentError(_validate.at_user("mean_gradient needs a shard"))
    w = np.ones(len(shards)) if weights is None else np.asarray(list(weights), np.float64)
    if w.shape != (len(shards),) or not np.all(np.isfinite(w)) or w.sum() <= 0:
        raise errors.InvalidArgumentError(
            _validate.at_user(
                f"weights must be {len(shards)} finite numbers with a positive sum, one per shard"
            )
        )
    w = w / w.sum()
    try:
        results = map(
            step,
            [(params, *shard) for shard in shards],
            address=address,
            workers=workers,
            progress=progress,
        )
    except errors.GradloopError as e:
        message = str(e)
        if not message.startswith("item "):
            raise
        raise type(e)("shard " + message.removeprefix("item ")) from e
    leaves = [nest.flatten(r) for r in results]
    averaged = []
    for column in builtins.map(list, zip(*leaves, strict=True)):
        values = [np.asarray(v) for v in column]
        dtype = values[0].dtype if values[0].dtype.kind == "f" else np.float64
        total = sum((wi * v for wi, v in zip(w, values, strict=True)), np.zeros((), dtype))
        averaged.append(_core.tensor(np.asarray(total, dtype)))
    value, grads = nest.pack_sequence_as(results[0], averaged)
    return value, grads
