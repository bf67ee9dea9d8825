"""Compiled mode (`gl.jit`, `gl.to_mlir`, `gl.export`) on IREE's llvm-cpu backend: every program
and gradient agrees with eager mode; emitted modules parse and verify with the MLIR bindings;
exported artifacts run under plain `iree-run-module`; the compile cache works."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import gradloop as gl
import test_graph_mode as programs
from gradloop import _iree_build

#: IREE compiles (or hundreds of programs): `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

pytest.importorskip("iree.compiler", reason="compiled mode needs iree-base-compiler")


def f64(*values: float) -> gl.Tensor:
    return gl.tensor(np.array(values, dtype=np.float64))


def f64_wide(start: float, stop: float) -> gl.Tensor:
    """Eight float64s: a tensor kept on the device (four elements or fewer are host scalars in
    compiled mode), for tests of the device's forms."""
    return gl.tensor(np.linspace(start, stop, 8))


def leaves(x: object) -> list[np.ndarray]:
    return programs.leaves(x)


def assert_compiled_matches_eager(fn, *args, rtol: float = 1e-10, jitted=None) -> None:
    """`gl.jit(fn)` (or `jitted`, the one a test already read the MLIR of: a second `gl.jit`
    traces from another line, and the module's locations make it a second compile) against
    eager mode."""
    eager = fn(*args)
    compiled = (jitted or gl.jit(fn))(*args)
    for e, c in zip(leaves(eager), leaves(compiled), strict=True):
        assert e.dtype == c.dtype and e.shape == c.shape
        np.testing.assert_allclose(c, e, rtol=rtol, atol=1e-12)


@pytest.fixture
def private_cache(tmp_path, monkeypatch) -> None:
    """A compile cache of the test's own, for the tests that count its entries (the others share
    the suite's: a module compiled by one test is read back by the next)."""
    monkeypatch.setenv("GRADLOOP_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize(
    ("fn", "args"),
    [
        (programs.nested_structures, (f64(1.0, 2.0),)),
        (programs.switch_with_default, (f64(0.3, 0.4), gl.tensor(1))),
        (programs.switch_with_default, (f64(0.3, 0.4), gl.tensor(7))),
        (programs.dict_loop, (f64(0.5, 2.0),)),
        (programs.nested_loops, (f64(0.3, 1.1),)),
        (programs.loop_with_cond, (f64(0.2, 0.3),)),
        (programs.bounded_loop, (f64(0.9, 1.05),)),
    ],
)
def test_programs_agree_with_eager_mode(fn, args) -> None:
    assert_compiled_matches_eager(fn, *args)


def loop(x, n):
    a = gl.tensor(0.999, dtype=gl.float64)
    body = lambda i, v: (i + 1, v * a + gl.sin(v) * 1e-3)  # noqa: E731
    return gl.while_loop(lambda i, v: i < n, body, (0, x))[1].sum()


def branches(x):
    y = gl.cond(x.sum() > 0, lambda: gl.sin(x) * x, lambda: gl.exp(x))
    k = gl.cast(x[0] > 0.5, gl.int32)
    return gl.switch_case(k, [lambda: y * y, lambda: gl.tanh(y)]).sum()


@pytest.mark.parametrize("x", [[0.3, 0.7], [0.9, -0.2], [-0.5, -0.4]])
def test_gradients_through_branches_compile(x) -> None:
    args = (f64(*x),)
    assert_compiled_matches_eager(gl.grad(branches), *args)
    assert_compiled_matches_eager(gl.grad(lambda t: gl.grad(branches)(t).sum()), *args)


@pytest.mark.parametrize("n", [0, 1, 3000])
def test_gradient_of_a_data_dependent_loop_compiles(n: int) -> None:
    assert_compiled_matches_eager(gl.value_and_grad(loop), f64(0.3, -0.8), gl.tensor(n))


def test_second_derivative_of_a_loop_compiles() -> None:
    def f(x):
        return gl.while_loop(lambda i, v: i < 4, lambda i, v: (i + 1, gl.sin(v) + v * 0.5), (0, x))[
            1
        ].sum()

    assert_compiled_matches_eager(gl.grad(lambda x: gl.grad(f)(x).sum()), f64(0.3, -0.2))


def sin_loop(x, c, n):
    """`while i < n: x = sin(x) * c + x`, then sum(x)."""
    i0 = gl.tensor(0, dtype=gl.int64)
    body = lambda i, v: (i + 1, gl.sin(v) * c + v)  # noqa: E731
    return gl.while_loop(lambda i, v: i < n, body, (i0, x))[1].sum()


def nested_loops(x, c, n, outer_bound=None):
    """`for i < n: (for j < i, at most 3 trips: x = tanh(x * c) + x)`, then sum(x); the outer
    loop at most `outer_bound` trips when given."""

    def outer(i, v):
        inner = lambda j, u: (j + 1, gl.tanh(u * c) + u)  # noqa: E731
        j0 = gl.tensor(0, dtype=gl.int64)
        return i + 1, gl.while_loop(lambda j, u: j < i, inner, (j0, v), maximum_iterations=3)[1]

    i0 = gl.tensor(0, dtype=gl.int64)
    return gl.while_loop(lambda i, v: i < n, outer, (i0, x), maximum_iterations=outer_bound)[
        1
    ].sum()


def x_c_n(n: int) -> tuple[gl.Tensor, gl.Tensor, gl.Tensor]:
    return f64(0.3, -0.8), f64(0.5, 0.2), gl.tensor(n, dtype=gl.int64)


@pytest.mark.parametrize("n", [0, 3])
def test_loop_gradients_with_zero_trips_compile(n: int) -> None:
    # The forward loop runs zero times: its stacks stay empty, the backward loop never runs.
    assert_compiled_matches_eager(gl.grad(sin_loop, argnums=(0, 1)), *x_c_n(n))
    second = gl.grad(lambda x, c, n: gl.grad(sin_loop)(x, c, n).sum(), argnums=(0, 1))
    assert_compiled_matches_eager(second, *x_c_n(n))


@pytest.mark.parametrize("n", [0, 1])
def test_second_order_gradient_of_nested_loops_compiles(n: int) -> None:
    second = gl.grad(lambda x, c, n: gl.grad(nested_loops)(x, c, n).sum(), argnums=(0, 1))
    assert_compiled_matches_eager(second, *x_c_n(n))


