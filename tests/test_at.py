"""`x.at[idx]` (JAX's functional updates) against numpy: every index form (ints, slices,
Ellipsis, integer arrays with repeats, negative and out-of-range indices, scalar integer tensors,
integer tensors), every update kind, eagerly, in graph mode and under `gl.jit`; gradients and
tangents against central finite differences in float64; a loop that saves its trajectory one
row per trip."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from gradcheck import check_grads, check_tangents
from runners import staged

MODES = ("eager", "executor", "compiled")
X = np.arange(24.0).reshape(4, 6) * 0.5 - 3.0

#: numpy's unbuffered in-place forms: repeats combine one after another.
UFUNC = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


def reference(x: np.ndarray, idx, kind: str, v) -> np.ndarray:
    out = x.copy()
    if kind == "set":
        out[idx] = v
    elif kind == "get":
        return x[idx]
    else:
        UFUNC[kind].at(out, idx, v)
    return out


STATIC = [
    1,
    -1,
    (2, 3),
    (-1, -2),
    slice(1, 3),
    (slice(None), slice(0, 6, 2)),
    (slice(None, None, -1), 0),
    (Ellipsis, 1),
    (1, Ellipsis),
    np.array([0, 2, 2, 3]),  # a repeat
    (np.array([1, 0, 1]), np.array([5, 0, 5])),  # repeats of whole positions
    (slice(1, 3), np.array([4, -1])),
]
KINDS = ("set", "add", "mul", "min", "max", "get")


def _label(idx) -> str:
    return repr(idx).replace(" ", "")


def _window_values(idx, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-4.0, 4.0, np.shape(X[idx]))


@pytest.mark.parametrize("mode", MODES)
def test_static_indices_match_numpy(mode: str) -> None:
    rng = np.random.default_rng(53)
    cases = [(idx, kind, _window_values(idx, rng)) for idx in STATIC for kind in KINDS]

    def every(x, *vs):
        out = []
        for (idx, kind, _), v in zip(cases, vs, strict=True):
            ref = x.at[idx]
            out.append(ref.get() if kind == "get" else getattr(ref, kind)(v))
        return tuple(out)

    got = staged(mode, every)(gl.tensor(X), *[gl.tensor(v) for _, _, v in cases])
    for (idx, kind, v), g in zip(cases, got, strict=True):
        want = reference(X, idx, kind, v)
        np.testing.assert_array_equal(np.asarray(g), want, err_msg=f"{kind} at {_label(idx)}")


@pytest.mark.parametrize("mode", MODES)
def test_scalar_tensor_positions(mode: str) -> None:
    """Data-dependent positions: one row, one element, negative, out of range."""

    def every(x, i, j, v_row, v):
        return (
            x.at[i].set(v_row), x.at[i].add(v_row), x.at[i, j].mul(v), x.at[i, j].min(v),
            x.at[i, j].max(v), x.at[i].get(), x.at[i, j].get(),
        )  # fmt: skip

    v_row, v = np.linspace(-1.0, 1.0, 6), np.float64(0.25)
    run = staged(mode, every)
    for i, j in ((2, 3), (-1, -6), (0, 5)):
        got = run(gl.tensor(X), gl.tensor(i), gl.tensor(j), gl.tensor(v_row), gl.tensor(v))
        wants = (
            reference(X, i, "set", v_row), reference(X, i, "add", v_row),
            reference(X, (i, j), "mul", v), reference(X, (i, j), "min", v),
            reference(X, (i, j), "max", v), X[i], X[i, j],
        )  # fmt: skip
        for k, (g, w) in enumerate(zip(got, wants, strict=True)):
            np.testing.assert_array_equal(np.asarray(g), w, err_msg=f"{k} at {(i, j)}")
    # out of range: get clamps, updates are dropped (JAX's .at)
    got = run(gl.tensor(X), gl.tensor(7), gl.tensor(-9), gl.tensor(v_row), gl.tensor(v))
    for k in range(5):
        np.testing.assert_array_equal(np.asarray(got[k]), X, err_msg=f"{k} out of range")
    np.testing.assert_array_equal(np.asarray(got[5]), X[3])
    np.testing.assert_array_equal(np.asarray(got[6]), X[3, 0])


@pytest.mark.parametrize("mode", MODES)
def test_integer_tensor_indices(mode: str) -> None:
    idx = np.array([[2, 0], [-1, 2]])  # a repeat of row 2 (-1 is row 3)
    v = np.random.default_rng(1).uniform(-1.0, 1.0, (2, 2, 6))

    def every(x, i, v):
        return x.at[i].add(v), x.at[i].get(), x.at[i].max(v)

    got = staged(mode, every)(gl.tensor(X), gl.tensor(idx), gl.tensor(v))
    np.testing.assert_allclose(np.asarray(got[0]), reference(X, idx, "add", v), rtol=1e-15)
    np.testing.assert_array_equal(np.asarray(got[1]), X[idx])
    # a repeat in max combines the gathered values (unique rows: numpy's maximum.at)
    want = X.copy()
    want[[0, 3]] = np.maximum(X[[0, 3]], v[[0, 1], [1, 0]])
    np.testing.assert_array_equal(np.asarray(got[2])[[0, 1, 3]], want[[0, 1, 3]])
    # out of range: dropped from updates, clamped in get
    far = gl.tensor(np.array([1, 9, -9]))
    added = gl.tensor(X).at[far].add(1.0)
    np.testing.assert_array_equal(np.asarray(added), reference(X, 1, "add", 1.0))
    np.testing.assert_array_equal(np.asarray(gl.tensor(X).at[far].get()), X[[1, 3, 0]])


def test_set_with_repeats() -> None:
    x = gl.tensor(X)
    v = gl.tensor(np.array([1.0, 2.0, 3.0]))
    # a static index: the last write wins, as numpy's assignment
    got = x.at[np.array([1, 1, 2]), 0].set(v)
    np.testing.assert_array_equal(np.asarray(got)[:, 0], [X[0, 0], 2.0, 3.0, X[3, 0]])
    # a tensor of indices: the mean of the values written at a repeat
    got = x.at[gl.tensor(np.array([1, 1, 2]))].set(gl.broadcast_to(v[:, None], (3, 6)))
    np.testing.assert_array_equal(np.asarray(got)[:, 0], [X[0, 0], 1.5, 3.0, X[3, 0]])


def test_values_take_the_tensor_dtype_and_errors_name_the_index() -> None:
    x = gl.tensor(X)
    got = x.at[0].set(gl.tensor([1.0] * 6))  # float32 values into float64, as JAX
    assert got.dtype == gl.float64
    i = gl.tensor(np.array([1, 2], dtype=np.int32))
    np.testing.assert_array_equal(np.asarray(i.at[0].add(5)), [6, 2])
    with pytest.raises(gl.errors.IndexError, match="at"):
        x.at[1.5].set(0.0)
    with pytest.raises(gl.errors.IndexError, match="at"):
        x.at[gl.tensor(np.array([0.5]))].set(0.0)
    with pytest.raises(gl.errors.IndexError, match="mixed"):
        x.at[gl.tensor(np.array([0, 1])), 1:3].set(0.0)
    with pytest.raises(gl.errors.IndexError, match="rank"):
        x.at[gl.tensor(0), gl.tensor(0), gl.tensor(0)].set(0.0)


GRAD_CASES = {
    "set_static": lambda x, v: x.at[1:3, ::2].set((v * v)[:, ::2]),
    "add_repeat": lambda x, v: x.at[np.array([0, 2, 2]), 1].add(gl.sin(v[0, :3])),
    "mul_static": lambda x, v: x.at[..., 1].mul(v[0, :4]),
    "max_static": lambda x, v: x.at[2].max(v[0] * 3.0),
    "set_dynamic": lambda x, v: x.at[gl.tensor(2)].set(gl.tanh(v[0])),
    "mul_dynamic": lambda x, v: x.at[gl.tensor(-1), gl.tensor(4)].mul(v[1, 1]),
    "add_tensor": lambda x, v: x.at[gl.tensor(np.array([3, 0, 3]))].add(v[0, :6] * v[1, :6]),
    "get_dynamic": lambda x, v: x.at[gl.tensor(1)].get() * v[0],
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradients_and_tangents(name: str) -> None:
    """Both the operand and the values, to second order; the tangents in every mode (the
    checker stages them eagerly, traced and compiled)."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-1.0, 1.0, (4, 6))
    v = rng.uniform(0.5, 1.5, (2, 6)) if name != "max_static" else X[2:4] / 3.0 + 0.3
    fn = GRAD_CASES[name]
    check_grads(fn, [x, v], order=2)
    check_tangents(fn, [x, v], order=1)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_of_a_set_window_is_zero_there(mode: str) -> None:
    def loss(x, v):
        return gl.sum(gl.sin(x.at[1:3, 2].set(v)))

    x, v = gl.tensor(X), gl.tensor(np.array([0.3, -0.4]))
    gx, gv = staged(mode, gl.grad(loss, argnums=(0, 1)))(x, v)
    want = np.cos(X)
    want[1:3, 2] = 0.0
    np.testing.assert_allclose(np.asarray(gx), want, rtol=1e-13)
    np.testing.assert_allclose(np.asarray(gv), np.cos([0.3, -0.4]), rtol=1e-13)


