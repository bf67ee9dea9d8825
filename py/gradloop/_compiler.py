"""IREE's compiler run in this process through its C embedding API (`iree.compiler.api`).

`iree.compiler.compile_str` starts an `iree-compile` process per module; here the library is
loaded once per process (about 80 ms, on a background thread from `warm_up`) and each later
module costs only its pass pipeline (W7's: 180 ms against 300 through a process), and the compile
runs with the GIL released, so Python keeps running while a module compiles in the background
(`gl.jit(tiered=True)`). Diagnostics are collected through the API's callback and raised as a
`CompilerFailure` carrying IREE's messages (`error:` lines first), as `iree-compile` prints them.

`iree.compiler.api`'s Python classes declare part of the C API; the calls that choose the
phases to compile from and to and that deliver diagnostics to a callback exist in the same
library (`embedding_api.h`) and are declared here.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

__all__ = ["CompilerFailure", "compile_to_vm", "vm_to_bytecode", "warm_up"]

#: `iree_compiler_diagnostic_severity_t`.
_SEVERITIES = {0: "note", 1: "warning", 2: "error", 3: "remark"}

_DIAGNOSTIC = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p
)

# One compile at a time: each uses every core in its LLVM stage, and a session is not thread safe.
_lock = threading.Lock()
_api: Any = None


class CompilerFailure(Exception):
    """IREE refused a module; the message holds its diagnostics, one per line."""


def _load() -> Any:
    """`iree.compiler.api`'s ctypes module, the library loaded and the missing calls declared
    (importing it loads and initialises the compiler: about 80 ms)."""
    global _api
    if _api is None:
        from iree.compiler.api import ctypes_dl

        lib = ctypes_dl._dylib
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


_warmed = False


def warm_up() -> None:
    """Loads the compiler on a background thread (once per process), so that the first compile
    does not wait for it. It compiles nothing: a compile beside the caller's first one would
    take a core from it (measured: a warm-up compile made an immediate first call 40 ms
    slower, and one 0.5 s later 50 ms faster)."""
    global _warmed
    if _warmed or _api is not None:
        return
    _warmed = True
    # Not a daemon: interpreter shutdown waits for it rather than cutting it off inside IREE.
    threading.Thread(target=_load, name="gradloop-compiler-load").start()


def _compile(
    text: bytes, flags: list[str], to_phase: str, from_phase: str, bytecode: bool
) -> bytes:
    api = _load()
    lib = api._dylib
    messages: list[tuple[int, str]] = []

    def collect(severity: int, message: int, size: int, _user: int) -> None:
        messages.append((severity, ctypes.string_at(message, size).decode(errors="replace")))

    callback = _DIAGNOSTIC(collect)  # must outlive the invocation

    def failure(stage: str) -> CompilerFailure:
        lines = [f"{_SEVERITIES.get(s, 'note')}: {m}" for s, m in messages]
        lines.sort(key=lambda line: not line.startswith("error:"))
        return CompilerFailure("\n".join(lines) or f"error: {stage} failed")

    with _lock:
        session = api.Session()
        try:
            try:
                session.set_flags(*flags)
            except ValueError as e:
                raise CompilerFailure(f"error: {e}") from None
            invocation = session.invocation()
            lib.ireeCompilerInvocationEnableCallbackDiagnostics(
                invocation._inv_p, 0, callback, None
            )
            if to_phase:
                lib.ireeCompilerInvocationSetCompileToPhase(invocation._inv_p, to_phase.encode())
            if from_phase:
                lib.ireeCompilerInvocationSetCompileFromPhase(
                    invocation._inv_p, from_phase.encode()
                )
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


def compile_to_vm(mlir: str, flags: list[str]) -> str:
    """`mlir` compiled with `flags` to IREE's VM dialect, as text."""
    return _compile(mlir.encode(), flags, "vm", "", bytecode=False).decode()


def vm_to_bytecode(vm: str) -> bytes:
    """A VM-dialect module (`compile_to_vm`'s text) as a `.vmfb`."""
    return _compile(vm.encode(), [], "", "vm", bytecode=True)
