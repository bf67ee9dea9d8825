"""Canaries: each asserts that one IREE bug gradloop works around (`gradloop._workarounds`) is
still there, on the workaround's reproducer (or a module distilled from it) compiled without
the workaround. A canary that fails means IREE fixed its bug: retire the workaround and its
entry (`py/gradloop/_workarounds.py`)."""

from __future__ import annotations

import ast
import pathlib
import re

import numpy as np
import pytest

import gradloop as gl
from gradloop import _compiler, _iree_build, _runtime, _workarounds
from program_fuzz import Program
from test_fuzz_modes import outputs
from test_mode_agreement import (
    A_SWITCH_PASSING_ONE_BUFFER_TWICE,
    ONLY_WITHOUT_MULTI_USE_FUSION,
    cond_while_cond,
)

#: IREE compiles (or hundreds of programs): `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent


def compile_text(text: str) -> bytes:
    """`text` compiled for this CPU as it is (`scf`, IREE's default flags)."""
    return _iree_build.compile_mlir(text, "llvm-cpu", False, False, (), False)


def module_of(fn, *args, **form):
    """The concrete function of `fn` on `args` and its MLIR in `form` (captures embedded)."""
    concrete = gl.function(fn).concrete_function(*args)
    mlir, facts = concrete.mlir_module(embed_captures=True, **form)
    return concrete, mlir, facts


def run(concrete, vmfb: bytes, *args, driver: str = "local-sync") -> list[np.ndarray]:
    """The module's results on `args` and the values of the Variables the function reads (its
    other captures are embedded)."""
    from gradloop import _core

    variables = [c.read() for c in concrete.captured_inputs if isinstance(c, _core.VariableHandle)]
    entry = _runtime.Function(vmfb, driver, concrete.graph.entry)
    return entry(*[np.asarray(a) for a in (*args, *variables)])


# --- forms ----------------------------------------------------------------------------------


def loop_loss(x, n):
    body = lambda i, v: (i + 1, v * 0.9 + gl.sin(v) * 0.1)  # noqa: E731
    return gl.while_loop(lambda i, v: i < n, body, (0, x))[1].sum()


def test_canary_list_stacks_fail_on_an_asynchronous_device() -> None:
    # A race: with 25 trips some processes never lose it; with 200, about 9 calls in 10 failed
    # in every process tried (IREE 3.13). Up to 200 calls, until one fails.
    x, n = gl.tensor(np.linspace(0.3, -0.8, 8)), gl.tensor(200)  # on the device: 8 elements
    form = {"list_stacks": True, "yield_barriers": "all", "unroll_loops": False}
    concrete, mlir, facts = module_of(gl.value_and_grad(loop_loss), x, n, **form)
    assert facts["tensor_stacks"]
    vmfb = _iree_build.compile_mlir(mlir, "llvm-cpu", False, False, (), True)
    failure = None
    for _ in range(200):
        try:
            run(concrete, vmfb, x, n, driver="local-task")
        except (RuntimeError, ValueError) as e:  # as IREE's runtime raises them
            failure = str(e)
            break
    assert failure is not None, "no call failed: retire the list stacks' restriction to local-sync"
    assert "transient buffer has not been committed" in failure


def form_stage(form: dict, cf: bool = False, flags: tuple[str, ...] = (), repair: bool = True):
    """A stage for `test_fuzz_modes.outputs`: the function compiled in `form` and run."""

    def stage(fn):
        def call(x):
            concrete, mlir, facts = module_of(fn, x, **form)
            f64 = "float64" in facts["dtypes"]
            if repair:
                vmfb = _iree_build.compile_mlir(mlir, "llvm-cpu", False, cf, flags, f64)
            else:  # without `_vm_repair` (and without the cache, whose modules are repaired)
                text = _iree_build.to_cf(mlir) if cf else mlir
                all_flags = [*_iree_build.target_flags("llvm-cpu", f64), *flags]
                vmfb = _compiler.vm_to_bytecode(_compiler.compile_to_vm(text, all_flags))
            return run(concrete, vmfb, x)

        return call

    return stage


ROLLED = {"list_stacks": False, "yield_barriers": "all", "unroll_loops": False}


