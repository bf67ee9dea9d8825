"""`gl.jit(fn, backend="xla")`: a function's pure StableHLO (`_stablehlo`) compiled by XLA through
jaxlib (the `gradloop[jax]` extra), on the CPU or, with `target="cuda"`, on a GPU jaxlib sees.

jaxlib's client compiles the module itself (its public function renamed `main`) and runs it on
device buffers made from the arguments, with their 64-bit types kept: no JAX tracing, lowering
or LAPACK initialisation stands between a first call and XLA, which is what a first call costs
beside JAX's own. Where this jaxlib lacks that client interface, the module goes through
`jax.export` instead: an `Exported` of a stand-in function of the same signature gets the
module's portable artifact in place of its own, and `jax.jit(exported.call)` compiles it. The
signature is the IREE backend's: the tensor arguments, then the captured tensors and the
Variables' values; the results, then the final values of the Variables the function assigns.
Neither route changes the caller's JAX configuration.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _core, _disk_cache, _notice, _stablehlo, _validate, errors

#: `gl.jit`'s targets on this backend, and the platform JAX names each.
PLATFORMS = {"llvm-cpu": "cpu", "cuda": "cuda"}


def require_jax(target: str) -> None:
    """Raises unless jaxlib is installed and sees a device for `target`."""
    if target not in PLATFORMS:
        raise errors.InvalidArgumentError(
            _validate.at_user(
                f"gl.jit(backend='xla'): unknown target {target!r}; expected one of "
                f"{list(PLATFORMS)}"
            )
        )
    try:
        import jax
    except ImportError as e:
        raise errors.InvalidArgumentError(
            _validate.at_user(
                "gl.jit(backend='xla') compiles with XLA through jaxlib, which is not installed: "
                f"pip install 'gradloop[jax]' ({e})"
            )
        ) from None
    try:
        jax.devices(PLATFORMS[target])
    except RuntimeError as e:
        raise errors.InvalidArgumentError(
            _validate.at_user(
                f"gl.jit(backend='xla', target={target!r}): jaxlib sees no "
                f"{PLATFORMS[target]} device ({str(e).splitlines()[0]})"
            )
        ) from None


#: A function's header as gradloop's emitter writes it: `func.func @f(%arg0: tensor<3xf64>,
#: ...) -> (tensor<...>, ...) {`, with no attributes on arguments or results.
_HEADER = (
    r"func\.func (?:public )?@{name}\(((?:%arg\d+: tensor<[0-9x]*\w+>(?:, )?)*)\)"
    r" -> (\(.*?\)|tensor<[0-9x]*\w+>) \{{"
)
_TENSOR = re.compile(r"tensor<((?:\d+x)*)(\w+)>")


def _types(text: str, name: str) -> tuple[list[Any], list[Any]]:
    """The argument and result types (`jax.ShapeDtypeStruct`s) of `text`'s function `name`:
    read from the header where gradloop's emitter wrote it (parsing the module in JAX's MLIR
    context costs a first call 15 ms), else from the parsed module."""
    import jax

    header = re.search(_HEADER.format(name=re.escape(name)), text)
    if header is not None:
        try:
            return tuple(  # type: ignore[return-value]
                [_spec_of(jax, *m) for m in _TENSOR.findall(part)]
                for part in (header.group(1), header.group(2))
            )
        except KeyError:
            pass  # an element type outside gradloop's: the parser says what it is
    return _parsed_types(text, name)


def _spec_of(jax: Any, dims: str, element: str) -> Any:
    shape = tuple(int(d) for d in dims.split("x") if d)
    return jax.ShapeDtypeStruct(shape, np.dtype(_ELEMENTS[element]))


def _parsed_types(text: str, name: str) -> tuple[list[Any], list[Any]]:
    """`_types` from the module parsed in JAX's MLIR context."""
    import jax
    from jaxlib.mlir import ir

    with _stablehlo._jax_context():
        module = ir.Module.parse(text)
        for op in module.body.operations:
            if ir.StringAttr(op.attributes["sym_name"]).value == name:
                kind = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
                return (
                    [_spec(jax, t) for t in kind.inputs],
                    [_spec(jax, t) for t in kind.results],
                )
    raise errors.InternalError(f"gl.jit(backend='xla'): the module has no function {name}")


