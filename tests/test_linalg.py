"""`gl.linalg` against numpy (and scipy's LU conventions): values eagerly, in graph mode and
under `gl.jit` (one program computes them all), batched; gradients of every function against
central differences to second order, forward mode and `hessian` too; the pure StableHLO
emission on the reference interpreter; singular matrices and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from gradcheck import check_grads
from runners import staged

L = gl.linalg
MODES = ("eager", "executor", "compiled")
RNG = np.random.default_rng(5)
A = RNG.standard_normal((4, 4)) + 2.0 * np.eye(4)
A[0, 0] = 0.1  # pivoting moves row 0
B = RNG.standard_normal((4, 2))
V = RNG.standard_normal(4)
SPD = A @ A.T + np.eye(4)
BATCH = RNG.standard_normal((3, 4, 4)) + 3.0 * np.eye(4)


def numpy_answers(a, b, v, spd, batch):
    chol = np.linalg.cholesky(spd)
    return [
        np.linalg.solve(a, b),
        np.linalg.solve(a, v),
        np.linalg.solve(np.tril(a), b),
        np.linalg.solve(np.triu(a).T, b),
        np.linalg.solve(np.tril(a, -1) + np.eye(4), b),
        chol,
        np.linalg.solve(spd, b),
        np.linalg.inv(a),
        np.linalg.det(a),
        *np.linalg.slogdet(a),
        np.linalg.det(batch),
        np.linalg.solve(batch, b),
        np.linalg.norm(b),
        np.linalg.norm(a, 1),
        np.linalg.norm(b, np.inf, axis=0),
        np.linalg.norm(v, 3),
        np.linalg.solve(a.T, b),
        *np.linalg.qr(np.concatenate([a, b.T])),
        np.linalg.qr(b.T, mode="r"),
        *np.linalg.qr(a[:3], mode="complete"),
        *np.linalg.lstsq(np.concatenate([a, b.T]), np.concatenate([v, v[:2]]), rcond=None),
        np.linalg.norm(a, 2),
        np.linalg.norm(batch, "nuc", axis=(1, 2)),
    ]


def every(a, b, v, spd, batch):
    lu_piv = L.lu_factor(a)
    return (
        L.solve(a, b),
        L.solve(a, v),
        L.solve_triangular(a, b, lower=True),
        L.solve_triangular(a, b, trans=1),
        L.solve_triangular(a, b, lower=True, unit_diagonal=True),
        L.cholesky(spd),
        L.cho_solve((L.cholesky(spd), True), b),
        L.inv(a),
        L.det(a),
        *L.slogdet(a),
        L.det(batch),
        L.solve(batch, b),
        L.norm(b),
        L.norm(a, 1),
        L.norm(b, float("inf"), axis=0),
        L.norm(v, 3),
        L.lu_solve(lu_piv, b, trans=1),
        *L.qr(gl.concatenate([a, gl.transpose(b)])),
        L.qr(gl.transpose(b), mode="r"),
        *L.qr(a[:3], mode="complete"),
        *L.lstsq(gl.concatenate([a, gl.transpose(b)]), gl.concatenate([v, v[:2]])),
        L.norm(a, 2),
        L.norm(batch, "nuc", axis=(1, 2)),
    )


ARGS = (A, B, V, SPD, BATCH)


@pytest.mark.parametrize("mode", MODES)
def test_values_match_numpy(mode: str) -> None:
    got = staged(mode, every)(*(gl.tensor(x) for x in ARGS))
    wants = numpy_answers(*ARGS)
    assert len(got) == len(wants)
    for k, (g, w) in enumerate(zip(got, wants, strict=True)):
        g = np.asarray(g)
        want_dtype = np.int32 if np.asarray(w).dtype.kind == "i" else np.float64
        assert g.shape == np.shape(w) and g.dtype == want_dtype, k
        np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-12, err_msg=f"result {k} ({mode})")


def test_float32_values_match_numpy() -> None:
    args = [gl.tensor(x.astype(np.float32)) for x in ARGS]
    got = every(*args)
    for k, (g, w) in enumerate(zip(got, numpy_answers(*ARGS), strict=True)):
        assert np.asarray(g).dtype == (np.int32 if np.asarray(w).dtype.kind == "i" else np.float32)
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-4, atol=2e-4, err_msg=f"result {k}")


def test_lu_factor_is_lapack_s() -> None:
    scipy_linalg = pytest.importorskip("scipy.linalg", reason="scipy comes with JAX")
    lu, piv = L.lu_factor(gl.tensor(A))
    want_lu, want_piv = scipy_linalg.lu_factor(A)
    np.testing.assert_allclose(np.asarray(lu), want_lu, rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(np.asarray(piv), want_piv)
    assert np.asarray(piv).dtype == np.int32


GRADIENTS = {
    "solve": (lambda a, b: L.solve(a, b), [A, B]),
    "solve_vector": (lambda a, v: L.solve(a, v), [A, V]),
    "solve_triangular_lower": (lambda a, b: L.solve_triangular(a, b, lower=True), [A, B]),
    "solve_triangular_transposed_unit": (
        lambda a, b: L.solve_triangular(a, b, trans=1, unit_diagonal=True),
        [A, B],
    ),
    "lu_factor": (lambda a: L.lu_factor(a)[0], [A]),
    "lu_solve_transposed": (lambda a, b: L.lu_solve(L.lu_factor(a), b, trans=1), [A, B]),
    "cholesky": (lambda s: L.cholesky(s), [SPD]),
    "cho_solve": (lambda s, b: L.cho_solve((L.cholesky(s), True), b), [SPD, B]),
    "inv": (lambda a: L.inv(a), [A]),
    "det": (lambda a: L.det(a), [A]),
    "slogdet": (lambda a: L.slogdet(a)[1], [A]),
    "batched_solve": (lambda a, b: L.solve(a, b), [BATCH, B]),
    "qr_tall_q": (lambda a: L.qr(a)[0], [np.concatenate([A, B.T])]),
    "qr_tall_r": (lambda a: L.qr(a)[1], [np.concatenate([A, B.T])]),
    "qr_wide_r": (lambda b: L.qr(b, mode="r"), [B.T]),
    "lstsq_tall": (
        lambda a, v: L.lstsq(a, v)[0] + L.lstsq(a, v)[1],
        [np.concatenate([A, B.T]), np.concatenate([V, V[:2]])],
    ),
    "lstsq_wide": (lambda b, y: L.lstsq(b, y)[0], [B.T, V[:2]]),
    "singular_value_norms": (lambda a: L.norm(a, 2) + L.norm(a, "nuc") + L.norm(a, -2), [A]),
    "norms": (lambda a: L.norm(a) + L.norm(a, 1) + L.norm(a[0], 3) + L.norm(a, -np.inf), [A]),
}


@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_gradients_match_finite_differences(name: str) -> None:
    fn, args = GRADIENTS[name]
    check_grads(fn, args, order=2, modes=("tape", "grad", "graph"))


def total(a, b, spd):
    return (
        gl.sum(L.solve(a, b) ** 2)
        + L.slogdet(a)[1]
        + L.det(a)
        + gl.sum(L.cho_solve((L.cholesky(spd), True), b) ** 2)
        + gl.sum(L.solve_triangular(a, b, lower=True) * b)
        + gl.sum(L.inv(a) ** 2)
    )


@pytest.mark.long
@pytest.mark.slow
def test_compiled_gradients_match_finite_differences() -> None:
    check_grads(total, [A, B, SPD], order=1, modes=("compiled",))


def _numeric_hessian(fn, x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    def grad(y):
        return np.asarray(gl.grad(fn)(gl.tensor(y))).ravel()

    basis = np.eye(x.size).reshape(x.size, *x.shape)
    return np.stack([(grad(x + eps * e) - grad(x - eps * e)) / (2 * eps) for e in basis], axis=1)


@pytest.mark.parametrize("mode", ["eager", "executor"])
def test_forward_mode_and_hessian_match_finite_differences(mode: str) -> None:
    b, spd = gl.tensor(B), gl.tensor(SPD)

    def fn(a):
        return total(a, b, spd)

    a = gl.tensor(A)
    direction = RNG.standard_normal(A.shape)
    _, tangent = staged(mode, lambda a, t: gl.jvp(fn, (a,), (t,)))(a, gl.tensor(direction))
    eps = 1e-6
    numeric = float(fn(gl.tensor(A + eps * direction))) - float(fn(gl.tensor(A - eps * direction)))
    np.testing.assert_allclose(float(tangent), numeric / (2 * eps), rtol=1e-6)
    hessian = np.asarray(staged(mode, gl.hessian(fn))(a)).reshape(A.size, A.size)
    np.testing.assert_allclose(hessian, _numeric_hessian(fn, A), rtol=1e-5, atol=1e-5)


def test_pure_stablehlo_runs_on_the_reference_interpreter() -> None:
    pytest.importorskip("jax", reason="the StableHLO reference interpreter comes with JAX")
    from test_stablehlo_export import assert_pure, reference

    text = gl.to_mlir(every, *(gl.tensor(x) for x in ARGS), dialect="stablehlo")
    assert_pure(text)
    for k, (g, w) in enumerate(zip(reference(text, *ARGS), numpy_answers(*ARGS), strict=True)):
        np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-12, err_msg=f"result {k}")


def test_singular_and_indefinite_matrices_raise_eagerly() -> None:
    singular = gl.tensor(np.array([[1.0, 2.0], [2.0, 4.0]]))
    assert float(L.det(singular)) == 0.0
    sign, logabs = L.slogdet(singular)
    assert float(sign) == 0.0 and float(logabs) == -np.inf
    for call in (
        lambda: L.solve(singular, gl.tensor(np.ones(2))),
        lambda: L.inv(singular),
        lambda: L.solve_triangular(
            gl.tensor(np.array([[1.0, 0.0], [1.0, 0.0]])), gl.ones([2], gl.float64), lower=True
        ),
    ):
        with pytest.raises(gl.errors.LinAlgError, match="singular"):
            call()
    indefinite = gl.tensor(np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(gl.errors.LinAlgError, match="not positive definite") as caught:
        L.cholesky(indefinite)
    assert "test_linalg.py" in str(caught.value)  # the user's line
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("mode", ["executor", "compiled"])
def test_traced_singular_and_indefinite_matrices_give_inf_or_nan(mode: str) -> None:
    def both(singular, indefinite):
        return L.solve(singular, gl.ones([2], gl.float64)), L.cholesky(indefinite)

    x, low = staged(mode, both)(
        gl.tensor(np.array([[1.0, 2.0], [2.0, 4.0]])), gl.tensor(np.array([[1.0, 2.0], [2.0, 1.0]]))
    )
    assert not np.isfinite(np.asarray(x)).all()
    assert np.isnan(np.asarray(low)).any()


def test_the_norm_s_gradient_at_zero_is_zero() -> None:
    for fn in (L.norm, lambda x: L.norm(x, "fro"), lambda x: L.norm(x, axis=1)):
        g = gl.grad(lambda x, fn=fn: gl.sum(fn(x)))(gl.zeros([2, 3], gl.float64))
        np.testing.assert_array_equal(np.asarray(g), np.zeros((2, 3)))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: L.solve(gl.ones([2, 3]), gl.ones([2])), "ShapeError", "square"),
        (lambda: L.solve(gl.ones([2, 2]), gl.ones([3])), "ShapeError", "rows"),
        (lambda: L.solve(gl.ones([2, 2]), gl.ones([2], gl.float64)), "DTypeError", "float64"),
        (lambda: L.inv(gl.ones([2, 2], gl.int32)), "DTypeError", "float32 or float64"),
        (lambda: L.solve(gl.ones([2, 3, 3]), gl.ones([4, 3, 1])), "ShapeError", "broadcast"),
        (
            lambda: L.solve_triangular(gl.ones([2, 2]), gl.ones([2]), trans=2),
            "InvalidArgumentError",
            "trans",
        ),
        (lambda: L.norm(gl.ones([2, 2]), "max"), "InvalidArgumentError", "not a matrix norm"),
        (
            lambda: L.lstsq(gl.tensor(np.ones((3, 2))), gl.tensor(np.ones(3))),
            "LinAlgError",
            "rank-deficient",
        ),
        (lambda: L.lstsq(gl.ones([3, 2]), gl.ones([4])), "ShapeError", "3 rows"),
        (lambda: L.norm(gl.ones([2]), axis=3), "InvalidArgumentError", "axis 3"),
        (
            lambda: L.lu_solve((gl.ones([2, 2]), gl.ones([2])), gl.ones([2])),
            "InvalidArgumentError",
            "piv",
        ),
    ],
)
def test_bad_arguments_raise_clear_errors(call, error: str, match: str) -> None:
    with pytest.raises(getattr(gl.errors, error), match=match):
        call()
