"""MLIR in, gradients out: `gl.mlir.grad` on StableHLO modules as JAX exports them (fixtures
written by `tests/fixtures/mlir/make_fixtures.py`, committed) and on hand-written `scf`
modules. For each: the output module parses and verifies with the MLIR bindings, compiles with
IREE (llvm-cpu), its `@main` gives what the input's `@main` gives, and `@main_grad` matches
central finite differences of `@main` in float64 — through data-dependent loops, whose trip
counts differ across the inputs tried. Also: errors, and the `grad` / `compile` commands."""

from __future__ import annotations

import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import gradloop as gl
from gradloop import _iree_build

pytest.importorskip("iree.compiler", reason="MLIR import needs iree-base-compiler")
runtime = pytest.importorskip("iree.runtime", reason="running modules needs iree-base-runtime")

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "mlir"


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.mlir").read_text()


class Compiled:
    """A module compiled for llvm-cpu, its functions called on numpy arrays (local-sync: the
    loops run thousands of host-side iterations, where local-task's per-dispatch cost shows)."""

    def __init__(self, text: str) -> None:
        vmfb = _iree_build.compile_mlir(text, "llvm-cpu")
        self._module = runtime.load_vm_flatbuffer(vmfb, driver="local-sync")

    def __call__(self, function: str, *args: np.ndarray) -> list[np.ndarray]:
        out = self._module[function](*args)
        results = out if isinstance(out, (tuple, list)) else [out]
        return [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]


def functions(text: str) -> dict[str, str]:
    """The module's functions by name, as MLIR prints them (parsed and verified first)."""
    from iree.compiler import ir

    with ir.Context():
        module = ir.Module.parse(text)
        module.operation.verify()
        return {str(op.attributes["sym_name"]).strip('"'): str(op) for op in module.body.operations}


def finite_difference(f, args, i, cotangents, h=1e-6) -> np.ndarray:
    """Central differences of `sum_k <cotangents[k], f(args)[k]>` w.r.t. `args[i]`."""

    def loss(a) -> float:
        return sum(float(np.sum(c * y)) for c, y in zip(cotangents, f(*a), strict=True))

    x = np.array(args[i], dtype=np.float64)
    grad = np.zeros_like(x)
    for j in np.ndindex(x.shape):
        shifted = []
        for delta in (h, -h):
            xs = x.copy()
            xs[j] += delta
            shifted.append(loss([*args[:i], xs, *args[i + 1 :]]))
        grad[j] = (shifted[0] - shifted[1]) / (2 * h)
    return grad


def check_gradients(text, args, wrt, cotangents=None, rtol=1e-6, atol=1e-8, h=None) -> Compiled:
    """`gl.mlir.grad(text, wrt=wrt)`: verified, the input's functions unchanged, compiled, and
    `@main_grad` equal to finite differences of `@main` (seeded with `cotangents`, or 1 for a
    scalar result; steps `h[k]` for argument `wrt[k]`, 1e-6 by default)."""
    out = gl.mlir.grad(text, wrt=wrt)
    before, after = functions(text), functions(out)
    assert after.pop("main_grad").startswith("func.func @main_grad(")
    assert after == before
    module = Compiled(out)
    seeds = [np.float64(1.0)] if cotangents is None else cotangents
    grads = module("main_grad", *args, *(cotangents or []))
    assert len(grads) == len(wrt)
    steps = h or [1e-6] * len(wrt)
    for i, g, step in zip(wrt, grads, steps, strict=True):
        fd = finite_difference(lambda *a: module("main", *a), args, i, seeds, h=step)
        np.testing.assert_allclose(g, fd, rtol=rtol, atol=atol, err_msg=f"d/d arg{i}")
    return module


def grow(x: float, c: float) -> tuple[float, int]:
    """The loop of `while_f64.mlir`: `while x < 10: x = x * c + sin(x)`; returns (x*x, trips)."""
    n = 0
    while x < 10.0:
        x, n = x * c + math.sin(x), n + 1
        assert n < 1000, "no fixed point below 10 for the points tested"
    return x * x, n


def test_a_data_dependent_while_loop_at_several_trip_counts() -> None:
    text = fixture("while_f64")
    points = [(1.0, 1.5), (0.6, 1.35), (2.5, 1.9), (0.3, 1.3)]
    trips = {grow(x, c)[1] for x, c in points}
    assert len(trips) == len(points), trips
    for x, c in points:
        args = [np.float64(x), np.float64(c)]
        module = check_gradients(text, args, wrt=(0, 1))
        assert module("main", *args)[0] == pytest.approx(grow(x, c)[0], rel=1e-12)


