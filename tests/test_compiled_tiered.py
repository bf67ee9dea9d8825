"""`gl.jit(fn, tiered=True)`: calls run on the frame executor while IREE compiles in the
background, then on the compiled module, with the same results as eager mode throughout; a
signature that does not compile keeps running, with a warning. Also the in-process compiler
(`_compiler`: IREE's diagnostics become `CompileError`s) and the progress line of long compiles."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest

import gradloop as gl
from gradloop import _compiler, _iree_build, compiled

#: IREE compiles (or hundreds of programs): `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

pytest.importorskip("iree.compiler", reason="compiled mode needs iree-base-compiler")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GRADLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_iree_build, "_memory_cache", {})


def damped(x: gl.Tensor) -> gl.Tensor:
    def body(i, v):
        v = gl.cond(gl.sum(v) > 0, lambda: v * 0.5 - 0.1, lambda: gl.sin(v) + 1.0)
        return i + 1, v

    return gl.while_loop(lambda i, v: i < 7, body, (gl.tensor(0, dtype=gl.int32), x))[1]


class HeldCompile:
    """Stands in for `compiled._Compiled`: the background compile waits until `release()`, so
    the test decides when the module is ready."""

    def __init__(self, monkeypatch, fail: bool = False) -> None:
        self.gate = threading.Event()
        self.started = 0
        real = compiled._Compiled
        held = self

        class Held(real):  # type: ignore[misc, valid-type]
            def __init__(self, concrete, target) -> None:
                held.started += 1
                held.gate.wait(timeout=60)
                if fail:
                    raise gl.errors.CompileError("IREE refused it (test)")
                super().__init__(concrete, target)

        monkeypatch.setattr(compiled, "_Compiled", Held)

    def release(self) -> None:
        self.gate.set()


def f32(*values: float) -> gl.Tensor:
    return gl.tensor(np.array(values, dtype=np.float32))


def test_tiered_calls_run_before_the_module_is_ready_then_compiled(monkeypatch) -> None:
    held = HeldCompile(monkeypatch)
    fn = gl.jit(damped, tiered=True)
    assert fn.tiered
    xs = [f32(0.3, -0.2), f32(-1.5, 0.1), f32(2.0, 2.0)]
    for x in xs:  # the compile is held: every call runs on the executor
        np.testing.assert_allclose(np.asarray(fn(x)), np.asarray(damped(x)), rtol=1e-6)
        assert not fn.compiled(x)
    assert held.started == 1  # one compile per signature, however many calls
    held.release()
    fn.wait(xs[0])
    assert fn.compiled(xs[0])
    for x in xs:
        np.testing.assert_allclose(np.asarray(fn(x)), np.asarray(damped(x)), rtol=1e-5, atol=1e-6)
    assert "scf.while" in fn.mlir(xs[0])


def test_tiered_gradient_agrees_with_eager_before_and_after_the_compile(monkeypatch) -> None:
    held = HeldCompile(monkeypatch)
    grad = gl.grad(lambda x: gl.sum(damped(x) ** 2))
    fn = gl.jit(grad, tiered=True)
    x = gl.tensor(np.array([0.4, -0.7, 1.3]))
    want = np.asarray(grad(x))
    np.testing.assert_allclose(np.asarray(fn(x)), want, rtol=1e-12)
    held.release()
    fn.wait(x)
    assert fn.compiled(x)
    np.testing.assert_allclose(np.asarray(fn(x)), want, rtol=1e-10)


def test_tiered_variables_see_every_call_in_both_tiers(monkeypatch) -> None:
    held = HeldCompile(monkeypatch)
    total = gl.Variable(gl.tensor(np.zeros(2)))

    def accumulate(x):
        total.assign_add(x * 2.0)
        return gl.sum(total.read())

    fn = gl.jit(accumulate, tiered=True)
    x = gl.tensor(np.array([1.0, 0.5]))
    assert float(fn(x)) == pytest.approx(3.0)  # on the executor
    held.release()
    fn.wait(x)
    assert float(fn(x)) == pytest.approx(6.0)  # compiled, from the executor's value
    np.testing.assert_allclose(np.asarray(total.read()), [4.0, 2.0])


def test_a_signature_that_does_not_compile_keeps_running_with_a_warning(monkeypatch) -> None:
    held = HeldCompile(monkeypatch, fail=True)
    fn = gl.jit(damped, tiered=True)
    x = f32(0.3, -0.2)
    want = np.asarray(damped(x))
    np.testing.assert_allclose(np.asarray(fn(x)), want, rtol=1e-6)
    held.release()
    fn.wait(x)
    with pytest.warns(gl.errors.TieredCompileWarning, match="refused it"):
        assert not fn.compiled(x)
    np.testing.assert_allclose(np.asarray(fn(x)), want, rtol=1e-6)
    with pytest.raises(gl.errors.CompileError, match="did not compile"):
        fn.mlir(x)


def test_the_default_waits_for_the_compiled_module() -> None:
    fn = gl.jit(damped)
    x = f32(0.9, 0.1)
    assert fn.compiled(x)  # says so before the first call: that call will wait
    np.testing.assert_allclose(np.asarray(fn(x)), np.asarray(damped(x)), rtol=1e-5, atol=1e-6)
    fn.wait(x)  # a no-op


def test_compiler_diagnostics_become_compile_errors() -> None:
    bad = """func.func @f(%a: tensor<f32>) -> tensor<i32> {
  return %a : tensor<f32>
}"""
    with pytest.raises(gl.errors.CompileError, match=r"error: .*doesn't match function result"):
        _iree_build.compile_mlir(bad)
    with pytest.raises(_compiler.CompilerFailure, match="option not found"):
        _compiler.compile_to_vm(bad, ["--no-such-iree-flag"])
    with pytest.raises(_compiler.CompilerFailure, match="error"):
        _compiler.vm_to_bytecode("this is not IREE's VM dialect")


def test_in_process_modules_run_like_iree_compile_modules() -> None:
    """The two-step in-process compile (to VM, repaired, to bytecode) gives a module that runs."""
    from gradloop import _runtime

    text = """func.func @f(%a: tensor<3xf32>) -> tensor<3xf32> {
  %0 = stablehlo.sine %a : tensor<3xf32>
  %1 = stablehlo.multiply %0, %a : tensor<3xf32>
  return %1 : tensor<3xf32>
}"""
    vmfb = _iree_build.compile_mlir(text)
    x = np.array([0.1, -2.0, 3.5], dtype=np.float32)
    (out,) = _runtime.Function(vmfb, "local-sync", "f")(x)
    np.testing.assert_allclose(out, np.sin(x) * x, rtol=1e-6)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("stream", "shown"), [(Terminal, True), (io.StringIO, False)])
@pytest.mark.parametrize("backend", ["iree", "xla"])
def test_long_compiles_say_so_once_on_a_terminal_only(
    monkeypatch, tmp_path, stream, shown, backend
) -> None:
    from gradloop import _notice

    err = stream()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr(_notice, "NOTICE_AFTER_S", 0.0)  # every compile is long
    monkeypatch.setenv("GRADLOOP_CACHE_DIR", str(tmp_path))  # nothing from the disk cache
    fn = gl.jit(damped, backend=backend)
    for x in (f32(0.3, 0.4), f32(0.5, 0.1)):  # one signature: compiled once, said once
        np.testing.assert_allclose(np.asarray(fn(x)), np.asarray(damped(x)), rtol=1e-5, atol=1e-6)
    text = err.getvalue()
    compiler = {"iree": "IREE", "xla": "XLA"}[backend]
    if shown:
        assert text.count(f"gradloop: compiling damped for llvm-cpu with {compiler}") == 1, text
        assert len(text.strip().splitlines()) == 1, text
    else:
        assert text == ""
    # silenced
    err.truncate(0)
    err.seek(0)
    monkeypatch.setenv("GRADLOOP_COMPILE_NOTICE", "0")
    gl.jit(damped, backend=backend)(f32(0.3, 0.4, 0.5))
    assert err.getvalue() == ""
