"""numpy's array functions in `gl` (`arrays`, `reductions`, `contractions`): values against
numpy eagerly, in graph mode and under `gl.jit` (one program computes them all, so one IREE
compile per dtype), gradients against central differences (every differentiable one, at
points where the answer is subtle: zeros in products, ties in sorts), the pure StableHLO
emission, and the errors of bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from gradcheck import check_grads
from runners import staged

MODES = ("eager", "executor", "compiled")
RNG = np.random.default_rng(53)
M = RNG.standard_normal((4, 5))
M[1, 2] = 0.0
M[3, 0] = M[3, 4] = 2.5  # a tie
V = RNG.standard_normal(5)
SORTED = np.array([-1.0, 0.0, 0.0, 0.5, 2.0, np.nan])
PROBES = np.array([[-2.0, 0.0, 0.25], [2.0, 3.0, np.nan]])
B3 = RNG.standard_normal((2, 4, 5))
C3 = RNG.standard_normal((2, 5, 3))
UNTIED = M + np.arange(20.0).reshape(4, 5) * 1e-3  # (a tie has no derivative)


def numpy_answers(m, v, s, p, b, c):
    """What each function gives in numpy, in the order `every` returns them."""
    return [
        np.eye(3, 4, 1),
        np.diag(v, -1),
        np.diag(m, 1),
        np.trace(m, -1),
        np.tril(m, 1),
        np.triu(m),
        np.linspace(-1.0, 2.0, 7),
        np.tile(v, (2, 1, 2)),
        np.repeat(m, [1, 0, 2, 1], axis=0),
        np.split(m, [1, 4], axis=1)[1],
        np.pad(m, ((1, 2), (3, 0)), "reflect"),
        np.pad(v, 3, "edge"),
        np.pad(m, 1, constant_values=7.0),
        np.any(m > 2.0, axis=1),
        np.all(m != 0.0, axis=0),
        np.argmax(m, axis=1),
        np.argmin(m),
        np.prod(m, axis=1),
        np.cumsum(m, axis=0),
        np.cumprod(v),
        np.log(np.sum(np.exp(m), axis=1)),
        np.exp(m) / np.sum(np.exp(m), axis=-1, keepdims=True),
        np.searchsorted(s, p, side="left"),
        np.searchsorted(s, p, side="right"),
        np.argsort(m, axis=1, kind="stable"),
        np.sort(m, axis=0),
        np.einsum("bij,bjk->bik", b, c),
        np.einsum("ii->i", m[:4, :4]),
        np.einsum("...j,j->...", m, v),
        np.tensordot(b, c, ([0, 2], [0, 1])),
        np.outer(v, v[:3]),
        np.cross(m[:, :3], v[:3]),
    ]


def every(m, v, s, p, b, c):
    return (
        gl.eye(3, 4, 1, dtype=m.dtype),
        gl.diag(v, -1),
        gl.diag(m, 1),
        gl.trace(m, -1),
        gl.tril(m, 1),
        gl.triu(m),
        gl.linspace(-1.0, 2.0, 7, dtype=m.dtype),
        gl.tile(v, (2, 1, 2)),
        gl.repeat(m, [1, 0, 2, 1], axis=0),
        gl.split(m, [1, 4], axis=1)[1],
        gl.pad(m, ((1, 2), (3, 0)), "reflect"),
        gl.pad(v, 3, "edge"),
        gl.pad(m, 1, constant_values=7.0),
        gl.any(m > 2.0, axis=1),
        gl.all(m != 0.0, axis=0),
        gl.argmax(m, axis=1),
        gl.argmin(m),
        gl.prod(m, axis=1),
        gl.cumsum(m, axis=0),
        gl.cumprod(v),
        gl.logsumexp(m, axis=1),
        gl.softmax(m),
        gl.searchsorted(s, p, side="left"),
        gl.searchsorted(s, p, side="right"),
        gl.argsort(m, axis=1),
        gl.sort(m, axis=0),
        gl.einsum("bij,bjk->bik", b, c),
        gl.einsum("ii->i", m[:4, :4]),
        gl.einsum("...j,j->...", m, v),
        gl.tensordot(b, c, ([0, 2], [0, 1])),
        gl.outer(v, v[:3]),
        gl.cross(m[:, :3], v[:3]),
    )


# float32 compiles the same ops as float64: one IREE compile is enough
@pytest.mark.parametrize(
    ("mode", "dtype"),
    [(m, np.float64) for m in MODES] + [("eager", np.float32), ("executor", np.float32)],
)
def test_values_match_numpy(mode: str, dtype: type) -> None:
    args = [x.astype(dtype) for x in (M, V, SORTED, PROBES, B3, C3)]
    got = staged(mode, every)(*(gl.tensor(a) for a in args))
    wants = numpy_answers(*args)
    assert len(got) == len(wants)
    rtol = 1e-12 if dtype == np.float64 else 2e-6
    for k, (g, w) in enumerate(zip(got, wants, strict=True)):
        g = np.asarray(g)
        assert g.shape == w.shape, (k, g.shape, w.shape)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=f"result {k} ({mode})")
            assert g.dtype == (np.bool_ if w.dtype == np.bool_ else np.int32), k
        else:
            assert g.dtype == dtype, k
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, err_msg=f"result {k} ({mode})")


GRADIENTS = {
    "diag_and_trace": (lambda m: gl.diag(gl.diag(m, 1), -1) + gl.trace(m) * m, [M[:4, :4]]),
    "tril_triu": (lambda m: gl.tril(m, -1) * gl.triu(m, 1).T, [M[:4, :4]]),
    "linspace_tensor_ends": (lambda a, b: gl.linspace(a, b, 5, axis=1) ** 2, [V[:3], V[3:4]]),
    "tile_repeat": (lambda v: gl.tile(v, 3) * gl.repeat(v, 3), [V]),
    "pad_modes": (
        lambda m: gl.sum(gl.pad(m, 2, "reflect") ** 2) + gl.pad(m, 1, "wrap") * 2.0,
        [M],
    ),
    "split": (lambda m: gl.split(m, 2, axis=0)[0] * gl.split(m, 2, axis=0)[1], [M]),
    "prod_with_a_zero": (lambda m: gl.prod(m, axis=1), [M]),
    "prod_all": (lambda v: gl.prod(v), [V]),
    "cumsum": (lambda m: gl.cumsum(m, axis=1) ** 2, [M]),
    "cumprod_with_a_zero": (lambda m: gl.cumprod(m, axis=1), [M]),
    "logsumexp_softmax": (
        lambda m: gl.logsumexp(m, axis=0) + gl.sum(gl.softmax(m, axis=0) * m, axis=0),
        [M],
    ),
    "sort": (
        lambda m: gl.sort(m, axis=1) * np.arange(5.0),
        [M + np.arange(20.0).reshape(4, 5) * 1e-3],
    ),
    "einsum": (lambda b, c: gl.einsum("bij,bjk->ik", b, c), [B3, C3]),
    "einsum_trace": (lambda m: gl.einsum("ii,ij->j", m[:, :4], m), [M[:4]]),
    "tensordot_outer_cross": (
        lambda a, b: gl.sum(gl.tensordot(a, b, 1)) * gl.outer(a[0], b[1]) + gl.cross(a, b)[0, 0],
        [M[:3, :3], M[1:4, 1:4]],
    ),
}


@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_gradients_match_finite_differences(name: str) -> None:
    fn, args = GRADIENTS[name]
    check_grads(fn, args, order=2, modes=("tape", "grad", "graph"))


@pytest.mark.slow
def test_compiled_gradients_of_them_all() -> None:
    def total(m, b, c):
        terms = [
            gl.sum(gl.diag(m[:, :4], 1)) * gl.trace(m[:, :4]),
            gl.sum(gl.tril(m, -1) ** 2),
            gl.sum(gl.prod(m, axis=1)),
            gl.sum(gl.cumprod(m, axis=0) * gl.cumsum(m, axis=1)),
            gl.sum(gl.logsumexp(m, axis=1)),
            gl.sum(gl.sort(m, axis=1) * np.arange(5.0)),
            gl.sum(gl.pad(m, 1, "symmetric") ** 3),
            gl.sum(gl.einsum("bij,bjk->ik", b, c) ** 2),
        ]
        return sum(terms[1:], terms[0])

    check_grads(total, [UNTIED, B3, C3], order=1, modes=("compiled",))


@pytest.mark.slow
def test_sums_of_broadcast_products_over_several_axes_compile() -> None:
    w = np.arange(5.0)
    m = gl.tensor(M)

    def sums(m):
        cube = gl.reshape(m, [4, 1, 5]) * np.ones((3, 5))
        return (
            gl.sum(m * w),
            gl.mean(m[:3] * w),
            gl.sum(cube * w, axis=(0, 2)),
            gl.sum(cube, (0, 2)),
        )

    got = gl.jit(sums)(m)
    cube = M.reshape(4, 1, 5) * np.ones((3, 5))
    wants = (np.sum(M * w), np.mean(M[:3] * w), np.sum(cube * w, axis=(0, 2)), cube.sum((0, 2)))
    for g, want in zip(got, wants, strict=True):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-12)


def test_pure_stablehlo_runs_on_the_reference_interpreter() -> None:
    pytest.importorskip("jax", reason="the StableHLO reference interpreter comes with JAX")
    from test_stablehlo_export import assert_pure, reference

    arrays = (M, V, SORTED, PROBES, B3, C3)
    text = gl.to_mlir(every, *(gl.tensor(x) for x in arrays), dialect="stablehlo")
    assert_pure(text)
    got = reference(text, *arrays)
    for k, (g, w) in enumerate(zip(got, numpy_answers(*arrays), strict=True)):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=f"result {k}")


def test_prod_and_cumprod_gradients_at_zeros_are_the_products_of_the_others() -> None:
    x = gl.tensor(np.array([2.0, 0.0, 3.0, 0.0]))
    np.testing.assert_array_equal(np.asarray(gl.grad(gl.prod)(x)), [0.0, 0.0, 0.0, 0.0])
    y = gl.tensor(np.array([2.0, 0.0, 3.0]))
    np.testing.assert_array_equal(np.asarray(gl.grad(gl.prod)(y)), [0.0, 6.0, 0.0])
    g = gl.grad(lambda v: gl.sum(gl.cumprod(v)))(y)
    # d/dv of 2 + 2v1 + 2*v1*3 at v = (2, 0, 3): (1 + v1 + 3 v1, 2 + 6, 2 v1)
    np.testing.assert_array_equal(np.asarray(g), [1.0, 8.0, 0.0])


def test_argmax_argmin_follow_numpy_on_nan_and_ties() -> None:
    x = np.array([[1.0, 3.0, 3.0, np.nan, 0.0], [-1.0, -1.0, 2.0, 2.0, -5.0]])
    for name in ("argmax", "argmin"):
        for axis in (None, 0, 1):
            got = getattr(gl, name)(gl.tensor(x), axis=axis)
            np.testing.assert_array_equal(np.asarray(got), getattr(np, name)(x, axis=axis))
    assert np.asarray(gl.argmax(gl.tensor(x), axis=1, keepdims=True)).shape == (2, 1)
    assert np.asarray(gl.argmax(gl.tensor(x), keepdims=True)).shape == (1, 1)


def test_empty_reductions() -> None:
    e = gl.zeros([0])
    assert not bool(gl.any(e)) and bool(gl.all(e))
    assert float(gl.prod(e)) == 1.0
    assert gl.cumsum(e).shape == (0,)
    with pytest.raises(gl.errors.InvalidArgumentError, match="argmax"):
        gl.argmax(e)


def test_logsumexp_of_infinities_and_weights() -> None:
    assert float(gl.logsumexp(gl.tensor([-np.inf, -np.inf]))) == -np.inf
    assert float(gl.logsumexp(gl.tensor([np.inf, 1.0]))) == np.inf
    big = np.array([1000.0, 1000.0])
    np.testing.assert_allclose(float(gl.logsumexp(gl.tensor(big))), 1000.0 + np.log(2.0))
    w = np.array([0.5, 2.0])
    got = gl.logsumexp(gl.tensor(np.array([1.0, 2.0])), b=gl.tensor(w))
    np.testing.assert_allclose(float(got), np.log(np.sum(w * np.exp([1.0, 2.0]))), rtol=1e-6)


def test_integer_and_bool_inputs() -> None:
    i = gl.tensor(np.array([[3, 1, 2], [0, 5, 5]], dtype=np.int32))
    np.testing.assert_array_equal(np.asarray(gl.sort(i, axis=1)), [[1, 2, 3], [0, 5, 5]])
    np.testing.assert_array_equal(np.asarray(gl.cumsum(i, axis=1)), [[3, 4, 6], [0, 5, 10]])
    np.testing.assert_array_equal(np.asarray(gl.prod(i, axis=0)), [0, 5, 10])
    assert gl.cumsum(gl.tensor([True, True])).dtype == gl.int32
    np.testing.assert_array_equal(np.asarray(gl.argmax(gl.tensor([False, True]))), 1)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: gl.einsum("ij,jk->ik", gl.ones([2, 3]), gl.ones([4, 5])), "ShapeError", "'j'"),
        (lambda: gl.einsum("ij->k", gl.ones([2, 3])), "InvalidArgumentError", "'k'"),
        (lambda: gl.einsum("ij,jk", gl.ones([2, 3])), "InvalidArgumentError", "2 operands"),
        (lambda: gl.einsum("ijk", gl.ones([2, 3])), "ShapeError", "ijk"),
        (lambda: gl.tensordot(gl.ones([2, 3]), gl.ones([4]), 1), "ShapeError", "tensordot"),
        (lambda: gl.split(gl.ones([5]), 2), "InvalidArgumentError", "equal sections"),
        (lambda: gl.pad(gl.ones([2]), 1, "mean"), "InvalidArgumentError", "mode"),
        (lambda: gl.cumsum(gl.ones([2]), axis=1), "InvalidArgumentError", "axis 1"),
        (lambda: gl.diag(gl.ones([2, 2, 2])), "InvalidArgumentError", "diag"),
        (lambda: gl.cross(gl.ones([4]), gl.ones([3])), "ShapeError", "cross"),
        (lambda: gl.searchsorted(gl.ones([2, 2]), gl.ones([1])), "InvalidArgumentError", "1-D"),
        (lambda: gl.repeat(gl.ones([3]), [1, 2]), "InvalidArgumentError", "repeat"),
    ],
)
def test_bad_arguments_raise_clear_errors(call, error: str, match: str) -> None:
    with pytest.raises(getattr(gl.errors, error), match=match):
        call()


def test_numpy_s_methods_are_the_functions() -> None:
    x = gl.tensor(M)
    calls = {
        "any": ((), {"axis": 1}),
        "all": ((0,), {}),
        "argmax": ((), {"axis": 1}),
        "argmin": ((), {}),
        "argsort": ((), {"axis": 0}),
        "prod": ((), {"axis": 1, "keepdims": True}),
        "cumsum": ((1,), {}),
        "cumprod": ((), {"axis": 0}),
        "clip": ((-0.5, 0.5), {}),
        "diagonal": ((1,), {}),
        "trace": ((), {}),
        "repeat": ((2,), {"axis": 0}),
    }
    for name, (args, kwargs) in calls.items():
        got = getattr(x, name)(*args, **kwargs)
        want = getattr(gl, name)(x, *args, **kwargs)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=name)
        np.testing.assert_allclose(
            np.asarray(got), getattr(M, name)(*args, **kwargs), err_msg=name, rtol=1e-12
        )


def test_numpy_s_reductions_call_the_tensor_s_methods() -> None:
    # np.sum(x), np.mean(x, dtype=...), np.max(x) and np.min(x) call the methods with numpy's
    # keywords (dtype, out): they give numpy's answers, and out= is a clear error.
    data = np.array([[1.5, -2.0, 4.0], [0.5, 3.0, -1.0]])
    x = gl.tensor(data)
    for name in ("sum", "mean", "max", "min"):
        for axis in (None, 0, 1):
            got = getattr(np, name)(x, axis=axis)
            want = getattr(np, name)(data, axis=axis)
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-15)
    counts = gl.tensor(np.array([[1, 2], [3, 4]], dtype=np.int32))
    mean = np.mean(counts, dtype=np.float32)
    assert isinstance(mean, gl.Tensor) and mean.dtype == gl.float32 and float(mean) == 2.5
    assert np.sum(counts, dtype=np.float64).dtype == gl.float64
    assert counts.sum(axis=0, keepdims=True).shape == (1, 2)
    with pytest.raises(gl.errors.InvalidArgumentError, match="out= is not supported"):
        np.sum(x, out=np.zeros(()))