def energy_rnn(w, x, limit, bound):
    """`h = tanh(w @ h + x)` until the energy sum |h|^2 passes `limit` (an argument: the stop
    is data-dependent), at most `bound` trips; a branch in the body makes the pushes differ."""

    def body(t, h, energy):
        h = gl.tanh(gl.matmul(w, h) + x)
        h = gl.cond(energy > limit * 0.5, lambda: h * 0.9, lambda: h)
        return t + 1, h, energy + gl.sum(h * h)

    init = (0, x * 0.0, gl.tensor(0.0, dtype=x.dtype))
    go = lambda t, h, energy: energy < limit  # noqa: E731
    _, h, energy = gl.while_loop(go, body, init, maximum_iterations=bound)
    return energy + gl.sum(h)


@pytest.mark.parametrize(
    ("dtype", "limit", "bound"), [("float64", 3.0, 50), ("float32", 3.0, 50), ("float64", 1e9, 7)]
)
def test_gradient_of_a_bounded_loop_with_a_data_dependent_stop_compiles(dtype, limit, bound):
    # With maximum_iterations the stacks are made full size before the loop (stack_bounds.rs);
    # the limit, a function argument, decides the trip count; the last case hits the bound.
    rng = np.random.default_rng(3)
    w = gl.tensor((rng.standard_normal((6, 6)) * 0.4).astype(dtype))
    x = gl.tensor(rng.standard_normal(6).astype(dtype))
    grad = gl.grad(energy_rnn, argnums=(0, 1))
    args = (w, x, gl.tensor(np.array(limit, dtype=dtype)), bound)
    assert "tensor.dim" not in gl.to_mlir(grad, *args)  # no push checks the capacity
    assert_compiled_matches_eager(grad, *args, rtol=1e-10 if dtype == "float64" else 2e-4)


def bounded_nested_loops(x, c, n):
    return nested_loops(x, c, n, outer_bound=4)


@pytest.mark.parametrize("n", [0, 3, 9])
def test_gradients_of_bounded_nested_loops_compile(n: int) -> None:
    assert_compiled_matches_eager(gl.grad(bounded_nested_loops, argnums=(0, 1)), *x_c_n(n))
    second = gl.grad(lambda x, c, n: gl.grad(bounded_nested_loops)(x, c, n).sum())
    assert_compiled_matches_eager(second, *x_c_n(n))


def with_previous(x):
    """A loop variable the body never reads (`prev = v`): the pattern that made iree-compile
    3.13 crash on loop gradients (see `rust/core/src/mlir/loop_vars.rs`)."""
    body = lambda i, v, prev: (i + 1, gl.sin(v) * 1.5, v)  # noqa: E731
    _, v, prev = gl.while_loop(lambda i, v, prev: i < 5, body, (0, x, x))
    return (v * prev).sum()


def with_reset(x):
    """A loop variable whose next value is a constant (reset every trip)."""
    body = lambda i, v, last: (i + 1, gl.sin(v) + v * last, gl.ones_like(last))  # noqa: E731
    _, v, _ = gl.while_loop(lambda i, v, last: i < 4, body, (0, x, x * 0.5))
    return v.sum()


@pytest.mark.parametrize(
    "fn",
    [
        with_previous,
        with_reset,
    ],
)
def test_loops_iree_would_strip_a_variable_of_compile(fn) -> None:
    assert_compiled_matches_eager(fn, f64(0.3, -0.8))
    assert_compiled_matches_eager(gl.grad(fn), f64(0.3, -0.8))


def test_gradient_of_the_flagship_example_compiles() -> None:
    from gradloop.examples import projectile

    fn = gl.value_and_grad(projectile.loss, has_aux=True)
    for theta in (0.1, 0.6):
        assert_compiled_matches_eager(fn, gl.tensor(theta, dtype=gl.float64), 35.0, rtol=1e-12)


def test_emitted_mlir_parses_and_verifies() -> None:
    from iree.compiler import ir

    for fn, args in [(loop, (f64(0.1, 0.2), gl.tensor(3))), (gl.grad(branches), (f64(0.3, 0.7),))]:
        text = gl.to_mlir(fn, *args)
        assert "func.func" in text and "loc(" in text
        with ir.Context():
            module = ir.Module.parse(text)
            assert module.operation.verify()


def double_sin(x):
    return gl.sin(x) * 2.0


@pytest.mark.usefixtures("private_cache")
def test_compiled_once_per_signature_and_cached_on_disk(tmp_path, monkeypatch) -> None:

    f = gl.jit(double_sin)
    f(f64(0.1, 0.2))
    f(f64(0.3, 0.4))
    cache = tmp_path / "cache"
    assert len(list(cache.glob("*.vmfb"))) == 1
    f(f64(0.1, 0.2, 0.3))  # a new shape compiles again
    assert len(list(cache.glob("*.vmfb"))) == 2
    monkeypatch.setattr(_iree_build, "_memory_cache", {})
    again = gl.jit(double_sin)  # the same MLIR: read from the disk cache, not compiled
    monkeypatch.setattr(_iree_build, "_compile_with_iree", None)  # would fail if called
    np.testing.assert_allclose(np.asarray(again(f64(0.5, 0.6))), 2 * np.sin([0.5, 0.6]))
    assert len(list(cache.glob("*.vmfb"))) == 2


@pytest.mark.usefixtures("private_cache")
def test_a_failed_compile_is_cached_too(tmp_path, monkeypatch) -> None:

    bad = "module { func.func @f() { %0 = stablehlo.no_such_op : tensor<f32> return } }"
    with pytest.raises(gl.errors.CompileError, match="no_such_op"):
        _iree_build.compile_mlir(bad)
    assert len(list((tmp_path / "cache").glob("*.error"))) == 2  # as it is, and as a CFG
    monkeypatch.setattr(_iree_build, "_compile_with_iree", None)  # would fail if called
    with pytest.raises(gl.errors.CompileError, match="no_such_op"):
        _iree_build.compile_mlir(bad)


@pytest.mark.usefixtures("private_cache")
def test_an_iree_compile_failure_is_a_compile_error_naming_function_and_line(
    monkeypatch,
) -> None:
    from gradloop import compiled

    def refuse(mlir, flags):
        raise compiled.errors.CompileError(
            compiled._validate.at_user("iree-compile failed: <stdin>:3:5: error: refused")
        )

    monkeypatch.setattr(_iree_build, "_compile_with_iree", refuse)
    monkeypatch.setattr(_iree_build, "_memory_cache", {})
    with pytest.raises(
        gl.errors.CompileError, match=r"compiling double_sin for llvm-cpu.*refused"
    ) as e:
        gl.jit(double_sin)(f64(0.25, 0.5, 0.75))
    assert "test_compiled.py" in str(e.value)


