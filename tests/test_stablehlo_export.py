"""Pure StableHLO out (`gl.to_mlir(..., dialect="stablehlo")`, `gl.export(..., format=
"stablehlo")`): modules of `func` and `stablehlo` ops alone, run by consumers that are not
gradloop — IREE (`--iree-input-type=stablehlo`), the StableHLO reference interpreter (jaxlib's
`eval_module`) and XLA through JAX — on values and gradients, against eager mode; random
programs too. Loop gradients keep fixed-size state: checkpoints, or one slot per possible trip
under `maximum_iterations`."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import gradloop as gl
from gradloop import _iree_build
from program_fuzz import Program, programs

pytestmark = pytest.mark.slow

jax = pytest.importorskip("jax", reason="the StableHLO consumers here come with JAX")
jax.config.update("jax_enable_x64", True)

from jax._src.interpreters import mlir as jax_mlir  # noqa: E402
from jaxlib.mlir import ir  # noqa: E402
from jaxlib.mlir.dialects import stablehlo  # noqa: E402

#: The public function's name: bare, or quoted (`@"<lambda>"`).
ENTRY = re.compile(r'func\.func @("[^"]*"|[\w.$]+)')

#: What a pure module may hold besides `stablehlo.*`.
ALLOWED = {"builtin.module", "func.func", "func.return"}


def op_names(text: str) -> set[str]:
    """Every op in the module, parsed by jaxlib's MLIR (a consumer's parser, not ours)."""
    names: set[str] = set()

    def visit(op):
        names.add(op.name)
        return ir.WalkResult.ADVANCE

    with jax_mlir.make_ir_context():
        ir.Module.parse(text).operation.walk(visit)
    return names


def assert_pure(text: str) -> None:
    foreign = {n for n in op_names(text) if n not in ALLOWED and not n.startswith("stablehlo.")}
    assert not foreign, f"not StableHLO: {sorted(foreign)}"


def reference(text: str, *args: np.ndarray) -> list[np.ndarray]:
    """The module run by the StableHLO reference interpreter."""
    with jax_mlir.make_ir_context():
        module = ir.Module.parse(text)
        out = stablehlo.eval_module(module, [ir.DenseElementsAttr.get(np.asarray(a)) for a in args])
        return [np.asarray(o) for o in out]


def iree(text: str, *args: np.ndarray) -> list[np.ndarray]:
    """The module compiled by IREE as StableHLO input and run. Through `compile_mlir`, which
    adds nothing to the module but IREE's flags (f64 kept, libm linked) and the repairs of
    IREE 3.13's VM bytecode encoder (`_vm_repair.py`): without them a second-order gradient
    fails to run ("indirect buffer reference slot 0 is out range")."""
    from iree import runtime as rt

    vmfb = _iree_build.compile_mlir(text, "llvm-cpu", cf=False)
    ctx = rt.SystemContext(config=rt.Config("local-sync"))
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
    name = ENTRY.search(text).group(1).strip('"')
    out = ctx.modules.module[name](*args)
    out = out if isinstance(out, (tuple, list)) else [out]
    return [np.asarray(o) for o in out]


def xla(text: str, *args: np.ndarray) -> list[np.ndarray]:
    """The module compiled and run by XLA, through jaxlib's client as `gl.jit(backend="xla")`
    hands it over: the public function renamed `main`, nothing else changed."""
    from gradloop import _xla

    name = "main" if "@main(" in text else ENTRY.search(text).group(1).strip('"')
    return _xla._executable(text, name, "llvm-cpu")(*[np.asarray(a) for a in args])


CONSUMERS = {"reference": reference, "iree": iree, "xla": xla}


def run_everywhere(fn, *args: gl.Tensor) -> str:
    """`fn`'s pure StableHLO module, checked pure and run by every consumer against eager."""
    text = gl.to_mlir(fn, *args, dialect="stablehlo")
    assert_pure(text)
    want = fn(*args)
    want = [np.asarray(w) for w in (want if isinstance(want, (tuple, list)) else [want])]
    arrays = [np.asarray(a) for a in args]
    for name, consumer in CONSUMERS.items():
        got = consumer(text, *arrays)
        assert len(got) == len(want), name
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14, err_msg=name)
    return text


def f64(*values: float) -> gl.Tensor:
    return gl.tensor(np.array(values, dtype=np.float64))


