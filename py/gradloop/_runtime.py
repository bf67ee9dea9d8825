"""IREE runtime plumbing for compiled mode: one device per driver, modules loaded on it, and
results copied back to numpy.

Inputs are passed as numpy arrays: the runtime copies them into device buffers. Results whose
memory the host can map (the CPU drivers) are read through the mapping. Others (Vulkan, CUDA)
are copied through a staging buffer the runtime allocates: `DeviceArray.to_host()` instead
imports the numpy array's own memory as the copy target, which Vulkan refuses unless the
pointer is page aligned ("minImportedHostPointerAlignment 4096").
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["load", "to_numpy"]

# One runtime configuration (device and VM instance) per driver: creating a device is slow.
_configs: dict[str, Any] = {}


def _config(driver: str) -> Any:
    from iree import runtime

    found = _configs.get(driver)
    if found is None:
        found = _configs[driver] = runtime.Config(driver)
    return found


def load(vmfb: bytes, driver: str, function: str) -> Any:
    """The function `function` of the module `vmfb`, loaded on `driver`'s device."""
    from iree import runtime

    config = _config(driver)
    module = runtime.VmModule.copy_buffer(config.vm_instance, vmfb)
    return runtime.load_vm_module(module, config)[function]


def to_numpy(result: Any) -> np.ndarray:
    """A result of a compiled function as a numpy array of its own (a copy)."""
    from iree import runtime

    if not isinstance(result, runtime.DeviceArray):
        return np.array(result)
    if result.is_host_accessible or _mappable(result):
        return np.array(result.to_host())
    return _staged_copy(result)


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
