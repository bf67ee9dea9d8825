"""What reverse and forward mode both see while they record, below both (`autodiff`,
`forward`, `variables` and the custom ops import it, and it imports none of them): the Python
tapes that record now, a pause of every tape, the Variable reads the tapes must see, and the
forward-mode accumulators that perturb a value."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import _core

if TYPE_CHECKING:
    from .variables import Variable

#: The `GradientTape` owning each live `_core.Tape`, by its key: which tapes record is the core's
#: one tape stack (`_core.recording_tape_keys`); this only maps its entries back to owners.
owners: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def recording_tapes() -> list[Any]:
    """Python tapes that record now, innermost last."""
    return [t for k in _core.recording_tape_keys() if (t := owners.get(k)) is not None]


@contextlib.contextmanager
def paused() -> Iterator[None]:
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
    for tape in recording_tapes():
        tape._note_read(variable, value)


def note_variable_use(variable: Variable, resource: _core.Tensor) -> None:
    """Called by `Variable.read()` while tracing, before the read: the recording tapes watch
    the variable's resource, whose gradient sums those of every read recorded after it,
    including reads inside `cond` branches and `while_loop` bodies."""
    if not variable.dtype.is_floating:
        return
    if variable.trainable and _core.any_tape_active():
        _core.watch_on_active_tapes(resource)
    for tape in recording_tapes():
        tape._note_read(variable, resource)


def perturbed(inputs: list[Any]) -> list[Any]:
    """The active forward-mode accumulators holding a tangent of one of `inputs` (tensors;
    other values are skipped), innermost last."""
    tensors = [x for x in inputs if isinstance(x, _core.Tensor)]
    return [
        a for a in _core.active_accumulators() if any(a.tangent(x) is not None for x in tensors)
    ]