def grow(x):
    """A loop whose trip count depends on the data, a `cond` inside it."""

    def body(i, y):
        return i + 1, gl.cond(gl.sum(y) > 1.0, lambda: y * 1.5, lambda: y + 0.3)

    _, y = gl.while_loop(lambda i, y: gl.sum(y) < 40.0, body, (gl.tensor(0), x))
    return gl.sum(y * y)


def test_a_data_dependent_loop_and_its_gradient_run_in_every_consumer() -> None:
    x = f64(0.3, 2.0, 5.0)
    text = run_everywhere(grow, x)
    assert "stablehlo.while" in text and "stablehlo.if" in text
    text = run_everywhere(gl.grad(grow), x)
    # the gradient of an unbounded loop keeps DEFAULT_CHECKPOINTS snapshots of its state
    assert "tensor<101x3xf64>" in text


def test_a_bounded_loop_keeps_one_slot_per_possible_trip() -> None:
    """`maximum_iterations` bounds the loop: its gradient's buffers have one row per trip, so
    no trip is advanced again and no schedule runs (no `[c]` integer vectors); `switch_case`
    inside it becomes `stablehlo.case`."""

    def switched(x):
        def body(i, y):
            k = gl.cast(gl.abs(gl.sin(gl.sum(y) * 3.0)) * 2.9, gl.int32)
            branches = [lambda: y * 1.1, lambda: gl.sin(y) + y, lambda: y * y * 0.5 + 1.0]
            return i + 1, gl.switch_case(k, branches)

        _, y = gl.while_loop(
            lambda i, y: gl.sum(y) < 30.0, body, (gl.tensor(0), x), maximum_iterations=12
        )
        return gl.sum(gl.tanh(y))

    x = f64(0.5, -0.25, 0.75)
    run_everywhere(switched, x)
    text = run_everywhere(gl.grad(switched), x)
    assert "stablehlo.case" in text and re.search(r"tensor<12x\d+xf64>", text)
    assert "tensor<12xi64>" not in text  # the schedule's slot vector


def test_a_loose_bound_checkpoints_instead_of_a_buffer_of_every_state() -> None:
    """`maximum_iterations=10**6` is a safety net, not a size: a buffer of every state could
    exhaust memory, so the gradient keeps the default checkpoints."""

    def loose(x):
        def body(i, y):
            return i + 1, gl.sin(y) * 0.1 + y * 1.2

        _, y = gl.while_loop(
            lambda i, y: gl.sum(y) < 10.0, body, (gl.tensor(0), x), maximum_iterations=10**6
        )
        return gl.sum(y * y)

    x = f64(0.5, 0.25)
    text = gl.to_mlir(gl.grad(loose), x, dialect="stablehlo")
    assert "tensor<101x2xf64>" in text and "1000001x" not in text
    np.testing.assert_allclose(reference(text, np.asarray(x))[0], gl.grad(loose)(x), rtol=1e-12)


def pendulums(x, n):
    """`n` symplectic Euler steps (a run-time input) of two pendulums: a loop no bound sizes,
    whose gradient stays of order one over thousands of trips."""

    def body(i, q, p):
        p = p - 0.01 * gl.sin(q)
        return i + 1, q + 0.01 * p, p

    _, q, p = gl.while_loop(lambda i, q, p: i < n, body, (gl.tensor(0), x, x * 0.5))
    return gl.sum(q * q * q + p)


@pytest.mark.parametrize("trips", [40, 2500], ids=["rows", "past-the-rows"])
def test_an_unbounded_loop_keeps_rows_while_its_trips_fit_and_checkpoints_past_them(
    trips,
) -> None:
    """No bound: the gradient writes a row per trip (2,048 rows here) and, only for a loop that
    outgrows them, runs the checkpointed form (101 snapshots) from the loop's start. Both
    branches, first and second order, against eager (stacks) and finite differences."""
    x, n = f64(0.5, -0.25), gl.tensor(trips)
    grad = gl.grad(pendulums)
    text = gl.to_mlir(grad, x, n, dialect="stablehlo")
    assert_pure(text)
    # rows (a trip's residuals joined into one) and the snapshots of the state
    assert re.search(r"tensor<2048x\d+xf64>", text) and "tensor<101x2xf64>" in text
    want = np.asarray(grad(x, n))
    for name in ("xla", "iree"):
        np.testing.assert_allclose(
            CONSUMERS[name](text, np.asarray(x), np.asarray(n))[0], want, rtol=1e-12, err_msg=name
        )
    assert_close_to_differences(lambda v: pendulums(gl.tensor(v), n), np.asarray(x), want)
    second = gl.grad(lambda x, n: gl.sum(gl.grad(pendulums)(x, n) * f64(1.0, 0.5)))
    text = gl.to_mlir(second, x, n, dialect="stablehlo")
    np.testing.assert_allclose(
        xla(text, np.asarray(x), np.asarray(n))[0], np.asarray(second(x, n)), rtol=1e-11
    )