def test_an_iree_run_time_failure_is_an_execution_error(monkeypatch) -> None:
    # Every form of the module fails as it runs: the user gets a gl.errors class naming the
    # function and the line, never IREE's builtin exception, and each rerun in another form
    # says so (a FormWarning).
    from gradloop import compiled

    loaded = []

    class Failing(compiled._runtime.Function):
        def __init__(self, *args):
            loaded.append(args)
            super().__init__(*args)

        def __call__(self, *inputs, copy=True):
            raise IndexError("c/runtime/src/iree/vm/list.c:98: OUT_OF_RANGE; index 3")

    monkeypatch.setattr(compiled._runtime, "Function", Failing)
    with (
        pytest.warns(gl.errors.FormWarning, match=r"double_sin.*OUT_OF_RANGE.*next form"),
        pytest.raises(gl.errors.ExecutionError, match=r"double_sin.*OUT_OF_RANGE") as e,
    ):
        gl.jit(double_sin)(f64(0.1, 0.2))
    assert "test_compiled.py" in str(e.value)
    # No stacks, no regions: one module (the emitter's facts say the other forms read the
    # same), with IREE's defaults and with each set of workaround flags.
    assert len(loaded) == len(_iree_build._workarounds.choices("no_multi_use_fusion"))


def test_a_form_that_does_not_load_gives_way_to_the_next_with_a_warning(monkeypatch) -> None:
    # IREE can compile a module its runtime refuses to load (Vulkan: push constants over the
    # device's limit): the next form is loaded, and a module no form of which loads is a
    # CompileError naming the function.
    from gradloop import compiled

    refusals = []

    class Refusing(compiled._runtime.Function):
        def __init__(self, *args):
            if len(refusals) < refuse:
                refusals.append(args)
                raise ValueError("Error creating vm context with modules: INVALID_ARGUMENT")
            super().__init__(*args)

    monkeypatch.setattr(compiled._runtime, "Function", Refusing)
    x, n = f64(0.1, 0.2), gl.tensor(40)
    refuse = 1
    with pytest.warns(gl.errors.FormWarning, match=r"loop.*does not load.*INVALID_ARGUMENT"):
        fn = gl.jit(loop)
        got = fn(x, n)
    np.testing.assert_allclose(np.asarray(got), np.asarray(loop(x, n)), rtol=1e-10)
    assert len(refusals) == 1
    refuse = 10**6
    with (
        pytest.warns(gl.errors.FormWarning),
        pytest.raises(gl.errors.CompileError, match=r"double_sin.*does not load it in any form"),
    ):
        gl.jit(double_sin)(f64(0.1, 0.2))


def test_a_form_that_fails_at_run_time_gives_way_to_the_next_with_a_warning(monkeypatch) -> None:
    from gradloop import compiled

    class FailsOnce(compiled._runtime.Function):
        failed = False

        def __call__(self, *inputs, copy=True):
            if not FailsOnce.failed:
                FailsOnce.failed = True
                raise ValueError("c/runtime/src/iree/vm/ref.h:223: INVALID_ARGUMENT; ref is null")
            return super().__call__(*inputs, copy=copy)

    monkeypatch.setattr(compiled._runtime, "Function", FailsOnce)
    jitted = gl.jit(double_sin)
    x = f64(0.1, 0.2)
    with pytest.warns(gl.errors.FormWarning, match="ref is null"):
        got = jitted(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(double_sin(x)), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jitted(x)), np.asarray(got))  # the form stays


def test_a_form_that_returns_wrong_numbers_gives_way_to_the_next(monkeypatch) -> None:
    # IREE 3.13 miscompiles rare modules silently in any one form: the first call of each
    # signature is checked against the interpreter, and a form that disagrees gives way.
    from gradloop import compiled

    class WrongOnce(compiled._runtime.Function):
        wrong = False

        def __call__(self, *inputs, copy=True):
            results = super().__call__(*inputs, copy=copy)
            if not WrongOnce.wrong:
                WrongOnce.wrong = True
                return [np.asarray(r) + 1e-3 for r in results]
            return results

    monkeypatch.setattr(compiled._runtime, "Function", WrongOnce)
    x = f64(0.1, 0.2)
    with pytest.warns(gl.errors.FormWarning, match="differ from the reference interpreter"):
        got = gl.jit(double_sin)(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(double_sin(x)), rtol=1e-12)


def test_wrong_numbers_in_every_form_are_an_error_and_change_no_variable(monkeypatch) -> None:
    from gradloop import compiled

    class AlwaysWrong(compiled._runtime.Function):
        def __call__(self, *inputs, copy=True):
            return [np.asarray(r) * 2.0 for r in super().__call__(*inputs, copy=copy)]

    monkeypatch.setattr(compiled._runtime, "Function", AlwaysWrong)
    v = gl.Variable(np.array([1.0, 2.0]))

    def step(x):
        v.assign_add(x)
        return gl.sum(v.read() * x)

    with (
        pytest.warns(gl.errors.FormWarning),
        pytest.raises(gl.errors.ExecutionError, match=r"step.*differ from the reference") as e,
    ):
        gl.jit(step)(f64(0.5, 0.25))
    assert "test_compiled.py" in str(e.value)
    np.testing.assert_array_equal(np.asarray(v.read()), [1.0, 2.0])


def test_agreement_tolerates_float32_rounding_and_not_more() -> None:
    from gradloop.compiled import _agree

    want = np.array([1.0, -2.0, np.nan, np.inf], dtype=np.float32)
    assert _agree([want * np.float32(1 + 1e-6)], [want])
    assert not _agree([want * np.float32(1.01)], [want])
    assert not _agree([np.array([1, 2])], [np.array([1, 3])])
    assert not _agree([np.zeros(3)], [np.zeros(4)])


def test_loop_gradient_stacks_as_lists_of_buffer_views_compile_and_run() -> None:
    # EmitOptions.list_stacks (O(1) per push), the first form on llvm-cpu (_iree_build.forms_for),
    # is not gl.to_mlir's: a module in it is right.
    from gradloop import compiled

    args = (f64_wide(-0.8, 0.6), f64_wide(0.5, 0.1), gl.tensor(3, dtype=gl.int64))
    grad = gl.grad(sin_loop, argnums=(0, 1))
    concrete = gl.function(grad).concrete_function(*args)
    mlir = concrete.to_mlir(embed_captures=True, list_stacks=True)
    assert "!util.list<?>" in mlir and "!util.list<?>" not in gl.to_mlir(grad, *args)
    entry = compiled._runtime.Function(
        _iree_build.compile_mlir(mlir), "local-sync", concrete.graph.entry
    )
    got = entry(*[np.asarray(a) for a in args if isinstance(a, gl.Tensor)])
    for g, want in zip(got, leaves(grad(*args)), strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-10)