_ELEMENTS = {"f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64", "i1": "bool"}


def _spec(jax: Any, t: Any) -> Any:
    from jaxlib.mlir import ir

    ranked = ir.RankedTensorType(t)
    element = _ELEMENTS.get(str(ranked.element_type))
    if element is None:
        raise errors.InternalError(f"gl.jit(backend='xla'): element type {ranked.element_type}")
    return jax.ShapeDtypeStruct(tuple(ranked.shape), np.dtype(element))


def _as_main(text: str, name: str) -> str:
    """`text` with its public function `name` renamed `main` (what JAX calls), and the calls
    of it; a private function already named `main` is renamed out of the way."""
    if name == "main":
        return text
    quoted = re.escape(name)
    text = re.sub(r"@main\b(?=\()", "@gradloop_main_", text)
    return re.sub(rf'@"?{quoted}"?(?=\()', "@main", text)


def _executable(text: str, name: str, target: str) -> Callable[..., list[np.ndarray]]:
    """`text`'s public function `name` compiled by XLA for `target`: a callable on numpy arrays
    of its argument types, returning numpy arrays."""
    ins, outs = _types(text, name)
    main = _as_main(text, name)
    try:
        return _ClientExecutable(main, name, target, ins)
    except _NoClient:
        return _exported_executable(main, name, target, ins, outs)


class _NoClient(Exception):
    """This jaxlib lacks the client interface `_ClientExecutable` uses."""


class _ClientExecutable:
    """A module compiled and run through jaxlib's client."""

    def __init__(self, main: str, name: str, target: str, ins: list[Any]) -> None:
        import jax

        try:
            # `jax.extend.backend` re-exports it, but importing `jax.extend` loads Pallas,
            # which a first call would wait for
            from jax._src.compiler import get_compile_options
        except ImportError:
            from jax.extend.backend import get_compile_options
        try:
            from jaxlib import _jax as xla

            put, devices = xla.batched_device_put, xla.DeviceList
            self._semantics = xla.HostBufferSemantics.ZERO_COPY
        except (ImportError, AttributeError):
            raise _NoClient from None
        self._device = jax.devices(PLATFORMS[target])[0]
        self._sharding = jax.sharding.SingleDeviceSharding(self._device)
        self._avals = [jax.core.ShapedArray(t.shape, t.dtype) for t in ins]
        self._put = put
        try:
            self._run = _load_or_compile(
                self._device, main, devices((self._device,)), get_compile_options(1, 1)
            ).execute
        except Exception as e:  # XLA's failures are jaxlib's own types
            raise errors.CompileError(
                _validate.at_user(f"compiling {name} with XLA ({target}): {_first_line(e)}")
            ) from None

    def __call__(self, *args: np.ndarray) -> list[np.ndarray]:
        if len(args) != len(self._avals):
            raise errors.InvalidArgumentError(
                _validate.at_user(f"expected {len(self._avals)} arguments, got {len(args)}")
            )
        buffers = []
        for k, (a, aval) in enumerate(zip(args, self._avals, strict=True)):
            a = np.asarray(a)
            if a.shape != aval.shape or a.dtype != aval.dtype:
                raise errors.InvalidArgumentError(
                    _validate.at_user(
                        f"argument {k}: expected {aval.dtype}{list(aval.shape)}, "
                        f"got {a.dtype}{list(a.shape)}"
                    )
                )
            buffers.append(
                self._put(
                    aval, self._sharding, [a], [self._device], True, False, self._semantics, True
                )
            )
        return [np.asarray(r) for r in self._run(buffers)]


def _load_or_compile(device: Any, main: str, devices: Any, options: Any) -> Any:
    """`main` compiled by `device`'s client, or its executable from the disk cache (keyed by
    the module, the device and jaxlib's version), as IREE's modules are: a compile of a few
    seconds becomes a read of a few milliseconds in the next process."""
    import jaxlib

    client = device.client
    key = hashlib.sha256(
        "\0".join(
            [main, jaxlib.__version__, client.platform, client.platform_version, device.device_kind]
        ).encode()
    ).hexdigest()
    path = _disk_cache.directory() / f"{key}.xla"
    if path.exists():
        # a torn or foreign entry is compiled again
        with contextlib.suppress(Exception):
            return client.deserialize_executable(path.read_bytes(), devices, options)
    executable = client.compile_and_load(main.encode(), devices, options)
    # a backend that cannot serialize runs uncached
    with contextlib.suppress(Exception):
        _disk_cache.write_atomic(path, client.serialize_executable(executable))
    return executable


