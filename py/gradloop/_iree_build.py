"""How a traced function becomes an IREE module: the flags per target, the forms a module is
written in (`Form`, `forms_for`: each IREE workaround of `_workarounds` a choice), the first
form IREE compiles (`compile_concrete`), and the compile cache.

`compile_mlir` caches each `.vmfb` in memory and on disk, keyed by the MLIR, the target, the
flags and the compiler version; a failed compile is cached too. IREE compiles in two steps, to
its VM IR and from it, with the repairs of `_vm_repair.py` in between.

float64 programs keep float64: IREE would demote them to float32 by default, so the flags that
keep f64 (and link libm for f64 transcendentals on `llvm-cpu`) are added when the module uses
f64. `vulkan-spirv` has no f64 on its default target: such modules are refused with a clear error.
Vulkan modules use 8-bit storage buffers (`VK_KHR_8bit_storage`, which desktop drivers and
Mesa's software Vulkan have): without them IREE emulates bool tensors in 32-bit words and reads
the last partial word of a bool input as false.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from typing import Any, NamedTuple

from . import _compiler, _disk_cache, _validate, _vm_repair, _workarounds, errors

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


def target_flags(
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
    lowers `scf` to `cf` first (`to_cf`); None compiles the module as it is and, if IREE
    refuses it, as a CFG. `workaround_flags` go to IREE after the others (see `Form`).
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
    flags = target_flags(target, uses_f64, portable, workaround_flags)
    key = hashlib.sha256(
        "\0".join([mlir, target, *flags, _compiler_version(), f"cf={cf}", _VM_REPAIR]).encode()
    ).hexdigest()
    found = _memory_cache.get(key)
    if found is not None:
        return found
    path = _disk_cache.directory() / f"{key}.vmfb"
    failed = path.with_suffix(".error")
    if path.exists():
        vmfb = path.read_bytes()
    elif failed.exists():  # the same compiler failed on the same text before
        raise errors.CompileError(failed.read_text())
    else:
        try:
            vmfb = _compile_with_iree(to_cf(mlir) if cf else mlir, flags)
        except errors.CompileTimeoutError:
            raise  # not cached: a later compile, with more time, may finish
        except errors.CompileError as e:
            _disk_cache.write_atomic(failed, str(e).encode())
            raise
        _disk_cache.write_atomic(path, vmfb)
    _memory_cache[key] = vmfb
    return vmfb


class Form(NamedTuple):
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


def forms_for(target: str) -> tuple[Form, ...]:
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
        Form(listed, barriers, cf, flags, unroll)
        for flags in _workarounds.choices("no_multi_use_fusion")
        for listed in stacks
        for barriers in _workarounds.choices("yield_barriers")
        for unroll in (True, False)
        for cf in _workarounds.choices("scf_to_cf")
    )


def compile_concrete(
    concrete: Any,
    target: str,
    embed_captures: bool,
    portable: bool = False,
    forms: tuple[Form, ...] | None = None,
    tried: set[Form] | None = None,
) -> tuple[str, bytes, dict[str, Any], tuple[Form, ...]]:
    """The MLIR, `.vmfb` and emitter's facts of `concrete` in the first of `forms` (its
    target's by default) that compiles, and the forms after it. The facts say which choices
    change the module (no tensor stacks: lists are buffers; no branch results through barriers;
    no regions: no CFG to lower to); a form that reads the same as one `tried` is skipped."""
    forms = forms_for(target) if forms is None else forms
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
        written = Form(
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
    mlir: str, target: str, portable: bool, form: Form, extra: tuple[str, ...], f64: bool
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


def first_line(message: str) -> str:
    """IREE's first diagnostic (`file:line:col: error: ...`), else the message's first line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in lines:
        if "error:" in line:
            return line
    return lines[0] if lines else message


def to_cf(mlir: str) -> str:
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
            _validate.at_user(f"the module does not parse: {first_line(str(e))}\n{e}")
        ) from None


def _compile_with_iree(mlir: str, flags: list[str]) -> bytes:
    """The `.vmfb` of `mlir`, compiled in process (`_compiler`) in two steps: to IREE's VM IR,
    which `_vm_repair.repair` repairs, then to bytecode."""
    try:
        vm = _compiler.compile_to_vm(mlir, flags)
        return _compiler.vm_to_bytecode(_vm_repair.repair(vm))
    except _compiler.CompileTimeout as e:
        raise errors.CompileTimeoutError(_validate.at_user(first_line(str(e)))) from None
    except _compiler.CompilerFailure as e:
        raise errors.CompileError(
            _validate.at_user(f"iree-compile failed: {first_line(str(e))}\n{e}")
        ) from None
