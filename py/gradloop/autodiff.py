"""Reverse-mode autodiff: `GradientTape`, `grad`, `value_and_grad`, `custom_gradient`,
`stop_gradient` and `recompute_grad`, over the Rust tape (`_core.Tape`).

Higher order comes from nesting: a tape records the ops of gradients computed while it is
active, so `grad(grad(f))` is a tape inside a tape. Variable reads are seen through a registry
kept by each Python tape, which maps each Variable to the tensors read from it while it
recorded; the tapes that record now are the core's (`_core.recording_tape_keys`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from . import _core, _recording, _validate, batching, errors, nest
from ._custom_ops import custom_op, fresh_outputs

if TYPE_CHECKING:  # variables.py imports this module's hooks (`_recording`)
    from .variables import Variable

__all__ = [
    "GradientTape",
    "custom_gradient",
    "grad",
    "recompute_grad",
    "stop_gradient",
    "value_and_grad",
]

_UNCONNECTED = ("none", "zero")


def _add_all(grads: list[Any]) -> Any:
    present = [g for g in grads if g is not None]
    return functools.reduce(_core.add, present) if present else None


class GradientTape:
    """Records the ops run on watched tensors inside `with` so that `gradient` can differentiate.

    Trainable Variables read inside the block are watched automatically; the gradient with
    respect to a Variable sums the gradients of every value read from it while the tape was
    recording. A non-persistent tape computes one gradient; `persistent=True` allows many.
    Gradients computed while other tapes record are recorded by them (higher order).
    """

    def __init__(self, persistent: bool = False) -> None:
        self._persistent = persistent
        self._recording = False
        self._clear()

    def _clear(self) -> None:
        old = getattr(self, "_tape", None)
        if old is not None and _recording.owners.get(old.key) is self:
            del _recording.owners[old.key]  # a dead tape's key may be reused by another
        self._tape = _core.Tape(self._persistent)
        _recording.owners[self._tape.key] = self
        self._used = False
        self._watched_vars: dict[Variable, None] = {}  # ordered set
        self._reads: dict[Variable, list[_core.Tensor]] = {}

    @property
    def persistent(self) -> bool:
        return self._persistent

    def __enter__(self) -> GradientTape:
        if self._recording:
            raise errors.GradientError(
                _validate.at_user("GradientTape: this tape is already recording (entered twice)")
            )
        self._start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._recording:
            self._stop()

    def _start(self) -> None:
        self._tape.push()
        self._recording = True

    def _stop(self) -> None:
        self._recording = False
        self._tape.pop()

    @contextlib.contextmanager
    def stop_recording(self) -> Iterator[None]:
        """Ops in this block are not recorded by this tape (other tapes still record)."""
        if not self._recording:
            raise errors.GradientError(
                _validate.at_user("GradientTape.stop_recording: the tape is not recording")
            )
        self._stop()
        try:
            yield
        finally:
            self._start()

    def reset(self) -> None:
        """Forgets everything recorded and watched, as if a fresh tape had been entered."""
        recording = self._recording
        if recording:
            self._stop()
        self._clear()
        if recording:
            self._start()

    def watch(self, x: Any) -> None:
        """Watches a float tensor, a Variable, or a nested structure of them."""
        for path, leaf in nest.flatten_with_paths(x):
            _validate.check_gradient_source(leaf, path, "GradientTape.watch")
            if isinstance(leaf, _validate.VARIABLE_TYPES):
                self._watched_vars.setdefault(leaf)
            else:
                self._tape.watch(leaf)

    def watched_variables(self) -> tuple[Variable, ...]:
        """Variables watched explicitly or read while recording, in first-seen order."""
        return tuple(self._watched_vars)

    def _note_read(self, variable: Variable, value: _core.Tensor) -> None:
        if not value.dtype.is_floating:
            return
        if not variable.trainable:
            if variable not in self._watched_vars:
                return
            self._tape.watch(value)  # explicitly watched: not covered by watch_on_active_tapes
        self._watched_vars.setdefault(variable)
        reads = self._reads.setdefault(variable, [])
        # The same stored value read twice counts once (each read is a new Python handle).
        if not any(r._tape_id == value._tape_id for r in reads):
            reads.append(value)

    def gradient(
        self,
        target: Any,
        sources: Any,
        output_gradients: Any = None,
        unconnected_gradients: str = "none",
    ) -> Any:
        """Gradients of `target` (summed over its elements) with respect to `sources`.

        `target` and `sources` may be nested structures; the result has the structure of
        `sources`. `output_gradients` (the structure of `target`, None leaves allowed) seeds
        each target instead of ones. A source the target does not depend on gets None, or zeros
        with `unconnected_gradients="zero"`.
        """
        if unconnected_gradients not in _UNCONNECTED:
            raise errors.InvalidArgumentError(
                _validate.at_user(
                    "GradientTape.gradient: unconnected_gradients must be 'none' or 'zero'; "
                    f"got {unconnected_gradients!r}"
                )
            )
        if self._used and not self._persistent:
            raise errors.GradientError(
                _validate.at_user(
                    "GradientTape.gradient: a non-persistent GradientTape can only compute one "
                    "gradient; create it with GradientTape(persistent=True) to call gradient() "
                    "more than once"
                )
            )
        targets = [self._target(leaf, path) for path, leaf in nest.flatten_with_paths(target)]
        seeds = self._seeds(target, targets, output_gradients)
        flat = [
            _validate.check_gradient_source(leaf, path, "GradientTape.gradient")
            for path, leaf in nest.flatten_with_paths(sources)
        ]
        # A Variable stands for every value read from it: its gradient is their sum.
        groups = [
            self._reads.get(s, []) if isinstance(s, _validate.VARIABLE_TYPES) else [s] for s in flat
        ]
        raw = iter(self._tape.gradient(targets, [t for g in groups for t in g], seeds))
        self._used = True
        grads = []
        for source, group in zip(flat, groups, strict=True):
            g = _add_all([next(raw) for _ in group])
            if g is None and unconnected_gradients == "zero":
                g = _core.zeros(source.shape, dtype=source.dtype)
            grads.append(g)
        return nest.pack_sequence_as(sources, grads)

    @staticmethod
    def _target(leaf: Any, path: str) -> _core.Tensor:
        if isinstance(leaf, _validate.VARIABLE_TYPES):
            return leaf.read()
        if not isinstance(leaf, _core.Tensor):
            raise errors.GradientError(
                _validate.at_user(
                    f"GradientTape.gradient: target at {nest.path_str(path)} must be a Tensor; "
                    f"got {type(leaf).__name__}"
                )
            )
        return leaf

    @staticmethod
    def _seeds(target: Any, targets: list[_core.Tensor], output_gradients: Any) -> list[Any] | None:
        if output_gradients is None:
            return None
        found = nest.structure_difference(target, output_gradients)
        if found is None:
            flat = nest.flatten(output_gradients)
        elif isinstance(output_gradients, (list, tuple)) and len(output_gradients) == len(targets):
            flat = list(output_gradients)  # TensorFlow also takes a flat list
        else:
            raise errors.InvalidArgumentError(
                _validate.at_user(
                    "GradientTape.gradient: output_gradients must have the structure of target "
                    f"(or be a flat list of {len(targets)}); at {nest.path_str(found[0])}: "
                    f"{found[1]} vs {found[2]}"
                )
            )
        return [
            g if g is None or isinstance(g, _core.Tensor) else _core.tensor(g, dtype=t.dtype)
            for t, g in zip(targets, flat, strict=True)
        ]


def value_and_grad(
    fn: Callable[..., Any], argnums: int | tuple[int, ...] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """`fn` turned into a function returning `(fn(*args), gradient)` (JAX semantics).

    The gradient is with respect to argument `argnums` (or a tuple of gradients for a tuple of
    argnums) and has that argument's structure. Arguments may be nested tuples/lists/dicts of
    float tensors, Python floats (converted to float32: pass a float64 tensor or numpy array for
    float64) or numpy arrays. `fn` must return a scalar float tensor, or `(scalar, aux)` with
    `has_aux=True`, in which case the value is `(scalar, aux)`. Unconnected inputs get zeros.
    Each call runs a fresh tape, so the result can be differentiated again.
    """
    return _value_and_grad(fn, argnums, has_aux, "value_and_grad")


def _value_and_grad(
    fn: Callable[..., Any], argnums: Any, has_aux: bool, api: str
) -> Callable[..., Any]:
    nums = _validate.check_argnums(argnums)
    where = f"{api}({getattr(fn, '__name__', 'fn')})"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        args_list = _validate.differentiable_args(args, nums, where)
        if _core.vmap_levels():
            # Inside vmap each lane differentiates with respect to its own copy.
            for i in nums:
                args_list[i] = nest.map_structure(batching.lanes_everywhere, args_list[i])
        wrt = tuple(args_list[i] for i in nums)
        with GradientTape() as tape:
            tape.watch(wrt)
            out = fn(*args_list, **kwargs)
            if has_aux and not (isinstance(out, tuple) and len(out) == 2):
                raise errors.GradientError(
                    _validate.at_user(f"{where}: with has_aux=True, fn must return (value, aux)")
                )
            value, aux = out if has_aux else (out, None)
            y = _validate.check_scalar_output(value, where)
        grads = tape.gradient(y, wrt, unconnected_gradients="zero")
        grads = grads[0] if isinstance(argnums, int) else grads
        return ((y, aux) if has_aux else y), grads

    return wrapper


def grad(
    fn: Callable[..., Any], argnums: int | tuple[int, ...] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """The gradient of scalar `fn` with respect to argument(s) `argnums` (see `value_and_grad`).

    With `has_aux=True` it returns `(gradient, aux)`. Composable: `grad(grad(f))`.
    """
    vg = _value_and_grad(fn, argnums, has_aux, "grad")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapper


def stop_gradient(x: Any) -> Any:
    """`x` (a tensor, Variable or nested structure of them) with gradients blocked."""
    read = lambda v: v.read() if isinstance(v, _validate.VARIABLE_TYPES) else v  # noqa: E731
    return nest.map_structure(lambda leaf: _core.stop_gradient(read(leaf)), x)


def custom_gradient(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: `fn(*args)` returns `(y, grad_fn)`; gradients of `y` use `grad_fn`.

    Every positional argument is a tensor input (Python numbers and numpy arrays are converted,
    Variables read); keyword arguments pass through undifferentiated. `grad_fn` receives the
    gradient of `y` in `y`'s structure, spread when `y` is a tuple/list (one argument per item,
    as TensorFlow does), and returns one gradient (or None) per positional argument: a tuple, or
    a single tensor when there is one argument. The forward pass is not recorded (Variables read
    in it get no gradient); the ops of `grad_fn` are recorded by the tapes active when it runs,
    so custom gradients can be differentiated again.
    """
    return custom_op(fn, f"custom_gradient({getattr(fn, '__name__', 'fn')})")