def assert_close_to_differences(f, x: np.ndarray, got: np.ndarray, h: float = 1e-6) -> None:
    for k in range(x.size):
        e = np.zeros_like(x)
        e[k] = h
        diff = (float(f(x + e)) - float(f(x - e))) / (2 * h)
        np.testing.assert_allclose(got[k], diff, rtol=1e-6, atol=1e-9)


@pytest.mark.long
def test_nested_loops_second_order_and_explicit_checkpoints() -> None:
    def nested(x):
        def outer(j, y):
            def inner(i, z):
                return i + 1, gl.sin(z) * 0.1 + 1.2 * z

            _, y = gl.while_loop(
                lambda i, z: gl.sum(z * z) < 9.0 + gl.cast(j, gl.float64),
                inner,
                (gl.tensor(0), y),
                checkpoints=3,
            )
            return j + 1, y * 0.9

        _, y = gl.while_loop(lambda j, y: j < 3, outer, (gl.tensor(0), x))
        return gl.sum(y)

    x = f64(0.4, 0.9)
    run_everywhere(nested, x)
    text = run_everywhere(gl.grad(nested), x)
    assert "tensor<4x2xf64>" in text  # the inner loop's own checkpoints=3
    run_everywhere(gl.grad(lambda x: gl.sum(gl.grad(nested)(x) * x)), x)


def test_forward_mode_and_a_hessian() -> None:
    x = f64(0.3, 2.0, 5.0)
    run_everywhere(lambda x: gl.jvp(grow, (x,), (f64(1.0, -0.5, 0.25),))[1], x)
    run_everywhere(gl.hessian(lambda x: grow(x[:1] * x) * 1e-3), f64(0.7))


def test_export_writes_a_portable_artifact_and_its_text(tmp_path) -> None:
    x = f64(0.3, 2.0, 5.0)
    out = gl.export(gl.grad(grow), x, path=tmp_path / "grad.mlirbc", format="stablehlo")
    text = out.with_suffix(".mlir").read_text()
    assert_pure(text)
    with jax_mlir.make_ir_context() as ctx:
        back = str(stablehlo.deserialize_portable_artifact(ctx, out.read_bytes()))
    assert_pure(back)
    got = reference(back, np.asarray(x))
    np.testing.assert_allclose(got[0], np.asarray(gl.grad(grow)(x)), rtol=1e-12)


def test_a_loop_that_assigns_a_variable_exports_with_its_gradient() -> None:
    """Variables are values in a module: the loop carries the assigned one, so recomputing
    trips from checkpoints repeats no assignment; the module takes the Variable's value after
    `x` and returns its final value after the gradient."""
    v = gl.Variable(np.zeros(2))

    def assigning(x):
        def body(i, y):
            v.assign_add(y)
            return i + 1, gl.sin(y) * 1.5

        return gl.sum(gl.while_loop(lambda i, y: i < 3, body, (gl.tensor(0), x))[1])

    x = f64(0.1, 0.2)
    text = gl.to_mlir(gl.grad(assigning), x, dialect="stablehlo")
    assert_pure(text)
    grad, assigned = reference(text, np.asarray(x), np.zeros(2))
    np.testing.assert_allclose(grad, np.asarray(gl.grad(assigning)(x)), rtol=1e-12)
    np.testing.assert_allclose(assigned, np.asarray(v.read()), rtol=1e-12)


def test_bad_dialects_and_formats_are_typed_errors() -> None:
    x = f64(0.1, 0.2)
    with pytest.raises(gl.errors.InvalidArgumentError, match="dialect"):
        gl.to_mlir(grow, x, dialect="hlo")
    with pytest.raises(gl.errors.InvalidArgumentError, match="format"):
        gl.export(grow, x, path="unused.bin", format="onnx")


