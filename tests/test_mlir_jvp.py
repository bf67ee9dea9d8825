"""MLIR in, forward mode out: `gl.mlir.jvp` and `gradloop jvp` on the StableHLO fixtures of
`test_mlir_import.py`. For each: the output parses and verifies, the input's functions are
unchanged, it compiles with IREE (llvm-cpu), `@main_jvp`'s results equal `@main`'s, and its
tangents match central finite differences of `@main` in float64 and agree with `@main_grad`
(`<c, J v>` both ways) — through data-dependent loops of up to thousands of trips."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from test_mlir_import import Compiled, creep, fixture, functions, gradloop_command, grow

pytest.importorskip("iree.compiler", reason="MLIR import needs iree-base-compiler")
pytest.importorskip("iree.runtime", reason="running modules needs iree-base-runtime")


def directional(module: Compiled, args, wrt, tangents, steps) -> list[np.ndarray]:
    """Central differences of `@main` along `tangents` (one per `wrt` argument)."""

    def shifted(sign: float) -> list[np.ndarray]:
        moved = list(args)
        for i, t, h in zip(wrt, tangents, steps, strict=True):
            moved[i] = np.asarray(args[i] + sign * h * t, dtype=np.asarray(args[i]).dtype)
        return module("main", *moved)

    plus, minus = shifted(1.0), shifted(-1.0)
    return [(p - m) / 2.0 for p, m in zip(plus, minus, strict=True)]


def check_jvp(text, args, wrt, tangents, rtol=1e-6, atol=1e-8, h=1e-6) -> Compiled:
    out = gl.mlir.jvp(text, wrt=wrt)
    before, after = functions(text), functions(out)
    assert after.pop("main_jvp").startswith("func.func @main_jvp(")
    assert after == before
    module = Compiled(out)
    primal = module("main", *args)
    got = module("main_jvp", *args, *tangents)
    floats = [y for y in primal if np.issubdtype(y.dtype, np.floating)]
    assert len(got) == len(primal) + len(floats)
    for y, g in zip(primal, got, strict=False):
        np.testing.assert_allclose(g, y, rtol=1e-12)  # compiled apart: a rounding may differ
    steps = [h] * len(wrt)
    fd = directional(module, args, wrt, tangents, steps)
    fd_floats = [
        d / h for d, y in zip(fd, primal, strict=True) if np.issubdtype(y.dtype, np.floating)
    ]
    for k, (t, e) in enumerate(zip(got[len(primal) :], fd_floats, strict=True)):
        np.testing.assert_allclose(t, e, rtol=rtol, atol=atol, err_msg=f"tangent of result {k}")
    return module


def test_a_data_dependent_while_loop_at_several_trip_counts() -> None:
    text = fixture("while_f64")
    points = [(1.0, 1.5), (0.6, 1.35), (2.5, 1.9)]
    assert len({grow(x, c)[1] for x, c in points}) == len(points)
    for x, c in points:
        args = [np.float64(x), np.float64(c)]
        check_jvp(text, args, (0, 1), [np.float64(0.7), np.float64(-1.3)])


def test_a_loop_of_thousands_of_iterations() -> None:
    x, c, h = 0.0, 0.002, 1e-9
    assert creep(x, c) > 3000 and creep(x - h, c - h) == creep(x + h, c + h) == creep(x, c)
    args = [np.float64(x), np.float64(c)]
    check_jvp(
        fixture("long_loop"), args, (0, 1), [np.float64(1.0), np.float64(1.0)], rtol=1e-5, h=h
    )


@pytest.mark.parametrize("n", [2, 5])
def test_jvp_agrees_with_the_gradient_through_a_cond_and_switch_in_a_loop(n) -> None:
    rng = np.random.default_rng(n)
    text = fixture("cond_in_loop")
    args = [np.array([0.3, -0.2, 0.5]), np.float64(0.8), np.int64(n)]
    tangents = [rng.normal(size=3), np.float64(rng.normal())]
    module = check_jvp(text, args, (0, 1), tangents)
    # <c, J v> = <J^T c, v>
    cotangents = [rng.normal(size=3), np.float64(rng.normal())]
    grads = Compiled(gl.mlir.grad(text, wrt=(0, 1)))("main_grad", *args, *cotangents)
    jv = module("main_jvp", *args, *tangents)[2:]
    lhs = sum(float(np.sum(c * t)) for c, t in zip(cotangents, jv, strict=True))
    rhs = sum(float(np.sum(g * v)) for g, v in zip(grads, tangents, strict=True))
    assert lhs == pytest.approx(rhs, rel=1e-10, abs=1e-12)


def test_an_mlp_loss() -> None:
    rng = np.random.default_rng(0)
    shapes = [(3, 5), (5,), (5, 2), (2,), (8, 3), (8, 2)]
    args = [rng.normal(size=s) for s in shapes]
    check_jvp(
        fixture("mlp"), args, (0, 2), [rng.normal(size=shapes[0]), rng.normal(size=shapes[2])]
    )


def test_bad_requests_raise_clear_errors() -> None:
    text = fixture("cond_in_loop")
    with pytest.raises(gl.errors.GradientError, match="argument 2 of @main is i64"):
        gl.mlir.jvp(text, wrt=(2,))
    with pytest.raises(gl.errors.IndexError, match="wrt index 5"):
        gl.mlir.jvp(text, wrt=(5,))
    with pytest.raises(gl.errors.InvalidArgumentError, match="twice"):
        gl.mlir.jvp(text, wrt=(0, 0))
    with pytest.raises(gl.errors.InvalidArgumentError, match="already defines @main_jvp"):
        gl.mlir.jvp(gl.mlir.jvp(text), wrt=(0,))


def test_the_jvp_command(tmp_path) -> None:
    src, out = tmp_path / "f.mlir", tmp_path / "f_jvp.mlir"
    src.write_text(fixture("while_f64"))
    r = gradloop_command("jvp", str(src), "-o", str(out), "--wrt", "1")
    assert r.returncode == 0, r.stderr
    module = Compiled(out.read_text())
    y, dy = module("main_jvp", np.float64(1.0), np.float64(1.5), np.float64(1.0))
    h = 1e-6
    f = lambda c: module("main", np.float64(1.0), np.float64(c))[0]  # noqa: E731
    fd = (f(1.5 + h) - f(1.5 - h)) / (2 * h)
    assert float(y) == pytest.approx(grow(1.0, 1.5)[0], rel=1e-12)
    assert float(dy) == pytest.approx(float(fd), rel=1e-6)
