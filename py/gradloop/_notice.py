"""One line on stderr when a compile keeps a call waiting (`compile_notice`): a first call that
takes minutes should not look hung."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

#: Seconds a compile runs before `compile_notice` says so.
NOTICE_AFTER_S = 2.0


def _read_by_someone(stream: object) -> bool:
    """A terminal, or a notebook's stderr (no terminal, but a person reads it); not a log, a
    pipe or CI's output."""
    isatty = getattr(stream, "isatty", None)  # stderr may be None or a bare writer
    return bool(callable(isatty) and isatty()) or "ipykernel" in sys.modules


@contextlib.contextmanager
def compile_notice(name: str, target: str, compiler: str) -> Iterator[None]:
    """Says once, after `NOTICE_AFTER_S`, that `compiler` is still compiling `name` for
    `target`; nothing where no one reads stderr, or with `GRADLOOP_COMPILE_NOTICE=0`."""
    stream = sys.stderr
    if os.environ.get("GRADLOOP_COMPILE_NOTICE", "1") == "0" or not _read_by_someone(stream):
        yield
        return
    line = (
        f"gradloop: compiling {name} for {target} with {compiler} "
        "(GRADLOOP_COMPILE_NOTICE=0 silences this)"
    )
    timer = threading.Timer(NOTICE_AFTER_S, lambda: print(line, file=stream, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
