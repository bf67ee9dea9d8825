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
import re
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from . import _core, _validate, batching, errors, nest

if TYPE_CHECKING:  # variables.py imports this module
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


#: The GradientTape owning each live `_core.Tape`, by its key: which tapes record is the core's
#: one tape stack (`_core.recording_tape_keys`); this only maps its entries back to owners.
_owners: weakref.WeakValueDictionary[int, GradientTape] = weakref.WeakValueDictionary()


def _recording_tapes() -> list[GradientTape]:
    """Python tapes that record now, innermost last."""
    return [t for k in _core.recording_tape_keys() if (t := _owners.get(k)) is not None]


@contextlib.contextmanager
def _paused() -> Iterator[None]:
    """Stops recording on every active tape for the block."""
    token = _core.pause_recording()
    try:
        yield
    finally:
        _core.resume_recording(token)


def note_variable_read(variable: Variable, value: _core.Tensor) -> None:
    """Called by `Variable.read()`: makes the read visible to the recording tapes."""
    if variable.trainable and value.dtype.is_floating and _core.any_tape_active():
        _core.watch_on_active_tapes(value)
    for tape in _recording_tapes():
        tape._note_read(variable, value)


def note_variable_use(variable: Variable, resource: _core.Tensor) -> None:
    """Called by `Variable.read()` while tracing, before the read: the recording tapes watch
    the variable's resource, whose gradient sums those of every read recorded after it,
    including reads inside `cond` branches and `while_loop` bodies."""
    if not variable.dtype.is_floating:
        return
    if variable.trainable and _core.any_tape_active():
        _core.watch_on_active_tapes(resource)
    for tape in _recording_tapes():
        tape._note_read(variable, resource)


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
        if old is not None and _owners.get(old.key) is self:
            del _owners[old.key]  # a dead tape's key may be reused by another
        self._tape = _core.Tape(self._persistent)
        _owners[self._tape.key] = self
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


def _fresh_outputs(y: Any, where: str) -> list[_core.Tensor]:
    """New identities for `y`'s tensors, so the tape sees the custom op's outputs as new values."""
    for path, leaf in nest.flatten_with_paths(y):
        if not isinstance(leaf, _core.Tensor):
            raise errors.GradientError(
                _validate.at_user(
                    f"{where}: output at {nest.path_str(path)} must be a Tensor; "
                    f"got {type(leaf).__name__}"
                )
            )
    return [_core.identity(t) for t in nest.flatten(y)]


def _run_forward(
    fn: Callable[..., Any], inputs: list[Any], kwargs: dict[str, Any], where: str
) -> tuple[Any, list[_core.Tensor], Callable[..., Any]]:
    """Runs a custom op's forward pass unrecorded: `(y, y's tensors as new values, grad_fn)`."""
    with _paused():  # the forward pass records nothing: the op stands for it
        result = fn(*inputs, **kwargs)
        if not (isinstance(result, tuple) and len(result) == 2 and callable(result[1])):
            raise errors.GradientError(
                _validate.at_user(f"{where}: the function must return (outputs, grad_fn)")
            )
        y, grad_fn = result
        return y, _fresh_outputs(y, where), grad_fn


def _call_grad_fn(
    grad_fn: Callable[..., Any], y: Any, out_grads: list[Any], inputs: list[Any], where: str
) -> list[Any]:
    """`grad_fn` on the cotangents in `y`'s structure (spread for a tuple/list `y`), checked."""
    dys = nest.pack_sequence_as(y, out_grads)
    grads = grad_fn(*dys) if isinstance(y, (tuple, list)) else grad_fn(dys)
    return _validate.check_custom_gradients(grads, inputs, where)


def perturbed(inputs: list[Any]) -> list[Any]:
    """The active forward-mode accumulators holding a tangent of one of `inputs` (tensors;
    other values are skipped), innermost last."""
    tensors = [x for x in inputs if isinstance(x, _core.Tensor)]
    return [
        a for a in _core.active_accumulators() if any(a.tangent(x) is not None for x in tensors)
    ]


