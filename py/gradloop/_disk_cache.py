"""The compile cache's directory, shared by both backends: IREE's `.vmfb`s (`_iree_build`) and
XLA's serialized executables (`_xla`). `GRADLOOP_CACHE_DIR`, else `$XDG_CACHE_HOME/gradloop`
(`~/.cache/gradloop`)."""

from __future__ import annotations

import os
import pathlib

__all__ = ["directory", "write_atomic"]


def directory() -> pathlib.Path:
    """Where compiled modules are kept (read at each use: tests point it elsewhere)."""
    root = os.environ.get("GRADLOOP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gradloop"
    )
    return pathlib.Path(root)


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    """Writes `data` to `path` whole or not at all; a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)  # atomic: concurrent processes never read half a file
    except OSError:
        pass  # a read-only cache directory only costs a recompile