def recompute_grad(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator trading compute for memory: the forward pass keeps no intermediates.

    Eagerly under a tape, `fn` is traced into a graph whose inputs are its positional tensor
    arguments and everything it closes over (tensors, scalars included, and Variables it
    reads), run on the frame executor and recorded as one op; its gradient is the graph's
    vector-Jacobian product, which runs `fn` again from those inputs (`_staged`), so gradients
    of any order reach closed-over values too. A function that cannot be traced (Python
    control flow on tensor values) runs as written, recorded op by op: the same gradients,
    without the saving. Inside `gl.vmap` the graph runs on every lane's values at once. Inside
    `@gl.function` and `gl.jit`, and under forward mode alone, `fn` runs as written and is
    differentiated as written.
    Positional arguments are the tensor inputs (as in `custom_gradient`); keyword arguments
    pass through undifferentiated.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _core.mode() != "recording" or not _core.any_tape_active():
            return fn(*args, **kwargs)
        where = f"recompute_grad({getattr(fn, '__name__', 'fn')})"
        inputs = [_validate.input_tensor(a, i, where) for i, a in enumerate(args)]
        structure: list[Any] = []

        def build(symbols: list[Any]) -> list[Any]:
            out = fn(*symbols, **kwargs)
            structure.append(out)
            return fresh_outputs(out, where)

        try:
            outputs = batching.staged_call("recompute_grad", inputs, build)
        except errors.ControlFlowError:
            return fn(*args, **kwargs)  # Python control flow on values: run as written
        return nest.pack_sequence_as(structure[0], outputs)

    return wrapper