def test_float32_gradients_agree_with_float64() -> None:
    x, c = 1.0, 1.5
    g32 = Compiled(gl.mlir.grad(fixture("while_f32"), wrt=(0, 1)))
    g64 = Compiled(gl.mlir.grad(fixture("while_f64"), wrt=(0, 1)))
    got = g32("main_grad", np.float32(x), np.float32(c))
    want = g64("main_grad", np.float64(x), np.float64(c))
    assert all(g.dtype == np.float32 for g in got)
    np.testing.assert_allclose(np.array(got, dtype=np.float64), want, rtol=1e-4)


def creep(x: float, c: float) -> int:
    """Trips of the loop of `long_loop.mlir`: `while x < 10: x = x + c * (1.2 + sin(x))`."""
    trips = 0
    while x < 10.0:
        x, trips = x + c * (1.2 + math.sin(x)), trips + 1
    return trips


def test_a_loop_of_thousands_of_iterations() -> None:
    # The trip count changes every ~c / trips in c (~1e-3 in x): the finite differences must
    # stay within one count, and their steps above the rounding noise of thousands of trips.
    x, c, hx, hc = 0.0, 0.002, 1e-6, 1e-9
    trips = creep(x, c)
    assert trips > 3000
    assert {creep(x - hx, c), creep(x + hx, c), creep(x, c - hc), creep(x, c + hc)} == {trips}
    args = [np.float64(x), np.float64(c)]
    check_gradients(fixture("long_loop"), args, wrt=(0, 1), rtol=1e-5, h=(hx, hc))


@pytest.mark.parametrize("n", [2, 5])
def test_a_cond_and_a_switch_inside_a_loop_with_two_results(n) -> None:
    rng = np.random.default_rng(n)
    args = [np.array([0.3, -0.2, 0.5]), np.float64(0.8), np.int64(n)]
    cotangents = [rng.normal(size=3), np.float64(rng.normal())]
    check_gradients(fixture("cond_in_loop"), args, wrt=(0, 1), cotangents=cotangents)


def test_an_mlp_loss() -> None:
    rng = np.random.default_rng(0)
    shapes = [(3, 5), (5,), (5, 2), (2,), (8, 3), (8, 2)]
    args = [rng.normal(size=s) for s in shapes]
    check_gradients(fixture("mlp"), args, wrt=(0, 1, 2, 3), atol=1e-9)


def test_stablehlo_if_and_scf_while_passing_computed_values() -> None:
    seed = [np.array([0.6, -1.3])]
    for y in (0.7, -0.4):
        args = [np.array([0.3, 1.1]), np.float64(y)]
        check_gradients(fixture("stablehlo_if"), args, wrt=(0, 1), cotangents=seed)
    for x in ([0.2, 0.1], [1.3, 1.4], [-0.5, 0.4]):
        args = [np.array(x), np.float64(0.3)]
        check_gradients(fixture("scf_while_forward"), args, wrt=(0, 1), cotangents=[np.ones(2)])


def scf_loop(x: np.ndarray, c: float, k: int) -> float:
    """The program of `scf_loop.mlir`, in numpy."""
    v, i = x.astype(np.float64), 0
    while np.sum(v * v) < 50:
        w = v * c if i % 2 == 1 else v + np.sin(v)
        v = {0: np.tanh(w) + w, 2: w * 1.1}.get(k, w + 0.5)
        i += 1
    return float(np.sum(v * v) * c)


def without_main(text: str) -> str:
    """The module without its `@main`: IREE 3.13 cannot compile an `scf.index_switch` with two
    or more cases ("expected each region to return 1 values, but default region returns 2"),
    which only `@main` has (the gradient's `Case` is a chain of `scf.if`)."""
    from iree.compiler import ir

    with ir.Context():
        module = ir.Module.parse(text)
        for op in list(module.body.operations):
            if str(op.attributes["sym_name"]) == '"main"':
                op.erase()
        return str(module)


@pytest.mark.parametrize("k", [0, 2, 7])
def test_scf_while_if_and_index_switch(k) -> None:
    out = gl.mlir.grad(fixture("scf_loop"), wrt=(0, 1))
    module = Compiled(without_main(out))
    x, c = np.array([0.5, 0.9, 0.7]), 1.3
    args = [x, np.float64(c), np.int32(k)]
    got = module("main_grad", *args)
    f = lambda x, c: [np.float64(scf_loop(x, c, k))]  # noqa: E731
    for g, i in zip(got, (0, 1), strict=True):
        fd = finite_difference(f, [x, np.float64(c)], i, [1.0])
        np.testing.assert_allclose(g, fd, rtol=1e-6, err_msg=f"d/d arg{i}")


UNSUPPORTED = """module {
  func.func @main(%x: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.cbrt %x : tensor<f32>
    return %0 : tensor<f32>
  }
}
"""


