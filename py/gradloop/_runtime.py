"""IREE runtime plumbing for compiled mode: one device per driver, functions of compiled modules
loaded on it and called on numpy arrays, results copied back to numpy.

Inputs are passed as numpy arrays: the runtime copies them into device buffers. Results whose
memory the host can map (the CPU drivers) are read through the mapping. Others (Vulkan, CUDA)
are copied through a staging buffer the runtime allocates: `DeviceArray.to_host()` instead
imports the numpy array's own memory as the copy target, which Vulkan refuses unless the
pointer is page aligned ("minImportedHostPointerAlignment 4096").
"""

from __future__ import annotations

import os
import re
import weakref
from typing import Any

import numpy as np

__all__ = ["Function", "device"]

# One runtime configuration (device and VM instance) per driver: creating a device is slow.
_configs: dict[str, Any] = {}

#: Drivers whose device is released once no loaded function uses it, because an idle one costs
#: the host: on Mesa's software Vulkan (lavapipe 22.3, Debian 12) IREE's device keeps two
#: threads polling its semaphores at full speed for as long as it lives, two cores taken from
#: everything else. Creating one again is cheap by comparison (`_workarounds`:
#: `vulkan_idle_device_spins`).
RELEASED_WHEN_UNUSED = frozenset({"vulkan"})

# Loaded functions per configuration (by id), for `RELEASED_WHEN_UNUSED`.
_users: dict[int, int] = {}

#: Runtime flags read when a driver is created. CUDA runs command buffers as CUDA graphs rather
#: than on streams: on an H100 that made W6's loop gradient (several dispatches per trip)
#: several times faster, cost W5's one-dispatch trips a little and left W4 unchanged
#: (docs/notes.md).
DRIVER_FLAGS = {"cuda": ("--cuda_use_streams=false",)}


def _config(driver: str) -> Any:
    from iree import runtime

    found = _configs.get(driver)
    if found is None:
        if DRIVER_FLAGS.get(driver):
            runtime.flags.parse_flags(*DRIVER_FLAGS[driver])
        # A device of our own, not iree.runtime's shared one: a lost device must be replaceable.
        device = runtime.get_device(driver, cache=False)
        found = _configs[driver] = runtime.Config(device=device)
    return found


def device(driver: str) -> Any:
    """The device compiled functions run on for `driver` (created on first use). One of
    `RELEASED_WHEN_UNUSED` that no function uses yet is not kept."""
    config = _config(driver)
    if driver in RELEASED_WHEN_UNUSED and not _users.get(id(config)):
        del _configs[driver]
    return config.device


def _use(config: Any) -> None:
    _users[id(config)] = _users.get(id(config), 0) + 1


def _unuse(driver: str, config: Any) -> None:
    left = _users.pop(id(config), 1) - 1
    if left:
        _users[id(config)] = left
    elif driver in RELEASED_WHEN_UNUSED and _configs.get(driver) is config:
        del _configs[driver]


# `mkstemp`'s name for the placeholder IREE reserves before writing `<name>_mem_.so` beside it.
_PLACEHOLDER = re.compile(r"iree_dylib_[A-Za-z0-9]{6}")


