"""The autodiff API: GradientTape, grad/value_and_grad (any order), custom_gradient, stop_gradient
and recompute_grad. Numerical checks use central finite differences in float64 (gradcheck.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gradloop as gl
from gradcheck import check_grads

GradErr = gl.errors.GradientError


def f64(*values: float) -> gl.Tensor:
    return gl.tensor(np.array(values, dtype=np.float64))


def scalar(x: float) -> gl.Tensor:
    return gl.tensor(x, dtype=gl.float64)


# ---- GradientTape --------------------------------------------------------------------------------


def test_non_scalar_target_is_summed() -> None:
    x = f64(1.0, 2.0, 3.0)
    with gl.GradientTape() as tape:
        tape.watch(x)
        y = x * x
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [2.0, 4.0, 6.0])


def test_nested_targets_and_sources() -> None:
    x, y = f64(1.0, 2.0), scalar(3.0)
    with gl.GradientTape() as tape:
        tape.watch({"x": x, "ys": [y]})
        out = {"a": (x * y).sum(), "b": [x]}
    g = tape.gradient(out, (x, {"y": y}))
    assert isinstance(g, tuple) and set(g[1]) == {"y"}
    np.testing.assert_array_equal(g[0].numpy(), [4.0, 4.0])  # y + 1 (from b)
    assert float(g[1]["y"]) == 3.0


def test_output_gradients_seed_targets() -> None:
    x = f64(1.0, 2.0)
    with gl.GradientTape(persistent=True) as tape:
        tape.watch(x)
        a, b = x * 2.0, x * x
    g = tape.gradient((a, b), x, output_gradients=(f64(1.0, 0.0), None))
    np.testing.assert_array_equal(g.numpy(), [2.0 + 2.0, 4.0])  # None seeds ones
    g = tape.gradient({"a": a}, x, output_gradients={"a": f64(3.0, 1.0)})
    np.testing.assert_array_equal(g.numpy(), [6.0, 2.0])
    g = tape.gradient(a, x, output_gradients=[f64(1.0, 1.0)])  # a flat list, as in TensorFlow
    np.testing.assert_array_equal(g.numpy(), [2.0, 2.0])
    with pytest.raises(
        gl.errors.InvalidArgumentError,
        match=r"output_gradients must have the structure of target.*at <root>: a tuple of 2 items "
        r"vs a list of 1 items",
    ):
        tape.gradient((a, b), x, output_gradients=[f64(1.0, 1.0)])


def test_unconnected_and_unwatched_sources() -> None:
    x, z, u = scalar(1.0), scalar(2.0), scalar(3.0)
    with gl.GradientTape(persistent=True) as tape:
        tape.watch([x, z])
        y = x * 3.0
    assert tape.gradient(y, [x, z, u])[1:] == [None, None]
    g = tape.gradient(y, [x, z, u], unconnected_gradients="zero")
    assert [float(t) for t in g] == [3.0, 0.0, 0.0] and g[2].dtype == gl.float64
    with pytest.raises(
        gl.errors.InvalidArgumentError, match="must be 'none' or 'zero'; got 'zeros'"
    ):
        tape.gradient(y, x, unconnected_gradients="zeros")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (gl.tensor([1, 2]), r"source at <root> has dtype int32; only float32 and float64"),
        ([scalar(1.0), gl.tensor(True)], r"source at \[1\] has dtype bool"),
        ({"k": 1.0}, r"source at \['k'\] must be a Tensor or a Variable; got float"),
    ],
)
def test_bad_sources(source: object, message: str) -> None:
    x = scalar(1.0)
    with gl.GradientTape() as tape:
        tape.watch(x)
        y = x * 2.0
    with pytest.raises(GradErr, match=f"GradientTape.gradient: {message}"):
        tape.gradient(y, source)


def test_bad_watch_and_target() -> None:
    with gl.GradientTape() as tape:
        with pytest.raises(GradErr, match=r"GradientTape.watch: source at \[0\] has dtype int64"):
            tape.watch([gl.tensor(1, dtype=gl.int64)])
        with pytest.raises(GradErr, match="must be a Tensor or a Variable; got float"):
            tape.watch(1.0)
    with pytest.raises(GradErr, match=r"target at \[1\] must be a Tensor; got str"):
        tape.gradient([scalar(1.0), "y"], scalar(1.0))


def test_non_persistent_tape_computes_once() -> None:
    x = scalar(2.0)
    with gl.GradientTape() as tape:
        tape.watch(x)
        y = x * x
        with pytest.raises(GradErr, match="already recording"):
            tape.__enter__()
    assert float(tape.gradient(y, x)) == 4.0
    with pytest.raises(GradErr, match=r"non-persistent GradientTape can only compute one gradient"):
        tape.gradient(y, x)


def test_persistent_tape_and_higher_order_inside_its_context() -> None:
    x = scalar(2.0)
    with gl.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = x * x * x
        g = tape.gradient(y, x)  # 3 x**2, recorded by this tape
    assert tape.persistent and float(g) == 12.0
    assert float(tape.gradient(g, x)) == 12.0 and float(tape.gradient(y, x)) == 12.0


def test_reset_forgets_the_recording() -> None:
    x = scalar(2.0)
    with gl.GradientTape() as tape:
        tape.watch(x)
        y = x * x
        tape.reset()
        z = x * 5.0
        tape.watch(x)
        w = x * 7.0
    assert float(tape.gradient([y, z, w], x)) == 7.0  # only w was recorded after the reset
    with gl.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = x * x
        tape.reset()
    assert tape.gradient(y, x) is None


def test_stop_recording() -> None:
    x = scalar(3.0)
    with gl.GradientTape() as tape:
        tape.watch(x)
        y = x * x
        with tape.stop_recording():
            z = x * 10.0
        w = y + z
    assert float(tape.gradient(w, x)) == 6.0  # z is a constant to the tape
    with pytest.raises(GradErr, match="stop_recording: the tape is not recording"):
        tape.stop_recording().__enter__()


def test_variable_reads_reach_exactly_the_tapes_recording_at_the_read() -> None:
    # The recording tapes are the core's one stack: a tape paused by stop_recording, or reset,
    # or exited, sees no read; a tape entered inside another's stop_recording sees its reads.
    v = gl.Variable(f64(2.0))
    with gl.GradientTape() as outer:
        a = v * 3.0
        with outer.stop_recording(), gl.GradientTape() as inner:
            b = v * v
        c = v * 5.0
    with gl.GradientTape() as later:
        later.reset()
        d = v * 7.0
    e = v * 11.0  # no tape records
    assert outer.watched_variables() == (v,) and inner.watched_variables() == (v,)
    np.testing.assert_allclose(outer.gradient([a, b, c, e], v).numpy(), 8.0)  # a and c only
    np.testing.assert_allclose(inner.gradient(b, v).numpy(), 4.0)
    np.testing.assert_allclose(later.gradient(d, v).numpy(), 7.0)


def test_third_derivative_with_nested_tapes() -> None:
    x = scalar(0.7)
    with gl.GradientTape() as t3:
        t3.watch(x)
        with gl.GradientTape() as t2:
            t2.watch(x)
            with gl.GradientTape() as t1:
                t1.watch(x)
                y = gl.sin(x) * x * x
            g1 = t1.gradient(y, x)
        g2 = t2.gradient(g1, x)
    g3 = t3.gradient(g2, x)
    # d3/dx3 (x^2 sin x) = -x^2 cos x - 6 x sin x + 6 cos x
    expected = -0.49 * math.cos(0.7) - 4.2 * math.sin(0.7) + 6 * math.cos(0.7)
    assert float(g3) == pytest.approx(expected, rel=1e-12)


def test_composite_function_against_finite_differences() -> None:
    def f(x: gl.Tensor, w: gl.Tensor) -> gl.Tensor:
        h = gl.tanh(gl.matmul(w, x))
        return gl.cond(h.sum() > 0, lambda: h * h, lambda: gl.exp(h))

    rng = np.random.default_rng(1)
    check_grads(f, [rng.standard_normal((3, 2)), rng.standard_normal((2, 3))], order=2)


# ---- grad / value_and_grad -----------------------------------------------------------------------


def test_grad_of_grad_of_grad() -> None:
    f = lambda x: gl.sin(x) * x  # noqa: E731
    x = scalar(0.3)
    expected = -3 * math.sin(0.3) - 0.3 * math.cos(0.3)  # (x sin x)''' = -3 sin x - x cos x
    assert float(gl.grad(gl.grad(gl.grad(f)))(x)) == pytest.approx(expected, rel=1e-12)
    assert float(gl.grad(gl.grad(gl.grad(gl.grad(lambda x: x**5))))(scalar(2.0))) == 240.0


def test_python_floats_become_float32_and_numpy_keeps_float64() -> None:
    g = gl.grad(lambda x: x * x)(3.0)
    assert g.dtype == gl.float32 and float(g) == 6.0
    g = gl.grad(lambda x: (x * x).sum())(np.array([1.0, 2.0]))
    assert g.dtype == gl.float64
    np.testing.assert_array_equal(g.numpy(), [2.0, 4.0])


def test_argnums_and_nested_arguments() -> None:
    def f(a: dict, b: list, c: gl.Tensor) -> gl.Tensor:
        return (a["w"] * b[0] * b[1][0]).sum() + c

    a, b, c = {"w": f64(1.0, 2.0)}, [scalar(3.0), (scalar(4.0),)], scalar(5.0)
    ga = gl.grad(f)(a, b, c)
    assert set(ga) == {"w"}
    np.testing.assert_array_equal(ga["w"].numpy(), [12.0, 12.0])
    gb, gc = gl.grad(f, argnums=(1, -1))(a, b, c)
    assert isinstance(gb, list) and isinstance(gb[1], tuple)
    assert [float(gb[0]), float(gb[1][0]), float(gc)] == [12.0, 9.0, 1.0]


def test_mixed_partial_derivative() -> None:
    # f = x^2 y^3: d/dy (df/dx) = 6 x y^2
    f = lambda x, y: x * x * y * y * y  # noqa: E731
    dxdy = gl.grad(lambda x, y: gl.grad(f, argnums=0)(x, y), argnums=1)
    assert float(dxdy(scalar(2.0), scalar(3.0))) == 108.0


def test_value_and_grad_and_has_aux() -> None:
    value, g = gl.value_and_grad(lambda x: (x * x).sum())(f64(1.0, 2.0))
    assert float(value) == 5.0
    np.testing.assert_array_equal(g.numpy(), [2.0, 4.0])
    (value, aux), g = gl.value_and_grad(lambda x: (x.sum() * 2.0, {"n": 7}), has_aux=True)(f64(1.0))
    assert float(value) == 2.0 and aux == {"n": 7} and float(g) == 2.0
    g, aux = gl.grad(lambda x, k: (x * k, k), has_aux=True)(scalar(1.0), k=3.0)
    assert float(g) == 3.0 and aux == 3.0


def test_unconnected_arguments_get_zeros() -> None:
    gx, gy = gl.grad(lambda x, y: x * 2.0, argnums=(0, 1))(scalar(1.0), f64(1.0, 2.0))
    assert float(gx) == 2.0
    np.testing.assert_array_equal(gy.numpy(), [0.0, 0.0])
    assert float(gl.grad(lambda x: 1.0)(scalar(1.0))) == 0.0


GRAD_ERRORS = [
    (lambda x: x * 2.0, f64(1.0, 2.0), r"grad\(<lambda>\): .* tensor; got float64 of shape \(2,\)"),
    (lambda x: gl.cast(x, gl.int32), scalar(1.0), r"got int32 of shape \(\)"),
    (lambda x: "y", scalar(1.0), "scalar float tensor; got str"),
    (lambda x: x * 2, 3, r"argument 0: source at <root> has dtype int32; only float32 and float64"),
    (lambda x: x["a"], {"a": gl.tensor(True)}, r"source at \['a'\] has dtype bool"),
    (lambda x: x * 2.0, scalar(1.0), r"with has_aux=True, fn must return \(value, aux\)"),
]


@pytest.mark.parametrize(("fn", "arg", "message"), GRAD_ERRORS)
def test_grad_errors(fn: object, arg: object, message: str) -> None:
    with pytest.raises(GradErr, match=message):
        gl.grad(fn, has_aux="has_aux" in message)(arg)


@pytest.mark.parametrize(
    ("argnums", "message"),
    [(2, "argnums 2 is out of range for 1 arguments"), ([0], "an int or"), ((), "non-empty")],
)
def test_bad_argnums(argnums: object, message: str) -> None:
    with pytest.raises(gl.errors.InvalidArgumentError, match=message):
        gl.value_and_grad(lambda x: x, argnums=argnums)(scalar(1.0))


# ---- custom_gradient -----------------------------------------------------------------------------


@gl.custom_gradient
def clip_grad(x: gl.Tensor) -> tuple:
    return x * 1.0, lambda dy: gl.minimum(gl.maximum(dy, -0.5), 0.5)


@gl.custom_gradient
def my_sin(x: gl.Tensor) -> tuple:
    return gl.sin(x), lambda dy: dy * gl.cos(x)


def test_custom_gradient_replaces_the_gradient() -> None:
    x = f64(1.0, 2.0)
    g = gl.grad(lambda t: (clip_grad(t) * 3.0).sum())(x)
    np.testing.assert_array_equal(g.numpy(), [0.5, 0.5])
    np.testing.assert_array_equal(clip_grad(x).numpy(), [1.0, 2.0])  # no tape: plain forward


def test_custom_gradient_higher_order() -> None:
    # the gradient function's ops are recorded by outer tapes: sin'' = -sin, sin''' = -cos
    x = scalar(0.4)
    assert float(gl.grad(gl.grad(my_sin))(x)) == pytest.approx(-math.sin(0.4), rel=1e-12)
    assert float(gl.grad(gl.grad(gl.grad(my_sin)))(x)) == pytest.approx(-math.cos(0.4), rel=1e-12)
    check_grads(lambda t: my_sin(t) * t, [np.array([0.3, -1.2])], order=2)


def test_custom_gradient_forward_is_not_recorded() -> None:
    x = scalar(1.0)
    with gl.GradientTape() as tape:
        tape.watch(x)
        y = my_sin(x)
    assert len(tape._tape) == 1  # the custom op only: sin ran with recording paused
    assert float(tape.gradient(y, x)) == pytest.approx(math.cos(1.0))


def test_custom_gradient_several_inputs_and_outputs() -> None:
    @gl.custom_gradient
    def prod_and_sum(x: gl.Tensor, y: gl.Tensor, *, scale: float = 1.0) -> tuple:
        def grad_fn(dp: gl.Tensor, ds: dict) -> tuple:
            return dp * y * scale + ds["s"], dp * x * scale + ds["s"]

        return (x * y * scale, {"s": x + y}), grad_fn

    def f(x: gl.Tensor, y: gl.Tensor) -> gl.Tensor:
        p, d = prod_and_sum(x, y, scale=2.0)
        return p * p + gl.sin(d["s"])

    check_grads(f, [np.array([0.5, 1.5]), np.array([-0.3, 0.8])], order=2)


def test_custom_gradient_unconnected_output_gets_zero_cotangent() -> None:
    @gl.custom_gradient
    def pair(x: gl.Tensor) -> tuple:
        return (x * 2.0, x * 3.0), lambda da, db: da * 2.0 + db * 3.0

    assert float(gl.grad(lambda x: pair(x)[1])(scalar(1.0))) == 3.0


CUSTOM_ERRORS = [
    (lambda x: (x, lambda dy: (dy, dy)), r"grad_fn returned 2 gradients for 1 tensor arguments"),
    (
        lambda x: (x, lambda dy: dy.sum()),
        r"a float64\[\] gradient for argument 0, which is float64\[2",
    ),
    (
        lambda x: (x, lambda dy: gl.cast(dy, gl.float32)),
        r"grad_fn returned a float32\[2\] gradient",
    ),
    (lambda x: x, r"the function must return \(outputs, grad_fn\)"),
    (lambda x: ("y", lambda dy: dy), r"output at <root> must be a Tensor; got str"),
]


@pytest.mark.parametrize(("result", "message"), CUSTOM_ERRORS)
def test_custom_gradient_errors(result: object, message: str) -> None:
    bad = gl.custom_gradient(result)
    with pytest.raises(GradErr, match=rf"custom_gradient\(<lambda>\): .*{message}"):
        gl.grad(lambda x: bad(x).sum())(f64(1.0, 2.0))


def test_errors_raised_by_grad_fn_propagate() -> None:
    def fail(dy: gl.Tensor) -> gl.Tensor:
        raise KeyError("from grad_fn")

    with pytest.raises(KeyError, match="from grad_fn"):
        gl.grad(gl.custom_gradient(lambda x: (x * 2.0, fail)))(scalar(1.0))


# ---- recompute_grad ------------------------------------------------------------


def _block(x: gl.Tensor, w: gl.Tensor) -> gl.Tensor:
    # a loop with a data-dependent trip count inside the recomputed block
    h = gl.while_loop(
        lambda v: (v * v).sum() < 4.0, lambda v: gl.tanh(gl.matmul(w, v)) * 1.5 + v, x
    )
    return gl.sin(h) * w.sum()


def _first_and_second_order(f: object, *args: gl.Tensor) -> list[np.ndarray]:
    first = gl.grad(lambda a, b: f(a, b).sum(), argnums=(0, 1))
    second = gl.grad(lambda a, b: sum(g.sum() for g in first(a, b)), argnums=(0, 1))
    return [g.numpy() for g in (*first(*args), *second(*args))]


def test_recompute_grad_matches_plain_gradients() -> None:
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 1)) * 0.3, rng.standard_normal((2, 2)) * 0.5
    recomputed = gl.recompute_grad(_block)
    check_grads(recomputed, [x, w], order=2)
    expected = _first_and_second_order(_block, gl.tensor(x), gl.tensor(w))
    got = _first_and_second_order(recomputed, gl.tensor(x), gl.tensor(w))
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-12)


def test_recompute_grad_records_one_op_and_reruns_the_graph() -> None:
    calls = []

    @gl.recompute_grad
    def f(x: gl.Tensor, n: gl.Tensor) -> tuple:
        calls.append(1)
        return gl.exp(x) * x, gl.cast(n, gl.float64) * x

    x, n = f64(0.5, 1.0), gl.tensor(3, dtype=gl.int32)
    with gl.GradientTape() as tape:
        tape.watch(x)
        a, b = f(x, n)
    assert len(tape._tape) == 1 and len(calls) == 1  # traced once, run as a graph
    g = tape.gradient([a, b], x)
    assert len(calls) == 1  # the gradient's graph runs it again, not its Python
    expected = np.exp([0.5, 1.0]) * np.array([1.5, 2.0]) + 3.0  # d(x e^x)/dx + n
    np.testing.assert_allclose(g.numpy(), expected, rtol=1e-12)