def test_export_runs_under_plain_iree_run_module(tmp_path) -> None:
    # iree-base-runtime installs it beside the interpreter of this environment.
    tool = os.path.join(os.path.dirname(sys.executable), "iree-run-module")
    tool = tool if os.path.exists(tool) else (shutil.which("iree-run-module") or tool)
    if not os.path.exists(tool):
        pytest.fail("iree-run-module is not installed (iree-base-runtime provides it)")
    w = f64(0.5, -1.5)

    def model(x, n):
        return gl.while_loop(lambda i, v: i < n, lambda i, v: (i + 1, gl.tanh(v * w) + v), (0, x))[
            1
        ]

    path = gl.export(model, f64(0.2, 0.4), gl.tensor(3), path=tmp_path / "model.vmfb")
    assert path.exists() and path.with_suffix(".mlir").exists()
    out = subprocess.run(
        [
            tool,
            f"--module={path}",
            "--function=model",
            "--device=local-task",
            "--input=2xf64=0.2 0.4",
            "--input=i32=3",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    want = model(f64(0.2, 0.4), gl.tensor(3)).numpy()
    got = np.array([float(v) for v in out.split("=")[-1].split()])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_exported_loop_gradient_runs_on_an_asynchronous_device(tmp_path) -> None:
    """`iree-run-module` runs on `local-task` by default, where the device runs behind the
    host: the gradient's stacks held as lists of buffer views failed there ("transient buffer
    has not been committed"), so exported modules keep their stacks in buffers."""
    tool = os.path.join(os.path.dirname(sys.executable), "iree-run-module")
    if not os.path.exists(tool):
        pytest.fail("iree-run-module is not installed (iree-base-runtime provides it)")

    def loop_loss(x, n):
        body = lambda i, v: (i + 1, v * 0.9 + gl.sin(v) * 0.1)  # noqa: E731
        return gl.while_loop(lambda i, v: i < n, body, (0, x))[1].sum()

    fn = gl.value_and_grad(loop_loss)
    x, n = f64_wide(0.3, -0.8), gl.tensor(25)
    path = gl.export(fn, x, n, path=tmp_path / "loss.vmfb")
    mlir = path.with_suffix(".mlir").read_text()
    assert "hal.tensor.export" not in mlir and "tensor.insert_slice" in mlir, "not buffers"
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "n.npy", n.numpy())
    outputs = [tmp_path / "value.npy", tmp_path / "grad.npy"]
    subprocess.run(
        [
            tool,
            f"--module={path}",
            "--function=loop_loss",
            "--device=local-task",
            f"--input=@{tmp_path / 'x.npy'}",
            f"--input=@{tmp_path / 'n.npy'}",
            *[f"--output=@{o}" for o in outputs],
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    for got, want in zip(outputs, leaves(fn(x, n)), strict=True):
        np.testing.assert_allclose(np.load(got), want, rtol=1e-10)


def test_bad_targets_are_clear_errors() -> None:
    with pytest.raises(gl.errors.InvalidArgumentError, match="unknown target"):
        gl.jit(lambda x: x, target="tpu")
    with pytest.raises(gl.errors.CompileError, match="float32"):
        gl.jit(lambda x: x * 2.0, target="vulkan-spirv")(f64(1.0))


def test_each_module_runs_on_the_driver_its_facts_choose() -> None:
    """llvm-cpu modules run on `local-sync` (a loop's trip synchronises with the host; a small
    call pays the pool's hand-off once), and those with dense ops on `local-task`'s pool; values
    agree either way."""

    rng = np.random.default_rng(3)
    a = gl.tensor(rng.standard_normal((256, 256)) / 16)

    def dense(x):
        return gl.tanh(x @ a) @ a

    def small(x):
        return gl.tanh(x * 0.5) + 1.0

    def small_loop(x):
        return gl.while_loop(lambda i, v: i < 5, lambda i, v: (i + 1, gl.sin(v) * 1.5), (0, x))[1]

    def dense_loop(x):
        return gl.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, gl.tanh(v @ a)), (0, x))[1]

    def dense_loop_gradient(x):
        # its stacks are lists of buffer views (the trip count is not known): local-sync
        def loss(x, n):
            counted = gl.while_loop(
                lambda i, v: i < n, lambda i, v: (i + 1, gl.tanh(v @ a)), (0, x)
            )
            return dense_loop(x).sum() + counted[1].sum()

        return gl.grad(loss)(x, gl.tensor(2))

    x = gl.tensor(rng.standard_normal((256, 256)))
    for fn, driver in (
        (dense, "local-task"),
        (small, "local-sync"),
        (small_loop, "local-sync"),
        (dense_loop, "local-task"),
        (dense_loop_gradient, "local-sync"),
    ):
        jitted = gl.jit(fn)
        np.testing.assert_allclose(np.asarray(jitted(x)), np.asarray(fn(x)), rtol=1e-9, atol=1e-12)
        (module,) = jitted._compiled.values()
        assert module.driver == driver, fn.__name__
    facts = {"loops": True, "heaviest_op": _iree_build.DENSE_WORK - 1}
    assert _iree_build.driver("llvm-cpu", facts) == "local-sync"
    assert _iree_build.driver("llvm-cpu", {**facts, "loops": False}) == "local-sync"
    dense_facts = {"loops": False, "heaviest_op": _iree_build.DENSE_WORK}
    assert _iree_build.driver("llvm-cpu", dense_facts) == "local-task"
    assert "hal.tensor.export" in gl.jit(dense_loop_gradient).mlir(x)  # the list form
    assert _iree_build.driver("vulkan-spirv", {"loops": False, "heaviest_op": 0}) == "vulkan"


def test_dense_modules_are_compiled_with_data_tiling_and_agree_with_eager(monkeypatch) -> None:
    """A CPU module with an op of `DENSE_WORK` or more compiles with `DENSE_FLAGS` (data
    tiling: W4 1.3x faster), a small one without; where IREE refuses the flags, the module
    compiles without them (here: a flag IREE does not know)."""

    seen: list[tuple[str, ...]] = []
    real = _iree_build.compile_mlir

    def spy(mlir, target="llvm-cpu", portable=False, cf=None, workaround_flags=(), uses_f64=None):
        seen.append(tuple(workaround_flags))
        return real(mlir, target, portable, cf, workaround_flags, uses_f64)

    monkeypatch.setattr(_iree_build, "compile_mlir", spy)
    rng = np.random.default_rng(5)
    a = gl.tensor(rng.standard_normal((256, 256)).astype(np.float32) / 16)
    x = gl.tensor(rng.standard_normal((256, 256)).astype(np.float32))

    def dense(x):
        return gl.tanh(x @ a) @ a + 1.0

    want = np.asarray(dense(x))
    np.testing.assert_allclose(np.asarray(gl.jit(dense)(x)), want, rtol=1e-5, atol=1e-5)
    assert seen == [_iree_build.DENSE_FLAGS]
    seen.clear()
    small = gl.jit(lambda x: gl.tanh(x * 0.5) + 1.0)
    np.testing.assert_allclose(np.asarray(small(x)), np.tanh(np.asarray(x) * 0.5) + 1.0, 1e-5, 1e-6)
    assert seen == [()]
    seen.clear()
    monkeypatch.setattr(_iree_build, "DENSE_FLAGS", ("--iree-no-such-flag-exists=true",))
    np.testing.assert_allclose(np.asarray(gl.jit(dense)(x)), want, rtol=1e-5, atol=1e-5)
    assert seen == [("--iree-no-such-flag-exists=true",), ()]


def data_loop(x, limit):
    """A loop whose condition reads the tensor state (a reduction) and carries an int, a float
    scalar and a tensor."""

    def cond(i, s, v):
        return gl.logical_and(gl.sum(v * v) < limit, i < 1000)

    def body(i, s, v):
        return i + 1, s + gl.sum(v), gl.cos(v) * 1.1 + 0.05 * gl.cast(i, v.dtype)

    return gl.while_loop(cond, body, (gl.tensor(0, dtype=gl.int32), gl.zeros((), x.dtype), x))


@pytest.mark.parametrize("limit", [0.0, 1.0, 4.0, 30.0, 60.0, 1e9])
def test_unrolled_loops_stop_on_the_same_iteration_as_eager(limit) -> None:
    """Loops of cheap ops run several predicated iterations per trip of the compiled loop; the
    iterations past the condition's end are discarded, whatever trip they fall in."""
    x = f64_wide(0.3, -0.2) * 0.6
    fn = gl.jit(data_loop)
    limit = gl.tensor(np.float64(limit))
    got = fn(x, limit)
    assert "stablehlo.select" in fn.mlir(x, limit)  # written unrolled
    want = data_loop(x, limit)
    assert int(got[0]) == int(want[0])
    for g, w in zip(got[1:], want[1:], strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [0, 1, 2, 31, 32, 33, 64, 100])
def test_unrolled_counting_loops_run_exactly_n_iterations(n) -> None:
    x = f64(0.1, 0.2)
    assert_compiled_matches_eager(loop, x, gl.tensor(n))


def recurrence(x, w, n):
    """h <- tanh(w h + x) for n steps: its gradient loop pops two stacks per iteration."""
    body = lambda i, h: (i + 1, gl.tanh(w * h + x))  # noqa: E731
    return gl.sum(gl.while_loop(lambda i, h: i < n, body, (0, x))[1] ** 2)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 16, 17, 30])