#: `tangent_fn(inputs, tangents, **kwargs)`: the flat tangents of a custom op's outputs (None
#: for zeros), from its inputs and their tangents (None for integer and bool inputs).
TangentFn = Callable[..., list[Any]]


def _custom_op(
    fn: Callable[..., Any],
    where: str,
    forward_fn: Callable[..., Any] | None = None,
    tangent_fn: TangentFn | None = None,
) -> Callable[..., Any]:
    """`fn(*tensors) -> (y, grad_fn)` as one recorded op whose gradient is `grad_fn`. Under
    forward mode (inputs with tangents) `forward_fn` runs instead, op by op; without one it is
    an error: a custom gradient says nothing of tangents. Traced, the op's node carries
    `grad_fn` and `tangent_fn` traced, for the tangents asked of it later (in a loop body or a
    branch, say)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        inputs = [_validate.input_tensor(a, i, where) for i, a in enumerate(args)]
        if perturbed(inputs):
            if forward_fn is None:
                raise errors.GradientError(
                    _validate.at_user(
                        f"{where} has no forward-mode rule, and jvp, jacfwd and hessian need "
                        "one: define the function with gl.custom_jvp (its rule gives the "
                        "tangents)"
                    )
                )
            return forward_fn(*inputs, **kwargs)
        if _core.trace_active():
            return _traced_custom_op(fn, inputs, kwargs, where, tangent_fn)
        y, outs, grad_fn = _run_forward(fn, inputs, kwargs, where)

        def backward(*out_grads: _core.Tensor) -> list[Any]:
            return _call_grad_fn(grad_fn, y, list(out_grads), inputs, where)

        if _core.any_tape_active():
            _core.record_custom_gradient(where, inputs, outs, backward)
        return nest.pack_sequence_as(y, outs)

    return wrapper


def _traced_custom_op(
    fn: Callable[..., Any],
    inputs: list[_core.Tensor],
    kwargs: dict[str, Any],
    where: str,
    tangent_fn: TangentFn | None,
) -> Any:
    """Graph mode: `fn` traced into a function of its own, called through a node whose gradient
    is `grad_fn` traced too (and whose tangent is `tangent_fn` traced, where there is one), so
    that the custom rules hold wherever the node ends up (a branch or loop body differentiated
    later, a compiled module). A rule that fails as it is traced does not fail the call: the
    node keeps the failure and raises it when a derivative is asked (as eagerly, where a rule
    runs only then)."""
    name = getattr(fn, "__name__", "custom_gradient")
    # Inside vmap the function and its rules are traced as one lane's (the levels set aside),
    # and the call node is batched with its rules (the core's rule for calls).
    _core.vmap_suspend()
    params = _core.trace_push(name, [(t.dtype, tuple(t.shape)) for t in inputs])
    try:
        y, outs, grad_fn = _run_forward(fn, params, kwargs, where)
        rules: dict[str, Any] = {}
        failures: list[str] = []

        def traced(kind: str, build: Callable[[], Any]) -> None:
            # Each rule on its own: a tangent rule that fails (a recompute_grad function
            # calling a custom_gradient one) leaves the gradient rule in force.
            try:
                rules[kind] = build()
            except Exception as e:
                what = "is malformed" if isinstance(e, TypeError) else "failed"
                failures.append(f"its rule {what}: {_described(e, where)}")

        traced(
            "grad",
            lambda: _traced_rule(
                f"{name}_grad",
                outs,
                lambda cts: _call_grad_fn(grad_fn, y, cts, params, where),
                params,
            ),
        )
        if tangent_fn is not None:
            traced(
                "tangent",
                lambda: _traced_rule(
                    f"{name}_jvp",
                    params,
                    lambda ts: tangent_fn(
                        params,
                        [
                            t if p.dtype.is_floating else None
                            for t, p in zip(ts, params, strict=True)
                        ],
                    ),
                    outs,
                ),
            )
        if failures:
            # the core names the user's line where a derivative is asked
            rules["refused"] = f"{where}: {failures[0]}"
    except BaseException:
        _core.trace_pop([])  # close the frame; the unfinished function is never called
        raise
    finally:
        _core.vmap_resume()
    # emit_custom_call closes the function's frame itself
    outputs = _core.emit_custom_call(inputs, params, outs, **rules)
    return nest.pack_sequence_as(y, outputs)


def _traced_rule(
    name: str,
    takes: list[_core.Tensor],
    rule: Callable[[list[_core.Tensor]], list[Any]],
    gives: list[_core.Tensor],
) -> Any:
    """`rule` traced as a function of values typed like `takes`, in a frame above the current
    one, returning one value typed like each of `gives` (zeros for None)."""
    values = _core.trace_push(name, [(t.dtype, tuple(t.shape)) for t in takes])
    try:
        with _paused():
            out = rule(values)
            if len(out) != len(gives):
                raise errors.GradientTypeError(
                    f"the rule gives {len(out)} values for {len(gives)} outputs"
                )
            out = [_core.zeros_like(g) if o is None else o for o, g in zip(out, gives, strict=True)]
            for k, (o, g) in enumerate(zip(out, gives, strict=True)):
                o = _core.tensor(o, dtype=g.dtype) if not isinstance(o, _core.Tensor) else o
                if (o.dtype, tuple(o.shape)) != (g.dtype, tuple(g.shape)):
                    raise errors.GradientTypeError(
                        f"the rule's value {k} is {o.dtype.name}{list(o.shape)} where "
                        f"{g.dtype.name}{list(g.shape)} is expected"
                    )
    except BaseException:
        _core.trace_pop([])
        raise
    return _core.trace_pop(out)


def _described(e: Exception, where: str) -> str:
    """A rule's failure for a message that names `where` and the user's line itself."""
    if not isinstance(e, errors.GradloopError):
        return f"{type(e).__name__}: {e}"
    text = re.sub(r" \(at [^()]*\)$", "", str(e))
    return text.removeprefix(f"{where}: ")


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
    return _custom_op(fn, f"custom_gradient({getattr(fn, '__name__', 'fn')})")


def recompute_grad(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator trading compute for memory: the forward pass keeps no intermediates.

    Eagerly under a tape, `fn` is traced into a graph whose inputs are its positional tensor
    arguments and everything it closes over (tensors, scalars included, and Variables it
    reads), run on the frame executor and recorded as one op; its gradient is the graph's
    vector-Jacobian product, which runs `fn` again from those inputs (`_staged`), so gradients
    of any order reach closed-over values too. A function that cannot be traced (Python
    control flow on tensor values) runs as written, recorded op by op: the same gradients,
    without the saving. Inside `@gl.function` and `gl.jit`, under forward mode alone, and
    eagerly inside `gl.vmap`, `fn` runs as written and is differentiated as written.
    Positional arguments are the tensor inputs (as in `custom_gradient`); keyword arguments
    pass through undifferentiated.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _core.mode() != "recording" or not _core.any_tape_active() or _core.vmap_levels():
            # inside vmap, eagerly: the staged graph runs on whole tensors, not lanes
            return fn(*args, **kwargs)
        where = f"recompute_grad({getattr(fn, '__name__', 'fn')})"
        inputs = [_validate.input_tensor(a, i, where) for i, a in enumerate(args)]
        from . import _staged

        structure: list[Any] = []

        def build(symbols: list[Any]) -> list[Any]:
            out = fn(*symbols, **kwargs)
            structure.append(out)
            return _fresh_outputs(out, where)

        specs = [(t.dtype, tuple(t.shape)) for t in inputs]
        try:
            staged, captured = _staged.trace("recompute_grad", specs, build)
        except errors.ControlFlowError:
            return fn(*args, **kwargs)  # Python control flow on values: run as written
        outputs = _staged.call(staged, inputs + list(captured))
        return nest.pack_sequence_as(structure[0], outputs)

    return wrapper
