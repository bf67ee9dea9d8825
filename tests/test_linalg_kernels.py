"""The factorisation kernels (faer) against the loops that define them: eagerly, on the frame
executor (a traced composite call runs as its kernel) and compiled (the loop), on values, on
singular and indefinite input, and where derivatives must read the loop."""

import numpy as np
import pytest

import gradloop as gl
from gradloop import _core
from gradloop.linalg import _loops

RNG = np.random.default_rng(7)


def _matrix(*shape, dtype=np.float64):
    a = RNG.standard_normal(shape)
    n = shape[-1]
    return (a + n * np.roll(np.eye(n), 1, axis=1)).astype(dtype)


def _np(x):
    return np.asarray(x)


COMPOSITES = {
    "lu_factor": (lambda a: _loops.lu_factor(a), lambda a: _loops._lu_factor_loop(a)),
    "cholesky": (
        lambda a: _loops.cholesky(a @ _mt(a)),
        lambda a: _loops._cholesky_loop(a @ _mt(a)),
    ),
}


def _mt(a):
    return _core.transpose(a, [*range(a.ndim - 2), a.ndim - 1, a.ndim - 2])


@pytest.mark.parametrize("shape", [(1, 1), (5, 5), (3, 6, 6), (2, 2, 33, 33)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lu_kernel_is_the_loop(shape, dtype):
    a = gl.tensor(_matrix(*shape, dtype=dtype))
    lu, piv, perm = _loops.lu_factor(a)
    lu_l, piv_l, perm_l = _loops._lu_factor_loop(a)
    tol = 1e-12 if dtype == np.float64 else 2e-4
    np.testing.assert_allclose(_np(lu), _np(lu_l), rtol=tol, atol=tol)
    np.testing.assert_array_equal(_np(piv), _np(piv_l))
    np.testing.assert_array_equal(_np(perm), _np(perm_l))
    assert piv.dtype.name == "int32" and perm.dtype.name == "int32"
    np.testing.assert_array_equal(_np(_loops.permutation(piv)), _np(perm))
    np.testing.assert_array_equal(_np(_loops._permutation_loop(piv)), _np(perm))


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("unit", [True, False])
def test_triangular_kernel_is_the_loop(lower, unit):
    a = gl.tensor(_matrix(3, 7, 7))
    b = gl.tensor(RNG.standard_normal((3, 7, 2)))
    x = _loops.triangular(a, b, lower, unit)
    np.testing.assert_allclose(
        _np(x), _np(_loops._triangular_loop(a, b, lower, unit)), rtol=1e-11, atol=1e-12
    )


@pytest.mark.parametrize("trans", [False, True])
def test_lu_solve_kernel_is_the_loop_and_solves(trans):
    a_np = _matrix(2, 9, 9)
    a, b = gl.tensor(a_np), gl.tensor(RNG.standard_normal((2, 9, 3)))
    lu, _, perm = _loops.lu_factor(a)
    x = _loops.lu_solve(lu, perm, b, trans)
    np.testing.assert_allclose(
        _np(x), _np(_loops._lu_solve_loop(lu, perm, b, trans)), rtol=1e-11, atol=1e-12
    )
    want = np.linalg.solve(np.swapaxes(a_np, -1, -2) if trans else a_np, _np(b))
    np.testing.assert_allclose(_np(x), want, rtol=1e-11, atol=1e-12)


def test_cholesky_kernel_is_the_loop_and_refuses_with_nan_throughout():
    m = _matrix(2, 6, 6)
    spd = gl.tensor(m @ np.swapaxes(m, -1, -2) + np.eye(6))
    np.testing.assert_allclose(
        _np(_loops.cholesky(spd)), _np(_loops._cholesky_loop(spd)), rtol=1e-12, atol=1e-12
    )
    bad = _np(spd).copy()
    bad[1, 3, 3] = -50.0
    for low in (_loops.cholesky(gl.tensor(bad)), _loops._cholesky_loop(gl.tensor(bad))):
        low = _np(low)
        assert np.isnan(low[1]).all(), "the indefinite matrix's factor is NaN throughout"
        np.testing.assert_allclose(low[0], np.linalg.cholesky(_np(spd)[0]), rtol=1e-12)


def test_the_executor_runs_composites_as_kernels_and_compilers_read_the_loop():
    def f(a, b):
        return (
            gl.linalg.solve(a, b)
            + gl.linalg.cholesky(a @ a.T + 10.0 * gl.eye(a.shape[0], dtype=a.dtype))[0]
        )

    fn = gl.function(f)
    a_np, b_np = _matrix(12, 12), RNG.standard_normal((12, 12))
    a, b = gl.tensor(a_np), gl.tensor(b_np)
    graph = fn.graph(a, b)
    text = str(graph)
    for kernel in ('kernel="lu_factor"', 'kernel="lu_solve{trans=false}"', 'kernel="cholesky"'):
        assert kernel in text, text
    lowered = str(gl.lower(graph))
    assert "lu_factor(" in lowered and "while(" not in lowered
    want = np.linalg.solve(a_np, b_np) + np.linalg.cholesky(a_np @ a_np.T + 10 * np.eye(12))[0]
    np.testing.assert_allclose(_np(fn(a, b)), want, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(_np(gl.jit(f)(a, b)), want, rtol=1e-10, atol=1e-11)
    mlir = gl.to_mlir(f, a, b, dialect="stablehlo")
    assert "stablehlo.custom_call" not in mlir and mlir.count("stablehlo.while") >= 4


def test_graph_text_round_trips_a_composite():
    """A pickled function travels as graph text: its composites keep their kernels."""
    import pickle

    fn = gl.function(lambda a, b: _loops.triangular(a, b, lower=True, unit_diagonal=False))
    a, b = gl.tensor(_matrix(4, 4)), gl.tensor(RNG.standard_normal((4, 1)))
    concrete = fn.concrete_function(a, b)
    text = str(concrete.graph)
    assert 'kernel="triangular_solve{lower=true, unit_diagonal=false}"' in text
    again = pickle.loads(pickle.dumps(concrete))
    assert str(again.graph) == text
    np.testing.assert_allclose(_np(again([a, b])[0]), _np(concrete([a, b])[0]), rtol=0, atol=0)


def test_singular_input_raises_eagerly_and_gives_non_finite_values_traced():
    a = gl.tensor(np.array([[1.0, 2.0], [2.0, 4.0]]))
    b = gl.tensor(np.array([1.0, 1.0]))
    with pytest.raises(gl.errors.LinAlgError, match="singular"):
        gl.linalg.solve(a, b)
    x = gl.function(gl.linalg.solve)(a, b)
    assert not np.isfinite(_np(x)).all()
    with pytest.raises(gl.errors.LinAlgError):
        gl.linalg.cholesky(gl.tensor(np.array([[1.0, 2.0], [2.0, 1.0]])))


def test_derivatives_read_the_loop_where_a_tape_or_tangent_is_active():
    """Under a tape (higher order) or a tangent, the composite runs its loop eagerly; the
    gradients and tangents match central differences either way."""
    a_np = _matrix(4, 4)
    b = gl.tensor(RNG.standard_normal(4))

    def loss(a):
        return gl.sum(gl.linalg.solve(a, b) ** 2)

    a = gl.tensor(a_np)
    g = _np(gl.grad(loss)(a))
    eps = 1e-6
    fd = np.zeros_like(a_np)
    for i in range(4):
        for j in range(4):
            d = np.zeros_like(a_np)
            d[i, j] = eps
            fd[i, j] = (float(loss(gl.tensor(a_np + d))) - float(loss(gl.tensor(a_np - d)))) / (
                2 * eps
            )
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(_np(gl.function(gl.grad(loss))(a)), g, rtol=1e-10)
    t = gl.tensor(RNG.standard_normal((4, 4)))
    _, tangent = gl.jvp(loss, (a,), (t,))
    np.testing.assert_allclose(float(tangent), float(np.sum(fd * _np(t))), rtol=1e-5)
    h = _np(gl.hessian(loss)(a)).reshape(16, 16)
    np.testing.assert_allclose(h, h.T, rtol=1e-7, atol=1e-9)


def test_kernel_refuses_bad_operands_with_typed_errors():
    with pytest.raises(gl.errors.ShapeError):
        _core.factor_kernel("lu_factor", [gl.tensor(np.ones((2, 3)))])
    with pytest.raises(gl.errors.DTypeError):
        _core.factor_kernel("cholesky", [gl.tensor(np.ones((2, 2), dtype=np.int32))])
    with pytest.raises(gl.errors.GradloopError):
        _core.factor_kernel("no_such_kernel", [gl.tensor(np.ones((2, 2)))])


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4), (6, 0), (40, 40)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_qr_kernel_is_the_loop(shape, dtype):
    a = gl.tensor(RNG.standard_normal(shape).astype(dtype))
    q, r = _loops.householder_qr(a)
    q_l, r_l = _loops._householder_qr_loop(a)
    tol = 1e-11 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(_np(q), _np(q_l), rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(r), _np(r_l), rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(q) @ _np(r), _np(a), rtol=tol, atol=tol)


def test_the_kernel_runs_under_a_tape_that_does_not_record_the_operands(monkeypatch):
    """A tape that watches something else records nothing of the factorisation: the kernel
    runs. A tape that records its operand runs the loop, which it can differentiate."""
    calls = []
    kernel = _core.factor_kernel

    def spy(text, inputs):
        calls.append(text)
        return kernel(text, inputs)

    monkeypatch.setattr(_core, "factor_kernel", spy)
    a, other = gl.tensor(_matrix(5, 5)), gl.tensor(np.ones(3))
    with gl.GradientTape() as tape:
        tape.watch(other)
        _loops.lu_factor(a)
    assert calls == ["lu_factor"]
    with gl.GradientTape() as tape:
        tape.watch(a)
        lu, _, _ = _loops.lu_factor(a)
        loss = gl.sum(lu)
    assert calls == ["lu_factor"], "the recorded operand ran the loop"
    assert tape.gradient(loss, a) is not None