def test_gradient_loops_unroll_exactly_across_trip_boundaries(n) -> None:
    """A loop gradient counts down the forward loop's trips: compiled, it runs 8 iterations
    per trip while 8 or more are left, then one per trip; every stack is popped exactly as often
    as it was pushed, for any remainder."""
    x, w, steps = f64(0.3, -0.5, 0.8), f64(0.9, 1.1, -0.7), gl.tensor(n)
    grad = gl.grad(recurrence, argnums=(0, 1))
    jitted = gl.jit(grad)
    assert "arith.cmpi sge" in jitted.mlir(x, w, steps)  # the countdown, unrolled
    assert_compiled_matches_eager(grad, x, w, steps, jitted=jitted)
    # The second order: the gradient of the gradient loop, itself a loop with stacks.
    hess = gl.grad(lambda x, w, m: gl.sum(grad(x, w, m)[0] * w), argnums=1)
    assert_compiled_matches_eager(hess, x, w, steps)


def countdown_with_a_running_sum(x, n):
    """`while k > 0: k - 1`: a countdown of ops alone carrying a sum the device computes (the
    shape of a checkpointed loop's advance)."""

    def body(k, s, v):
        v = gl.sin(v) * 1.1 + 0.05
        return k - 1, s + gl.sum(v * v), v

    start = gl.cast(n, gl.int64)
    return gl.while_loop(lambda k, s, v: k > 0, body, (start, gl.zeros((), x.dtype), x))[1:]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 16, 21])
def test_countdowns_of_ops_with_a_running_sum_match_eager(n) -> None:
    """Unrolled 8 iterations a trip, then one a trip for the rest: values as eager mode's for
    any remainder, and the gradient through both loops."""
    x, steps = f64(0.3, -0.5, 0.8), gl.tensor(n)
    jitted = gl.jit(countdown_with_a_running_sum)
    assert "arith.cmpi sge" in jitted.mlir(x, steps)
    assert_compiled_matches_eager(countdown_with_a_running_sum, x, steps, jitted=jitted)
    grad = gl.grad(lambda x, m: gl.sum(countdown_with_a_running_sum(x, m)[0]))
    assert_compiled_matches_eager(grad, x, steps)


def bounded_recurrence(x, w, n, bound):
    body = lambda i, h: (i + 1, gl.tanh(w * h + x))  # noqa: E731
    _, h = gl.while_loop(lambda i, h: i < n, body, (0, x), maximum_iterations=bound)
    return gl.sum(h**2)


@pytest.mark.parametrize(("n", "bound"), [(0, 5), (3, 5), (9, 5), (40, 33), (33, 40), (70, 100)])
def test_forward_loops_with_pushes_unroll_keeping_only_the_iterations_run(n, bound) -> None:
    """A loop whose condition the host computes (a counter) runs several iterations per trip
    even while it pushes its gradient's stacks: every push of a trip lands, the stack's size and
    the `maximum_iterations` counter advance by the iterations kept, and the gradient loop pops
    exactly those, whether the condition or the bound stops the loop, on any iteration of a
    trip."""
    x, w, steps = f64_wide(0.3, -0.5), f64_wide(0.9, -0.7), gl.tensor(n)
    grad = gl.grad(lambda x, w, m: bounded_recurrence(x, w, m, bound), argnums=(0, 1))
    jitted = gl.jit(grad)
    mlir = jitted.mlir(x, w, steps)
    assert "stablehlo.select" in mlir and "hal.tensor.export" in mlir  # predicated, pushing
    assert_compiled_matches_eager(grad, x, w, steps, jitted=jitted)
    value = lambda x, w, m: bounded_recurrence(x, w, m, bound)  # noqa: E731
    assert_compiled_matches_eager(value, x, w, steps)


