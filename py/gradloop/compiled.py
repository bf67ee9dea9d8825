"""Compiled mode: traced graphs emitted as MLIR (StableHLO inside `scf`) and compiled by IREE.

`to_mlir(fn, *args)` is the text; `jit(fn, target=...)` compiles once per input signature (the
signature rules of `gl.function`), caches the `.vmfb` in memory and on disk (keyed by the MLIR,
the target, the flags and the compiler version) and runs it with `iree-base-runtime`;
`export(fn, *args, path=...)` writes a self-contained `.vmfb` (captured tensors embedded as
constants) and its `.mlir` beside it, which plain `iree-run-module` runs.

Variables are values in a compiled module: it takes each Variable the function uses as an
input (its value on entry, after the function's own inputs) and returns the final value of
each Variable the function may assign after its own results. `jit` passes the current values
and stores the returned ones, so every call sees the Variables as they are then.

Tensor stacks (the intermediates a loop gradient saves) are lists of buffer views on `llvm-cpu`
(O(1) per push) where IREE compiles that form, and growable buffers otherwise; each is
compiled as `scf`, or as a CFG (`_to_cf`) where IREE refuses the `scf` (see `_forms`).
`to_mlir` gives the buffer form in `scf`; `Jit.mlir` gives the form that runs. A failed
compile is cached too. IREE compiles in two steps, to its VM IR and from it, with the repairs of
`_vm_repair.py` in between.
The first call of each signature is also run on the graph interpreter and the results
compared: a form whose numbers differ gives way to the next (IREE miscompiles rare modules).
Every failure is a `gl.errors` exception naming the function and the user's line: a
`CompileError` with IREE's first diagnostic, an `ExecutionError` when the module fails as it runs.

float64 programs keep float64: IREE would demote them to float32 by default, so the flags that
keep f64 (and link libm for f64 transcendentals on `llvm-cpu`) are added when the module uses
f64. `vulkan-spirv` has no f64 on its default target: such modules are refused with a clear error.
Vulkan modules use 8-bit storage buffers (`VK_KHR_8bit_storage`, which desktop drivers and
Mesa's software Vulkan have): without them IREE emulates bool tensors in 32-bit words and reads
the last partial word of a bool input as false.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.metadata
import os
import pathlib
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from . import (
    _compiler,
    _core,
    _notice,
    _runtime,
    _stablehlo,
    _validate,
    _vm_repair,
    _workarounds,
    _xla,
    errors,
)
from .function import Function

__all__ = ["export", "jit", "to_mlir"]

#: Compiler target -> the IREE runtime driver `jit` runs it on by default (`driver` chooses per
#: module on llvm-cpu).
TARGETS = {"llvm-cpu": "local-sync", "vulkan-spirv": "vulkan", "cuda": "cuda"}

#: Work of one op (`OpDef::work`: elements, or multiply-adds for products) from which a CPU
#: module runs on `local-task`'s worker pool: gemm itself goes parallel there.
DENSE_WORK = 1 << 22


#: IREE flags for CPU modules with an op of `DENSE_WORK` or more: data tiling packs the
#: operands of matrix products into the layout the kernels read (W4, the MLP training step,
#: gains about a quarter: docs/notes.md). Small modules gain nothing from it and compile
#: longer.
DENSE_FLAGS = ("--iree-dispatch-creation-data-tiling=true",)


def dense_flags(target: str, facts: dict[str, Any]) -> tuple[str, ...]:
    """The flags `facts` (the emitter's) ask for on `target`: `DENSE_FLAGS` for CPU modules of
    dense work, none otherwise."""
    dense = target == "llvm-cpu" and facts.get("heaviest_op", 0) >= DENSE_WORK
    return DENSE_FLAGS if dense else ()


def driver(target: str, facts: dict[str, Any]) -> str:
    """The runtime driver for a module of `target` with the emitter's `facts`. On llvm-cpu:
    `local-sync` (dispatches on the calling thread) by default: a loop's every trip steps
    through IREE's VM and synchronises with the host (`local-task` hands each step to its pool,
    several times slower per trip: benches/driver_overhead.py), and a small loop-free call
    pays the hand-off once (`x + 1` on float32[16]: 67 against 126 µs a call); `local-task`
    (dispatches spread over the cores) for modules with ops of `DENSE_WORK` or more, whose
    dispatches outweigh the hand-offs (the MLP step, `docs/notes.md`). A module holding
    tensor stacks as lists of buffer views (`facts["list_stacks"]`) runs on `local-sync`
    always: IREE 3.13 lets a pushed view into its list before an asynchronous device has
    allocated its buffer, and a later pop fails ("transient buffer has not been committed",
    docs/compiled-mode.md)."""
    lists = facts.get("list_stacks", False)
    if target == "llvm-cpu" and facts["heaviest_op"] >= DENSE_WORK and not lists:
        return "local-task"
    return TARGETS[target]


# Bool tensors live in bytes: see the module doc.
_VULKAN_FEATURES = (
    "spirv:v1.3,cap:Shader,cap:Int8,cap:StorageBuffer8BitAccess,ext:SPV_KHR_8bit_storage"
)


def _function(fn: Callable[..., Any]) -> Function:
    return fn if isinstance(fn, Function) else Function(fn)


#: `to_mlir`'s dialects: StableHLO inside `scf` with IREE's host-side forms (what `jit`
#: compiles), or pure StableHLO (`_stablehlo.py`).
DIALECTS = ("iree", "stablehlo")


def to_mlir(fn: Callable[..., Any], *args: Any, dialect: str = "iree", **kwargs: Any) -> str:
    """The MLIR module of `fn` traced for these arguments: a public `func.func` taking the
    tensor arguments (captured tensors embedded as constants). `dialect="iree"`: StableHLO
    inside `scf`, with the `arith`, `tensor` and `util` ops IREE runs on the host;
    `dialect="stablehlo"`: `func` and `stablehlo` ops alone, static shapes, loop gradients in
    fixed-size state (see `gradloop._stablehlo`), for any StableHLO consumer."""
    if dialect == "stablehlo":
        return _stablehlo.module(_function(fn), *args, **kwargs)
    if dialect != "iree":
        raise errors.InvalidArgumentError(
            _validate.at_user(f"unknown dialect {dialect!r}; expected one of {list(DIALECTS)}")
        )
    return _function(fn).concrete_function(*args, **kwargs).to_mlir(embed_captures=True)


def _flags(
    target: str, uses_f64: bool, portable: bool = False, workaround_flags: tuple[str, ...] = ()
) -> list[str]:
    if target not in TARGETS:
        raise errors.InvalidArgumentError(
            _validate.at_user(f"unknown target {target!r}; expected one of {sorted(TARGETS)}")
        )
    flags = ["--iree-input-type=stablehlo", f"--iree-hal-target-backends={target}"]
    if target == "llvm-cpu":
        # `host` for what runs here; a generic CPU for artifacts meant for other machines.
        flags.append(f"--iree-llvmcpu-target-cpu={'generic' if portable else 'host'}")
        if uses_f64:
            flags.append("--iree-input-demote-f64-to-f32=false")
        if uses_f64 or not portable:
            # A system shared library instead of IREE's embedded ELF: f64 transcendentals link
            # against libm, and linking takes less time per module (what `jit` waits for).
            flags.append("--iree-llvmcpu-link-embedded=false")
    elif uses_f64:
        if target == "vulkan-spirv":
            raise errors.CompileError(
                _validate.at_user(
                    "vulkan-spirv has no float64 on its default target: cast the program to "
                    "float32 (gl.cast) to run it on Vulkan"
                )
            )
        flags.append("--iree-input-demote-f64-to-f32=false")
    if target == "vulkan-spirv":
        flags.append(f"--iree-vulkan-target-features={_VULKAN_FEATURES}")
    if target == "cuda":
        flags.append("--iree-cuda-target=sm_80")
    return flags + list(workaround_flags)


def _compiler_version() -> str:
    return importlib.metadata.version("iree-base-compiler")


def _cache_dir() -> pathlib.Path:
    root = os.environ.get("GRADLOOP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gradloop"
    )
    return pathlib.Path(root)


_memory_cache: dict[str, bytes] = {}

#: Part of the cache key: modules compiled before the VM repairs (`_vm_repair.py`) are compiled
#: again.
_VM_REPAIR = "vm-refs=1,vm-widths=1"


def compile_mlir(
    mlir: str,
    target: str = "llvm-cpu",
    portable: bool = False,
    cf: bool | None = None,
    workaround_flags: tuple[str, ...] = (),
    uses_f64: bool | None = None,
) -> bytes:
    """The `.vmfb` of `mlir` for `target`, from the memory or disk cache when compiled before.
    `portable` compiles for a generic CPU instead of this machine's (`llvm-cpu` only). `cf`
    lowers `scf` to `cf` first (`_to_cf`); None compiles the module as it is and, if IREE
    refuses it, as a CFG. `workaround_flags` go to IREE after the others (see `_Form`).
    `uses_f64` comes from the emitter's facts for modules gradloop wrote; for other text, any
    mention of f64 counts (a false positive only keeps f64 where there is none)."""
    if uses_f64 is None:
        uses_f64 = "f64" in mlir
    if cf is None:
        try:
            return compile_mlir(mlir, target, portable, False, workaround_flags, uses_f64)
        except errors.CompileTimeoutError:
            raise  # the CFG is no faster to compile: never wait twice
        except errors.CompileError:
            return compile_mlir(mlir, target, portable, True, workaround_flags, uses_f64)
    flags = _flags(target, uses_f64, portable, workaround_flags)
    key = hashlib.sha256(
        "\0".join([mlir, target, *flags, _compiler_version(), f"cf={cf}", _VM_REPAIR]).encode()
    ).hexdigest()
    found = _memory_cache.get(key)
    if found is not None:
        return found
    path = _cache_dir() / f"{key}.vmfb"
    failed = path.with_suffix(".error")
    if path.exists():
        vmfb = path.read_bytes()
    elif failed.exists():  # the same compiler failed on the same text before
        raise errors.CompileError(failed.read_text())
    else:
        try:
            vmfb = _compile_with_iree(_to_cf(mlir) if cf else mlir, flags)
        except errors.CompileTimeoutError:
            raise  # not cached: a later compile, with more time, may finish
        except errors.CompileError as e:
            _write_atomic(failed, str(e).encode())
            raise
        _write_atomic(path, vmfb)
    _memory_cache[key] = vmfb
    return vmfb


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)  # atomic: concurrent processes never read half a file
    except OSError:
        pass  # a read-only cache directory only costs a recompile


class _Form(NamedTuple):
    """How a module is written for IREE: tensor stacks as lists of buffer views (O(1) per push)
    or growable buffers (copied on every trip); which branch results go through barriers;
    `scf` as it is or lowered to `cf`; compiled with IREE's defaults, or with workaround flags;
    loops of cheap ops unrolled (several predicated iterations per trip, which divides IREE's
    cost per trip) or not. All but the unrolling are IREE workarounds (`_workarounds`)."""

    list_stacks: bool
    yield_barriers: str
    cf: bool
    workaround_flags: tuple[str, ...] = ()
    unroll_loops: bool = False


def _forms(target: str) -> tuple[_Form, ...]:
    """The forms a module is compiled in, in order; a form IREE refuses, or whose module then
    fails as it runs (before it returns anything), gives way to the next, with a `FormWarning`
    for a run-time failure (see `_workarounds`, the registry: IREE 3.13 fails some
    modules in each form and none that the tests know of in all). A module IREE's stream passes
    refuse as `scf` (nested regions) is refused unrolled or not, so its CFG comes next, before
    the same module not unrolled (W6's gradient: 0.25 s less). On Vulkan lists fail
    ("transient buffer has no staged Vulkan backing"); CUDA is compiled with buffers."""
    lists = _workarounds.choices("list_stacks")
    stacks = lists if target == "llvm-cpu" else (False,)
    return tuple(
        _Form(listed, barriers, cf, flags, unroll)
        for flags in _workarounds.choices("no_multi_use_fusion")
        for listed in stacks
        for barriers in _workarounds.choices("yield_barriers")
        for unroll in (True, False)
        for cf in _workarounds.choices("scf_to_cf")
    )


def _compile_concrete(
    concrete: Any,
    target: str,
    embed_captures: bool,
    portable: bool = False,
    forms: tuple[_Form, ...] | None = None,
    tried: set[_Form] | None = None,
) -> tuple[str, bytes, dict[str, Any], tuple[_Form, ...]]:
    """The MLIR, `.vmfb` and emitter's facts of `concrete` in the first of `forms` (its
    target's by default) that compiles, and the forms after it. The facts say which choices
    change the module (no tensor stacks: lists are buffers; no branch results through barriers;
    no regions: no CFG to lower to); a form that reads the same as one `tried` is skipped."""
    forms = _forms(target) if forms is None else forms
    tried = set() if tried is None else tried
    failure: errors.CompileError | None = None
    for k, form in enumerate(forms):
        if failure is not None and _too_big(failure) and form.unroll_loops:
            continue  # past a budget, only forms without unrolled loops are smaller
        try:
            mlir, facts = concrete.mlir_module(
                embed_captures=embed_captures,
                list_stacks=form.list_stacks,
                yield_barriers=form.yield_barriers,
                unroll_loops=form.unroll_loops,
            )
        except errors.CompileError as e:
            if not form.unroll_loops:
                raise
            failure = e  # the module outgrew the emitter's budget unrolled: try it rolled
            continue
        written = _Form(
            form.list_stacks and facts["tensor_stacks"],
            facts["yield_barriers"],
            form.cf and facts["regions"],
            form.workaround_flags,
            facts["unrolled_loops"],
        )
        if written in tried:
            continue
        tried.add(written)
        f64 = "float64" in facts["dtypes"]
        try:
            vmfb = _compile_form(mlir, target, portable, form, dense_flags(target, facts), f64)
            return mlir, vmfb, dict(facts, list_stacks=written.list_stacks), forms[k + 1 :]
        except errors.CompileTimeoutError as e:
            if not written.unroll_loops:
                raise errors.CompileTimeoutError(
                    f"compiling {concrete.graph.entry} for {target}: {e}"
                ) from None
            failure = e
        except errors.CompileError as e:
            failure = e
    if failure is None:
        raise errors.CompileError(f"compiling {concrete.graph.entry} for {target}: no form left")
    raise errors.CompileError(f"compiling {concrete.graph.entry} for {target}: {failure}")


def _compile_form(
    mlir: str, target: str, portable: bool, form: _Form, extra: tuple[str, ...], f64: bool
) -> bytes:
    """`compile_mlir` in `form` with the module's `extra` flags (`dense_flags`), and without
    them where IREE refuses the module with them: they only make it faster."""
    flags = form.workaround_flags
    if extra:
        try:
            return compile_mlir(mlir, target, portable, form.cf, flags + extra, f64)
        except errors.CompileTimeoutError:
            raise
        except errors.CompileError:
            pass
    return compile_mlir(mlir, target, portable, form.cf, flags, f64)


def _too_big(failure: errors.CompileError) -> bool:
    """Whether a form failed for its size (the emitter's budget, or IREE's time limit), so
    that only smaller forms are worth trying."""
    return isinstance(failure, errors.CompileTimeoutError) or "MiB of MLIR text" in str(failure)


def _first_line(message: str) -> str:
    """IREE's first diagnostic (`file:line:col: error: ...`), else the message's first line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in lines:
        if "error:" in line:
            return line
    return lines[0] if lines else message


def _to_cf(mlir: str) -> str:
    """`mlir` with `scf` lowered to `cf` branches (MLIR's `convert-scf-to-cf`): IREE 3.13's
    stream passes reject some verified modules with nested `scf` regions ("operand does not
    dominate this use", "maximum iteration count exceeded in fixed point pipeline") and compile
    the same program as a CFG (`_workarounds`: `scf_to_cf`)."""
    from iree.compiler import ir
    from iree.compiler.passmanager import PassManager

    try:
        with ir.Context() as ctx:
            module = ir.Module.parse(mlir)
            PassManager.parse("builtin.module(convert-scf-to-cf)", ctx).run(module.operation)
            return str(module)
    except ir.MLIRError as e:
        raise errors.CompileError(
            _validate.at_user(f"the module does not parse: {_first_line(str(e))}\n{e}")
        ) from None


def _compile_with_iree(mlir: str, flags: list[str]) -> bytes:
    """The `.vmfb` of `mlir`, compiled in process (`_compiler`) in two steps: to IREE's VM IR,
    which `_vm_repair.repair` repairs, then to bytecode."""
    try:
        vm = _compiler.compile_to_vm(mlir, flags)
        return _compiler.vm_to_bytecode(_vm_repair.repair(vm))
    except _compiler.CompileTimeout as e:
        raise errors.CompileTimeoutError(_validate.at_user(_first_line(str(e)))) from None
    except _compiler.CompilerFailure as e:
        raise errors.CompileError(
            _validate.at_user(f"iree-compile failed: {_first_line(str(e))}\n{e}")
        ) from None


#: What IREE's runtime raises for a module it cannot load or run: its Python bindings use
#: several builtins (a dispatch over the device's push-constant limit is an `IndexError` as the
#: module loads), each turned into a `gl.errors` exception naming the function.
_IREE_FAILURES = (RuntimeError, ValueError, LookupError, OSError)


class _Compiled:
    """One signature compiled: the module's entry and where the Variables go. `portable`
    compiles for a generic CPU (`llvm-cpu`): a module that travels to other machines
    (`gl.distributed`) keeps it in `vmfb`."""

    def __init__(self, concrete: Any, target: str, portable: bool = False) -> None:
        self.concrete = concrete
        self.target = target
        self.portable = portable
        self._tried: set[_Form] = set()
        self._load(None)
        self.captured = concrete.captured_inputs
        self.assigned = [self.captured[k] for k in concrete.assigned_variables]
        self._checked = False

    def _load(self, forms: tuple[_Form, ...] | None) -> None:
        """Compiles and loads the first of `forms` that IREE compiles and its runtime loads.
        A module can compile and still not load: on Vulkan, a dispatch whose push constants
        exceed the device's limit (Mesa's: 128 bytes) fails as the module is created; the
        next form (here the loop not unrolled) is loaded instead, with a `FormWarning`."""
        name = self.concrete.graph.entry
        refused = None
        while True:
            try:
                with _notice.compile_notice(name, self.target, "IREE"):
                    self.mlir, vmfb, facts, self._later_forms = _compile_concrete(
                        self.concrete, self.target, False, self.portable, forms, self._tried
                    )
            except errors.CompileError as e:
                if refused is None:
                    raise
                raise errors.CompileError(
                    f"compiled function {name} ({self.target}): IREE's runtime does not load "
                    f"it in any form IREE compiles: {refused}"
                ) from e
            self.driver = driver(self.target, facts)
            _runtime.device(self.driver)  # a missing device is no module's failure
            try:
                self.entry = _runtime.Function(vmfb, self.driver, name)
                self.vmfb = vmfb
                return
            except _IREE_FAILURES as e:
                refused = failure = _first_line(str(e))
                if not self._later_forms:
                    raise errors.CompileError(
                        f"compiled function {name} ({self.target}): IREE's runtime does not "
                        f"load it in any form IREE compiles: {failure}"
                    ) from e
                warnings.warn(
                    errors.FormWarning(
                        f"compiled function {name} ({self.target}) does not load in one form "
                        f"({failure}); loading it in the next form"
                    ),
                    stacklevel=2,
                )
                forms = self._later_forms

    def _run(self, inputs: list[np.ndarray]) -> Any:
        while True:
            try:
                return self.entry(*inputs, copy=False)  # results are copied into tensors
            except _IREE_FAILURES as e:
                failure = _first_line(str(e))
                # A call changes nothing before it returns (Variables are values in the
                # module): the same program, written in the next form, runs again; not silently.
                if not self._next_form(failure):
                    name = self.concrete.graph.entry
                    raise errors.ExecutionError(
                        _validate.at_user(
                            f"compiled function {name} ({self.target}) failed at run time: "
                            f"{failure}"
                        )
                    ) from e

    def _next_form(self, failure: str) -> bool:
        """Loads the module in the next form that compiles, with a `FormWarning`; False when
        no form is left."""
        if not self._later_forms:
            return False
        try:
            self._load(self._later_forms)
        except errors.CompileError:
            return False
        warnings.warn(
            errors.FormWarning(
                f"compiled function {self.concrete.graph.entry} ({self.target}) failed in one "
                f"form ({failure}); running it compiled in the next form"
            ),
            stacklevel=5,
        )
        return True

    def __call__(self, tensors: list[_core.Tensor]) -> list[_core.Tensor]:
        # Captured tensors and the Variables' current values follow the arguments.
        inputs = [np.asarray(t) for t in tensors]
        inputs += [
            np.asarray(c.read() if isinstance(c, _core.VariableHandle) else c)
            for c in self.captured
        ]
        reference = None if self._checked else self._reference(tensors)
        while True:
            outputs = [np.asarray(r) for r in self._run(inputs)]
            if reference is None or _agree(outputs, reference):
                break
            # IREE 3.13 returns wrong numbers, silently, for rare branch-heavy modules in any
            # one form (docs/compiled-mode.md): the first call is checked, never trusted.
            failure = "its results differ from the reference interpreter's"
            if not self._next_form(failure):
                raise errors.ExecutionError(
                    _validate.at_user(
                        f"compiled function {self.concrete.graph.entry} ({self.target}): "
                        f"{failure} in every form IREE compiles"
                    )
                )
        self._checked = True
        # the arrays are the results' own copies, which nothing else holds: read in place
        results = [_core.tensor_in_place(r) for r in outputs]
        n = len(results) - len(self.assigned)
        for handle, value in zip(self.assigned, results[n:], strict=True):
            handle.assign(value)
        return results[:n]

    def _reference(self, tensors: list[_core.Tensor]) -> list[np.ndarray] | None:
        """The results and assigned Variables' final values of the same call on the graph
        interpreter, the Variables left as they were; None where the interpreter does not run
        it (the compiled module may: IREE clamps indices the interpreter refuses)."""
        before = [h.read() for h in self.assigned]
        try:
            results = self.concrete(tensors)
            return [np.asarray(r) for r in results] + [np.asarray(h.read()) for h in self.assigned]
        except errors.GradloopError:
            return None
        finally:
            for handle, value in zip(self.assigned, before, strict=True):
                handle.assign(value)


def _agree(outputs: list[np.ndarray], reference: list[np.ndarray]) -> bool:
    """Whether compiled `outputs` match the interpreter's: exactly for integers and bools, to
    a float32 or float64 tolerance for floats (IREE's transcendentals are not libm's)."""
    if len(outputs) != len(reference):
        return False
    for got, want in zip(outputs, reference, strict=True):
        if got.shape != want.shape:
            return False
        if want.dtype.kind != "f":
            if not np.array_equal(got, want):
                return False
            continue
        rtol = 1e-6 if want.dtype == np.float64 else 1e-3
        scale = float(np.max(np.abs(want), initial=0.0, where=np.isfinite(want)))
        if not np.allclose(got, want, rtol=rtol, atol=rtol * (1.0 + scale), equal_nan=True):
            return False
    return True


class _Tiered:
    """One signature under `gl.jit(fn, tiered=True)`: IREE compiles it on a background thread
    while calls run on the frame executor; once the module is ready (checked at each call,
    without waiting) calls run compiled, the first of them checked against the interpreter as
    always. A signature that does not compile keeps running on the executor, with a
    `TieredCompileWarning`."""

    def __init__(self, concrete: Any, target: str) -> None:
        self.concrete = concrete
        self.target = target
        self._pending: concurrent.futures.Future[_Compiled] | None = _background().submit(
            _Compiled, concrete, target
        )
        self.compiled: _Compiled | None = None

    def ready(self) -> bool:
        """Whether calls run compiled now (False while IREE compiles or after it failed)."""
        pending = self._pending
        if pending is not None and pending.done():
            self._pending = None
            try:
                self.compiled = pending.result()
            except errors.CompileError as e:
                warnings.warn(
                    errors.TieredCompileWarning(
                        f"{self.concrete.graph.entry} ({self.target}) runs on the frame "
                        f"executor: {e}"
                    ),
                    stacklevel=4,
                )
        return self.compiled is not None

    def wait(self) -> None:
        """Blocks until the background compile is over (for tests and benchmarks)."""
        if self._pending is not None:
            concurrent.futures.wait([self._pending])

    def __call__(self, tensors: list[_core.Tensor]) -> list[_core.Tensor]:
        if self.ready():
            assert self.compiled is not None
            return self.compiled(tensors)
        return list(self.concrete(tensors))


_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _background() -> concurrent.futures.ThreadPoolExecutor:
    """One thread compiles in the background: compiles are serialised anyway (`_compiler`), and
    the pool is joined at exit, so no compile is cut off inside IREE."""
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gradloop-compile")
    return _pool


class Jit:
    """`gl.jit(fn, target, tiered)`: compiled once per input signature, cached (see the module
    doc)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        target: str = "llvm-cpu",
        tiered: bool = False,
        backend: str = "iree",
    ) -> None:
        self._function = _function(fn)
        self._target = target
        self._tiered = tiered
        self._backend = backend
        self._compiled: dict[int, _Compiled | _Tiered | _xla.Compiled] = {}
        if backend == "xla":
            if tiered:
                raise errors.InvalidArgumentError(
                    _validate.at_user(
                        "gl.jit: tiered=True runs calls on the frame executor while IREE "
                        "compiles; backend='xla' compiles at the first call"
                    )
                )
            _xla.require_jax(target)
            return
        if backend != "iree":
            raise errors.InvalidArgumentError(
                _validate.at_user(
                    f"gl.jit: unknown backend {backend!r}; expected one of {BACKENDS}"
                )
            )
        _flags(target, uses_f64=False)  # raises the unknown-target error
        _compiler.warm_up()  # loads the compiler while the caller goes on

    @property
    def target(self) -> str:
        return self._target

    @property
    def tiered(self) -> bool:
        return self._tiered

    @property
    def backend(self) -> str:
        return self._backend

    def _module(self, concrete: Any, tiered: bool) -> _Compiled | _Tiered | _xla.Compiled:
        found = self._compiled.get(id(concrete))
        if found is None or found.concrete is not concrete:
            module = _xla.Compiled if self._backend == "xla" else _Tiered if tiered else _Compiled
            found = self._compiled[id(concrete)] = module(concrete, self._target)
        return found

    def _signature(self, args: Any, kwargs: Any) -> tuple[Any, list[Any]]:
        structure, leaves = self._function._flatten(args, kwargs)
        # XLA runs pure StableHLO: loop gradients in fixed-size state
        fixed = _stablehlo.DEFAULT_CHECKPOINTS if self._backend == "xla" else None
        return self._function._concrete(structure, leaves, fixed), leaves

    def mlir(self, *args: Any, **kwargs: Any) -> str:
        """The MLIR this call signature compiles (compiling it if it was not yet; waiting for
        it under `tiered=True`)."""
        entry, _ = self._signature(args, kwargs)
        module = self._module(entry.fn, self._tiered)
        if isinstance(module, _Tiered):
            module.wait()
            if not module.ready():
                raise errors.CompileError(
                    f"{entry.fn.graph.entry} did not compile for {self._target}"
                )
            assert module.compiled is not None
            return module.compiled.mlir
        return module.mlir

    def compiled(self, *args: Any, **kwargs: Any) -> bool:
        """Whether a call with these arguments runs the compiled module now: always under the
        default (the call waits for it); under `tiered=True`, once the background compile of
        this signature is done."""
        entry, _ = self._signature(args, kwargs)
        module = self._module(entry.fn, self._tiered)
        return module.ready() if isinstance(module, _Tiered) else True

    def wait(self, *args: Any, **kwargs: Any) -> None:
        """Under `tiered=True`, blocks until the background compile of this signature is over
        (it starts it if no call did yet); a no-op otherwise."""
        entry, _ = self._signature(args, kwargs)
        module = self._module(entry.fn, self._tiered)
        if isinstance(module, _Tiered):
            module.wait()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _core.mode() != "eager":
            # Traced into an enclosing function, or differentiated (a tape, jvp): the module's
            # results would carry no gradient or tangent, so its Python runs inline, as
            # `gl.function` does.
            return self._function(*args, **kwargs)
        if self._backend == "xla":
            entry, leaves = self._signature(args, kwargs)
            tensors = [x for x in leaves if isinstance(x, _core.Tensor)]
        else:
            entry, tensors = self._function._lookup(args, kwargs)
        return entry.outputs(self._module(entry.fn, self._tiered)(tensors))


#: `jit`'s backends: IREE (`.vmfb` modules, every target) or XLA through jaxlib.
BACKENDS = ["iree", "xla"]


def jit(
    fn: Callable[..., Any], target: str = "llvm-cpu", tiered: bool = False, backend: str = "iree"
) -> Jit:
    """`fn` compiled once per input signature, cached.

    `backend="iree"`: compiled with IREE for `target` ("llvm-cpu", "vulkan-spirv" or "cuda").
    The first call of each input signature waits for its module. With `tiered=True` it
    does not: IREE compiles in the background while calls run on the frame executor, and
    calls run compiled once the module is ready (`Jit.compiled(*args)` says which).

    `backend="xla"`: the function's pure StableHLO (`to_mlir(..., dialect="stablehlo")`, loop
    gradients in fixed-size state) compiled by XLA through jaxlib (`gradloop[jax]`), for the
    CPU ("llvm-cpu") or a GPU jaxlib sees ("cuda"). Variables are threaded through as with
    IREE. XLA runs loops at JAX's own speed; IREE's modules are what ship without Python."""
    return Jit(fn, target, tiered, backend)


#: `export`'s formats: an IREE `.vmfb`, or a StableHLO portable artifact.
FORMATS = ("vmfb", "stablehlo")


def export(
    fn: Callable[..., Any],
    *args: Any,
    path: str | os.PathLike[str],
    target: str = "llvm-cpu",
    format: str = "vmfb",  # noqa: A002 - DESIGN's name
) -> pathlib.Path:
    """Writes `fn` traced for `args` at `path`, its MLIR text beside it (`.mlir`).

    `format="vmfb"`: an IREE module for `target`, self-contained: run it with
    `iree-run-module --module=PATH --function=<name> --input=...` (the function is named after
    `fn`). `format="stablehlo"`: a StableHLO portable artifact (versioned bytecode, written
    through jaxlib's StableHLO bindings) of the pure StableHLO module
    (`to_mlir(..., dialect="stablehlo")`), for any StableHLO consumer; `target` is not used.

    Signature: the tensor arguments in order (Python values are fixed at their traced
    values), then one input per Variable `fn` uses, its value on entry, in the order `fn`
    first used them; it returns the results, then the final value of each Variable `fn` may
    assign, in that same order (Variables it only reads have no output). Closed-over tensors
    are embedded as constants."""
    if format == "stablehlo":
        text = _stablehlo.module(_function(fn), *args)
        artifact = _stablehlo.portable_artifact(text)
        out = pathlib.Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".mlir").write_text(text)
        out.write_bytes(artifact)
        return out
    if format != "vmfb":
        raise errors.InvalidArgumentError(
            _validate.at_user(f"unknown format {format!r}; expected one of {list(FORMATS)}")
        )
    concrete = _function(fn).concrete_function(*args)
    # Stacks as buffers: the module may run on an asynchronous device (`iree-run-module`'s
    # default `local-task`, CUDA), where lists of buffer views fail (see `driver`).
    forms = tuple(form for form in _forms(target) if not form.list_stacks)
    mlir, vmfb, _, _ = _compile_concrete(
        concrete, target, embed_captures=True, portable=True, forms=forms
    )
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".mlir").write_text(mlir)
    out.write_bytes(vmfb)
    return out
