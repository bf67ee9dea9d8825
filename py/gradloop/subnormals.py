"""Subnormal floats flushed to zero, on request."""

from __future__ import annotations

from . import _core, _validate, errors


def set_flush_subnormals(enabled: bool) -> bool:
    """Flushes subnormal floats to zero (`enabled=True`), or keeps them (`False`, the default).

    gradloop computes with IEEE subnormals, as numpy does. XLA, and so JAX, runs its CPU code
    with them flushed: a subnormal result becomes zero and a subnormal input reads as zero.
    Intel cores take a slow microcode path for each vector instruction that meets a subnormal,
    and a loop gradient whose cotangent shrinks through hundreds of steps meets many: flushing
    gives JAX's numerics and, there, its speed (an RNN's loop gradient about 1.6 times
    faster on such a core). The values that change are those under 1.2e-38 (float32) or
    2.2e-308 (float64) in magnitude.

    The mode belongs to each CPU thread: it is set on the calling thread and on gradloop's
    worker threads. Like `torch.set_flush_denormal`, it also applies to whatever else runs on
    the calling thread (numpy included) until it is cleared. Modules compiled by `gl.jit`
    flush subnormals whatever this says: IREE's and XLA's CPU code both run that way.

    Args:
        enabled: True to flush subnormals to zero, False to keep them.

    Returns:
        True when the mode was set; False where the CPU has no such mode (nothing changes).

    Raises:
        gradloop.errors.InvalidArgumentTypeError: `enabled` is not a bool.
    """
    if not isinstance(enabled, bool):
        message = f"set_flush_subnormals: enabled must be True or False, not {enabled!r}"
        raise errors.InvalidArgumentTypeError(_validate.at_user(message))
    return _core.set_flush_subnormals(enabled)