def test_canary_nested_regions_are_refused_as_scf() -> None:
    second = gl.grad(lambda x: gl.sum(gl.grad(cond_while_cond)(x)))
    x = gl.tensor(np.array([0.3, -0.2]))
    want = np.asarray(second(x))
    lists = dict(ROLLED, list_stacks=True)
    with pytest.raises(gl.errors.CompileError, match=r"does not dominate|iteration count"):
        form_stage(lists)(second)(x)
    np.testing.assert_allclose(form_stage(lists, cf=True)(second)(x)[0], want, rtol=1e-10)


def test_canary_multi_use_fusion_refuses_a_second_order_gradient() -> None:
    program = Program(ONLY_WITHOUT_MULTI_USE_FUSION)
    with pytest.raises(gl.errors.CompileError, match="workgroup distributed contexts"):
        outputs(program, form_stage(ROLLED))
    flags = _workarounds.choices("no_multi_use_fusion")[1]
    eager = outputs(program, lambda f: f)
    ran = outputs(program, form_stage(ROLLED, flags=flags))[: len(eager)]  # less the Variables
    for got, want in zip(ran, eager, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


# --- the VM bytecode encoder ----------------------------------------------------------------


def test_canary_a_buffer_passed_twice_arrives_null() -> None:
    program = Program(A_SWITCH_PASSING_ONE_BUFFER_TWICE, width=6)  # on the device: 6 elements
    with pytest.raises(IndexError, match="indirect buffer reference slot 0 is out range"):
        outputs(program, form_stage(ROLLED, repair=False))
    eager = outputs(program, lambda f: f)
    ran = outputs(program, form_stage(ROLLED))[: len(eager)]  # less the Variables
    for got, want in zip(ran, eager, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def test_canary_an_unrolled_loop_gradient_does_not_load_on_vulkan() -> None:
    from test_compiled_targets import loop_loss

    second = gl.grad(lambda x: gl.grad(loop_loss)(x, 3).sum())
    x = gl.tensor(np.linspace(0.3, -0.2, 8, dtype=np.float32))  # on the device: 8 elements
    form = {"list_stacks": False, "yield_barriers": "all", "unroll_loops": True}
    concrete, mlir, facts = module_of(second, x, **form)
    assert facts["unrolled_loops"]
    vmfb = _iree_build.compile_mlir(mlir, "vulkan-spirv", False, None, (), False)
    with pytest.raises(Exception, match=r"push_constant_ranges.*exceeds device limit"):
        _runtime.Function(vmfb, "vulkan", concrete.graph.entry)


def test_canary_an_idle_vulkan_device_keeps_two_cores_busy() -> None:
    import gc
    import time

    from iree import runtime

    device = runtime.get_device("vulkan", cache=False)
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(1.0)
    busy = (time.process_time() - cpu) / (time.monotonic() - wall)
    del device
    gc.collect()
    assert busy > 0.5, f"an idle Vulkan device took {busy:.2f} cores"  # two while alone


def test_canary_loading_a_system_library_leaves_its_placeholder_open() -> None:
    from iree import runtime

    from test_compiled import _dylib_placeholders

    text = "func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {\n"
    text += "  %y = stablehlo.sine %x : tensor<3xf32>\n  return %y : tensor<3xf32>\n}\n"
    vmfb = compile_text(text)  # a system shared library, as `gl.jit` links
    config = _runtime._config("local-sync")
    before = set(_dylib_placeholders())
    module = runtime.VmModule.copy_buffer(config.vm_instance, vmfb)
    runtime.load_vm_module(module, config)
    leaked = set(_dylib_placeholders()) - before
    _runtime.close_leaked_dylib_placeholders()
    assert len(leaked) == 1, leaked


# --- emissions ------------------------------------------------------------------------------

BOOL_CONVERT_INTO_A_PRODUCT = """
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>, %w: tensor<4x4xf32>) -> tensor<4xf32> {
  %c = stablehlo.compare GT, %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
  %f = stablehlo.convert %c : (tensor<4xi1>) -> tensor<4xf32>
  %d = stablehlo.dot_general %f, %w, contracting_dims = [0] x [0]
    : (tensor<4xf32>, tensor<4x4xf32>) -> tensor<4xf32>
  return %d : tensor<4xf32>
}
"""


def test_canary_a_bool_convert_fused_into_a_product_fails_to_verify() -> None:
    with pytest.raises(gl.errors.CompileError, match=r"linalg\.vecmat"):
        compile_text(BOOL_CONVERT_INTO_A_PRODUCT)


BOOL_SCALAR_INTO_A_TENSOR = """
func.func @main(%x: tensor<f32>) -> tensor<i1> {
  %z = arith.constant 0.0 : f32
  %e = tensor.extract %x[] : tensor<f32>
  %b = arith.cmpf ogt, %e, %z : f32
  %t = tensor.from_elements %b : tensor<i1>
  return %t : tensor<i1>
}
"""


def test_canary_a_bool_scalar_into_a_tensor_is_refused() -> None:
    with pytest.raises(gl.errors.CompileError, match="from_elements"):
        compile_text(BOOL_SCALAR_INTO_A_TENSOR)


POWER = """
func.func @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<3xf32> {
  %p = stablehlo.power %a, %b : tensor<3xf32>
  return %p : tensor<3xf32>
}
"""


def test_canary_powers_of_negative_bases_are_nan() -> None:
    entry = _runtime.Function(compile_text(POWER), "local-sync", "main")
    a, b = np.array([-2.0, -3.0, 2.0], np.float32), np.array([2.0, 3.0, 2.0], np.float32)
    got = entry(a, b)[0]
    assert np.isnan(got[:2]).all() and got[2] == 4.0


# --- the registry ---------------------------------------------------------------------------


def _test_names(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("w", _workarounds.WORKAROUNDS, ids=lambda w: w.name)
def test_every_workaround_names_a_reproducer_and_a_canary_that_exist(w) -> None:
    named = [w.reproducer] + ([w.canary] if w.canary else [])
    for test in named:
        path, _, name = test.partition("::")
        assert name in _test_names(ROOT / path), f"{w.name}: no test {test}"
    assert w.bug and w.knob
    assert (w.canary is None) != (w.no_canary is None), f"{w.name}: a canary, or why none"
    if w.upstream is not None:
        assert re.match(r"https://github\.com/iree-org/iree/issues/\d+$", w.upstream)


def test_the_forms_are_generated_from_the_registry() -> None:
    forms = _iree_build.forms_for("llvm-cpu")
    dims = {
        "list_stacks": {f.list_stacks for f in forms},
        "yield_barriers": {f.yield_barriers for f in forms},
        "scf_to_cf": {f.cf for f in forms},
        "no_multi_use_fusion": {f.workaround_flags for f in forms},
    }
    for name, seen in dims.items():
        assert seen == set(_workarounds.choices(name)), name
    # the preferred choice of every dimension comes first
    first = forms[0]
    assert first.list_stacks is _workarounds.choices("list_stacks")[0]
    assert first.yield_barriers == _workarounds.choices("yield_barriers")[0]
    assert first.cf is _workarounds.choices("scf_to_cf")[0]


def test_the_private_names_the_compiler_worker_uses_still_exist() -> None:
    # `_compiler` reaches IREE's compiler library and an invocation's handle through private
    # names (`PRIVATE_NAMES`): an IREE that renames them fails here, by name.
    from gradloop import _compiler

    api = _compiler._load()
    lib = _compiler._library(api)
    for symbol in (
        "ireeCompilerInvocationSetCompileToPhase",
        "ireeCompilerInvocationSetCompileFromPhase",
        "ireeCompilerInvocationEnableCallbackDiagnostics",
    ):
        assert getattr(lib, symbol) is not None
    session = api.Session()
    try:
        assert _compiler._handle(session.invocation())
    finally:
        session.close()


# Two scalars into a column: IREE 3.13 gives the last one twice.
COLUMN_FROM_ELEMENTS = """
func.func @main(%x: tensor<2xf32>) -> tensor<2x1xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %a = tensor.extract %x[%c0] : tensor<2xf32>
  %b = tensor.extract %x[%c1] : tensor<2xf32>
  %sa = math.sin %a : f32
  %sb = math.sin %b : f32
  %column = tensor.from_elements %sa, %sb : tensor<2x1xf32>
  return %column : tensor<2x1xf32>
}
"""

# A loop that rebuilds a 2x2 matrix from four scalars on every trip: refused.
MATRIX_FROM_ELEMENTS = """
func.func @main(%w: tensor<2x2xf32>, %v: tensor<2xf32>, %n: tensor<i64>) -> tensor<2xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %a = tensor.extract %w[%c0, %c0] : tensor<2x2xf32>
  %b = tensor.extract %w[%c0, %c1] : tensor<2x2xf32>
  %c = tensor.extract %w[%c1, %c0] : tensor<2x2xf32>
  %d = tensor.extract %w[%c1, %c1] : tensor<2x2xf32>
  %limit = tensor.extract %n[] : tensor<i64>
  %zero = arith.constant 0 : i64
  %one = arith.constant 1 : i64
  %r:6 = scf.while (%i = %zero, %x = %v, %p = %a, %q = %b, %s = %c, %t = %d)
      : (i64, tensor<2xf32>, f32, f32, f32, f32) -> (i64, tensor<2xf32>, f32, f32, f32, f32) {
    %go = arith.cmpi slt, %i, %limit : i64
    scf.condition(%go) %i, %x, %p, %q, %s, %t : i64, tensor<2xf32>, f32, f32, f32, f32
  } do {
  ^bb0(%i: i64, %x: tensor<2xf32>, %p: f32, %q: f32, %s: f32, %t: f32):
    %m = tensor.from_elements %p, %q, %s, %t : tensor<2x2xf32>
    %y = stablehlo.dot_general %m, %x, contracting_dims = [1] x [0]
        : (tensor<2x2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %z = stablehlo.tanh %y : tensor<2xf32>
    %i1 = arith.addi %i, %one : i64
    scf.yield %i1, %z, %p, %q, %s, %t : i64, tensor<2xf32>, f32, f32, f32, f32
  }
  return %r#1 : tensor<2xf32>
}
"""


def test_canary_a_tensor_built_from_elements_as_a_column_is_wrong() -> None:
    x = np.array([0.1, 0.2], np.float32)
    entry = _runtime.Function(compile_text(COLUMN_FROM_ELEMENTS), "local-sync", "main")
    got = np.asarray(entry(x)[0]).ravel()
    assert got[0] == got[1] == np.sin(x[1]), got  # the right answer is sin(x)
    with pytest.raises(gl.errors.CompileError, match="invalid Write access range"):
        compile_text(MATRIX_FROM_ELEMENTS)


def test_canary_a_third_order_gradient_on_host_scalars_is_wrong_as_scf() -> None:
    """The third derivative of `vector_program` (its 2-vectors held as host scalars) compiled
    with its loops rolled: right when lowered to `cf` first, wrong as `scf`."""
    from test_higher_order_loops import third, vector_program

    g3, _ = third(vector_program)
    x = gl.tensor(np.array([0.7, -0.4]))
    want = np.asarray(g3(x))
    concrete, mlir, _ = module_of(g3, x, list_stacks=True, unroll_loops=False)
    results = {}
    for cf in (False, True):
        vmfb = _iree_build.compile_mlir(mlir, "llvm-cpu", False, cf, (), True)
        results[cf] = run(concrete, vmfb, x)[0]
    np.testing.assert_allclose(results[True], want, rtol=1e-10)
    assert not np.allclose(results[False], want, rtol=1e-6), results[False]


SUM_OF_A_BROADCAST_PRODUCT = """
func.func @main(%m: tensor<4x5xf32>, %w: tensor<5xf32>) -> tensor<f32> {
  %b = stablehlo.broadcast_in_dim %w, dims = [1] : (tensor<5xf32>) -> tensor<4x5xf32>
  %p = stablehlo.multiply %m, %b : tensor<4x5xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%p init: %zero) applies stablehlo.add across dimensions = [0, 1]
      : (tensor<4x5xf32>, tensor<f32>) -> tensor<f32>
  return %s : tensor<f32>
}
"""


def test_canary_a_sum_of_a_broadcast_product_over_two_axes_fails() -> None:
    with pytest.raises(gl.errors.CompileError, match="invalid accumulator/result vector shape"):
        compile_text(SUM_OF_A_BROADCAST_PRODUCT)
    # the same sum over the merged axes compiles
    merged = SUM_OF_A_BROADCAST_PRODUCT.replace(
        "%s = stablehlo.reduce(%p init: %zero) applies stablehlo.add across dimensions = [0, 1]\n"
        "      : (tensor<4x5xf32>, tensor<f32>) -> tensor<f32>",
        "%f = stablehlo.reshape %p : (tensor<4x5xf32>) -> tensor<20xf32>\n"
        "  %s = stablehlo.reduce(%f init: %zero) applies stablehlo.add across dimensions = [0]\n"
        "      : (tensor<20xf32>, tensor<f32>) -> tensor<f32>",
    )
    assert "tensor<20xf32>" in merged
    entry = _runtime.Function(compile_text(merged), "local-sync", "main")
    m, w = np.arange(20.0, dtype=np.float32).reshape(4, 5), np.arange(5.0, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(entry(m, w)[0]), np.sum(m * w), rtol=1e-6)
