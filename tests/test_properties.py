"""Property tests against numpy: broadcasting of binary ops over random shape pairs (incompatible
ones included), reductions over random axes, basic indexing, take, layout round trips, and simple
gradient identities (d/dx sum(x*y) = y summed back to x's shape).
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gradloop as gl

SETTINGS = settings(max_examples=50, deadline=None)
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=3)
nonempty_shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=3)
seeds = st.integers(0, 2**32 - 1)

BINARY = {
    "add": (gl.add, np.add),
    "sub": (gl.sub, np.subtract),
    "mul": (gl.mul, np.multiply),
    "maximum": (gl.maximum, np.maximum),
    "less": (gl.less, np.less),
    "pow": (gl.pow, np.power),
}


def values(shape: tuple[int, ...], seed: int, dtype=np.float64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-5, 6, shape).astype(dtype)
    return rng.uniform(0.5, 2.0, shape).astype(dtype)


@SETTINGS
@given(a=shapes, b=shapes, name=st.sampled_from(sorted(BINARY)), seed=seeds)
def test_binary_broadcasting(a, b, name, seed) -> None:
    fn, ref = BINARY[name]
    x, y = values(a, seed), values(b, seed + 1)
    try:
        expected = ref(x, y)
    except ValueError:
        try:
            fn(gl.tensor(x), gl.tensor(y))
        except gl.errors.ShapeError as e:
            assert isinstance(e, ValueError)
            assert name in str(e)
        else:
            raise AssertionError(f"{name} of shapes {a} and {b} should raise ShapeError")
        return
    got = fn(gl.tensor(x), gl.tensor(y))
    assert got.shape == expected.shape and got.dtype == gl.as_dtype(expected.dtype)
    if expected.dtype == np.bool_:
        np.testing.assert_array_equal(np.asarray(got), expected)
    else:
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12)


@SETTINGS
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=4, max_side=3),
    seed=seeds,
)
def test_where_broadcasting(shapes, seed) -> None:
    c_shape, x_shape, y_shape = shapes.input_shapes
    c = np.random.default_rng(seed).uniform(size=c_shape) < 0.5
    x, y = values(x_shape, seed, np.int64), values(y_shape, seed + 1, np.int64)
    got = gl.where(gl.tensor(c), gl.tensor(x), gl.tensor(y))
    assert got.shape == shapes.result_shape and got.dtype == gl.int64
    np.testing.assert_array_equal(np.asarray(got), np.where(c, x, y))


@st.composite
def reduction_case(draw):
    shape = draw(shapes)
    ndim = len(shape)
    if draw(st.booleans()) or ndim == 0:
        axis = None
    else:
        chosen = draw(st.lists(st.integers(0, ndim - 1), unique=True, min_size=1, max_size=ndim))
        signed = [a - ndim if draw(st.booleans()) else a for a in chosen]
        axis = signed[0] if len(signed) == 1 and draw(st.booleans()) else tuple(signed)
    return shape, axis, draw(st.booleans())


@SETTINGS
@given(
    case=reduction_case(),
    name=st.sampled_from(["sum", "mean", "max", "min"]),
    seed=seeds,
)
def test_reductions(case, name, seed) -> None:
    shape, axis, keepdims = case
    x = values(shape, seed, np.float64 if name == "mean" else np.int32)
    reduced = range(len(shape)) if axis is None else np.atleast_1d(axis)
    empty_reduction = any(shape[a] == 0 for a in reduced)
    assume(not (empty_reduction and name != "sum"))  # max/min/mean of nothing are undefined
    expected = np.asarray(getattr(np, name)(x, axis=axis, keepdims=keepdims)).astype(x.dtype)
    got = getattr(gl, name)(gl.tensor(x), axis=axis, keepdims=keepdims)
    assert got.shape == expected.shape and got.dtype == gl.as_dtype(x.dtype)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12)


@SETTINGS
@given(data=st.data(), shape=shapes, seed=seeds)
def test_basic_indexing(data, shape, seed) -> None:
    index = data.draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    x = values(shape, seed)
    expected = x[index]
    got = gl.tensor(x)[index]
    assert got.shape == expected.shape
    np.testing.assert_array_equal(np.asarray(got), expected)


@SETTINGS
@given(data=st.data(), shape=nonempty_shapes.filter(lambda s: len(s) > 0), seed=seeds)
def test_take(data, shape, seed) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    idx_shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3))
    idx = np.random.default_rng(seed).integers(-n, n, idx_shape)
    x = values(shape, seed)
    got = gl.take(gl.tensor(x), gl.tensor(idx), axis=axis)
    expected = np.take(x, idx, axis=axis)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(np.asarray(got), expected)


@SETTINGS
@given(data=st.data(), shape=shapes, seed=seeds)
def test_transpose_and_reshape_round_trips(data, shape, seed) -> None:
    x = values(shape, seed, np.int64)
    perm = data.draw(st.permutations(range(len(shape))))
    t = gl.transpose(gl.tensor(x), perm)
    np.testing.assert_array_equal(np.asarray(t), np.transpose(x, perm))
    back = gl.transpose(t, np.argsort(perm).tolist())
    np.testing.assert_array_equal(np.asarray(back), x)
    flat = gl.reshape(gl.tensor(x), (-1,))
    np.testing.assert_array_equal(np.asarray(flat), x.reshape(-1))
    assert gl.reshape(flat, shape).shape == shape
    np.testing.assert_array_equal(np.asarray(gl.reshape(flat, shape)), x)


@SETTINGS
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3),
    seed=seeds,
)
def test_broadcast_to(shapes, seed) -> None:
    x = values(shapes.input_shapes[0], seed)
    got = gl.broadcast_to(gl.tensor(x), shapes.result_shape)
    np.testing.assert_array_equal(np.asarray(got), np.broadcast_to(x, shapes.result_shape))


def sum_to(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Reduces a broadcast gradient back to `shape` (the adjoint of broadcasting)."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, d in enumerate(shape) if d == 1)
    return g.sum(axis=axes, keepdims=True).reshape(shape)


@SETTINGS
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3),
    seed=seeds,
)
def test_gradient_of_sum_of_product(shapes, seed) -> None:
    # d/dx sum(x * y) = y (summed over the dimensions x was broadcast along), and symmetrically
    a, b = shapes.input_shapes
    x, y = values(a, seed), values(b, seed + 1)
    tx, ty = gl.tensor(x), gl.tensor(y)
    with gl.GradientTape() as tape:
        tape.watch(tx)
        tape.watch(ty)
        z = gl.sum(tx * ty)
    gx, gy = tape.gradient(z, [tx, ty])
    out = shapes.result_shape
    np.testing.assert_allclose(np.asarray(gx), sum_to(np.broadcast_to(y, out), a), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gy), sum_to(np.broadcast_to(x, out), b), rtol=1e-12)
    assert gx.shape == a and gy.shape == b


@SETTINGS
@given(case=reduction_case(), seed=seeds)
def test_gradient_of_mean(case, seed) -> None:
    # d/dx sum(mean(x, axis) * c) = c broadcast back, divided by the number of reduced elements
    shape, axis, keepdims = case
    reduced = range(len(shape)) if axis is None else np.atleast_1d(axis)
    count = int(np.prod([shape[a] for a in reduced]))
    assume(count > 0)
    x = values(shape, seed)
    c = values(np.mean(x, axis=axis, keepdims=keepdims).shape, seed + 1)
    g = gl.grad(lambda t: gl.sum(gl.mean(t, axis=axis, keepdims=keepdims) * gl.tensor(c)))(
        gl.tensor(x)
    )
    kept = np.mean(x, axis=axis, keepdims=True).shape
    expected = np.broadcast_to(c.reshape(kept), shape) / count
    np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-12)