def close_leaked_dylib_placeholders() -> int:
    """Closes and removes the placeholder files IREE leaks when it loads a module's system
    shared library (`--iree-llvmcpu-link-embedded=false`): its loader reserves a name with
    `mkstemp`, writes the library beside it, and never closes the reserved file nor removes it.
    One descriptor per load otherwise: a process at the usual limit of 1,024 open files fails
    to load its thousandth module, and the temporary directory fills with empty files
    (`_workarounds`: `dylib_placeholder_leak`). IREE never uses the descriptor again, so
    closing it while another thread loads is harmless. Returns how many were closed."""
    if os.environ.get("IREE_PRESERVE_DYLIB_TEMP_FILES"):
        return 0  # kept for tools that read them, as IREE's own flag asks
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return 0  # not Linux: nothing to find them by
    closed = 0
    for name in descriptors:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed since the listing (the listing's own descriptor among them)
        if not _PLACEHOLDER.fullmatch(os.path.basename(target)):
            continue
        try:
            os.close(int(name))
            closed += 1
            os.unlink(target)
        except OSError:
            pass  # closed or removed by another thread meanwhile
    return closed


_ATTEMPTS = 3


class Function:
    """Function `name` of the module `vmfb` on `driver`'s device, called on numpy arrays; the
    results come back as numpy arrays of their own.

    Mesa's software Vulkan now and then reports `VK_ERROR_DEVICE_LOST` while running programs
    with loop gradients under IREE 3.13 (about 1 to 3 calls in 100; the results computed before
    are right, and forward loops of thousands of trips never did). A lost device is unusable,
    so it is replaced and the call run again, up to `_ATTEMPTS` times in all: a call changes
    nothing on the device (inputs are uploaded and results downloaded each time), so running it
    again is safe.
    """

    def __init__(self, vmfb: bytes, driver: str, name: str) -> None:
        self._vmfb, self._driver, self._name = vmfb, driver, name
        self._load()

    def _load(self) -> None:
        from iree import runtime

        config = _config(self._driver)
        _use(config)
        # Counted until this function is collected or loads again (a lost device).
        self._release = weakref.finalize(self, _unuse, self._driver, config)
        self._config = config
        module = runtime.VmModule.copy_buffer(config.vm_instance, self._vmfb)
        try:
            self._entry = runtime.load_vm_module(module, config)[self._name]
        finally:
            close_leaked_dylib_placeholders()
        # Per result, where the host maps it: the element type it is stored in and the dtype
        # it reads as (they differ for bools, stored in bytes); set by the first call.
        self._mapped: list[tuple[Any, Any] | None] | None = None

    def _run(self, inputs: tuple[np.ndarray, ...], copy: bool = True) -> list[np.ndarray]:
        out = self._entry(*inputs)
        results = out if isinstance(out, (tuple, list)) else [out]
        if self._mapped is None:
            self._mapped = [_host_dtypes(r) for r in results]
        mapped = self._mapped
        if len(mapped) == len(results) and all(d is not None for d in mapped):
            # Results the host maps (the CPU drivers), read without `DeviceArray.to_host`'s
            # checks, which cost several times this whole read.
            pairs = zip(results, mapped, strict=True)
            return [_read_mapped(r, d, copy) for r, d in pairs]  # type: ignore[arg-type]
        return [to_numpy(r, copy) for r in results]

    def __call__(self, *inputs: np.ndarray, copy: bool = True) -> list[np.ndarray]:
        """The results as numpy arrays of their own; with `copy=False`, those the host can map
        are views of the result buffers instead (which they keep alive: a caller that copies
        them anyway, into tensors, saves a copy)."""
        for _ in range(_ATTEMPTS - 1):
            try:
                return self._run(inputs, copy)
            except RuntimeError as e:
                if "DEVICE_LOST" not in str(e):
                    raise
            if _configs.get(self._driver) is self._config:
                del _configs[self._driver]  # the next load creates a new device
            self._release()
            self._load()
        return self._run(inputs, copy)


def to_numpy(result: Any, copy: bool = True) -> np.ndarray:
    """A result of a compiled function as a numpy array of its own (a copy), or with
    `copy=False` a view of its buffer where the host can map it (the view holds the mapping,
    which holds the buffer)."""
    from iree import runtime

    if not isinstance(result, runtime.DeviceArray):
        return np.array(result, copy=copy or None)
    if result.is_host_accessible or _mappable(result):
        return np.array(result.to_host(), copy=copy or None)
    return _staged_copy(result)


def _host_dtypes(result: Any) -> tuple[Any, Any] | None:
    """For a result the host maps, the numpy dtype of its stored elements and the dtype it
    reads as; None for any other result."""
    from iree import runtime

    if not isinstance(result, runtime.DeviceArray) or not _mappable(result):
        return None
    view = result._buffer_view
    return runtime.HalElementType.map_to_dtype(view.element_type), result.dtype


def _read_mapped(result: Any, dtypes: tuple[Any, Any], copy: bool) -> np.ndarray:
    """A result the host maps, as numpy; a copy, or with `copy=False` a view of the mapping
    (the array's base holds the mapping, which holds the buffer)."""
    stored, wanted = dtypes
    view = result._buffer_view
    host = view.map().asarray(view.shape, stored)
    if stored != wanted:
        return host.astype(wanted)
    return np.array(host, copy=copy or None)


def _mappable(array: Any) -> bool:
    from iree import runtime

    buffer = array._buffer_view.get_buffer()
    visible = int(runtime.MemoryType.HOST_VISIBLE)
    scoped = int(runtime.BufferUsage.MAPPING_SCOPED)
    return buffer.memory_type() & visible == visible and buffer.allowed_usage() & scoped == scoped


def _staged_copy(array: Any) -> np.ndarray:
    """Device -> staging buffer (host memory the device writes) -> numpy."""
    from iree import runtime

    view, device = array._buffer_view, array._device
    source = view.get_buffer()
    if source.byte_length() == 0:
        return np.zeros(view.shape, array.dtype)
    staging = device.allocator.allocate_buffer(
        memory_type=int(runtime.MemoryType.HOST_LOCAL | runtime.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(runtime.BufferUsage.TRANSFER_TARGET | runtime.BufferUsage.MAPPING_SCOPED),
        allocation_size=source.byte_length(),
    )
    semaphore = device.create_semaphore(0)
    device.queue_copy(
        source,
        staging,
        wait_semaphores=runtime.HalFence.create_at(semaphore, 0),
        signal_semaphores=runtime.HalFence.create_at(semaphore, 1),
    )
    runtime.HalFence.create_at(semaphore, 1).wait()
    raw = runtime.HalElementType.map_to_dtype(view.element_type)
    out = np.array(staging.map().asarray(view.shape, raw))
    return out.astype(array.dtype, copy=False)