def energy_loop(x, w, limit, bound):
    """Runs h <- tanh(w h + x) until the energy sum |h|^2 reaches `limit` (a reduction of the
    state decides, on the device) or `bound` trips; the loss reads the energy and the state."""

    def cond(i, h, energy):
        return gl.logical_and(energy < limit, i < 1000)

    def body(i, h, energy):
        h = gl.tanh(w * h + x)
        return i + 1, h, energy + gl.sum(h * h)

    init = (0, x, gl.zeros((), x.dtype))
    _, h, energy = gl.while_loop(cond, body, init, maximum_iterations=bound)
    return energy + gl.sum(h)


@pytest.mark.parametrize(
    ("limit", "bound"), [(0.5, 50), (3.0, 50), (20.0, 50), (20.0, 9), (1e9, 37)]
)
def test_loops_the_device_decides_unroll_reading_back_once_a_trip(limit, bound) -> None:
    """A loop that pushes (its gradient's stacks) and counts its trips while a reduction of its
    state decides when it stops: the rank-0 state stays on the device within a trip, the
    counter `i` is computed on the host for every iteration, and the number of iterations kept
    is read back once, at the trip's end."""
    x, w = f64_wide(0.3, -0.5), f64_wide(0.9, -0.7)
    limit = gl.tensor(np.float64(limit))
    grad = gl.grad(lambda x, w, c: energy_loop(x, w, c, bound), argnums=(0, 1))
    jitted = gl.jit(grad)
    assert "stablehlo.select" in jitted.mlir(x, w, limit)  # predicated
    assert_compiled_matches_eager(grad, x, w, limit, jitted=jitted)
    value = lambda x, w, c: energy_loop(x, w, c, bound)  # noqa: E731
    assert_compiled_matches_eager(value, x, w, limit)


def test_loops_the_device_decides_index_on_the_host() -> None:
    """`xs[i]` in a loop whose state stays on the device within a trip: the index's wrap
    (`i < 0`, against a `fill` constant) is computed on the host with the counter, so that the
    slice's start is known there (on the device IREE read it back: a second wait per trip)."""
    xs = gl.tensor(np.linspace(-1.0, 1.0, 160).reshape(20, 8))

    def reading(x, w, limit):
        def cond(i, h, energy):
            return gl.logical_and(energy < limit, i < 20)

        def body(i, h, energy):
            h = gl.tanh(w * h + xs[i])
            return i + 1, h, energy + gl.sum(h * h)

        init = (0, x, gl.zeros((), x.dtype))
        _, h, energy = gl.while_loop(cond, body, init, maximum_iterations=20)
        return energy + gl.sum(h)

    grad = gl.grad(reading, argnums=(0, 1))
    for limit in (0.5, 5.0, 1e9):
        args = (f64_wide(0.3, -0.5), f64_wide(0.9, -0.7), gl.tensor(np.float64(limit)))
        jitted = gl.jit(grad)
        mlir = jitted.mlir(*args)
        assert "stablehlo.select" in mlir  # predicated, state on the device
        device_index = [line for line in mlir.splitlines() if "stablehlo.compare LT" in line]
        assert not [line for line in device_index if "tensor<i32>" in line], device_index[:1]
        assert_compiled_matches_eager(grad, *args, jitted=jitted)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["floor", "ceil", "round"])
def test_rounding_of_a_loop_scalar_runs_on_the_host(name, dtype) -> None:
    """floor, ceil and round of a rank-0 loop variable are `math` ops in IREE's VM (the
    checkpoint schedule halves its gaps so): no dispatch and read-back per trip, and the
    values numpy gives, ties to even."""
    op = getattr(gl, name)

    def rounded(x):
        def body(i, s):
            return i + 1, s + op(s * 0.25 + gl.cast(i, x.dtype) + 0.5)

        return gl.while_loop(lambda i, s: i < 6, body, (gl.tensor(0), x))[1]

    x = gl.tensor(np.array(1.5, dtype=dtype))
    jitted = gl.jit(rounded)
    mlir = jitted.mlir(x)
    mnemonic = {"floor": "math.floor", "ceil": "math.ceil", "round": "math.roundeven"}[name]
    assert mnemonic in mlir and "stablehlo.round" not in mlir and f"stablehlo.{name}" not in mlir
    want, rule = np.array(1.5, dtype=dtype), getattr(np, name)
    for i in range(6):
        want = want + rule(want * np.asarray(0.25, dtype) + np.asarray(i + 0.5, dtype))
    assert np.asarray(jitted(x)) == want
    assert_compiled_matches_eager(rounded, x, jitted=jitted)


def test_results_stay_the_callers_after_later_calls() -> None:
    """Results are copied out of IREE's buffers into tensors once (the runtime hands back views
    of mapped result buffers): a later call, which may reuse buffers, changes no earlier result."""
    fn = gl.jit(lambda x: (gl.sin(x) * 2.0, x + 1.0))
    first = fn(f64(0.1, 0.2, 0.3))
    kept = [np.asarray(r).copy() for r in first]
    for k in range(5):
        fn(f64(k, 2.0 * k, 3.0 * k))
    for r, want in zip(first, kept, strict=True):
        np.testing.assert_array_equal(np.asarray(r), want)
    np.testing.assert_allclose(kept[0], 2.0 * np.sin([0.1, 0.2, 0.3]), rtol=1e-12)


# ---- bounded emission and compile time ------------------------------------------------------


def forwarding_loop(c0, c1, c2):
    """One trip; the body forwards one loop variable into another's place and makes constants."""
    return gl.while_loop(
        lambda x0, i, x2: i == 0.0,
        lambda x0, x1, x2: (gl.zeros_like(x0), gl.ones_like(x1), x0),
        (c0, c1, c2),
    )


FORWARDING_ARGS = (1.5, 0.0, 2.5)