def jax_loop(x):
    """A JAX program JAX cannot reverse-differentiate: a data-dependent `lax.while_loop` with
    a `lax.cond` inside."""
    import jax.numpy as jnp

    def cond(s):
        return jnp.sum(s[1] * s[1]) < 50.0

    def body(s):
        i, y = s
        y = jax.lax.cond(jnp.sum(y) > 1.0, lambda y: y * 1.3 + jnp.sin(y), lambda y: y + 0.3, y)
        return i + 1, y

    return jnp.sum(jnp.tanh(jax.lax.while_loop(cond, body, (0, x))[1]))


def as_main(text: str, name: str) -> str:
    """`text` with `@name` as its `@main` (the function consumers run), `@main` renamed."""
    return text.replace("@main(", "@main_primal(").replace(f"@{name}(", "@main(")


def test_a_jax_export_comes_back_pure_with_its_gradient_and_tangent(tmp_path) -> None:
    """JAX's export of a loop `jax.grad` refuses, through `gl.mlir.grad` and `gl.mlir.jvp`
    (and the command line) with `dialect="stablehlo"`: pure StableHLO whose derivatives the
    reference interpreter and XLA compute as finite differences say."""
    import jax.numpy as jnp

    x = np.array([0.3, 0.5, 0.9])
    exported = jax.export.export(jax.jit(jax_loop))(jax.ShapeDtypeStruct((3,), jnp.float64))
    text = exported.mlir_module()
    eps = 1e-6
    fd = np.array([(jax_loop(x + eps * e) - jax_loop(x - eps * e)) / (2 * eps) for e in np.eye(3)])
    grad = gl.mlir.grad(text, dialect="stablehlo")
    assert_pure(grad)
    for consumer in (reference, xla):
        np.testing.assert_allclose(consumer(as_main(grad, "main_grad"), x)[0], fd, rtol=1e-6)
    tangent = np.array([1.0, -0.5, 0.25])
    jvp = gl.mlir.jvp(text, dialect="stablehlo")
    assert_pure(jvp)
    value, dot = reference(as_main(jvp, "main_jvp"), x, tangent)
    np.testing.assert_allclose(value, jax_loop(x), rtol=1e-12)
    np.testing.assert_allclose(dot, fd @ tangent, rtol=1e-6)
    # the command line, with its own checkpoints
    source, out = tmp_path / "loop.mlir", tmp_path / "loop_grad.mlir"
    source.write_text(text)
    from gradloop import cli

    args = [str(source), "-o", str(out), "--format", "stablehlo", "--checkpoints", "4"]
    assert cli.main(["grad", *args]) == 0
    written = out.read_text()
    assert_pure(written)
    assert "tensor<5x3xf64>" in written  # 4 snapshots and the row for states not kept
    np.testing.assert_allclose(reference(as_main(written, "main_grad"), x)[0], fd, rtol=1e-6)
    with pytest.raises(gl.errors.InvalidArgumentError, match="dialect"):
        gl.mlir.grad(text, dialect="xla")


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs(heavy=False))
def test_random_programs_agree_with_eager_in_the_reference_interpreter(spec) -> None:
    """Random nested control flow: value and gradient as pure StableHLO, run by the reference
    interpreter, against eager; Variables a loop assigns come back as the module's last
    results, equal to their values after the eager call."""
    program = Program(spec)
    x = gl.tensor(np.array([0.41, -0.23, 0.37]))

    def both(x):
        return program(x), gl.grad(program)(x)

    program.reset()
    text = gl.to_mlir(both, x, dialect="stablehlo")
    assert_pure(text)
    concrete = gl.function(both).fixed_state_function(100, x)
    handles = [c for c in concrete.captured_inputs if hasattr(c, "read")]
    got = reference(text, np.asarray(x), *[np.asarray(h.read()) for h in handles])
    want = [np.asarray(w) for w in both(x)]
    assigned = [concrete.captured_inputs[k] for k in concrete.assigned_variables]
    want += [np.asarray(h.read()) for h in assigned]
    program.reset()
    assert len(got) == len(want), spec
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, err_msg=str(spec))
