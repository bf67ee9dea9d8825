"""IREE's compiler through its C embedding API (`iree.compiler.api`), in a worker process that
this process starts once and keeps.

`iree.compiler.compile_str` starts an `iree-compile` process per module; here one worker process
loads the library once (started in the background by `warm_up`) and each later module costs only
its pass pipeline and two pipe transfers (`docs/notes.md` has the figures). The worker is what
bounds a compile: IREE cannot be interrupted in process, and some modules never finish (a 45-line
loop sat in IREE's passes for more than ten minutes). A compile that runs past its `timeout` has
its worker killed and raises `CompileTimeout`; the next compile starts a fresh worker. The caller
waits with the GIL released, so Python keeps running while a module compiles in the background
(`gl.jit(tiered=True)`). Diagnostics are collected through the API's callback and raised as a
`CompilerFailure` carrying IREE's messages (`error:` lines first), as `iree-compile` prints them.

`iree.compiler.api`'s Python classes declare part of the C API; the calls that choose the
phases to compile from and to and that deliver diagnostics to a callback exist in the same
library (`embedding_api.h`) and are declared here.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any

__all__ = ["CompileTimeout", "CompilerFailure", "compile_to_vm", "vm_to_bytecode", "warm_up"]

#: Seconds one compile may run before its worker is killed (`GRADLOOP_COMPILE_TIMEOUT_S`).
DEFAULT_TIMEOUT_S = 300.0

#: `iree_compiler_diagnostic_severity_t`.
_SEVERITIES = {0: "note", 1: "warning", 2: "error", 3: "remark"}

_DIAGNOSTIC = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p
)

_api: Any = None


class CompilerFailure(Exception):
    """IREE refused a module; the message holds its diagnostics, one per line."""


class CompileTimeout(CompilerFailure):
    """IREE did not finish a module within the time allowed; its worker was killed."""


def timeout_s() -> float:
    """The time one compile may take: `GRADLOOP_COMPILE_TIMEOUT_S`, else `DEFAULT_TIMEOUT_S`."""
    try:
        value = float(os.environ.get("GRADLOOP_COMPILE_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def _load() -> Any:
    """`iree.compiler.api`'s ctypes module, the library loaded and the missing calls declared
    (importing it loads and initialises the compiler, which takes a while)."""
    global _api
    if _api is None:
        from iree.compiler.api import ctypes_dl

        lib = _library(ctypes_dl)
        lib.ireeCompilerInvocationSetCompileToPhase.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.ireeCompilerInvocationSetCompileToPhase.restype = None
        lib.ireeCompilerInvocationSetCompileFromPhase.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.ireeCompilerInvocationSetCompileFromPhase.restype = None
        lib.ireeCompilerInvocationEnableCallbackDiagnostics.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            _DIAGNOSTIC,
            ctypes.c_void_p,
        ]
        lib.ireeCompilerInvocationEnableCallbackDiagnostics.restype = None
        _api = ctypes_dl
    return _api


#: The two private names of `iree.compiler.api` this module relies on (the package declares
#: no public way to reach the library or an invocation's handle); `tests/test_iree_canaries.py`
#: checks that both still exist, so an IREE that renames them fails there, by name.
PRIVATE_NAMES = ("ctypes_dl._dylib", "Invocation._inv_p")


def _library(ctypes_dl: Any) -> Any:
    """The compiler library `iree.compiler.api` loaded (`PRIVATE_NAMES`)."""
    return ctypes_dl._dylib


def _handle(invocation: Any) -> Any:
    """An invocation's C handle (`PRIVATE_NAMES`)."""
    return invocation._inv_p


def _compile_here(
    text: bytes, flags: list[str], to_phase: str, from_phase: str, bytecode: bool
) -> bytes:
    api = _load()
    lib = _library(api)
    messages: list[tuple[int, str]] = []

    def collect(severity: int, message: int, size: int, _user: int) -> None:
        messages.append((severity, ctypes.string_at(message, size).decode(errors="replace")))

    callback = _DIAGNOSTIC(collect)  # must outlive the invocation

    def failure(stage: str) -> CompilerFailure:
        lines = [f"{_SEVERITIES.get(s, 'note')}: {m}" for s, m in messages]
        lines.sort(key=lambda line: not line.startswith("error:"))
        return CompilerFailure("\n".join(lines) or f"error: {stage} failed")

    session = api.Session()
    try:
        try:
            session.set_flags(*flags)
        except ValueError as e:
            raise CompilerFailure(f"error: {e}") from None
        invocation = session.invocation()
        handle = _handle(invocation)
        lib.ireeCompilerInvocationEnableCallbackDiagnostics(handle, 0, callback, None)
        if to_phase:
            lib.ireeCompilerInvocationSetCompileToPhase(handle, to_phase.encode())
        if from_phase:
            lib.ireeCompilerInvocationSetCompileFromPhase(handle, from_phase.encode())
        source = api.Source.wrap_buffer(session, text + b"\0")
        if not invocation.parse_source(source):
            raise failure("parsing")
        if not invocation.execute():
            raise failure("compiling")
        output = api.Output.open_membuffer()
        try:
            (invocation.output_vm_bytecode if bytecode else invocation.output_ir)(output)
            return bytes(output.map_memory())
        except ValueError as e:
            raise CompilerFailure(f"error: {e}") from None
        finally:
            output.close()
    finally:
        session.close()


