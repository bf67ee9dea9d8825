"""numpy's elementwise math (`tan` ... `expm1`, `arctan2`, `fmod`/`remainder`/`floor_divide`,
`clip`, `hypot`, `square`, the float predicates, `finfo`) against numpy: in float64 and
float32, on values that reach the special cases (domain ends, signed zeros, infinities, NaN,
integer division by zero), eagerly, in graph mode and under `gl.jit` (whose pure StableHLO
writes several of them as compositions). Gradients and tangents are rows of
test_op_gradients.py's table."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from runners import staged

UNARY = {
    "tan": np.linspace(-1.5, 1.5, 7),
    "arcsin": np.array([-1.0, -0.999, -0.5, -0.0, 0.0, 1e-9, 0.5, 0.999, 1.0, 1.5, np.nan]),
    "arccos": np.array([-1.0, -0.999, -0.5, 0.0, 1e-9, 0.5, 0.999, 1.0, -1.5, np.nan]),
    "arctan": np.array([-np.inf, -1e10, -1.0, -0.0, 0.0, 1e-9, 1.0, 1e10, np.inf, np.nan]),
    "sinh": np.array([-20.0, -1.0, -1e-9, -0.0, 0.0, 1e-9, 0.5, 1.0, 20.0, np.inf, np.nan]),
    "cosh": np.array([-20.0, -1.0, -1e-9, 0.0, 1e-9, 0.5, 1.0, 20.0, -np.inf, np.nan]),
    "arcsinh": np.array([-1e200, -1e10, -1.0, -1e-9, -0.0, 0.0, 1e-9, 1.0, 1e10, 1e200, np.inf]),
    "arccosh": np.array([1.0, 1.0 + 1e-9, 1.5, 10.0, 1e10, 1e200, np.inf, 0.5, np.nan]),
    "arctanh": np.array([-1.0, -0.999, -0.5, -1e-9, -0.0, 0.0, 1e-9, 0.5, 0.999, 1.0, 2.0]),
    "log1p": np.array([-1.0, -0.5, -1e-12, -0.0, 0.0, 1e-12, 1.0, 1e10, np.inf, -2.0]),
    "expm1": np.array([-np.inf, -50.0, -1.0, -1e-12, -0.0, 0.0, 1e-12, 1.0, 50.0, np.nan]),
    "square": np.array([-3.0, -0.0, 0.5, 1e200, np.inf, np.nan]),
}

A = np.array([-7.5, 7.5, -7.0, 3.0, 0.0, -0.0, 5.5, -5.5, np.inf, 1.0, np.nan, 2.0])
B = np.array([2.0, -2.0, 3.5, -1.5, 2.0, 3.0, np.inf, -np.inf, 2.0, 0.0, 1.0, -0.0])
BINARY = ("arctan2", "fmod", "remainder", "floor_divide", "hypot")

MODES = ("eager", "executor", "compiled")


def _rtol(dtype: type) -> float:
    return 1e-13 if dtype == np.float64 else 2e-6


def _close(got: np.ndarray, want: np.ndarray, rtol: float, what: str) -> None:
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=what)
    # signs of zeros and infinities as numpy's
    finite_zero = want == 0
    same_sign = np.signbit(got[finite_zero]) == np.signbit(want[finite_zero])
    # (remainder's zeros are JAX's, not numpy's; compiled compositions may lose a zero's sign)
    assert same_sign.all() or what.startswith("remainder") or "compiled" in what, what


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_unary_functions_match_numpy(mode: str, dtype: type) -> None:
    names = sorted(UNARY)

    def every(*xs):
        return tuple(getattr(gl, n)(x) for n, x in zip(names, xs, strict=True))

    with np.errstate(all="ignore"):  # 1e200 is inf in float32
        args = [gl.tensor(UNARY[n].astype(dtype)) for n in names]
        wants = [getattr(np, n)(UNARY[n].astype(dtype)) for n in names]
    for name, got, want in zip(names, staged(mode, every)(*args), wants, strict=True):
        got = np.asarray(got)
        assert got.dtype == dtype, name
        rtol = _rtol(dtype) * (1e3 if mode == "compiled" and dtype == np.float32 else 1)
        _close(got, want, rtol, f"{name} ({mode}, {np.dtype(dtype).name})")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_binary_functions_match_numpy(mode: str, dtype: type) -> None:
    def every(a, b):
        return tuple(getattr(gl, n)(a, b) for n in BINARY)

    a, b = A.astype(dtype), B.astype(dtype)
    if mode == "compiled" and dtype == np.float32:
        # IREE's float32 atan2 gives +pi for a finite negative y and x = -inf (numpy: -pi)
        a, b = a[b != -np.inf], b[b != -np.inf]
    got = staged(mode, every)(gl.tensor(a), gl.tensor(b))
    for name, g in zip(BINARY, got, strict=True):
        with np.errstate(all="ignore"):
            want = getattr(np, name)(a, b)
        _close(np.asarray(g), want, _rtol(dtype), f"{name} ({mode})")


@pytest.mark.parametrize("mode", ["eager", "executor"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_division_matches_numpy_including_by_zero(mode: str, dtype: type) -> None:
    a = np.array([-7, 7, -7, 7, 3, 0, 5, -5, 6, -6], dtype=dtype)
    b = np.array([2, -2, -2, 2, -1, 2, 0, 0, 3, 3], dtype=dtype)

    def every(a, b):
        return gl.fmod(a, b), gl.remainder(a, b), gl.floor_divide(a, b), a % 4

    got = staged(mode, every)(gl.tensor(a), gl.tensor(b))
    with np.errstate(all="ignore"):
        wants = (np.fmod(a, b), np.remainder(a, b), np.floor_divide(a, b), a % 4)
    for g, w in zip(got, wants, strict=True):
        assert np.asarray(g).dtype == dtype
        np.testing.assert_array_equal(np.asarray(g), w)


def test_python_numbers_adapt_to_the_tensor() -> None:
    x = gl.tensor(np.array([-3.5, 2.25], dtype=np.float32))
    assert gl.fmod(x, 2).dtype == gl.float32
    np.testing.assert_array_equal(np.asarray(gl.remainder(x, 2)), np.remainder([-3.5, 2.25], 2))
    np.testing.assert_array_equal(np.asarray(gl.floor_divide(7.0, x)), np.floor_divide(7.0, x))
    i = gl.tensor(np.array([7, -7], dtype=np.int32))
    np.testing.assert_array_equal(np.asarray(gl.mod(i, 3)), [1, 2])


def test_predicates() -> None:
    x = np.array([1.0, -np.inf, np.inf, np.nan, 0.0, -1e30])
    for dtype in (np.float64, np.float32):
        t = gl.tensor(x.astype(dtype))
        for name in ("isfinite", "isnan", "isinf"):
            got = staged("executor", getattr(gl, name))(t)
            assert got.dtype == gl.bool_
            np.testing.assert_array_equal(np.asarray(got), getattr(np, name)(x.astype(dtype)))
    i = gl.tensor(np.array([1, 2], dtype=np.int32))
    assert np.asarray(gl.isfinite(i)).all() and not np.asarray(gl.isnan(i)).any()


def test_clip_bounds_and_gradients() -> None:
    x = gl.tensor(np.array([-2.0, -0.5, 0.0, 0.5, 2.0]))
    np.testing.assert_array_equal(np.asarray(gl.clip(x, -0.5, 0.5)), np.clip(x, -0.5, 0.5))
    np.testing.assert_array_equal(np.asarray(gl.clip(x, a_min=0.0)), np.clip(x, 0.0, None))
    np.testing.assert_array_equal(np.asarray(gl.clip(x, a_max=0.0)), np.clip(x, None, 0.0))
    # the bounds included, as TensorFlow's clip_by_value
    g = gl.grad(lambda x: gl.sum(gl.clip(x, -0.5, 0.5)))(x)
    np.testing.assert_array_equal(np.asarray(g), [0.0, 1.0, 1.0, 1.0, 0.0])
    # a tensor bound gets the gradient where it is taken
    lo = gl.tensor(np.array([-1.0, 0.0, 1.0, 0.0, 0.0]))
    glo = gl.grad(lambda lo: gl.sum(gl.clip(x, lo, 1.0)))(lo)
    np.testing.assert_array_equal(np.asarray(glo), [1.0, 1.0, 1.0, 0.0, 0.0])
    with pytest.raises(gl.errors.InvalidArgumentError, match="clip"):
        gl.clip(x)


def test_hypot_has_no_nan_gradient_at_zero_and_no_overflow() -> None:
    z = gl.tensor(np.zeros(3))
    ga, gb = gl.grad(lambda a, b: gl.sum(gl.hypot(a, b)), argnums=(0, 1))(z, z)
    np.testing.assert_array_equal(np.asarray(ga), np.zeros(3))
    np.testing.assert_array_equal(np.asarray(gb), np.zeros(3))
    big = gl.tensor(np.array([1e200, 3e300]))
    np.testing.assert_allclose(np.asarray(gl.hypot(big, big)), np.hypot(big, big), rtol=1e-15)


def test_finfo_is_numpy_s() -> None:
    for dtype, np_dtype in ((gl.float32, np.float32), (gl.float64, np.float64)):
        info = gl.finfo(dtype)
        want = np.finfo(np_dtype)
        assert (info.eps, info.max, info.min, info.tiny, info.bits) == (
            want.eps,
            want.max,
            want.min,
            want.tiny,
            want.bits,
        )
    assert gl.finfo("float64").eps == np.finfo(np.float64).eps
    with pytest.raises(gl.errors.DTypeError, match="finfo"):
        gl.finfo(gl.int32)


@pytest.mark.parametrize(
    "name", ["tan", "arcsin", "sinh", "log1p", "expm1", "arctan2", "fmod", "remainder"]
)
def test_float_only_functions_refuse_integers_with_the_op_name(name: str) -> None:
    i = gl.tensor(np.array([1, 2], dtype=np.int32))
    fn = getattr(gl, name)
    if name in ("fmod", "remainder"):
        np.testing.assert_array_equal(np.asarray(fn(i, i)), [0, 0])  # integers are numpy's
        return
    with pytest.raises(gl.errors.DTypeError, match=name):
        fn(i) if name not in ("arctan2",) else fn(i, i)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_erf_matches_math_erf(mode: str, dtype: type) -> None:
    import math

    x = np.array(
        [
            -np.inf,
            -6.0,
            -2.5,
            -1.0,
            -0.5,
            -1e-8,
            -0.0,
            0.0,
            1e-30,
            0.3,
            1.0,
            1.5,
            7.9,
            8.1,
            30.0,
            np.inf,
            np.nan,
        ],
        dtype=dtype,
    )
    want = np.array([math.erf(float(v)) for v in x])
    got = np.asarray(staged(mode, gl.erf)(gl.tensor(x)))
    assert got.dtype == dtype
    # one algorithm (Cephes' rational approximations) in the kernel and in the emission
    _close(got, want, 4e-16 if dtype == np.float64 else 2e-7, f"erf ({mode})")