def _exported_executable(
    main: str, name: str, target: str, ins: list[Any], outs: list[Any]
) -> Callable[..., list[np.ndarray]]:
    """The `jax.export` route: slower to a first call (JAX lowers a stand-in and initialises
    its LAPACK handlers), for a jaxlib without `_ClientExecutable`'s interface."""
    import jax
    import jax.numpy as jnp

    artifact = _stablehlo.portable_artifact(main)

    def stand_in(*args: Any) -> tuple[Any, ...]:
        return tuple(jnp.zeros(o.shape, o.dtype) for o in outs)

    with jax.enable_x64(True):
        exported = jax.export.export(jax.jit(stand_in), platforms=[PLATFORMS[target]])(*ins)
        exported = dataclasses.replace(
            exported, mlir_module_serialized=artifact, module_kept_var_idx=tuple(range(len(ins)))
        )
        try:
            compiled = jax.jit(exported.call).lower(*ins).compile()
        except Exception as e:  # XLA's failures are jaxlib's own types
            raise errors.CompileError(
                _validate.at_user(f"compiling {name} with XLA ({target}): {_first_line(e)}")
            ) from None

    def call(*args: np.ndarray) -> list[np.ndarray]:
        with jax.enable_x64(True):
            return [np.asarray(r) for r in compiled(*args)]

    return call


def load(artifact: bytes, target: str = "llvm-cpu") -> Any:
    """A StableHLO portable artifact (`gl.export(..., format="stablehlo")`) compiled by XLA: a
    callable on numpy arrays, in the artifact's signature, returning numpy arrays."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    require_jax(target)
    with _stablehlo._jax_context() as context:
        module = stablehlo.deserialize_portable_artifact(context, artifact)
        public = [
            ir.StringAttr(op.attributes["sym_name"]).value
            for op in module.body.operations
            if "sym_visibility" not in op.attributes
            or ir.StringAttr(op.attributes["sym_visibility"]).value == "public"
        ]
        text = str(module)
    if len(public) != 1:
        raise errors.InvalidArgumentError(
            _validate.at_user(f"a StableHLO artifact with one public function; found {public}")
        )
    return _executable(text, public[0], target)


class Compiled:
    """One signature of a function compiled by XLA."""

    def __init__(self, concrete: Any, target: str) -> None:
        self.concrete = concrete
        self.target = target
        self.captured = concrete.captured_inputs
        self.assigned = [self.captured[k] for k in concrete.assigned_variables]
        self.mlir = concrete.to_mlir(embed_captures=False, pure_stablehlo=True)
        with _notice.compile_notice(concrete.graph.entry, target, "XLA"):
            self._call = _executable(self.mlir, concrete.graph.entry, target)

    def __call__(self, tensors: list[_core.Tensor]) -> list[_core.Tensor]:
        inputs = [np.asarray(t) for t in tensors]
        inputs += [
            np.asarray(c.read() if isinstance(c, _core.VariableHandle) else c)
            for c in self.captured
        ]
        try:
            outputs = self._call(*inputs)
        except errors.GradloopError:
            raise
        except Exception as e:  # XLA's failures are jaxlib's own types
            raise errors.ExecutionError(
                _validate.at_user(
                    f"compiled function {self.concrete.graph.entry} (XLA, {self.target}) "
                    f"failed: {_first_line(e)}"
                )
            ) from None
        # views of XLA's result buffers, which XLA never writes again: read in place
        results = [_core.tensor_in_place(r) for r in outputs]
        n = len(results) - len(self.assigned)
        for handle, value in zip(self.assigned, results[n:], strict=True):
            handle.assign(value)
        return results[:n]


def _first_line(e: Exception) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