@pytest.mark.parametrize("mode", MODES)
def test_a_loop_saves_its_trajectory_row_by_row(mode: str) -> None:
    """The pattern of ODE solvers' saved steps and L-BFGS's ring buffers: a data-dependent
    row written each trip; the value and the gradient through every saved row."""
    steps = 7

    def trajectory(y0, rate):
        saved = gl.zeros((steps + 1, 3), dtype=gl.float64).at[0].set(y0)

        def body(k, y, saved):
            y = y + 0.1 * gl.sin(rate * y)
            return k + 1, y, saved.at[k + 1].set(y)

        _, _, saved = gl.while_loop(lambda k, y, s: k < steps, body, (gl.tensor(0), y0, saved))
        return saved

    def reference_np(y0, rate):
        rows = [y0]
        for _ in range(steps):
            rows.append(rows[-1] + 0.1 * np.sin(rate * rows[-1]))
        return np.stack(rows)

    y0, rate = np.array([0.2, -0.5, 1.0]), 1.3
    got = staged(mode, trajectory)(gl.tensor(y0), gl.tensor(rate, dtype=gl.float64))
    np.testing.assert_allclose(np.asarray(got), reference_np(y0, rate), rtol=1e-13)

    def loss(rate):
        return gl.sum(trajectory(gl.tensor(y0), rate) ** 2)

    g = float(staged(mode, gl.grad(loss))(gl.tensor(rate, dtype=gl.float64)))
    eps = 1e-6
    fd = (np.sum(reference_np(y0, rate + eps) ** 2) - np.sum(reference_np(y0, rate - eps) ** 2)) / (
        2 * eps
    )
    np.testing.assert_allclose(g, fd, rtol=1e-7)
