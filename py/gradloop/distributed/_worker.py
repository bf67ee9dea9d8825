"""What runs on a Ray worker: the actor that loads staged functions once and serves items.

This module imports numpy alone at the top: the driver ships it by value
(`cloudpickle.register_pickle_by_value`), so a worker serving compiled functions needs IREE's
runtime (`iree-base-runtime`) and numpy, not gradloop. Graph functions need gradloop's
executor there, and import it when their payload is loaded.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class CompiledPayload:
    """A compiled function as it travels: its module, entry, IREE driver and the values passed
    after the arguments (captured tensors, the Variables it reads)."""

    vmfb: bytes
    function: str
    driver: str
    driver_flags: tuple[str, ...]
    captured: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class GraphPayload:
    """A graph function as it travels: a `ConcreteFunction`, pickled as its graph's text and
    captured values."""

    concrete: Any


@dataclass(frozen=True)
class ItemError:
    """An item's failure as it travels back: the exception's class (module and name) and
    message; the driver raises or returns it as that class where it knows it."""

    module: str
    name: str
    message: str


def _compiled_caller(payload: CompiledPayload, configs: dict[str, Any]) -> Any:
    from iree import runtime

    config = configs.get(payload.driver)
    if config is None:
        if payload.driver_flags:
            runtime.flags.parse_flags(*payload.driver_flags)
        config = configs[payload.driver] = runtime.Config(device=runtime.get_device(payload.driver))
    module = runtime.VmModule.copy_buffer(config.vm_instance, payload.vmfb)
    entry = runtime.load_vm_module(module, config)[payload.function]

    def call(args: tuple[np.ndarray, ...]) -> list[np.ndarray]:
        out = entry(*args, *payload.captured)
        results = out if isinstance(out, (tuple, list)) else [out]
        return [np.array(r.to_host() if hasattr(r, "to_host") else r) for r in results]

    return call


def _graph_caller(payload: GraphPayload) -> Any:
    concrete = payload.concrete

    def call(args: tuple[np.ndarray, ...]) -> list[np.ndarray]:
        return [np.array(r) for r in concrete(list(args))]

    return call


class Worker:
    """A Ray actor (`ray.remote(Worker)`): `run` calls a staged function on a chunk of items.

    Payloads arrive as object references inside a list, so that Ray does not fetch them with
    every chunk: a payload is fetched and loaded the first time its key is seen, then kept.
    """

    def __init__(self, threads: int) -> None:
        # One core per actor: gradloop's executor and kernels would otherwise each start a
        # thread per core of the machine, and the actors on it would contend.
        for name in ("GRADLOOP_NUM_THREADS", "RAYON_NUM_THREADS"):
            os.environ.setdefault(name, str(threads))
        self._callers: dict[str, Any] = {}
        self._configs: dict[str, Any] = {}
        self.loads = 0

    def ping(self) -> tuple[int, str]:
        """The worker's process id and Ray node: its first answer says it is up."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def imports_gradloop(self) -> bool:
        """Whether this worker process imported gradloop (serving compiled modules does not)."""
        import sys

        return "gradloop" in sys.modules

    def _caller(self, key: str, boxed_payload: list[Any]) -> Any:
        caller = self._callers.get(key)
        if caller is None:
            import ray

            payload = ray.get(boxed_payload[0])
            if isinstance(payload, CompiledPayload):
                caller = _compiled_caller(payload, self._configs)
            else:
                caller = _graph_caller(payload)
            self._callers[key] = caller
            self.loads += 1
        return caller

    def run(
        self, key: str, boxed_payload: list[Any], count: int, stacked: tuple[np.ndarray, ...]
    ) -> tuple[tuple[np.ndarray, ...] | list[list[np.ndarray] | ItemError], float]:
        """Calls the function on `count` items whose inputs come stacked (input k of item j is
        `stacked[k][j]`: a few arrays pickle much faster than many small ones). Returns the
        outputs stacked the same way, or where an item failed, each item's flat results or
        its `ItemError` (one item's failure is its own); and the seconds the items took, from
        which the driver sizes later chunks."""
        start = time.perf_counter()
        try:
            caller = self._caller(key, boxed_payload)
        except Exception as e:  # a payload that does not load fails every item
            failed = [_item_error(e, "loading the staged function")] * count
            return failed, time.perf_counter() - start
        results: list[list[np.ndarray] | ItemError] = []
        for j in range(count):
            try:
                results.append(caller(tuple(column[j, ...] for column in stacked)))
            except Exception as e:  # reported to the driver, per item
                results.append(_item_error(e, "running it"))
        seconds = time.perf_counter() - start
        if any(isinstance(r, ItemError) for r in results):
            return results, seconds
        return stack(results), seconds  # type: ignore[arg-type]

    def loaded(self) -> int:
        """How many payloads this actor process has loaded (each once)."""
        return self.loads


def stack(items: list[list[np.ndarray]]) -> tuple[np.ndarray, ...]:
    """Flat values of several items (all of one signature) as one array per position."""
    return tuple(np.stack(column) for column in zip(*items, strict=True))


def unstack(stacked: tuple[np.ndarray, ...], count: int) -> list[list[np.ndarray]]:
    return [[column[j, ...] for column in stacked] for j in range(count)]


def _item_error(e: Exception, doing: str) -> ItemError:
    cls = type(e)
    message = str(e) or cls.__name__
    if not cls.__module__.startswith("gradloop"):
        message = f"{doing} failed: {cls.__name__}: {message}"
    return ItemError(cls.__module__, cls.__qualname__, message)
