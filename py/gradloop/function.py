"""Graph mode: `@gl.function` traces Python into the Rust graph IR and runs the graph.

A call looks at its arguments' signature: every tensor (and numpy array) argument contributes
its dtype and shape, every other argument its value (Python values and structure are static).
The first call with a new signature traces the function: its tensor arguments become symbolic
tensors, ops on them add nodes, `cond`/`switch_case`/`while_loop` on symbolic values build
`If`/`Case`/`While` nodes over traced functions, tensors the function closes over become
captured inputs and Variables become resource inputs. Calls run the cached graph on the Rust
frame executor with the GIL released: lowered once to dataflow (`lower`), run lazily (an op in
an untaken branch, or one no result needs, never runs), with up to `parallel_iterations` loop
iterations in flight across `GRADLOOP_NUM_THREADS` threads (default: the machine's cores).
`gradloop._core.set_graph_runner("interpreter")` runs them on the reference interpreter instead.

Two cases run the Python function directly instead: a call made while another function is being
traced (it is inlined into that trace), and a call while a `GradientTape` records (the ops then
record on it as in eager mode, so gradients of calls are exact; gradients *inside* a function
are symbolic).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from . import _core, _validate, batching, errors, nest
from . import variables as _variables

__all__ = ["Function", "function", "inline", "lower", "prune"]

#: Traces of one Function beyond this many warn (each new signature retraces).
RETRACE_WARNING_THRESHOLD = 5


class _Static:
    """A non-tensor argument leaf in a signature (hashed by value, or identity when unhashable)."""

    __slots__ = ("key",)

    def __init__(self, value: Any) -> None:
        if isinstance(value, Hashable):
            try:
                hash(value)
                self.key: Any = (type(value), value)
                return
            except TypeError:
                pass
        self.key = ("id", id(value))


def _leaf_spec(leaf: Any) -> Any:
    if isinstance(leaf, _core.Tensor):
        return ("tensor", leaf.dtype.name, tuple(leaf.shape))
    if isinstance(leaf, _variables.Variable):
        return ("variable", id(leaf))
    return ("static", _Static(leaf).key)


def _positional(args: tuple[Any, ...]) -> tuple[tuple, list[Any]] | None:
    """The signature of `args` when each is a tensor or a tuple or list of tensors (else None):
    the containers, dtypes and shapes; with the tensors in order."""
    key: list[Any] = []
    tensors: list[Any] = []
    for a in args:
        kind = type(a)
        if kind is _core.Tensor:
            key.append((a.dtype, a.shape))
            tensors.append(a)
        elif kind is tuple or kind is list:
            if not all(type(x) is _core.Tensor for x in a):
                return None
            key.append((kind, tuple((x.dtype, x.shape) for x in a)))
            tensors.extend(a)
        else:
            return None
    return tuple(key), tensors


class _Concrete:
    """One traced signature: the graph function and how to rebuild the outputs."""

    def __init__(self, fn: Any, structure: Any, tensor_slots: list[int], statics: list[Any]):
        self.fn = fn
        self.structure = structure
        self.tensor_slots = tensor_slots  # output leaf positions filled by graph results
        self.statics = statics  # every output leaf; tensor slots are replaced per call
        self.single = tensor_slots == [0] and not nest.is_nested(structure)

    def outputs(self, results: list[_core.Tensor]) -> Any:
        if self.single:
            return results[0]
        leaves = list(self.statics)
        for slot, value in zip(self.tensor_slots, results, strict=True):
            leaves[slot] = value
        return nest.pack_sequence_as(self.structure, leaves)


class Function:
    """A Python function traced into a graph once per input signature (see the module doc).

    Call it like the function; `graph(*args)` returns the traced `Graph` for those arguments'
    signature (`str(graph)` is its text form), tracing if needed.
    """

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        if not callable(fn):
            raise errors.InvalidArgumentError(
                _validate.at_user(f"gl.function needs a callable; got {type(fn).__name__}")
            )
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._name = name or getattr(fn, "__name__", "function")
        self._cache: dict[Any, _Concrete] = {}
        # The same traces, keyed by the signature of positional tensor arguments alone.
        self._by_positional: dict[tuple, _Concrete] = {}
        self._traces = 0
        # Itself with `vmap` calls inside, for calls on lanes (`batching.call_over_lanes`).
        self._over_lanes: dict[Any, Any] = {}

    @property
    def python_function(self) -> Callable[..., Any]:
        return self._fn

    @property
    def trace_count(self) -> int:
        """How many signatures were traced so far."""
        return self._traces

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        # Decorating a method: bind `self` as a static argument.
        if instance is None:
            return self
        return functools.partial(self.__call__, instance)

    def __repr__(self) -> str:
        return f"<gl.function {self._name} ({self._traces} traces)>"

    def _flatten(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any]]:
        structure = (args, kwargs)
        leaves = []
        for leaf in nest.flatten(structure):
            if isinstance(leaf, (np.ndarray, np.generic)) and not isinstance(leaf, np.bool_):
                leaf = _core.tensor(leaf)
            leaves.append(leaf)
        return structure, leaves

    def _concrete(
        self, structure: Any, leaves: list[Any], fixed_state_loops: int | None = None
    ) -> _Concrete:
        key = (nest.format_structure(structure, lambda _: "*"), tuple(map(_leaf_spec, leaves)))
        if fixed_state_loops is not None:
            key = (*key, fixed_state_loops)
        found = self._cache.get(key)
        if found is None:
            found = self._trace(structure, leaves, fixed_state_loops)
            self._cache[key] = found
        return found

    def _trace(
        self, structure: Any, leaves: list[Any], fixed_state_loops: int | None = None
    ) -> _Concrete:
        self._traces += 1
        if self._traces > RETRACE_WARNING_THRESHOLD:
            warnings.warn(
                _validate.at_user(
                    f"gl.function {self._name} traced {self._traces} times: each new input "
                    "signature (tensor dtypes and shapes, Python argument values) traces "
                    "again; pass tensors instead of Python numbers that change between calls"
                ),
                errors.RetracingWarning,
                stacklevel=3,
            )
        tensors = [x for x in leaves if isinstance(x, _core.Tensor)]
        specs = [(t.dtype, tuple(t.shape)) for t in tensors]
        symbols = iter(_core.trace_begin(self._name, specs, fixed_state_loops))
        try:
            traced_leaves = [next(symbols) if isinstance(x, _core.Tensor) else x for x in leaves]
            args, kwargs = nest.pack_sequence_as(structure, traced_leaves)
            out = self._fn(*args, **kwargs)
            out_leaves = nest.flatten(out)
            slots, results = [], []
            for i, leaf in enumerate(out_leaves):
                if isinstance(leaf, _variables.Variable):
                    leaf = out_leaves[i] = leaf.read()
                if isinstance(leaf, _core.Tensor):
                    slots.append(i)
                    results.append(leaf)
            fn = _core.trace_finish(results)
        except BaseException:
            _core.trace_abort()
            raise
        statics = [None if i in set(slots) else leaf for i, leaf in enumerate(out_leaves)]
        return _Concrete(fn, out, slots, statics)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _core.mode() != "eager":  # inside a trace, or recorded by tapes: inline
            return self._fn(*args, **kwargs)
        levels = batching.argument_levels(args, kwargs)
        if levels:
            return batching.call_over_lanes(
                self._fn, lambda f: Function(f, self._name), self._over_lanes, levels, args, kwargs
            )
        try:
            concrete, inputs = self._lookup(args, kwargs)
        except errors.InvalidArgumentError as e:
            if _core.vmap_levels() and batching.closes_over_lanes(e):
                return self._fn(*args, **kwargs)  # as under a tape
            raise
        return concrete.outputs(concrete.fn(inputs))

    def _lookup(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[_Concrete, list]:
        """The trace for these arguments (traced if needed) and its tensor inputs. The common
        call, tensors (or tuples and lists of them) passed positionally, skips flattening the
        arguments."""
        found = None if kwargs else _positional(args)
        if found is not None:
            concrete = self._by_positional.get(found[0])
            if concrete is not None:
                return concrete, found[1]
        structure, leaves = self._flatten(args, kwargs)
        concrete = self._concrete(structure, leaves)
        if found is not None:
            self._by_positional[found[0]] = concrete
        return concrete, [x for x in leaves if isinstance(x, _core.Tensor)]

    def graph(self, *args: Any, **kwargs: Any) -> Any:
        """The traced `Graph` for the signature of these arguments (traced if needed)."""
        structure, leaves = self._flatten(args, kwargs)
        return self._concrete(structure, leaves).fn.graph

    def concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """The traced function for these arguments' signature: `.graph`, `.captured_inputs`."""
        structure, leaves = self._flatten(args, kwargs)
        return self._concrete(structure, leaves).fn

    def fixed_state_function(self, checkpoints: int, *args: Any, **kwargs: Any) -> Any:
        """`concrete_function`, traced with every loop gradient in fixed-size state, as pure
        StableHLO needs: a loop without `checkpoints` keeps one snapshot per possible trip when
        `maximum_iterations` bounds it by at most 4096, else `checkpoints` snapshots."""
        structure, leaves = self._flatten(args, kwargs)
        return self._concrete(structure, leaves, checkpoints).fn


def function(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Decorator: trace `fn` into a graph per input signature and run it as a graph.

    Usable as ``@gl.function`` or ``@gl.function(name="step")``. See the module doc.
    """
    if fn is None:
        return lambda f: Function(f, name=name)
    return Function(fn, name=name)


def inline(graph: Any) -> Any:
    """A new graph whose function calls are replaced by the callees' nodes (Grappler's function
    inlining); `If`/`Case`/`While` keep calling their branch and body functions."""
    return graph.inline()


def lower(graph: Any) -> Any:
    """The graph's entry lowered to dataflow, as the frame executor runs it: calls inlined,
    `If`/`Case` as `switch` + `merge`, each `While` as a frame of `enter` / `merge` / `switch` /
    `next_iteration` / `exit`. `str()` of the result is its text."""
    return graph.lower()


def prune(graph: Any, fetches: Any) -> Any:
    """A new graph returning the entry's results at `fetches` (an int or a sequence of ints),
    without the nodes that neither they nor a side effect need: writes to Variables are kept."""
    indices = [fetches] if isinstance(fetches, int) else list(fetches)
    return graph.prune(indices)