def test_unrolling_a_loop_of_constants_emits_a_small_module_in_bounded_memory() -> None:
    # Each unrolled iteration selected between constants whose keys nested those before: the
    # emitter's memory doubled per iteration until the machine's was gone. In a child process
    # under a memory limit, so that a regression fails here instead of taking the suite down.
    script = textwrap.dedent(
        """
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        import numpy as np
        import gradloop as gl
        from test_compiled import forwarding_loop, FORWARDING_ARGS
        args = [gl.tensor(np.float64(v)) for v in FORWARDING_ARGS]
        concrete = gl.function(forwarding_loop).concrete_function(*args)
        text, facts = concrete.mlir_module(unroll_loops=True)
        assert facts["unrolled_loops"], facts
        print(len(text))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(__file__),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.strip()) < 200_000


def test_a_loop_forwarding_a_variable_into_another_compiles_and_agrees() -> None:
    args = [gl.tensor(np.float64(v)) for v in FORWARDING_ARGS]
    assert_compiled_matches_eager(forwarding_loop, *args)

    def loss(c0, c1, c2):
        out = forwarding_loop(c0 * 2.0, c1, c2 * c0)
        return out[0] + out[1] * 3.0 + out[2] * out[2]

    grads = gl.grad(loss, argnums=(0, 1, 2))
    assert_compiled_matches_eager(grads, *args)


def mixed_dtype_loop(i, a, b, c, d, e):
    """A 3-trip loop over six loop variables of five dtypes, then a `cond` on its counter."""

    def body(i, a, b, c, d, e):
        return (
            i + 1,
            a * 1.5 + 1.0,
            b - 0.5 * gl.cast(c, gl.float64),
            c + 2,
            d * 2,
            gl.logical_not(e),
        )

    i, a, b, c, d, e = gl.while_loop(lambda i, *rest: i < 3, body, (i, a, b, c, d, e))
    return gl.cond(i > 2, lambda: (a * 2.0, b, d, e), lambda: (a, b * 3.0, d + 1, e))


def test_a_loop_over_many_mixed_dtype_variables_compiles_and_agrees() -> None:
    args = (
        gl.tensor(np.int32(0)),
        gl.tensor(np.array([1.0, 2.0], np.float32)),
        gl.tensor(np.array([1.0, 2.0])),
        gl.tensor(np.array([1, 2], np.int32)),
        gl.tensor(np.array([1, 2], np.int64)),
        gl.tensor(np.array([True, False])),
    )
    assert_compiled_matches_eager(mixed_dtype_loop, *args, rtol=1e-6)
    grad = gl.grad(lambda b, *rest: gl.sum(mixed_dtype_loop(rest[0], rest[1], b, *rest[2:])[1]))
    assert_compiled_matches_eager(grad, args[2], args[0], args[1], *args[3:])


@pytest.mark.usefixtures("private_cache")
def test_a_compile_past_its_time_limit_is_stopped_and_not_cached(tmp_path, monkeypatch) -> None:
    from gradloop import _compiler

    monkeypatch.setattr(_iree_build, "_memory_cache", {})  # compiled by earlier tests
    monkeypatch.setenv("GRADLOOP_COMPILE_TIMEOUT_S", "0.001")
    fn = gl.jit(double_sin)
    x = f64(0.1, 0.2)
    started = time.monotonic()
    with pytest.raises(gl.errors.CompileTimeoutError, match="did not finish compiling"):
        fn(x)
    assert time.monotonic() - started < 30  # two forms at most, each stopped at once
    with pytest.raises(_compiler.CompileTimeout):
        _compiler.compile_to_vm(
            gl.to_mlir(double_sin, x), _iree_build.target_flags("llvm-cpu", True)
        )
    assert not list((tmp_path / "cache").glob("*.error"))
    monkeypatch.delenv("GRADLOOP_COMPILE_TIMEOUT_S")
    # a fresh compiler process takes the next compile
    np.testing.assert_allclose(np.asarray(gl.jit(double_sin)(x)), 2 * np.sin([0.1, 0.2]))


def halved_cos(x):
    return gl.cos(x) * 0.5


def test_an_interrupted_compile_leaves_no_answer_for_the_next(monkeypatch) -> None:
    # A compile interrupted while it waits (Ctrl-C, a test's time limit) left the worker's
    # answer in the pipe: the next compile read it as its own, or both sides blocked writing.
    from gradloop import _compiler

    flags, x = _iree_build.target_flags("llvm-cpu", True), f64(0.1, 0.2)
    read = _compiler._Worker._read

    def interrupted(self, *args):
        monkeypatch.setattr(_compiler._Worker, "_read", read)
        raise KeyboardInterrupt

    monkeypatch.setattr(_compiler._Worker, "_read", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _compiler.compile_to_vm(gl.to_mlir(double_sin, x), flags)
    vm = _compiler.compile_to_vm(gl.to_mlir(halved_cos, x), flags)
    assert "halved_cos" in vm and "double_sin" not in vm


def test_a_module_over_a_dispatch_limit_as_it_loads_is_a_compile_error(monkeypatch) -> None:
    # IREE's runtime refuses a dispatch with more push constants than its limit as the module
    # loads, with a builtin IndexError: that becomes the next form, then a CompileError.
    from gradloop import compiled

    class Refusing(compiled._runtime.Function):
        def __init__(self, *args):
            raise IndexError("dispatch requiring 65 constants exceeds limit of 64")

    monkeypatch.setattr(compiled._runtime, "Function", Refusing)
    with (
        pytest.warns(gl.errors.FormWarning, match="65 constants"),
        pytest.raises(gl.errors.CompileError, match=r"double_sin.*65 constants exceeds"),
    ):
        gl.jit(double_sin)(f64(0.1, 0.2))


def test_a_forked_child_compiles_with_a_compiler_process_of_its_own() -> None:
    from gradloop import _compiler

    x = f64(0.1, 0.2)
    text, flags = gl.to_mlir(double_sin, x), _iree_build.target_flags("llvm-cpu", True)
    assert _compiler.compile_to_vm(text, flags)  # the parent's compiler process is running
    parents = _compiler._worker.process.pid
    with warnings.catch_warnings():
        # JAX, if an earlier test of this process imported it, warns that its threads make a
        # fork unsafe; the child touches nothing of JAX's.
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        pid = os.fork()
    if pid == 0:  # the child: the parent's pipes are not its to use
        code = 1
        try:
            compiled_here = _compiler.compile_to_vm(text, flags)
            code = 0 if compiled_here and _compiler._worker.process.pid != parents else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's compile did not finish")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert _compiler.compile_to_vm(text, flags)  # and the parent's still answers


def test_results_read_from_mapped_buffers_keep_dtype_shape_and_values() -> None:
    """CPU results are read straight from their mapped buffers after the first call: bools
    (stored in bytes), empty, rank-0 and several results at once, call after call."""

    def fn(x, y):
        return x > 0.0, x[:0], y.sum(), gl.cast(y, gl.int64) + 1

    jitted = gl.jit(fn)
    rng = np.random.default_rng(5)
    for _ in range(3):
        x, y = rng.standard_normal(7), rng.standard_normal((2, 3))
        got = [np.asarray(r) for r in jitted(gl.tensor(x), gl.tensor(y))]
        want = [np.asarray(r) for r in fn(gl.tensor(x), gl.tensor(y))]
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
    (module,) = jitted._compiled.values()
    assert module.entry._mapped is not None and all(d is not None for d in module.entry._mapped)


def _dylib_placeholders() -> list[str]:
    """The files IREE's loader reserved with `mkstemp` that this process holds open."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if re.fullmatch(r"iree_dylib_[A-Za-z0-9]{6}", os.path.basename(target)):
            found.append(target)
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux's /proc/self/fd")
def test_loading_many_modules_leaves_no_open_file_behind() -> None:
    # A process allowed 48 more open files loads a module 80 times (IREE's loader leaked one
    # open file per load of a system shared library, as `gl.jit` links them).
    import resource

    from gradloop import _runtime

    text = "func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {\n"
    text += "  %y = stablehlo.sine %x : tensor<3xf32>\n  return %y : tensor<3xf32>\n}\n"
    vmfb = _iree_build.compile_mlir(text, "llvm-cpu")
    x = np.array([0.1, 0.2, 0.3], np.float32)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    allowed = min(len(os.listdir("/proc/self/fd")) + 48, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (allowed, hard))
    try:
        for _ in range(80):
            (got,) = _runtime.Function(vmfb, "local-sync", "main")(x)
            np.testing.assert_allclose(got, np.sin(x), rtol=1e-6)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert _dylib_placeholders() == []


def adaptive_pendulum(damping: gl.Tensor) -> gl.Tensor:
    """An adaptive ODE solve (Heun-Euler 2(1), accept or reject by `cond` inside a
    `while_loop`) of a damped pendulum, its state a float64[2]: the final angle squared."""

    def rate(y):
        return gl.stack([y[1], -damping * y[1] - gl.sin(y[0])])

    def more(t, y, h, steps):
        return t < 3.0

    def step(t, y, h, steps):
        h = gl.minimum(h, 3.0 - t)
        k1 = rate(y)
        k2 = rate(y + h * k1)
        y_new = y + h * 0.5 * (k1 + k2)
        error = h * 0.5 * (k2 - k1)
        scale = 1e-8 + gl.maximum(gl.abs(y), gl.abs(y_new)) * 1e-5
        norm = gl.stop_gradient(gl.sqrt(gl.mean((error / scale) ** 2.0)))
        factor = gl.minimum(5.0, gl.maximum(0.2, 0.9 * gl.maximum(norm, 1e-10) ** -0.5))
        return gl.cond(
            norm < 1.0,
            lambda: (t + h, y_new, h * factor, steps + 1),
            lambda: (t, y, h * factor, steps),
        )

    start = (gl.zeros((), gl.float64), f64(1.0, 0.0), gl.tensor(np.float64(0.01)), 0)
    _, y, _, _ = gl.while_loop(more, step, start)
    return y[0] ** 2.0


def test_small_vectors_in_loops_are_host_scalars_and_agree_with_eager() -> None:
    """A loop over a float64[2] state (an ODE solver's) holds it as two host scalars: the loop
    and its gradient carry no tensor, so no trip waits for a device dispatch; the value and
    gradient agree with eager mode."""
    damping = gl.tensor(np.float64(0.3))
    grad = gl.value_and_grad(adaptive_pendulum)
    jitted = gl.jit(grad)
    mlir = jitted.mlir(damping)
    loops = [line for line in mlir.splitlines() if "scf.while" in line]
    assert len(loops) == 2, loops  # the solve and its gradient
    for loop in loops:  # float64 values and stacks alike on the host
        assert not re.search(r"tensor<[^>]*f64>", loop.split("->")[-1]), loop[:300]
    assert "math.sin" in mlir and "stablehlo.sine" not in mlir
    assert_compiled_matches_eager(grad, damping, rtol=1e-11, jitted=jitted)
    for value in (0.0, 0.7):
        assert_compiled_matches_eager(adaptive_pendulum, gl.tensor(np.float64(value)), rtol=1e-11)


def test_small_matrices_held_as_host_scalars_agree_with_eager() -> None:
    """2x1 and 2x2 values held as host scalars and rebuilt into tensors for a product in a loop,
    and a host 2-vector reshaped and broadcast into columns of a device tensor: IREE computes a
    `from_elements` into a tensor of rank 2 wrongly (`_workarounds`: `multi_dim_from_elements`),
    so these must be built 1-D and reshaped."""
    rng = np.random.default_rng(3)
    x = gl.tensor(rng.standard_normal((2, 1)) * 0.3)
    w = gl.tensor(rng.standard_normal((2, 2)) * 0.5)

    def block(x, w):
        step = lambda v: gl.tanh(gl.matmul(w, v)) * 1.5 + v  # noqa: E731
        h = gl.while_loop(lambda v: (v * v).sum() < 4.0, step, x)
        return gl.sin(h) * w.sum()

    assert_compiled_matches_eager(block, x, w)
    assert_compiled_matches_eager(gl.grad(lambda x, w: block(x, w).sum(), argnums=(0, 1)), x, w)

    def columns(v, m):
        body = lambda i, v: (i + 1, gl.sin(v) + 0.1)  # noqa: E731
        v = gl.while_loop(lambda i, v: i < 3, body, (0, v))[1]
        return gl.reshape(v, (2, 1)) * m + gl.expand_dims(v, 1), gl.reshape(v * 2.0, (2, 1))

    assert_compiled_matches_eager(columns, f64(0.3, -0.4), gl.tensor(np.arange(6.0).reshape(2, 3)))


def test_the_compile_worker_dies_with_its_parent_even_mid_compile(tmp_path) -> None:
    """A worker busy in a compile does not read its pipe (stopped here to stand for that):
    when the process that started it dies, the kernel kills it, so no orphan keeps a core."""
    import signal

    code = (
        "from gradloop import _compiler\n"
        "_compiler.warm_up()\n"
        "print(_compiler._worker.process.pid, flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    time.sleep(1.0)  # the worker has asked for its parent-death signal
    os.kill(worker, signal.SIGSTOP)
    parent.kill()
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = pathlib.Path(f"/proc/{worker}/stat")
        if not state.exists() or state.read_text().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        os.kill(worker, signal.SIGKILL)
        raise AssertionError("the stopped worker outlived its parent")