_HEADER = struct.Struct("<Q")


class _Worker:
    """The compiler's process: requests and answers are pickled tuples behind a length, over its
    stdin and stdout."""

    def __init__(self) -> None:
        code = f"import runpy; runpy.run_path({__file__!r}, run_name={_WORKER_NAME!r})"
        self.process = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
        self.owner = os.getpid()  # a forked child starts its own: the pipes are the parent's

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a write the worker never read
                    pipe.close()

    def request(self, message: tuple[Any, ...], timeout: float) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        data = pickle.dumps(message)
        try:
            self.process.stdin.write(_HEADER.pack(len(data)) + data)
            self.process.stdin.flush()
        except OSError:
            raise self._died() from None
        deadline = time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        (size,) = _HEADER.unpack(self._read(fd, _HEADER.size, deadline, timeout))
        return pickle.loads(self._read(fd, size, deadline, timeout))

    def _read(self, fd: int, n: int, deadline: float, timeout: float) -> bytes:
        chunks, left = [], n
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                self.kill()
                raise CompileTimeout(
                    f"error: IREE did not finish compiling within {timeout:g} s (the compile "
                    "was stopped; GRADLOOP_COMPILE_TIMEOUT_S sets the limit)"
                )
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise self._died()
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _died(self) -> CompilerFailure:
        code = self.process.wait()
        self.kill()
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        return CompilerFailure(f"error: IREE's compiler process ended ({how}) while compiling")


_WORKER_NAME = "__gradloop_compile_worker__"

# One compile at a time: each uses every core in its LLVM stage.
_lock = threading.Lock()
_worker: _Worker | None = None


def _running_worker() -> _Worker:
    global _worker
    if _worker is None or _worker.owner != os.getpid() or not _worker.alive():
        if _worker is None:
            atexit.register(_stop_worker)
        _worker = _Worker()
    return _worker


def _stop_worker() -> None:
    """At exit: the worker ends when its pipe closes (killed if it does not, mid-compile)."""
    if _worker is None or _worker.owner != os.getpid():
        return
    process = _worker.process
    try:
        if process.stdin is not None:
            process.stdin.close()
        process.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        pass
    _worker.kill()


def warm_up() -> None:
    """Starts the compiler's worker process (once per process; it loads IREE while the caller
    goes on), so that the first compile does not wait for it. It compiles nothing: a compile
    beside the caller's first one would take a core from it (measured: `docs/notes.md`)."""
    with _lock:
        _running_worker()


def _compile(
    text: bytes, flags: list[str], to_phase: str, from_phase: str, bytecode: bool
) -> bytes:
    with _lock:
        worker = _running_worker()
        try:
            status, value = worker.request(
                (text, flags, to_phase, from_phase, bytecode), timeout_s()
            )
        except BaseException:
            # Interrupted mid-request (Ctrl-C, a test's time limit): the worker may still be
            # writing its answer, and a later request written past it would wait on each other
            # for ever. The next compile starts a fresh worker.
            worker.kill()
            raise
    if status == "ok":
        return value
    raise CompilerFailure(value)


def _die_with_parent() -> None:
    """A compile may run for minutes without reading its pipe: the kernel kills the worker
    when the process that started it dies (Linux's parent-death signal), so that no orphan
    keeps a core busy."""
    if not sys.platform.startswith("linux"):
        return
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before the signal was asked for
        os._exit(0)


def _serve() -> None:
    """The worker's loop: one compile per request, until its parent closes the pipe."""
    _die_with_parent()
    _load()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while header := stdin.read(_HEADER.size):
        (size,) = _HEADER.unpack(header)
        args = pickle.loads(stdin.read(size))
        try:
            answer: tuple[str, Any] = ("ok", _compile_here(*args))
        except CompilerFailure as e:
            answer = ("error", str(e))
        except Exception as e:  # any failure is the compile's, reported
            answer = ("error", f"error: {type(e).__name__}: {e}")
        data = pickle.dumps(answer)
        stdout.write(_HEADER.pack(len(data)) + data)
        stdout.flush()


def compile_to_vm(mlir: str, flags: list[str]) -> str:
    """`mlir` compiled with `flags` to IREE's VM dialect, as text."""
    return _compile(mlir.encode(), flags, "vm", "", bytecode=False).decode()


def vm_to_bytecode(vm: str) -> bytes:
    """A VM-dialect module (`compile_to_vm`'s text) as a `.vmfb`."""
    return _compile(vm.encode(), [], "", "vm", bytecode=True)


if __name__ == _WORKER_NAME:
    _serve()
