"""Forward results of every op against numpy: values, result dtype and shape, for each dtype where
the op is meaningful; Python operators, scalar adaptation, tensor construction and numpy interop.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import gradloop as gl

NP = {
    gl.float32: np.float32,
    gl.float64: np.float64,
    gl.int32: np.int32,
    gl.int64: np.int64,
    gl.bool_: np.bool_,
}
FLOATS = (gl.float32, gl.float64)
INTS = (gl.int32, gl.int64)
NUMERIC = FLOATS + INTS
SHAPES = ((), (5,), (2, 3), (0, 4), (1, 3, 1))


def make(
    dtype: gl.DType,
    shape: tuple[int, ...],
    seed: int = 0,
    low: float = -3.0,
    high: float = 3.0,
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == gl.bool_:
        return rng.uniform(size=shape) < 0.5
    if dtype in INTS:
        return rng.integers(int(low), int(high) + 1, shape).astype(NP[dtype])
    return rng.uniform(low, high, shape).astype(NP[dtype])


def check(result: gl.Tensor, expected: np.ndarray, dtype: gl.DType | None = None) -> None:
    """`result` has `expected`'s shape, the dtype `dtype` (default: expected's), and its values."""
    assert isinstance(result, gl.Tensor)
    want = dtype if dtype is not None else gl.as_dtype(expected.dtype)
    assert result.dtype == want, f"dtype {result.dtype} != {want}"
    assert result.shape == expected.shape, f"shape {result.shape} != {expected.shape}"
    got = np.asarray(result)
    if want == gl.float32:
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)
    elif want == gl.float64:
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    else:
        np.testing.assert_array_equal(got, expected)


UNARY = {
    "neg": (gl.neg, np.negative, NUMERIC, "real"),
    "abs": (gl.abs, np.abs, NUMERIC, "real"),
    "sign": (gl.sign, np.sign, NUMERIC, "real"),
    "floor": (gl.floor, np.floor, FLOATS, "real"),
    "ceil": (gl.ceil, np.ceil, FLOATS, "real"),
    "round": (gl.round, np.round, FLOATS, "real"),
    "relu": (gl.relu, lambda x: np.maximum(x, x.dtype.type(0)), NUMERIC, "real"),
    "exp": (gl.exp, np.exp, FLOATS, "real"),
    "log": (gl.log, np.log, FLOATS, "pos"),
    "sqrt": (gl.sqrt, np.sqrt, FLOATS, "pos"),
    "sin": (gl.sin, np.sin, FLOATS, "real"),
    "cos": (gl.cos, np.cos, FLOATS, "real"),
    "tanh": (gl.tanh, np.tanh, FLOATS, "real"),
    "sigmoid": (
        gl.sigmoid,
        lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype),
        FLOATS,
        "real",
    ),
    "logical_not": (gl.logical_not, np.logical_not, (gl.bool_,), "real"),
}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(
    ("name", "dtype"),
    [(n, d) for n, spec in UNARY.items() for d in spec[2]],
    ids=lambda v: str(v),
)
def test_unary(name: str, dtype: gl.DType, shape: tuple[int, ...]) -> None:
    fn, ref, _, domain = UNARY[name]
    x = make(dtype, shape, low=0.1 if domain == "pos" else -3.0)
    if dtype in INTS and x.ndim:
        x[..., :1] = 0  # sign(0) and relu(0) included
    check(fn(gl.tensor(x)), np.asarray(ref(x)))


PAIRS = (
    ((), ()),
    ((4,), (4,)),
    ((2, 3), (3,)),
    ((2, 1), (1, 3)),
    ((), (2, 2)),
    ((3, 1, 2), (4, 1)),
    ((0, 3), (1, 3)),
)
ARITH = {
    "add": (gl.add, np.add),
    "sub": (gl.sub, np.subtract),
    "mul": (gl.mul, np.multiply),
}
ARITH |= {"maximum": (gl.maximum, np.maximum), "minimum": (gl.minimum, np.minimum)}
COMPARE = {
    "equal": (gl.equal, np.equal),
    "not_equal": (gl.not_equal, np.not_equal),
    "less": (gl.less, np.less),
    "less_equal": (gl.less_equal, np.less_equal),
    "greater": (gl.greater, np.greater),
    "greater_equal": (gl.greater_equal, np.greater_equal),
}


@pytest.mark.parametrize("shapes", PAIRS, ids=str)
@pytest.mark.parametrize("dtype", NUMERIC, ids=str)
@pytest.mark.parametrize("name", sorted(ARITH))
def test_arithmetic(name: str, dtype: gl.DType, shapes: tuple) -> None:
    fn, ref = ARITH[name]
    a, b = make(dtype, shapes[0], 1), make(dtype, shapes[1], 2)
    check(fn(gl.tensor(a), gl.tensor(b)), ref(a, b))


@pytest.mark.parametrize("shapes", PAIRS, ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_div_and_pow(dtype: gl.DType, shapes: tuple) -> None:
    a, b = make(dtype, shapes[0], 1), make(dtype, shapes[1], 2)
    b = np.where(np.abs(b) < 0.1, b.dtype.type(0.5), b)
    check(gl.div(gl.tensor(a), gl.tensor(b)), a / b)
    base = np.asarray(np.abs(a) + a.dtype.type(0.1))  # an array even when 0-d
    check(gl.pow(gl.tensor(base), gl.tensor(b)), np.power(base, b))


# ordering comparisons are defined on numeric dtypes, equality on every dtype
CMP_CASES = [
    (n, d)
    for n in sorted(COMPARE)
    for d in (*NUMERIC, gl.bool_)
    if d != gl.bool_ or "equal" in n[:9]
]


@pytest.mark.parametrize("shapes", PAIRS, ids=str)
@pytest.mark.parametrize(("name", "dtype"), CMP_CASES, ids=str)
def test_comparison(name: str, dtype: gl.DType, shapes: tuple) -> None:
    fn, ref = COMPARE[name]
    a, b = make(dtype, shapes[0], 1, -2, 2), make(dtype, shapes[1], 2, -2, 2)
    if dtype in FLOATS:  # exact ties too
        a, b = np.asarray(np.round(a)), np.asarray(np.round(b))
    check(fn(gl.tensor(a), gl.tensor(b)), ref(a, b))


@pytest.mark.parametrize("shapes", PAIRS, ids=str)
def test_logical(shapes: tuple) -> None:
    a, b = make(gl.bool_, shapes[0], 1), make(gl.bool_, shapes[1], 2)
    check(gl.logical_and(gl.tensor(a), gl.tensor(b)), np.logical_and(a, b))
    check(gl.logical_or(gl.tensor(a), gl.tensor(b)), np.logical_or(a, b))
    check(gl.tensor(a) & gl.tensor(b), a & b)
    check(gl.tensor(a) | gl.tensor(b), a | b)
    check(~gl.tensor(a), ~a)


@pytest.mark.parametrize("shapes", PAIRS, ids=str)
@pytest.mark.parametrize("dtype", [np.int32, np.int64], ids=str)
def test_bitwise(shapes: tuple, dtype) -> None:
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=shapes[0], dtype=dtype)
    b = rng.integers(info.min, info.max, size=shapes[1], dtype=dtype)
    for fn, ref in (
        (gl.bitwise_and, np.bitwise_and),
        (gl.bitwise_or, np.bitwise_or),
        (gl.bitwise_xor, np.bitwise_xor),
    ):
        check(fn(gl.tensor(a), gl.tensor(b)), ref(a, b))
        traced = gl.function(fn)(gl.tensor(a), gl.tensor(b))
        np.testing.assert_array_equal(np.asarray(traced), ref(a, b))
    with pytest.raises(gl.errors.DTypeError, match="integer"):
        gl.bitwise_and(gl.tensor(np.ones(2)), gl.tensor(np.ones(2)))


@pytest.mark.parametrize("dtype", (*NUMERIC, gl.bool_), ids=str)
@pytest.mark.parametrize(
    "shapes",
    [((2, 3),) * 3, ((3,), (2, 3), ()), ((2, 1), (1, 3), (2, 3)), ((0, 1), (3,), (1,))],
    ids=str,
)
def test_where(dtype: gl.DType, shapes: tuple) -> None:
    c, x, y = (
        make(gl.bool_, shapes[0], 3),
        make(dtype, shapes[1], 4),
        make(dtype, shapes[2], 5),
    )
    check(gl.where(gl.tensor(c), gl.tensor(x), gl.tensor(y)), np.where(c, x, y))


AXES = (None, 0, -1, 1, (0, 2), (-1, 0), (), (0, 1, 2))


# mean is defined on floats only (an integer mean is not exact): see test_errors
REDUCE_CASES = [
    (n, d) for n in ("sum", "mean", "max", "min") for d in NUMERIC if n != "mean" or d in FLOATS
]


@pytest.mark.parametrize("keepdims", (False, True))
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize(("name", "dtype"), REDUCE_CASES, ids=str)
def test_reduction(name: str, dtype: gl.DType, axis: object, keepdims: bool) -> None:
    x = make(dtype, (2, 3, 4), 7)
    expected = np.asarray(getattr(np, name)(x, axis=axis, keepdims=keepdims)).astype(x.dtype)
    check(getattr(gl, name)(gl.tensor(x), axis=axis, keepdims=keepdims), expected, dtype)
    check(getattr(gl.tensor(x), name)(axis=axis, keepdims=keepdims), expected, dtype)


@pytest.mark.parametrize("shape", ((), (1,), (0, 3), (3, 0)), ids=str)
def test_sum_of_small_and_empty(shape: tuple[int, ...]) -> None:
    x = make(gl.float64, shape)
    check(gl.sum(gl.tensor(x)), np.sum(x))
    check(gl.sum(gl.tensor(x), keepdims=True), np.sum(x, keepdims=True))
    for axis in range(x.ndim):
        check(gl.sum(gl.tensor(x), axis=axis), np.sum(x, axis=axis))


def test_max_min_over_nonempty_axis_of_empty_tensor() -> None:
    x = make(gl.float32, (0, 3))
    check(gl.max(gl.tensor(x), axis=1), np.max(x, axis=1))
    check(gl.min(gl.tensor(x), axis=-1, keepdims=True), np.min(x, axis=-1, keepdims=True))


MATMUL_SHAPES = (
    ((3, 4), (4, 2)),
    ((1, 1), (1, 5)),
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (3, 4, 2)),
    ((4,), (4, 2)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 4, 3)),
    ((3, 0), (0, 2)),
    ((0, 3), (3, 2)),
)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(dtype: gl.DType, shapes: tuple) -> None:
    a, b = make(dtype, shapes[0], 1), make(dtype, shapes[1], 2)
    check(gl.matmul(gl.tensor(a), gl.tensor(b)), a @ b)
    check(gl.tensor(a) @ gl.tensor(b), a @ b)


INDEXES = (
    (5,), 0, -1, slice(1, 4), slice(None, None, 2), slice(None, None, -1), slice(-2, None, -2),
    slice(10, None), slice(-10, 2), slice(3, 1), None, Ellipsis,
)  # fmt: skip
INDEXES_2D = (
    1, -2, (0, 1), (-1, -1), (slice(None), 2), (slice(1, None), slice(None, None, -2)),
    (None, slice(None), 1), (Ellipsis, 0), (0, Ellipsis), (0, None, slice(1, 3)),
    (slice(None, None, -1), None), (Ellipsis, None),
)  # fmt: skip


@pytest.mark.parametrize("index", INDEXES[1:], ids=repr)
@pytest.mark.parametrize("dtype", (gl.float32, gl.int64, gl.bool_), ids=str)
def test_index_1d(dtype: gl.DType, index: object) -> None:
    x = make(dtype, (5,))
    check(gl.tensor(x)[index], np.asarray(x[index]))


@pytest.mark.parametrize("index", INDEXES_2D, ids=repr)
@pytest.mark.parametrize("dtype", (gl.float64, gl.int32), ids=str)
def test_index_2d(dtype: gl.DType, index: object) -> None:
    x = make(dtype, (3, 4))
    check(gl.tensor(x)[index], np.asarray(x[index]))


@pytest.mark.parametrize(
    "index",
    [
        (1, Ellipsis, slice(None, None, -1)),
        (slice(None), None, slice(None, None, 2), -1),
        (Ellipsis, 1, slice(1, 3)),
        (),
    ],
    ids=repr,
)
def test_index_3d(index: object) -> None:
    x = make(gl.float32, (2, 3, 4))
    check(gl.tensor(x)[index], np.asarray(x[index]))


@pytest.mark.parametrize("idx_dtype", INTS, ids=str)
def test_index_with_scalar_int_tensor(idx_dtype: gl.DType) -> None:
    x = make(gl.float32, (3, 4))
    for i in range(3):
        t = gl.tensor(i, dtype=idx_dtype)
        check(gl.tensor(x)[t], x[i])
        check(gl.tensor(x)[t, 1:], x[i, 1:])
        check(gl.tensor(x)[:, t], x[:, i])


@pytest.mark.parametrize(
    ("shape", "indices", "axis"),
    [
        ((5,), [0, 4, 2, 2], 0),
        ((5,), [-1, -5, 1], 0),
        ((3, 4), [[0, 1], [3, -1]], 1),
        ((3, 4), [2, -3], -2),
        ((3, 4), [1, 0, -1], -1),
        ((3, 4), 2, 0),
        ((2, 3), [5, 0, -2], None),
        ((3, 2), [], 0),
    ],
    ids=str,
)
@pytest.mark.parametrize("idx_dtype", INTS, ids=str)
def test_take(shape: tuple, indices: object, axis: int | None, idx_dtype: gl.DType) -> None:
    x = make(gl.float64, shape)
    idx = np.asarray(indices, dtype=NP[idx_dtype])
    check(gl.take(gl.tensor(x), gl.tensor(idx), axis=axis), np.take(x, idx, axis=axis))


@pytest.mark.parametrize("dtype", (*NUMERIC, gl.bool_), ids=str)
def test_layout_ops(dtype: gl.DType) -> None:
    x = make(dtype, (2, 3, 4))
    t = gl.tensor(x)
    check(gl.reshape(t, (4, 6)), x.reshape(4, 6))
    check(gl.reshape(t, (-1, 2)), x.reshape(-1, 2))
    check(t.reshape(24), x.reshape(24))
    check(t.reshape(2, 12), x.reshape(2, 12))
    check(gl.transpose(t), x.transpose())
    check(gl.transpose(t, (1, 2, 0)), x.transpose(1, 2, 0))
    check(t.transpose(2, 0, 1), x.transpose(2, 0, 1))
    check(t.T, x.T)
    check(gl.broadcast_to(t[:, :1], (5, 2, 3, 4)), np.broadcast_to(x[:, :1], (5, 2, 3, 4)))
    check(gl.concatenate([t, t[:1]], axis=0), np.concatenate([x, x[:1]], axis=0))
    check(
        gl.concatenate([t, t[:, :, :2]], axis=-1),
        np.concatenate([x, x[:, :, :2]], axis=-1),
    )
    check(gl.concatenate([t[:, :0], t], axis=1), np.concatenate([x[:, :0], x], axis=1))
    for axis in (0, 1, 3, -1, -4):
        check(gl.stack([t, t, t], axis=axis), np.stack([x, x, x], axis=axis))
    check(gl.expand_dims(t, 1), np.expand_dims(x, 1))
    check(gl.squeeze(gl.tensor(x[:1, :, :1])), np.squeeze(x[:1, :, :1]))
    check(gl.reshape(gl.tensor(x[0, 0, 0, ...]), (1, 1)), x[0, 0, 0].reshape(1, 1))


@pytest.mark.parametrize("to", (*NUMERIC, gl.bool_), ids=str)
@pytest.mark.parametrize("src", (*NUMERIC, gl.bool_), ids=str)
def test_cast(src: gl.DType, to: gl.DType) -> None:
    x = make(src, (2, 3))
    if src in FLOATS:
        x[0, 0] = 0  # 0 -> False
        x[1, 0] = -2.75  # floats to ints truncate toward zero
    check(gl.cast(gl.tensor(x), to), x.astype(NP[to]))
    check(gl.tensor(x).astype(to), x.astype(NP[to]))


def test_creation() -> None:
    check(gl.arange(5, dtype=gl.int64), np.arange(5, dtype=np.int64))
    check(gl.arange(2, 11, 3, dtype=gl.int32), np.arange(2, 11, 3, dtype=np.int32))
    check(gl.arange(5, 0, -2, dtype=gl.int32), np.arange(5, 0, -2, dtype=np.int32))
    check(gl.arange(0.0, 1.0, 0.25, dtype=gl.float64), np.arange(0.0, 1.0, 0.25))
    check(gl.arange(3, 3, dtype=gl.float32), np.arange(3, 3, dtype=np.float32))
    for dtype in (*NUMERIC, gl.bool_):
        check(gl.zeros((2, 3), dtype=dtype), np.zeros((2, 3), NP[dtype]))
        check(gl.ones((0, 2), dtype=dtype), np.ones((0, 2), NP[dtype]))
        check(gl.ones(4, dtype=dtype), np.ones(4, NP[dtype]))
        x = make(dtype, (3, 1))
        check(gl.zeros_like(gl.tensor(x)), np.zeros_like(x))
        check(gl.ones_like(gl.tensor(x)), np.ones_like(x))
    check(gl.zeros_like(gl.tensor(make(gl.int32, (2,))), dtype=gl.float64), np.zeros(2))
    check(
        gl.ones_like(gl.tensor(make(gl.float32, (2,))), dtype=gl.int64),
        np.ones(2, np.int64),
    )
    check(gl.full((2, 2), 7.5, dtype=gl.float64), np.full((2, 2), 7.5))
    check(gl.full(3, 4, dtype=gl.int32), np.full(3, 4, np.int32))
    check(gl.full((), -1.0, dtype=gl.float32), np.full((), -1.0, np.float32))


def test_creation_default_dtypes() -> None:
    # Python scalars default as in gl.tensor: int -> int32, float -> float32, bool -> bool
    check(gl.arange(4), np.arange(4, dtype=np.int32))
    check(gl.arange(0.5, 2.0, 0.5), np.arange(0.5, 2.0, 0.5, dtype=np.float32))
    check(gl.full((2,), 3), np.full(2, 3, np.int32))
    check(gl.full((2,), 3.0), np.full(2, 3.0, np.float32))
    check(gl.full((2,), True), np.full(2, True))
    check(gl.zeros((2,)), np.zeros(2, np.float32))
    check(gl.ones(()), np.ones((), np.float32))


# ---- Python operators and scalar adaptation --------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_python_operators(dtype: gl.DType) -> None:
    a, b = make(dtype, (2, 3), 1), make(dtype, (3,), 2, 0.5, 2.0)
    ta, tb = gl.tensor(a), gl.tensor(b)
    check(ta + tb, a + b)
    check(ta - tb, a - b)
    check(ta * tb, a * b)
    check(ta / tb, a / b)
    check(tb**ta, b**a)
    check(ta @ gl.tensor(a.T), a @ a.T)
    check(-ta, -a)
    check(+ta, a)
    check(abs(ta), np.abs(a))
    check(ta < tb, a < b)
    check(ta <= tb, a <= b)
    check(ta > tb, a > b)
    check(ta >= tb, a >= b)
    check(ta == gl.tensor(a), a == a.copy())
    check(ta != tb, a != b)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_reflected_operators_with_python_scalars(dtype: gl.DType) -> None:
    a = make(dtype, (4,), 3, 0.5, 2.0)
    t, s = gl.tensor(a), NP[dtype]
    check(t + 2, a + s(2))
    check(2 + t, s(2) + a)
    check(t - 0.5, a - s(0.5))
    check(3 - t, s(3) - a)
    check(2.5 * t, s(2.5) * a)
    check(t * 2, a * s(2))
    check(t / 4, a / s(4))
    check(1.0 / t, s(1.0) / a)
    check(t**2, a ** s(2))
    check(t**0.5, a ** s(0.5))
    check(2.0**t, s(2.0) ** a)
    check(t > 1, s(1) < a)
    check(t >= 1.5, a >= s(1.5))
    check(t == 1.0, a == s(1.0))


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_python_int_adapts_to_int_tensors(dtype: gl.DType) -> None:
    a = make(dtype, (2, 3), 4)
    t, s = gl.tensor(a), NP[dtype]
    check(t + 3, a + s(3))
    check(3 - t, s(3) - a)
    check(t * -2, a * s(-2))
    check(gl.maximum(t, 0), np.maximum(a, s(0)))
    check(gl.minimum(1, t), np.minimum(s(1), a))
    check(t > 0, a > 0)
    check(-t, -a)


def test_bool_operators_with_python_bools() -> None:
    a = make(gl.bool_, (5,))
    t = gl.tensor(a)
    check(t & True, a & True)
    check(False | t, False | a)
    check(True & t, True & a)
    check(gl.equal(t, True), np.equal(a, True))


@pytest.mark.parametrize(
    "expr",
    [
        lambda t: t + 1.5,
        lambda t: 1.5 + t,
        lambda t: t * 0.5,
        lambda t: 2.0 - t,
        lambda t: gl.add(t, 0.5),
        lambda t: gl.maximum(0.0, t),
        lambda t: gl.where(t > 0, t, 0.5),
    ],
    ids=["add", "radd", "mul", "rsub", "gl.add", "gl.maximum", "gl.where"],
)
@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_python_float_does_not_adapt_to_int_tensors(dtype: gl.DType, expr) -> None:
    t = gl.tensor(make(dtype, (3,)))
    with pytest.raises(gl.errors.DTypeError):
        expr(t)


@pytest.mark.parametrize(
    "expr",
    [
        lambda a, b: a + b,
        lambda a, b: b * a,
        lambda a, b: gl.maximum(a, b),
        lambda a, b: a @ b,
        lambda a, b: a < b,
    ],
    ids=["add", "rmul", "maximum", "matmul", "less"],
)
def test_mixed_tensor_dtypes_raise(expr) -> None:
    f32, f64 = gl.tensor(make(gl.float32, (2, 2))), gl.tensor(make(gl.float64, (2, 2)))
    i32, i64 = gl.tensor(make(gl.int32, (2, 2))), gl.tensor(make(gl.int64, (2, 2)))
    for a, b in ((f32, f64), (f64, f32), (i32, f32)):
        with pytest.raises(gl.errors.DTypeError):
            expr(a, b)
    with pytest.raises(gl.errors.DTypeError):
        expr(i32, i64)


def test_scalar_results_keep_float32() -> None:
    t = gl.tensor(np.array([1.0, 2.0], np.float32))
    check(t * 0.1, np.array([1.0, 2.0], np.float32) * np.float32(0.1))
    check(t + 1e10, np.array([1.0, 2.0], np.float32) + np.float32(1e10))


# ---- tensor construction, attributes, numpy interop ------------------------------------------


@pytest.mark.parametrize(
    ("data", "dtype", "shape"),
    [
        (1.5, gl.float32, ()),
        (2, gl.int32, ()),
        (True, gl.bool_, ()),
        ([1.0, 2.0], gl.float32, (2,)),
        ([[1, 2, 3], [4, 5, 6]], gl.int32, (2, 3)),
        ([1, 2.5], gl.float32, (2,)),
        ([[True], [False]], gl.bool_, (2, 1)),
        ([], gl.float32, (0,)),
        ([[[0.5]]], gl.float32, (1, 1, 1)),
    ],
    ids=repr,
)
def test_tensor_from_python(data: object, dtype: gl.DType, shape: tuple) -> None:
    check(gl.tensor(data), np.asarray(data, dtype=NP[dtype]), dtype)
    assert gl.tensor(data).shape == shape


@pytest.mark.parametrize("dtype", (*NUMERIC, gl.bool_), ids=str)
def test_tensor_from_numpy_keeps_dtype(dtype: gl.DType) -> None:
    for shape in SHAPES:
        x = make(dtype, shape)
        check(gl.tensor(x), x, dtype)
    x = make(dtype, (3, 4))[:, ::2]  # a non-contiguous view
    check(gl.tensor(x), x, dtype)
    check(gl.tensor(x[1, 1]), np.asarray(x[1, 1]), dtype)  # a numpy scalar


@pytest.mark.parametrize("dtype", (*NUMERIC, gl.bool_), ids=str)
def test_tensor_from_numpy_in_every_layout_and_byte_order(dtype: gl.DType) -> None:
    x = make(dtype, (3, 4))
    swapped = x.astype(x.dtype.newbyteorder())  # equal values, the other byte order
    check(gl.tensor(swapped), x, dtype)
    check(gl.tensor(np.asfortranarray(x)), x, dtype)
    check(gl.tensor(x.view(np.matrix)), x, dtype)  # a subclass keeps its dtype
    check(gl.tensor(x, dtype=dtype), x, dtype)  # the dtype it has: no conversion
    check(gl.tensor(x, dtype=gl.float64), x.astype(np.float64), gl.float64)


@pytest.mark.parametrize("array", [np.zeros(2, np.float16), np.zeros(2, np.uint8)], ids=str)
def test_tensor_from_numpy_of_an_unsupported_dtype_names_it(array: np.ndarray) -> None:
    with pytest.raises(gl.errors.DTypeError, match=f"numpy dtype {array.dtype} is not supported"):
        gl.tensor(array)


def test_tensor_with_explicit_dtype() -> None:
    check(gl.tensor([1, 2], dtype=gl.float64), np.array([1.0, 2.0]))
    check(gl.tensor(3, dtype=gl.int64), np.array(3, np.int64))
    check(gl.tensor(2.0, dtype=gl.float64), np.array(2.0))
    check(gl.tensor(np.arange(3.0), dtype=gl.float32), np.arange(3.0, dtype=np.float32))
    check(gl.tensor([0.0, 1.0], dtype="float64"), np.array([0.0, 1.0]))
    t = gl.tensor([1.0, 2.0])
    check(gl.tensor(t), np.array([1.0, 2.0], np.float32))


@pytest.mark.parametrize("dtype", (*NUMERIC, gl.bool_), ids=str)
def test_numpy_views_share_memory(dtype: gl.DType) -> None:
    x = make(dtype, (3, 4))
    t = gl.tensor(x)
    a, b = np.asarray(t), t.numpy()
    assert a.dtype == NP[dtype] and a.shape == (3, 4)
    np.testing.assert_array_equal(a, x)
    assert np.shares_memory(a, b), "np.asarray(t) and t.numpy() should view the same memory"
    assert np.shares_memory(a, np.asarray(t))
    assert not a.flags.writeable and not b.flags.writeable
    with pytest.raises(ValueError):
        a[0, 0] = a[1, 1]
    np.testing.assert_array_equal(np.asarray(t), x)  # the tensor is unchanged


@pytest.mark.parametrize("dtype", list(NP))
def test_a_large_tensor_starts_on_a_cache_line(dtype) -> None:
    # XLA's CPU client reads an argument in place only at a 64-byte boundary (backend="xla")
    for n in (4096, 10_000, 100_000):
        x = (np.arange(n) % 7).astype(NP[dtype])
        for t in (gl.tensor(x), gl.sin(gl.tensor(x, dtype=gl.float64)), gl.ones((n,))):
            assert np.asarray(t).ctypes.data % 64 == 0
        np.testing.assert_array_equal(np.asarray(gl.tensor(x)), x)


def test_a_tensor_read_in_place_shares_its_arrays_memory_and_keeps_it_alive() -> None:
    from gradloop import _core

    x = np.linspace(0.0, 1.0, 1000)
    x.flags.writeable = False
    t = _core.tensor_in_place(x)
    assert np.shares_memory(np.asarray(t), x)
    del x
    gc.collect()
    fresh = gl.tensor(np.linspace(0.0, 1.0, 1000))
    np.testing.assert_array_equal(np.asarray(gl.exp(t)), np.asarray(gl.exp(fresh)))
    # what cannot be read in place is copied: strided, another byte order, bool; tiny
    # tensors are held inline
    for y in (
        np.arange(2000.0)[::2],
        np.arange(1000.0).astype(">f8"),
        np.arange(1000) % 2 == 0,
        np.arange(3.0),
    ):
        t = _core.tensor_in_place(y)
        assert not np.shares_memory(np.asarray(t), y)
        np.testing.assert_array_equal(np.asarray(t), y)


def test_numpy_conversion_with_dtype() -> None:
    t = gl.tensor([1.5, 2.5])
    a = np.asarray(t, dtype=np.float64)
    assert a.dtype == np.float64
    np.testing.assert_array_equal(a, [1.5, 2.5])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_attributes(shape: tuple[int, ...]) -> None:
    t = gl.tensor(make(gl.float64, shape))
    assert t.shape == shape and isinstance(t.shape, tuple)
    assert t.dtype == gl.float64 and t.dtype != gl.float32
    assert t.ndim == len(shape)
    assert t.size == int(np.prod(shape))
    if shape:
        assert len(t) == shape[0]


def test_dtypes() -> None:
    assert [d.name for d in (gl.float32, gl.float64, gl.int32, gl.int64, gl.bool_)] == [
        "float32", "float64", "int32", "int64", "bool",
    ]  # fmt: skip
    assert gl.as_dtype("float32") == gl.float32
    assert gl.as_dtype(np.int64) == gl.int64
    assert len({gl.float32, gl.as_dtype("float32"), gl.float64}) == 2


def test_scalar_conversions() -> None:
    assert float(gl.tensor(2.5)) == 2.5
    assert int(gl.tensor(7, dtype=gl.int64)) == 7
    assert bool(gl.tensor(True)) is True and bool(gl.tensor(False)) is False
    assert gl.tensor(3).item() == 3 and isinstance(gl.tensor(3).item(), int)
    assert gl.tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert [10, 20, 30][gl.tensor(1)] == 20  # __index__


@pytest.mark.parametrize("dtype", (*NUMERIC, gl.bool_), ids=str)
def test_repr_is_numpy_like(dtype: gl.DType) -> None:
    x = make(dtype, (2, 3))
    text = repr(gl.tensor(x))
    assert text.startswith("tensor(")
    body = np.array2string(x, separator=", ")
    assert body.replace("\n", "").replace(" ", "") in text.replace("\n", "").replace(" ", "")
    if dtype in (gl.float32, gl.int32):  # numpy names non-default dtypes in its repr
        assert dtype.name in text


# ---- larger tensors (parallel kernels) and ops on views -------------------------------------


@pytest.mark.parametrize("dtype", (gl.float64, gl.int64, gl.float32), ids=str)
def test_large_tensors(dtype: gl.DType) -> None:
    x, y = make(dtype, (300, 257), 1), make(dtype, (257,), 2)
    tx, ty = gl.tensor(x), gl.tensor(y)
    check(tx * ty - tx, x * y - x)
    check(gl.maximum(tx, ty), np.maximum(x, y))
    check(gl.max(tx, axis=0), np.max(x, axis=0))
    check(gl.min(tx, axis=(0, 1)), np.asarray(np.min(x)))
    check(gl.transpose(tx)[::3], x.T[::3])
    if dtype == gl.float32:  # float32 sums of 77100 terms: compare loosely
        np.testing.assert_allclose(np.asarray(gl.sum(tx)), x.sum(dtype=np.float64), rtol=1e-4)
        np.testing.assert_allclose(np.asarray(gl.sum(tx, axis=1)), x.sum(axis=1), rtol=1e-4)
    else:
        check(gl.sum(tx), np.asarray(x.sum()).astype(x.dtype))
        check(gl.sum(tx, axis=1), x.sum(axis=1).astype(x.dtype))
        check(gl.sum(tx, axis=0, keepdims=True), x.sum(axis=0, keepdims=True).astype(x.dtype))


def test_large_matmul() -> None:
    a, b = make(gl.float64, (3, 70, 90), 1), make(gl.float64, (90, 110), 2)
    got = np.asarray(gl.tensor(a) @ gl.tensor(b))
    np.testing.assert_allclose(got, a @ b, rtol=1e-10, atol=1e-10)


def test_ops_on_views() -> None:
    # results of transpose, slicing with steps, broadcast_to and indexing feed further ops
    x = make(gl.float64, (4, 6), 3)
    t = gl.tensor(x)
    check((t.T[::-2] + 1.0) @ t[:, 1:4], (x.T[::-2] + 1.0) @ x[:, 1:4])
    check(
        gl.sum(gl.broadcast_to(t[None, 1], (3, 6)) * t[:3, ::-1], axis=1),
        np.sum(x[None, 1] * x[:3, ::-1], axis=1),
    )
    check(gl.exp(t[..., None][1:3, ::2, 0]), np.exp(x[..., None][1:3, ::2, 0]))
    check(gl.reshape(gl.transpose(t)[1:], (5, 4)), x.T[1:].reshape(5, 4))


BIG = 2**40


@pytest.mark.parametrize(
    ("make_tensor", "exact"),
    [
        (lambda: gl.tensor(BIG), [BIG]),
        (lambda: gl.tensor([1, BIG]), [1, BIG]),
        (lambda: gl.tensor([1, 2], dtype=gl.int32) + BIG, [BIG + 1, BIG + 2]),
        (lambda: gl.full((2,), BIG, dtype=gl.int32), [BIG, BIG]),
    ],
    ids=["tensor(int)", "tensor(list)", "int32 + int", "full"],
)
def test_python_ints_never_silently_wrap(make_tensor, exact: list[int]) -> None:
    # a Python int that does not fit the dtype is an error (as in numpy 2), or is kept exactly
    # by choosing a wider dtype; it is never wrapped around or clipped
    try:
        t = make_tensor()
    except (gl.errors.GradloopError, OverflowError):
        return
    assert np.asarray(t).astype(np.int64).ravel().tolist() == exact, f"got {t!r}"


@pytest.mark.parametrize(
    ("fn", "ref"), [(gl.floor, np.floor), (gl.ceil, np.ceil), (gl.round, np.round)]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rounding_matches_numpy_on_special_values_in_every_mode(fn, ref, dtype) -> None:
    # Halves (numpy rounds them to even), values beyond int64, signed zeros and non-finite.
    values = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.0, 0.2, -0.7, 3e19, -4e20]
    values += [np.inf, -np.inf, np.nan]
    x = np.array(values, dtype=dtype)
    want = ref(x)
    for stage in (lambda f: f, gl.function, gl.jit):
        got = np.asarray(stage(fn)(gl.tensor(x)))
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("fn", [gl.floor, gl.ceil, gl.round])
def test_rounding_has_a_zero_gradient(fn) -> None:
    x = gl.tensor(np.array([-1.3, 0.4, 2.6]))
    with gl.GradientTape() as tape:
        tape.watch(x)
        y = gl.sum(fn(x) * x)
    # d/dx (round(x) * x) = round(x): rounding itself contributes zero.
    np.testing.assert_array_equal(np.asarray(tape.gradient(y, x)), np.asarray(fn(x)))


# The transcendental kernels run vectorised (8 f32 / 4 f64 lanes, rust/core/src/ops/lanes.rs),
# with the scalar kernel for the lanes the vector form does not serve: special values, subnormal
# logarithms, huge trigonometric arguments, and sizes on both sides of the parallel threshold
# (1 << 15) and of a lane block.
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 1e-40, 1e-310, 88.8, -104.0, 709.8]
SPECIAL += [-746.0, 1e-8, -1e-8, 3.0e4, 6.0e5, 3.0e7, -1e30, 1e300, 0.5, 2.0]
VECTORISED = {
    "exp": np.exp,
    "log": np.log,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


@pytest.mark.parametrize("size", [1, 7, 9, 1 << 15, (1 << 15) + 13])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(VECTORISED))
def test_vectorised_kernels_match_numpy_on_special_values_and_sizes(name, dtype, size) -> None:
    np_dtype = np.float32 if dtype == gl.float32 else np.float64
    x = np.linspace(-30, 30, size).astype(np_dtype)
    with np.errstate(all="ignore"):
        special = np.array(SPECIAL).astype(np_dtype)[:size]
        x[: special.size] = special
        # the float64 value of the input, rounded to its dtype: the best answer there is
        want = VECTORISED[name](x.astype(np.float64)).astype(np_dtype).astype(np.float64)
    got = np.asarray(getattr(gl, name)(gl.tensor(x))).astype(np.float64)
    eps = np.finfo(np_dtype).eps
    # sine and cosine near their zeros are compared absolutely (their scale is 1)
    atol = 2 * eps if name in ("sin", "cos") else np.finfo(np_dtype).tiny
    np.testing.assert_allclose(got, want, rtol=4 * eps, atol=atol)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_vectorised_pow_follows_numpy_on_every_kind_of_base(dtype) -> None:
    np_dtype = np.float32 if dtype == gl.float32 else np.float64
    bases = [0.0, -0.0, 2.0, -2.0, -2.0, 0.5, np.inf, np.nan, 1.0, 1.0, -8.0, 10.0, 3.7, 1e-3]
    exps = [0.0, 3.0, -1.0, 3.0, 0.5, np.inf, 2.0, 0.0, np.nan, np.inf, 1 / 3, -30.0, 2.2, 0.7]
    a, b = np.array(bases, np_dtype), np.array(exps, np_dtype)
    rtol = 4 * np.finfo(np_dtype).eps
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(np.asarray(gl.pow(gl.tensor(a), gl.tensor(b))), a**b, rtol=rtol)
        big = np.linspace(0.01, 50, (1 << 15) + 5).astype(np_dtype)
        for e in (np_dtype(2.5), np.linspace(-2, 2, big.size).astype(np_dtype)):
            got = np.asarray(gl.pow(gl.tensor(big), gl.tensor(e)))
            np.testing.assert_allclose(got, big**e, rtol=rtol)
