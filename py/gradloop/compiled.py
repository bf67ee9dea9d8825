"""Compiled mode: traced graphs emitted as MLIR (StableHLO inside `scf`) and compiled by IREE
(`_iree_build`: flags, forms, the compile cache) or XLA (`_xla`).

`to_mlir(fn, *args)` is the text; `jit(fn, target=...)` compiles once per input signature (the
signature rules of `gl.function`) and runs the module with `iree-base-runtime`;
`export(fn, *args, path=...)` writes a self-contained `.vmfb` (captured tensors embedded as
constants) and its `.mlir` beside it, which plain `iree-run-module` runs.

Variables are values in a compiled module: it takes each Variable the function uses as an
input (its value on entry, after the function's own inputs) and returns the final value of
each Variable the function may assign after its own results. `jit` passes the current values
and stores the returned ones, so every call sees the Variables as they are then.

Tensor stacks (the intermediates a loop gradient saves) are lists of buffer views on `llvm-cpu`
(O(1) per push) where IREE compiles that form, and growable buffers otherwise; each is
compiled as `scf`, or as a CFG where IREE refuses the `scf` (`_iree_build.forms_for`).
`to_mlir` gives the buffer form in `scf`; `Jit.mlir` gives the form that runs.
The first call of each signature is also run on the graph interpreter and the results
compared: a form whose numbers differ gives way to the next (IREE miscompiles rare modules).
Every failure is a `gl.errors` exception naming the function and the user's line: a
`CompileError` with IREE's first diagnostic, an `ExecutionError` when the module fails as it runs.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _compiler, _core, _notice, _runtime, _stablehlo, _validate, _xla, batching, errors
from ._iree_build import Form, compile_concrete, driver, first_line, forms_for, target_flags
from .function import Function

__all__ = ["export", "jit", "to_mlir"]


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
        self._tried: set[Form] = set()
        self._load(None)
        self.captured = concrete.captured_inputs
        self.assigned = [self.captured[k] for k in concrete.assigned_variables]
        self._checked = False

    def _load(self, forms: tuple[Form, ...] | None) -> None:
        """Compiles and loads the first of `forms` that IREE compiles and its runtime loads.
        A module can compile and still not load: on Vulkan, a dispatch whose push constants
        exceed the device's limit (Mesa's: 128 bytes) fails as the module is created; the
        next form (here the loop not unrolled) is loaded instead, with a `FormWarning`."""
        name = self.concrete.graph.entry
        refused = None
        while True:
            try:
                with _notice.compile_notice(name, self.target, "IREE"):
                    self.mlir, vmfb, facts, self._later_forms = compile_concrete(
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
                refused = failure = first_line(str(e))
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
                failure = first_line(str(e))
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
        # Itself with `vmap` calls inside, for calls on lanes (`batching.call_over_lanes`).
        self._over_lanes: dict[Any, Any] = {}
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
        target_flags(target, uses_f64=False)  # raises the unknown-target error
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
        # XLA runs pure StableHLO: loop gradients in fixed-size state, loops over lanes masked
        xla = self._backend == "xla"
        fixed = _stablehlo.DEFAULT_CHECKPOINTS if xla else None
        with batching.loops_masked(xla and not batching.XLA_LOOP_BUCKETS):
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
        levels = batching.argument_levels(args, kwargs)
        if levels:
            again = lambda f: Jit(f, self._target, self._tiered, self._backend)  # noqa: E731
            return batching.call_over_lanes(
                self._function._fn, again, self._over_lanes, levels, args, kwargs
            )
        try:
            if self._backend == "xla":
                entry, leaves = self._signature(args, kwargs)
                tensors = [x for x in leaves if isinstance(x, _core.Tensor)]
            else:
                entry, tensors = self._function._lookup(args, kwargs)
        except errors.InvalidArgumentError as e:
            if _core.vmap_levels() and batching.closes_over_lanes(e):
                return self._function._fn(*args, **kwargs)  # as under a tape
            raise
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
    forms = tuple(form for form in forms_for(target) if not form.list_stacks)
    mlir, vmfb, _, _ = compile_concrete(
        concrete, target, embed_captures=True, portable=True, forms=forms
    )
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".mlir").write_text(mlir)
    out.write_bytes(vmfb)
    return out