def test_unsupported_ops_are_named_with_their_location() -> None:
    with pytest.raises(gl.errors.CompileError, match=r"stablehlo\.cbrt.*<mlir>:3:10"):
        gl.mlir.grad(UNSUPPORTED)
    assert "stablehlo.while" in gl.mlir.supported_ops()


def test_bad_requests_raise_clear_errors() -> None:
    with pytest.raises(gl.errors.CompileError, match=r"invalid MLIR:\n  <mlir>:2:\d+: .*"):
        gl.mlir.grad("module {\n  func.func @main( {\n}")
    text = fixture("cond_in_loop")
    with pytest.raises(gl.errors.GradientError, match="argument 2 of @main is i64"):
        gl.mlir.grad(text, wrt=(2,))
    with pytest.raises(gl.errors.IndexError, match="wrt index 5"):
        gl.mlir.grad(text, wrt=(5,))
    with pytest.raises(gl.errors.InvalidArgumentError, match=r"no function @f .*@main"):
        gl.mlir.grad(text, function="f")
    with pytest.raises(gl.errors.InvalidArgumentError, match="wrt must be argument indices"):
        gl.mlir.grad(text, wrt=("0",))


def gradloop_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gradloop", *args], capture_output=True, text=True, timeout=120
    )


def test_the_grad_and_compile_commands(tmp_path) -> None:
    src, out, vmfb = tmp_path / "f.mlir", tmp_path / "f_grad.mlir", tmp_path / "f.vmfb"
    src.write_text(fixture("while_f64"))
    r = gradloop_command("grad", str(src), "-o", str(out), "--wrt", "0,1")
    assert r.returncode == 0, r.stderr
    assert "func.func @main_grad(" in out.read_text()
    r = gradloop_command("compile", str(out), "-o", str(vmfb), "--target", "llvm-cpu")
    assert r.returncode == 0, r.stderr
    tool = pathlib.Path(sys.executable).parent / "iree-run-module"
    results = [tmp_path / "g0.npy", tmp_path / "g1.npy"]
    run = subprocess.run(
        [
            str(tool),
            f"--module={vmfb}",
            "--function=main_grad",
            "--input=f64=1.0",
            "--input=f64=1.5",
            *(f"--output=@{r}" for r in results),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    want = Compiled(out.read_text())("main_grad", np.float64(1.0), np.float64(1.5))
    np.testing.assert_allclose([np.load(r) for r in results], want, rtol=1e-12)
    bad = tmp_path / "bad.mlir"
    bad.write_text(UNSUPPORTED)
    r = gradloop_command("grad", str(bad), "-o", str(tmp_path / "x.mlir"))
    assert r.returncode == 1
    assert "stablehlo.cbrt" in r.stderr and f"{bad}:3:10" in r.stderr, r.stderr


def test_large_constants_and_reductions_to_a_scalar() -> None:
    # MLIR prints constants of more than 100 elements as hex: d/dx sum(x * w + max(x)) is
    # w + one-hot(argmax(x)).
    w = np.linspace(-1.0, 2.0, 150)
    x = np.cos(np.arange(150.0))
    body = ", ".join(repr(float(v)) for v in w)
    text = f"""module {{
  func.func @main(%x: tensor<150xf64>) -> tensor<f64> {{
    %w = stablehlo.constant dense<[{body}]> : tensor<150xf64>
    %zero = stablehlo.constant dense<0.0> : tensor<f64>
    %low = stablehlo.constant dense<0xFFF0000000000000> : tensor<f64>
    %p = stablehlo.multiply %x, %w : tensor<150xf64>
    %s = stablehlo.reduce(%p init: %zero) applies stablehlo.add across dimensions = [0]
      : (tensor<150xf64>, tensor<f64>) -> tensor<f64>
    %m = stablehlo.reduce(%x init: %low) applies stablehlo.maximum across dimensions = [0]
      : (tensor<150xf64>, tensor<f64>) -> tensor<f64>
    %r = stablehlo.add %s, %m : tensor<f64>
    return %r : tensor<f64>
  }}
}}
"""
    (g,) = Compiled(gl.mlir.grad(text))("main_grad", x)
    np.testing.assert_allclose(g, w + (np.arange(150) == np.argmax(x)), rtol=1e-14)


def test_ops_jax_programs_use_around_loops() -> None:
    # Away from the kinks: x from 0 and z = [x[1:], 2 x[:2]] from +-0.5 (where, relu, clip),
    # and sum(w) from an integer (floor).
    args = [np.array([-0.9, -0.35, 0.1, 0.7, 0.95]), np.array([0.6, 0.8, 1.1, 1.3, 1.45])]
    check_gradients(fixture("op_zoo"), args, wrt=(0, 1))
