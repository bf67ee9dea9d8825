"""`gl.vmap`: every result compared with the unbatched function run lane by lane (values,
gradients, trip counts and branches taken), ops against numpy through that comparison, and
gradients through batched control flow against central finite differences."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gradloop as gl
from gradcheck import check_grads

RNG = np.random.default_rng(54)


def lanewise(fn: Callable[..., Any], args: list[Any], in_axes: Any = 0) -> Any:
    """`fn` run on each lane alone, results stacked along axis 0: what `vmap` must equal."""
    axes = list(in_axes) if isinstance(in_axes, (tuple, list)) else [in_axes] * len(args)
    size = next(np.shape(a)[ax] for a, ax in zip(args, axes, strict=True) if ax is not None)
    outs = []
    for i in range(size):
        lane = [
            a if ax is None else gl.tensor(np.take(np.asarray(a), i, axis=ax))
            for a, ax in zip(args, axes, strict=True)
        ]
        outs.append(gl.nest.map_structure(np.asarray, fn(*lane)) if False else fn(*lane))
    flat = [gl.nest.flatten(o) for o in outs]
    stacked = [np.stack([np.asarray(f[k]) for f in flat]) for k in range(len(flat[0]))]
    return gl.nest.pack_sequence_as(outs[0], stacked)


def assert_lanes(got: Any, want: Any, exact: bool = False) -> None:
    for g, w in zip(gl.nest.flatten(got), gl.nest.flatten(want), strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if exact:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def f64(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def positive(*shape: int) -> np.ndarray:
    return RNG.uniform(0.5, 2.0, shape)


# (name, fn, args, in_axes, exact): one lane's function of tensors; exact for ops that are the
# same kernel per element (elementwise ops are bit for bit; products and reductions may sum in
# another order).
OPS: list[tuple[str, Callable[..., Any], list[Any], Any, bool]] = [
    ("sin", gl.sin, [f64(5, 3)], 0, True),
    ("exp_axis1", gl.exp, [f64(3, 4)], 1, True),
    ("log", gl.log, [positive(4, 2, 3)], 0, True),
    ("tanh", gl.tanh, [f64(4, 3)], 0, True),
    ("sigmoid", gl.sigmoid, [f64(4, 3)], 0, True),
    ("relu", gl.relu, [f64(4, 3)], 0, True),
    ("sqrt", gl.sqrt, [positive(4, 3)], 0, True),
    ("abs_sign", lambda x: gl.abs(x) * gl.sign(x), [f64(4, 3)], 0, True),
    ("floor_ceil_round", lambda x: gl.floor(x) + gl.ceil(x) + gl.round(x), [f64(4, 3)], 0, True),
    (
        "inverse_trig",
        lambda x: gl.arcsin(x * 0.3) + gl.arctan(x) + gl.arccos(x * 0.2),
        [f64(4, 3)],
        0,
        True,
    ),
    ("hyperbolic", lambda x: gl.sinh(x) + gl.cosh(x) + gl.arcsinh(x), [f64(4, 3)], 0, True),
    ("erf_log1p_expm1", lambda x: gl.erf(x) + gl.log1p(x * x) + gl.expm1(x), [f64(4, 3)], 0, True),
    ("add_unbatched", gl.add, [f64(4, 3), f64(3)], (0, None), True),
    ("sub_rank", gl.sub, [f64(4, 3), f64(4, 2, 3)], 0, True),
    ("mul_rank_lower", gl.mul, [f64(4, 2, 3), f64(4, 3)], 0, True),
    ("div_scalar_lane", gl.div, [f64(4), positive(4, 3)], 0, True),
    ("pow", gl.pow, [positive(4, 3), f64(4, 3)], 0, True),
    ("maximum_axes", gl.maximum, [f64(3, 4), f64(4, 3)], (1, 0), True),
    ("minimum_none", gl.minimum, [f64(2, 3), f64(5, 2, 3)], (None, 0), True),
    (
        "arctan2_mod",
        lambda a, b: gl.arctan2(a, b) + gl.mod(a, b),
        [f64(4, 3), positive(4, 3)],
        0,
        True,
    ),
    (
        "comparisons",
        lambda a, b: gl.where(gl.logical_and(a < b, a != b), a, b * 2.0),
        [f64(4, 3), f64(4, 3)],
        0,
        True,
    ),
    (
        "where_unbatched_cond",
        lambda c, a: gl.where(c, a, -a),
        [f64(3) > 0, f64(4, 3)],
        (None, 0),
        True,
    ),
    (
        "integers",
        lambda a, b: gl.bitwise_xor(a, b) + a * 3,
        [RNG.integers(0, 50, (4, 3)), RNG.integers(0, 50, (3,))],
        (0, None),
        True,
    ),
    ("cast", lambda x: gl.cast(gl.cast(x * 10.0, gl.int32), gl.float64), [f64(4, 3)], 0, True),
    ("sum_axis", lambda x: gl.sum(x, axis=1), [f64(4, 3, 5)], 0, False),
    ("sum_all_keepdims", lambda x: gl.sum(x, keepdims=True), [f64(4, 3, 5)], 0, False),
    (
        "max_min_mean",
        lambda x: gl.max(x, axis=1) + gl.min(x) + gl.mean(x, axis=-1),
        [f64(4, 3, 5)],
        0,
        False,
    ),
    ("matmul_both", gl.matmul, [f64(4, 2, 3), f64(4, 3, 5)], 0, False),
    ("matmul_left", gl.matmul, [f64(4, 2, 3), f64(3, 5)], (0, None), False),
    ("matmul_right", gl.matmul, [f64(2, 3), f64(4, 3, 5)], (None, 0), False),
    ("matvec", gl.matmul, [f64(4, 2, 3), f64(4, 3)], 0, False),
    ("vecmat", gl.matmul, [f64(4, 3), f64(3, 5)], (0, None), False),
    ("batched_matmul_lane", gl.matmul, [f64(4, 6, 2, 3), f64(3, 5)], (0, None), False),
    ("reshape", lambda x: gl.reshape(x, (3, 2)), [f64(4, 6)], 0, True),
    ("transpose", lambda x: gl.transpose(x, (2, 0, 1)), [f64(4, 2, 3, 5)], 0, True),
    ("broadcast_to", lambda x: gl.broadcast_to(x, (2, 3)), [f64(4, 3)], 0, True),
    (
        "concatenate_mixed",
        lambda a, b: gl.concatenate([a, b], axis=0),
        [f64(4, 3), f64(2)],
        (0, None),
        True,
    ),
    ("stack", lambda a, b: gl.stack([a, b], axis=1), [f64(4, 3), f64(4, 3)], 0, True),
    ("slice", lambda x: x[1:3, ::2], [f64(4, 4, 5)], 0, True),
    ("reverse_pad", lambda x: gl.pad(x[::-1], ((1, 2),)), [f64(4, 3)], 0, True),
    ("take_batched_x", lambda x: gl.take(x, gl.tensor([2, 0, 2]), axis=1), [f64(4, 2, 3)], 0, True),
    (
        "take_batched_indices",
        lambda i: gl.take(gl.tensor(np.arange(12.0).reshape(3, 4)), i, axis=1),
        [RNG.integers(-4, 4, (5, 2))],
        0,
        True,
    ),
    (
        "take_both",
        lambda x, i: gl.take(x, i, axis=1),
        [f64(5, 2, 4, 3), RNG.integers(-4, 4, (5, 6))],
        0,
        True,
    ),
    ("dynamic_index", lambda x, i: x[i], [f64(5, 4, 3), RNG.integers(0, 4, (5,))], 0, True),
    (
        "dynamic_index_unbatched_x",
        lambda x, i: x[i, 1:],
        [f64(4, 3), RNG.integers(0, 4, (5,))],
        (None, 0),
        True,
    ),
    (
        "at_set_dynamic",
        lambda x, i, v: x.at[i].set(v),
        [f64(5, 4, 3), RNG.integers(0, 4, (5,)), f64(5, 3)],
        0,
        True,
    ),
    (
        "at_add_indices",
        lambda x, i: x.at[i].add(1.5),
        [f64(5, 6), RNG.integers(0, 6, (5, 4))],
        0,
        True,
    ),
    ("cumsum_sort", lambda x: gl.cumsum(gl.sort(x)), [f64(4, 7)], 0, False),
    ("einsum", lambda a, b: gl.einsum("ij,jk->ik", a, b), [f64(4, 2, 3), f64(4, 3, 2)], 0, False),
    (
        "solve",
        lambda a, b: gl.linalg.solve(a, b),
        [f64(4, 3, 3) + 3 * np.eye(3), f64(4, 3)],
        0,
        False,
    ),
    (
        "cholesky",
        lambda a: gl.linalg.cholesky(a @ gl.transpose(a) + 3.0 * gl.eye(3, dtype=gl.float64)),
        [f64(4, 3, 3)],
        0,
        False,
    ),
    (
        "det_inv",
        lambda a: gl.linalg.det(a) + gl.sum(gl.linalg.inv(a)),
        [f64(4, 3, 3) + 3 * np.eye(3)],
        0,
        False,
    ),
]


@pytest.mark.parametrize("name, fn, args, in_axes, exact", OPS, ids=[o[0] for o in OPS])
@pytest.mark.parametrize("mode", ["eager", "graph", "vmap_of_graph"])
def test_each_op_batched_is_the_op_on_each_lane(
    name: str, fn: Callable[..., Any], args: list[Any], in_axes: Any, exact: bool, mode: str
) -> None:
    batched = gl.vmap(fn, in_axes=in_axes)
    if mode == "graph":
        batched = gl.function(batched)
    if mode == "vmap_of_graph":  # called on lanes, the function compiles with the vmap inside
        batched = gl.vmap(gl.function(fn), in_axes=in_axes)
    got = batched(*[gl.tensor(a) for a in args])
    assert_lanes(got, lanewise(fn, args, in_axes), exact=exact)


def test_in_axes_prefixes_out_axes_and_axis_size() -> None:
    x, y = f64(3, 4), f64(4, 2)

    def fn(pair: dict[str, Any], scale: Any) -> Any:
        return {"sum": pair["a"] * scale + gl.sum(pair["b"]), "b": pair["b"]}

    got = gl.vmap(fn, in_axes=({"a": 1, "b": 0}, None), out_axes={"sum": 1, "b": 0})(
        {"a": gl.tensor(x), "b": gl.tensor(y)}, gl.tensor(2.0, dtype=gl.float64)
    )
    want_sum = np.stack([x[:, i] * 2.0 + y[i].sum() for i in range(4)], axis=1)
    np.testing.assert_allclose(np.asarray(got["sum"]), want_sum, rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(got["b"]), y)
    ones = gl.vmap(lambda: gl.ones(2), in_axes=(), axis_size=3)()
    np.testing.assert_array_equal(np.asarray(ones), np.ones((3, 2)))
    # An output the same in every lane: repeated, or kept with out_axes=None.
    rep = gl.vmap(lambda a: (a, gl.tensor(1.5)), out_axes=(0, None))(gl.tensor(x))
    assert np.asarray(rep[1]).shape == ()
    neg_axis = gl.vmap(lambda a: a * 2.0, in_axes=-1, out_axes=-1)(gl.tensor(x))
    np.testing.assert_array_equal(np.asarray(neg_axis), x * 2.0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: gl.vmap(gl.add)(gl.ones(3), gl.ones(4)), "different sizes"),
        (lambda: gl.vmap(gl.sin, in_axes=2)(gl.ones((3, 4))), "out of range"),
        (lambda: gl.vmap(gl.add, in_axes=(0, 0, 0))(gl.ones(3), gl.ones(3)), "3 entries"),
        (lambda: gl.vmap(lambda d: d["a"], in_axes=({"b": 0},))({"a": gl.ones(3)}), "keys"),
        (lambda: gl.vmap(gl.sin, in_axes=None)(gl.ones(3)), "axis_size"),
        (lambda: gl.vmap(gl.sin, out_axes=None)(gl.ones(3)), "differs per lane"),
        (lambda: gl.vmap(gl.sin, in_axes="0"), "in_axes must be"),
        (lambda: gl.vmap(gl.sin, axis_size=0), "axis_size must be"),
        (lambda: gl.vmap(gl.sin)(gl.tensor(1.0)), "is a scalar"),
        (lambda: gl.vmap(gl.sin, axis_size=2)(gl.ones(3)), "axis_size is 2"),
    ],
)
def test_bad_arguments_are_invalid_argument_errors_naming_them(call: Any, message: str) -> None:
    with pytest.raises(gl.errors.InvalidArgumentError, match=message):
        call()


def test_reading_a_lane_and_keeping_it_past_vmap_are_clear_errors() -> None:
    with pytest.raises(gl.errors.ControlFlowError, match=r"every lane of a gl\.vmap"):
        gl.vmap(lambda x: x.numpy())(gl.ones(3))
    kept = []
    gl.vmap(lambda x: kept.append(x * 2.0) or x)(gl.ones(3))
    with pytest.raises(gl.errors.InvalidArgumentError, match="outside the vmap call"):
        gl.sin(kept[0])


def test_a_variable_assigned_a_batched_value_raises() -> None:
    v = gl.Variable(gl.zeros(()))
    with pytest.raises(gl.errors.InvalidArgumentError, match="one value, not one per lane"):
        gl.vmap(lambda x: v.assign(x))(gl.ones(3))
    with pytest.raises(gl.errors.InvalidArgumentError, match="one value, not one per lane"):
        gl.function(lambda xs: gl.vmap(lambda x: v.assign(x) or x)(xs))(gl.ones(3))
    np.testing.assert_array_equal(np.asarray(v.read()), 0.0)


# ---- transforms ---------------------------------------------------------------------------------


def loss(x: Any, w: Any) -> Any:
    return gl.sum(gl.sin(x * w) * x) + gl.sum(w * w)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_per_example_gradients_and_gradients_of_a_batch(mode: str) -> None:
    xs, w = f64(5, 3), f64(3)
    stage = gl.function if mode == "graph" else (lambda f: f)
    per_example = stage(gl.vmap(gl.grad(loss, argnums=(0, 1)), in_axes=(0, None)))(
        gl.tensor(xs), gl.tensor(w)
    )
    want = lanewise(gl.grad(loss, argnums=(0, 1)), [xs, w], (0, None))
    assert_lanes(per_example, want)
    # The gradient of the batch's total: per-lane gradients of x, their sum for w.
    total = stage(gl.grad(lambda a, b: gl.sum(gl.vmap(loss, in_axes=(0, None))(a, b)), (0, 1)))
    gx, gw = total(gl.tensor(xs), gl.tensor(w))
    np.testing.assert_allclose(np.asarray(gx), want[0], rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gw), want[1].sum(0), rtol=1e-12)


def test_gradients_of_the_batch_match_finite_differences() -> None:
    w = f64(3)
    check_grads(
        lambda xs: gl.vmap(lambda x: gl.sum(gl.sin(x * gl.tensor(w)) * x))(xs),
        [f64(4, 3)],
        modes=("tape", "grad", "graph"),
    )


def test_vmap_of_jvp_hessian_and_nested_vmap() -> None:
    xs, w = f64(4, 3), f64(3)
    f = lambda x: loss(x, gl.tensor(w))  # noqa: E731
    jvps = gl.vmap(lambda x, t: gl.jvp(f, (x,), (t,)))(gl.tensor(xs), gl.tensor(xs * 0.5))
    assert_lanes(jvps, lanewise(lambda x, t: gl.jvp(f, (x,), (t,)), [xs, xs * 0.5]))
    # tangents batched over a primal that is not: a Jacobian's columns at once
    basis = np.eye(3)
    cols = gl.vmap(lambda t: gl.jvp(f, (gl.tensor(xs[0]),), (t,))[1])(gl.tensor(basis))
    np.testing.assert_allclose(np.asarray(cols), np.asarray(gl.grad(f)(gl.tensor(xs[0]))))
    hess = gl.vmap(gl.hessian(f))(gl.tensor(xs))
    assert_lanes(hess, lanewise(gl.hessian(f), [xs]))
    nested = gl.vmap(gl.vmap(lambda a, b: a * b + gl.sin(a)), in_axes=(0, None))(
        gl.tensor(f64(2, 3)), gl.tensor(w)
    )
    want = np.stack(
        [
            [a * b + np.sin(a) for a, b in zip(row, w, strict=True)]
            for row in np.asarray(gl.vmap(lambda a: a, in_axes=0)(gl.tensor(f64(2, 3))))
        ]
    )
    assert np.asarray(nested).shape == want.shape


def test_nested_vmap_is_the_double_loop() -> None:
    a, b = f64(2, 3), f64(4, 3)
    got = gl.vmap(lambda x: gl.vmap(lambda y: gl.sum(x * y))(gl.tensor(b)))(gl.tensor(a))
    np.testing.assert_allclose(np.asarray(got), a @ b.T, rtol=1e-12)
    g = gl.vmap(
        gl.vmap(gl.grad(lambda x, y: gl.sum(gl.sin(x * y))), in_axes=(None, 0)), in_axes=(0, None)
    )(gl.tensor(a), gl.tensor(b))
    want = np.stack([[np.cos(x * y) * y for y in b] for x in a])
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-12)


def test_gradient_tape_inside_vmap() -> None:
    xs = f64(4, 3)

    def lane(x: Any) -> Any:
        with gl.GradientTape() as tape:
            tape.watch(x)
            y = gl.sum(x * x * x)
        return tape.gradient(y, x)

    np.testing.assert_allclose(np.asarray(gl.vmap(lane)(gl.tensor(xs))), 3 * xs**2)
    w = gl.tensor(f64(3))

    def shared(x: Any) -> Any:
        with gl.GradientTape() as tape:
            tape.watch(w)
            y = gl.sum(x * w)
        return tape.gradient(y, w)

    with pytest.raises(gl.errors.InvalidArgumentError, match="same in every lane"):
        gl.vmap(shared)(gl.tensor(xs))


# ---- control flow -------------------------------------------------------------------------------


def piecewise(x: Any) -> Any:
    return gl.cond(x > 0, lambda: gl.sqrt(x) * 2.0, lambda: x * x)


def newton(a: Any) -> Any:
    def body(x: Any, k: Any) -> Any:
        return x - (x * x * x - a) / (3.0 * x * x), k + 1

    return gl.while_loop(lambda x, k: gl.abs(x * x * x - a) > 1e-12 * a, body, (a, gl.tensor(0)))


CONTROL_MODES = ["eager", "graph"]


def staged(mode: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` run as `mode` runs it: eagerly, traced by `@gl.function`, or compiled."""
    return {
        "eager": fn,
        "graph": gl.function(fn),
        "jit": gl.jit(fn),
        "xla": gl.jit(fn, backend="xla"),
    }[mode]


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_batched_cond_runs_each_branch_on_its_lanes_only(mode: str) -> None:
    xs = np.array([-2.0, -0.5, 0.0, 0.3, 1.5, 4.0])
    got = staged(mode, gl.vmap(piecewise))(gl.tensor(xs))
    assert_lanes(got, lanewise(piecewise, [xs]), exact=True)
    # sqrt of a negative lane would be NaN, and its gradient NaN: neither reaches the result.
    grads = staged(mode, gl.vmap(gl.grad(piecewise)))(gl.tensor(xs))
    assert np.all(np.isfinite(np.asarray(grads)))
    assert_lanes(grads, lanewise(gl.grad(piecewise), [xs]))
    check_grads(
        lambda v: gl.vmap(piecewise)(v), [np.array([-1.5, 0.7, 2.0])], modes=("tape", "graph")
    )


def test_a_branch_no_lane_takes_never_runs() -> None:
    table = gl.tensor(np.arange(4.0))
    ran = []

    def bad() -> Any:
        ran.append(1)
        return gl.take(table, gl.tensor(99))  # out of range: an error if it ran

    out = gl.vmap(lambda x: gl.cond(x > -10.0, lambda: x + 1.0, bad))(gl.tensor(f64(5)))
    assert np.asarray(out).shape == (5,) and not ran
    # The lanes that take it raise, as the unbatched function does.
    with pytest.raises(gl.errors.GradloopError):
        gl.vmap(lambda x: gl.cond(x > 0.0, lambda: x + 1.0, bad))(gl.tensor([1.0, -1.0]))


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_batched_switch_case_with_default_and_out_of_range_indices(mode: str) -> None:
    idx = np.array([0, 1, 2, 7, -3, 1])
    xs = positive(6)

    def fn(i: Any, x: Any) -> Any:
        return gl.switch_case(i, [lambda: x + 1.0, lambda: x * 10.0], default=lambda: gl.log(x))

    got = staged(mode, gl.vmap(fn))(gl.tensor(idx), gl.tensor(xs))
    assert_lanes(got, lanewise(fn, [idx, xs]), exact=True)
    grads = staged(mode, gl.vmap(gl.grad(fn, argnums=1)))(gl.tensor(idx), gl.tensor(xs))
    assert_lanes(grads, lanewise(gl.grad(fn, argnums=1), [idx, xs]))


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_batched_while_loop_makes_each_lanes_own_trips(mode: str) -> None:
    a = np.array([1.0, 8.0, 27.0, 1000.0, 2.0, 0.001])
    x, k = staged(mode, gl.vmap(newton))(gl.tensor(a))
    want_x, want_k = lanewise(newton, [a])
    np.testing.assert_array_equal(np.asarray(k), want_k)  # trip counts exactly
    np.testing.assert_array_equal(np.asarray(x), want_x)
    assert len(set(want_k.tolist())) > 3
    root = lambda a: newton(a)[0]  # noqa: E731
    got = staged(mode, gl.vmap(gl.grad(root)))(gl.tensor(a))
    assert_lanes(got, lanewise(gl.grad(root), [a]))
    modes = ("tape",) if mode == "eager" else ("graph",)
    check_grads(lambda v: gl.vmap(root)(v), [np.array([2.0, 30.0, 0.5])], modes=modes)


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_finished_lanes_stop_and_their_nans_stay_out(mode: str) -> None:
    # After a lane's own last trip, one more would divide by zero: it never runs.
    def countdown(n: Any, x: Any) -> Any:
        def body(n: Any, x: Any) -> Any:
            return n - 1, x + 1.0 / gl.cast(n, gl.float64)

        return gl.while_loop(lambda n, x: n > 0, body, (n, x))[1]

    ns, xs = np.array([0, 3, 1, 5]), f64(4)
    got = staged(mode, gl.vmap(countdown))(gl.tensor(ns), gl.tensor(xs))
    assert np.all(np.isfinite(np.asarray(got)))
    assert_lanes(got, lanewise(countdown, [ns, xs]), exact=True)
    grads = staged(mode, gl.vmap(gl.grad(countdown, argnums=1)))(gl.tensor(ns), gl.tensor(xs))
    np.testing.assert_array_equal(np.asarray(grads), np.ones(4))


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_maximum_iterations_and_closed_over_values_hold_per_lane(mode: str) -> None:
    w = gl.tensor(f64(3))

    def fn(x: Any, stop: Any) -> Any:
        out = gl.while_loop(
            lambda i, y: gl.sum(y * y) < stop,
            lambda i, y: (i + 1, y * 1.5 + w),
            (0, x),
            maximum_iterations=6,
        )
        return out

    xs, stops = f64(5, 3) * 0.1, np.array([0.0, 1.0, 10.0, 100.0, 1e9])
    got = staged(mode, gl.vmap(fn))(gl.tensor(xs), gl.tensor(stops))
    assert_lanes(got, lanewise(fn, [xs, stops]), exact=True)
    total = gl.vmap(gl.grad(lambda x, s: gl.sum(fn(x, s)[1])))
    g = staged(mode, total)(gl.tensor(xs), gl.tensor(stops))
    assert_lanes(g, lanewise(gl.grad(lambda x, s: gl.sum(fn(x, s)[1])), [xs, stops]))


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_nested_batched_control_flow(mode: str) -> None:
    def fn(x: Any) -> Any:
        def body(y: Any) -> Any:
            return gl.cond(y > 1.0, lambda: y * 0.5, lambda: y + 0.75)

        return gl.while_loop(lambda y: gl.abs(y - 1.0) > 0.1, body, x, maximum_iterations=20)

    xs = np.array([0.2, 3.0, 17.0, 1.05, 6.5])
    assert_lanes(staged(mode, gl.vmap(fn))(gl.tensor(xs)), lanewise(fn, [xs]), exact=True)
    got = staged(mode, gl.vmap(gl.grad(fn)))(gl.tensor(xs))
    assert_lanes(got, lanewise(gl.grad(fn), [xs]))


def orbit(r: Any, x0: Any, n: Any, checkpoints: int | None) -> Any:
    """A logistic map of `n` trips whose body closes over `r`."""

    def body(i: Any, x: Any) -> Any:
        return i + 1, r * x * (1.0 - x) + 0.01 * gl.sin(x)

    start = (gl.tensor(0), x0)
    _, x = gl.while_loop(lambda i, x: i < n, body, start, checkpoints=checkpoints)
    return gl.sum(x * x)


def test_an_eager_checkpointed_loop_under_vmap_is_staged_over_its_lanes() -> None:
    # Eagerly under a tape, `checkpoints=` stages the loop as a graph: inside vmap, the graph
    # takes every lane's values and the closed-over lanes of `r`, each lane makes its own trips,
    # and every derivative of it (run inside jacrev's vmap too) is each lane's.
    from gradloop import _staged

    rs, x0s, ns = (
        np.linspace(2.5, 3.5, 4),
        RNG.uniform(0.1, 0.4, (4, 3)),
        np.array([3, 5, 7, 9], np.int32),
    )
    args = [gl.tensor(rs), gl.tensor(x0s), gl.tensor(ns)]
    kept = lambda r, x0, n: orbit(r, x0, n, 2)  # noqa: E731
    stacked = lambda r, x0, n: orbit(r, x0, n, None)  # noqa: E731
    staged_before = len(_staged._cache)
    per_example = gl.vmap(gl.grad(kept))(*args)
    assert len(_staged._cache) > staged_before
    assert_lanes(per_example, lanewise(gl.grad(stacked), [rs, x0s, ns]))
    of_batch = gl.grad(lambda r: gl.sum(gl.vmap(kept)(r, args[1], args[2])))(args[0])
    assert_lanes(of_batch, per_example)
    rows = gl.jacrev(lambda r: gl.vmap(kept)(r, args[1], args[2]))(args[0])
    np.testing.assert_allclose(np.asarray(rows), np.diag(np.asarray(per_example)), rtol=1e-12)
    hessians = gl.vmap(gl.hessian(kept))(*args)
    assert_lanes(hessians, lanewise(gl.grad(gl.grad(stacked)), [rs, x0s, ns]))
    forward = gl.vmap(lambda r, x0, n: gl.jvp(lambda r: kept(r, x0, n), (r,), (1.0 + 0 * r,)))
    assert_lanes(
        forward(*args),
        lanewise(lambda r, x0, n: (stacked(r, x0, n), gl.grad(stacked)(r, x0, n)), [rs, x0s, ns]),
    )
    outer = gl.tensor(np.stack([rs, rs[::-1]]))
    nested = gl.vmap(gl.vmap(gl.grad(kept)), in_axes=(0, None, None))(outer, *args[1:])
    want = np.stack([lanewise(gl.grad(stacked), [row, x0s, ns]) for row in np.asarray(outer)])
    np.testing.assert_allclose(np.asarray(nested), want, rtol=1e-12, atol=1e-12)
    check_grads(lambda r: gl.vmap(kept)(r, args[1], args[2]), [rs], modes=("tape", "grad"))


def test_jacfwd_of_an_eager_checkpointed_loop_batches_its_tangents() -> None:
    # jacfwd's basis tangents are lanes of its vmap over a primal that is not: the staged
    # loop's Jacobian-vector product runs over those lanes.
    def f(x: Any, checkpoints: int | None) -> Any:
        def body(i: Any, y: Any) -> Any:
            return i + 1, 3.1 * y * (1.0 - y) + 0.01 * gl.sin(x)

        start = (gl.tensor(0), x)
        return gl.while_loop(lambda i, y: i < 4, body, start, checkpoints=checkpoints)[1]

    x = gl.tensor(RNG.uniform(0.1, 0.4, 5))
    for transform in (gl.jacfwd, gl.jacrev):
        got = transform(lambda x: f(x, 2))(x)
        np.testing.assert_allclose(got, transform(lambda x: f(x, None))(x), rtol=1e-12)
    squared = lambda c: lambda x: gl.sum(f(x, c) ** 2)  # noqa: E731
    got = gl.jacfwd(gl.jacrev(squared(2)))(x)
    np.testing.assert_allclose(got, gl.hessian(squared(None))(x), rtol=1e-10, atol=1e-12)


def test_a_staged_loop_keeps_a_bounded_number_of_functions_over_lanes() -> None:
    # The same checkpointed loop, its gradient run under jacrev's vmap at 20 lane counts.
    from gradloop import _staged

    x0 = RNG.uniform(0.1, 0.4, 20)

    def rows(x: Any, n: int, checkpoints: int | None) -> Any:
        def body(i: Any, x: Any) -> Any:
            return i + 1, 3.1 * x * (1.0 - x)

        start = (gl.tensor(0), x)
        _, x = gl.while_loop(lambda i, x: i < 4, body, start, checkpoints=checkpoints)
        return x[:n]

    for n in range(1, 21):
        jac = gl.jacrev(lambda x, n=n: rows(x, n, 2))(gl.tensor(x0))
        want = gl.jacrev(lambda x, n=n: rows(x, n, None))(gl.tensor(x0))
        np.testing.assert_allclose(np.asarray(jac), np.asarray(want), rtol=1e-12)
    kept = [len(s._lanes) for st in _staged._cache.values() for s in st._vjps.values()]
    assert max(kept) == _staged.LANE_PATTERNS, kept


@gl.recompute_grad
def _rematerialized(x: Any, k: Any, w: Any) -> Any:
    return gl.sin(x * w) * k + gl.cond(gl.sum(x) > 0, lambda: x * 2.0, lambda: gl.exp(x))


def test_an_eager_recompute_grad_under_vmap_is_staged_over_its_lanes() -> None:
    from gradloop import _staged

    w = gl.tensor(positive(4))  # closed over by the layers' callers, passed unbatched

    def f(x: Any, k: Any) -> Any:
        return gl.sum(_rematerialized(_rematerialized(x, k, w), k, w))

    xs, ks = f64(5, 4), np.linspace(0.1, 0.9, 5)
    staged_before = len(_staged._cache)
    got = gl.vmap(gl.grad(f, argnums=(0, 1)))(gl.tensor(xs), gl.tensor(ks))
    assert len(_staged._cache) > staged_before
    assert_lanes(got, lanewise(gl.grad(f, argnums=(0, 1)), [xs, ks]))
    rows = gl.jacrev(lambda k: gl.vmap(f)(gl.tensor(xs), k))(gl.tensor(ks))
    np.testing.assert_allclose(np.asarray(rows), np.diag(np.asarray(got[1])), rtol=1e-12)
    hessians = gl.vmap(gl.hessian(lambda x, k: f(x, k), argnums=1))(gl.tensor(xs), gl.tensor(ks))
    assert_lanes(hessians, lanewise(gl.hessian(f, argnums=1), [xs, ks]))


EAGER_VMAP_MEMORY = """
import sys
import numpy as np
import gradloop as gl

c = None if sys.argv[1] == "stacks" else int(sys.argv[1])

def status_kb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

def loss(x, w, n):
    def body(i, h):
        return i + 1, gl.sin(h) * w + 0.001
    _, h = gl.while_loop(lambda i, h: i < n, body, (gl.tensor(0), x), checkpoints=c)
    return gl.sum(h)

grad = gl.vmap(gl.grad(loss, argnums=(0, 1)))
x = gl.tensor(np.linspace(0, 1, 16 * 512).reshape(16, 512))
w = gl.tensor(np.linspace(0.99, 0.999, 16))
grad(x, w, gl.tensor(np.arange(5, 21, dtype=np.int32)))  # traced, buffers sized
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size starts again from the current one
before = status_kb("VmRSS")
_, gw = grad(x, w, gl.tensor(np.arange(985, 1001, dtype=np.int32)))
print(status_kb("VmHWM") - before, float(np.abs(np.asarray(gw)).sum()))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not __import__("os").path.exists("/proc/self/clear_refs"),
    reason="measures peak memory with Linux's /proc/self/clear_refs (a peak reset)",
)
def test_an_eager_checkpointed_loop_under_vmap_keeps_c_snapshots_not_every_trip() -> None:
    # 16 lanes of float64[512], about 1,000 trips each: the stacks keep two residuals a trip
    # (about 128 MB), the checkpoints 100 snapshots of every lane (6.5 MB).
    from peak_memory import peak_growth_mb

    kept, g_kept = peak_growth_mb(EAGER_VMAP_MEMORY, "100", timeout=600)
    stacked, g_stacked = peak_growth_mb(EAGER_VMAP_MEMORY, "stacks", timeout=600)
    assert kept < 40, f"checkpoints=100 under vmap grew the process by {kept:.1f} MB"
    assert stacked > 100, f"stacks grew the process by {stacked:.1f} MB"
    assert g_kept == pytest.approx(g_stacked, rel=1e-12)


def test_uniform_control_flow_traced_inside_vmap() -> None:
    xs, w = f64(4, 3), f64(3)

    @gl.function
    def fn(xs: Any, w: Any) -> Any:
        def lane(x: Any) -> Any:
            y = gl.cond(gl.sum(w) > 0, lambda: x * w, lambda: x - w)
            return gl.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, gl.sin(y) + x), (0, y))

        return gl.vmap(lane)(xs)

    def lane(x: Any, w: Any) -> Any:
        y = x * w if w.sum() > 0 else x - w
        for _ in range(3):
            y = np.sin(y) + x
        return y

    i, y = fn(gl.tensor(xs), gl.tensor(w))
    np.testing.assert_array_equal(np.asarray(i), [3, 3, 3, 3])
    np.testing.assert_allclose(np.asarray(y), np.stack([lane(x, w) for x in xs]), rtol=1e-12)


@pytest.mark.parametrize("backend", ["jit", "xla"])
def test_compiled_batched_loops_and_branches_agree_with_each_lane(backend: str) -> None:
    a = np.array([1.0, 8.0, 27.0, 1000.0, 2.0, 0.001])
    x, k = staged(backend, gl.vmap(newton))(gl.tensor(a))
    want_x, want_k = lanewise(newton, [a])
    np.testing.assert_array_equal(np.asarray(k), want_k)
    np.testing.assert_allclose(np.asarray(x), want_x, rtol=1e-12)

    def bounded(a: Any) -> Any:
        return gl.while_loop(
            lambda x: gl.abs(x * x * x - a) > 1e-12 * a,
            lambda x: x - (x * x * x - a) / (3.0 * x * x),
            a,
            maximum_iterations=40,
        )

    fn = gl.vmap(gl.grad(lambda a: piecewise(bounded(a) - 2.0)))
    got = staged(backend, fn)(gl.tensor(a))
    want = lanewise(gl.grad(lambda a: piecewise(bounded(a) - 2.0)), [a])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10)


def test_batched_loops_in_pure_stablehlo() -> None:
    text = gl.to_mlir(gl.vmap(newton), gl.tensor(np.ones(4)), dialect="stablehlo")
    assert "stablehlo.while" in text and "scf." not in text


def gap(x: Any, y: Any) -> Any:
    # The untaken branch's sqrt of a negative is NaN, and its gradient too: neither may leak.
    return gl.cond(x > y, lambda: gl.sqrt(x - y), lambda: (y - x) * (y + 2.0))


PAIRS = (np.array([0.3, 1.2, -0.4]), np.array([0.1, 0.9, 1.5, -1.0]))


def pairwise(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` over every (x, y) pair: rows from the outer vmap, columns from the inner."""
    return gl.vmap(gl.vmap(fn, in_axes=(None, 0)), in_axes=(0, None))


def each_pair(fn: Callable[..., Any], xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    return np.array([[np.asarray(fn(gl.tensor(x), gl.tensor(y))) for y in ys] for x in xs])


NESTED_MODES = ["eager", "graph", "xla"]


@pytest.mark.parametrize("mode", NESTED_MODES)
def test_a_predicate_batched_over_two_vmap_calls_at_once_holds_per_pair(mode: str) -> None:
    # The outer level runs one lane at a time (traced: a copy of the cond per outer lane);
    # each pair takes its own branch, and the untaken branch's NaN reaches nothing.
    xs, ys = PAIRS
    got = staged(mode, pairwise(gap))(gl.tensor(xs), gl.tensor(ys))
    np.testing.assert_array_equal(np.asarray(got), each_pair(gap, xs, ys))
    for argnum in (0, 1):
        grads = staged(mode, pairwise(gl.grad(gap, argnums=argnum)))(gl.tensor(xs), gl.tensor(ys))
        assert np.all(np.isfinite(np.asarray(grads)))
        want = each_pair(gl.grad(gap, argnums=argnum), xs, ys)
        np.testing.assert_allclose(np.asarray(grads), want, rtol=1e-14)
    if mode == "eager":
        check_grads(lambda a, b: gl.sum(pairwise(gap)(a, b)), [xs, ys], modes=("tape", "graph"))


def branchy(i: Any, x: Any) -> Any:
    """A cond, a switch and a loop whose predicates differ per lane, then a checkpointed loop."""
    y = gl.cond(x > 0.0, lambda: gl.sqrt(x), lambda: -x)
    z = gl.switch_case(i, [lambda: y + 1.0, lambda: y * 2.0])
    root = newton(z * z + 1.0)[0]

    def body(k: Any, v: Any) -> Any:
        return k + 1, v * 1.5 + root  # root >= 1: it passes 8 within a few trips

    _, w = gl.while_loop(lambda k, v: v < 8.0, body, (gl.tensor(0), root), checkpoints=2)
    return w + z


@pytest.mark.parametrize("mode", ["eager", "graph", "jit", "xla"])
def test_zero_lanes_run_no_trip_and_no_branch(mode: str) -> None:
    # A batch of zero lanes (the last, empty batch of a dataset) gives empty results of the
    # unbatched function's dtypes, values and per-example gradients alike, as in JAX.
    value = staged(mode, gl.vmap(branchy))
    grad = staged(mode, gl.vmap(gl.grad(branchy, argnums=1)))
    for i, x in [
        (np.array([0, 1, 1], dtype=np.int32), np.array([2.0, -0.5, 0.3])),
        (np.zeros(0, dtype=np.int32), np.zeros(0)),
    ]:
        args = (gl.tensor(i), gl.tensor(x))
        if x.size:
            assert_lanes(value(*args), lanewise(branchy, [i, x]))
            assert_lanes(grad(*args), lanewise(gl.grad(branchy, argnums=1), [i, x]))
            continue
        for got in (value(*args), grad(*args)):
            got = np.asarray(got)
            assert got.shape == (0,) and got.dtype == np.float64, (got.shape, got.dtype)
    k = staged(mode, gl.vmap(newton))(gl.tensor(np.zeros(0)))[1]
    assert np.asarray(k).shape == (0,) and np.asarray(k).dtype == np.int32


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_per_lane_indices_over_zero_lanes(mode: str) -> None:
    # A gather by per-lane index built one block start too many for zero lanes (a ShapeError).
    def pick(x: Any) -> Any:
        i = gl.cast(gl.abs(x[0]) * 2.0, gl.int32) % 3
        return x.at[i].set(gl.tanh(x[i]) * 2.0) + x[i]

    xs = np.array([[0.2, -1.0, 0.5], [1.4, 0.3, -0.2]])
    assert_lanes(staged(mode, gl.vmap(pick))(gl.tensor(xs)), lanewise(pick, [xs]))
    for fn in (pick, gl.grad(lambda x: gl.sum(pick(x)))):
        got = np.asarray(staged(mode, gl.vmap(fn))(gl.tensor(np.zeros((0, 3)))))
        assert got.shape == (0, 3) and got.dtype == np.float64


def test_zero_outer_lanes_of_a_predicate_over_nested_levels_is_a_clear_error() -> None:
    # Each outer lane runs the construct alone; with none, nothing gives its results' structure.
    with pytest.raises(gl.errors.InvalidArgumentError, match="outer call has zero lanes"):
        pairwise(gap)(gl.tensor(np.zeros(0)), gl.tensor(PAIRS[1]))
    inner_empty = pairwise(gap)(gl.tensor(PAIRS[0]), gl.tensor(np.zeros(0)))
    assert np.asarray(inner_empty).shape == (3, 0)


@pytest.mark.parametrize("mode", NESTED_MODES)
def test_loops_and_switches_batched_over_nested_levels_at_once(mode: str) -> None:
    a = positive(3, 4) * np.array([[1.0], [30.0], [1e4]])
    root = lambda v: newton(v)[0]  # noqa: E731
    x, k = staged(mode, gl.vmap(gl.vmap(newton)))(gl.tensor(a))
    want_x, want_k = (
        np.array([[np.asarray(newton(gl.tensor(v))[j]) for v in r] for r in a]) for j in (0, 1)
    )
    # XLA may contract x * x * x - a into other roundings; the trips are the same.
    np.testing.assert_allclose(np.asarray(x), want_x, rtol=0 if mode != "xla" else 1e-15)
    np.testing.assert_array_equal(np.asarray(k), want_k)  # each lane's own trips
    assert len(np.unique(want_k)) > 2
    grads = staged(mode, gl.vmap(gl.vmap(gl.grad(root))))(gl.tensor(a))
    np.testing.assert_allclose(np.asarray(grads), (1 / 3) * a ** (-2 / 3), rtol=1e-9)
    if mode == "eager":
        check_grads(lambda v: gl.sum(gl.vmap(gl.vmap(root))(v)), [a[:2, :2]], modes=("tape",))

    def pick(x: Any, y: Any) -> Any:
        index = gl.cast(gl.floor(x + y), gl.int32)
        return gl.switch_case(index, [lambda: x * y, lambda: x - y], default=lambda: -x)

    xs, ys = PAIRS
    got = staged(mode, pairwise(pick))(gl.tensor(xs), gl.tensor(ys))
    np.testing.assert_array_equal(np.asarray(got), each_pair(pick, xs, ys))


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_three_nested_levels_and_a_predicate_over_two_of_them(mode: str) -> None:
    def fn(x: Any, y: Any, z: Any) -> Any:
        return gl.cond(x * z > y, lambda: x + y + z, lambda: x * y * z)

    def nest3(fn: Callable[..., Any]) -> Callable[..., Any]:
        inner = gl.vmap(fn, in_axes=(None, None, 0))
        return gl.vmap(gl.vmap(inner, in_axes=(None, 0, None)), in_axes=(0, None, None))

    xs, ys, zs = f64(2), f64(3), f64(4)
    got = staged(mode, nest3(fn))(gl.tensor(xs), gl.tensor(ys), gl.tensor(zs))
    want = [[[float(fn(*map(gl.tensor, (x, y, z)))) for z in zs] for y in ys] for x in xs]
    np.testing.assert_array_equal(np.asarray(got), np.array(want))
    # The predicate differs over the outer and inner levels only (not y's).
    only_xz = nest3(lambda x, y, z: gl.cond(x > z, lambda: x - z + y, lambda: z * y))
    got = staged(mode, only_xz)(gl.tensor(xs), gl.tensor(ys), gl.tensor(zs))
    want = [[[x - z + y if x > z else z * y for z in zs] for y in ys] for x in xs]
    np.testing.assert_allclose(np.asarray(got), np.array(want), rtol=1e-15)


@gl.custom_gradient
def constant_slope(x: Any) -> Any:
    # Its gradient function returns a value the same in every lane (unbatched).
    return x * 2.0, lambda dy: gl.tensor(5.0, dtype=gl.float64)


@pytest.mark.parametrize("mode", NESTED_MODES)
def test_a_gradient_the_same_in_every_lane_reaches_only_the_lanes_that_ran_it(mode: str) -> None:
    # A custom gradient returned unbatched, inside a branch some lanes take: it is each taking
    # lane's (once added to the lanes that did not take the branch too).
    def fn(x: Any) -> Any:
        return gl.cond(x > 0, lambda: constant_slope(x), lambda: x * x)

    xs = np.array([0.3, -1.2, 0.5, -0.1])
    got = staged(mode, gl.vmap(gl.grad(fn)))(gl.tensor(xs))
    np.testing.assert_array_equal(np.asarray(got), lanewise(gl.grad(fn), [xs]))


@pytest.mark.parametrize("mode", NESTED_MODES)
def test_custom_gradients_in_a_branch_chosen_per_pair_of_lanes(mode: str) -> None:
    # Found by the nested vmap fuzzer: a custom gradient inside a branch taken per pair got
    # its input's narrowed lanes back only over one level.
    def fn(x: Any, y: Any) -> Any:
        return gl.cond(x > y, lambda: halved_square_norm(x * y), lambda: constant_slope(y))

    xs, ys = PAIRS
    grad = gl.grad(fn, argnums=(0, 1))
    got = staged(mode, pairwise(grad))(gl.tensor(xs), gl.tensor(ys))
    for k in range(2):
        want = each_pair(lambda x, y, k=k: grad(x, y)[k], xs, ys)
        np.testing.assert_allclose(np.asarray(got[k]), want, rtol=1e-14)


def test_a_traced_construct_is_copied_for_at_most_64_outer_lanes() -> None:
    xs, ys = f64(65), f64(2)
    with pytest.raises(gl.errors.InvalidArgumentError, match="at most 64"):
        gl.function(pairwise(gap))(gl.tensor(xs), gl.tensor(ys))
    # swapped, the outer call is the smaller one
    swapped = gl.vmap(gl.vmap(gap, in_axes=(0, None)), in_axes=(None, 0))
    got = gl.function(swapped)(gl.tensor(xs), gl.tensor(ys))
    np.testing.assert_array_equal(np.asarray(got), each_pair(gap, xs, ys).T)


@pytest.mark.parametrize("mode", NESTED_MODES)
def test_a_loop_per_inner_lane_that_closes_over_the_outer_lanes(mode: str) -> None:
    # The condition differs over the inner level only; the body reads the outer level's w.
    def f(w: Any, a: Any) -> Any:
        def body(i: Any, x: Any) -> Any:
            return i + 1, x * 0.9 + w

        more = lambda i, x: i < gl.cast(a, gl.int32)  # noqa: E731
        return gl.while_loop(more, body, (gl.tensor(0), a))

    ws, As = np.array([0.5, 1.0, 2.0]), np.array([1.0, 8.0, 30.0, 0.3])
    got = staged(mode, pairwise(f))(gl.tensor(ws), gl.tensor(As))
    want = [each_pair(lambda w, a, k=k: f(w, a)[k], ws, As) for k in (0, 1)]
    np.testing.assert_array_equal(np.asarray(got[0]), want[0])  # each lane's own trips
    np.testing.assert_allclose(np.asarray(got[1]), want[1], rtol=1e-14)
    grad = gl.grad(lambda w, a: f(w, a)[1], argnums=(0, 1))
    got = staged(mode, pairwise(grad))(gl.tensor(ws), gl.tensor(As))
    for k in range(2):
        want = each_pair(lambda w, a, k=k: grad(w, a)[k], ws, As)
        np.testing.assert_allclose(np.asarray(got[k]), want, rtol=1e-13)


def outer_only(x: Any, y: Any) -> Any:
    # Branches and trips follow the outer level's x alone; what they give differs over y too.
    branch = gl.cond(x > 0, lambda: x * y, lambda: -y)
    trips = gl.cast(gl.abs(x) * 3.0, gl.int32)
    body = lambda i, v: (i + 1, v * 0.5 + y)  # noqa: E731
    _, v = gl.while_loop(lambda i, v: i < trips, body, (gl.tensor(0), y))
    return branch * v


@pytest.mark.parametrize("mode", [*CONTROL_MODES, "xla"])
def test_an_outer_predicate_with_results_batched_by_the_inner_vmap(mode: str) -> None:
    xs, ys = PAIRS
    got = staged(mode, pairwise(outer_only))(gl.tensor(xs), gl.tensor(ys))
    np.testing.assert_allclose(np.asarray(got), each_pair(outer_only, xs, ys), rtol=1e-15)
    grad = gl.grad(outer_only, argnums=(0, 1))
    got = staged(mode, pairwise(grad))(gl.tensor(xs), gl.tensor(ys))
    for k in range(2):
        want = each_pair(lambda x, y, k=k: grad(x, y)[k], xs, ys)
        np.testing.assert_allclose(np.asarray(got[k]), want, rtol=1e-13)


@gl.custom_gradient
def halved_square_norm(x: Any) -> Any:
    """sum(x^2) whose gradient rule (one lane's) is half the true one: a rule, not autodiff."""

    def grad(g: Any) -> Any:
        return g * x

    return gl.sum(x * x), grad


@pytest.mark.parametrize("mode", ["eager"])
def test_custom_gradient_rules_see_lanes_inside_and_after_vmap(mode: str) -> None:
    xs = f64(4, 3)
    inside = staged(mode, gl.vmap(gl.grad(halved_square_norm)))(gl.tensor(xs))
    np.testing.assert_allclose(np.asarray(inside), xs, rtol=1e-12)
    # The gradient of the batch, taken after vmap returned: the rule runs on its lanes again.
    after = staged(mode, gl.grad(lambda v: gl.sum(gl.vmap(halved_square_norm)(v) * 2.0)))
    np.testing.assert_allclose(np.asarray(after(gl.tensor(xs))), 2.0 * xs, rtol=1e-12)


@pytest.mark.parametrize("mode", ["graph", "jit", "xla"])
def test_custom_rules_traced_inside_vmap_hold_per_lane(mode: str) -> None:
    # Traced, a custom rule's function is one lane's, and its call node is batched with the
    # rule: the rule, not autodiff, gives each lane's gradient.
    xs = f64(4, 3)
    inside = staged(mode, gl.vmap(gl.grad(halved_square_norm)))(gl.tensor(xs))
    np.testing.assert_allclose(np.asarray(inside), xs, rtol=1e-12)
    after = staged(mode, gl.grad(lambda v: gl.sum(gl.vmap(halved_square_norm)(v) * 2.0)))
    np.testing.assert_allclose(np.asarray(after(gl.tensor(xs))), 2.0 * xs, rtol=1e-12)


@gl.custom_gradient
def weighted(x: Any, w: Any) -> Any:
    def grad(g: Any) -> Any:
        return g * w * 2.0, g * x

    return gl.sum(x * w), grad


@pytest.mark.parametrize("mode", ["eager", "graph", "jit"])
def test_a_custom_rule_operand_the_same_in_every_lane_gets_the_lanes_gradients_summed(
    mode: str,
) -> None:
    xs, w = f64(4, 3), f64(3)

    def loss(w: Any) -> Any:
        return gl.sum(gl.vmap(lambda x: weighted(x, w))(gl.tensor(xs)))

    def per_lane(x: Any) -> Any:
        return gl.grad(lambda x: weighted(x, gl.tensor(w)))(x)

    np.testing.assert_allclose(
        np.asarray(staged(mode, gl.grad(loss))(gl.tensor(w))), xs.sum(0), rtol=1e-12
    )
    assert_lanes(staged(mode, gl.vmap(per_lane))(gl.tensor(xs)), lanewise(per_lane, [xs]))


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_a_custom_rule_that_closes_over_a_lane(mode: str) -> None:
    def fn(x: Any) -> Any:
        @gl.custom_gradient
        def inner(y: Any) -> Any:
            def grad(g: Any) -> Any:
                return g * x * 3.0

            return gl.sum(y * x), grad

        return gl.grad(inner)(x * 2.0) + inner(x)

    xs = f64(4, 3)
    assert_lanes(staged(mode, gl.vmap(fn))(gl.tensor(xs)), lanewise(fn, [xs]))


@pytest.mark.parametrize("mode", ["eager", "graph", "jit"])
def test_a_custom_rule_inside_a_branch_chosen_per_lane(mode: str) -> None:
    # Traced, the lanes that do not take the branch run it on a copy of one that does; the
    # rule's gradient of those copies is not the lanes' (they get the other branch's).
    def fn(x: Any) -> Any:
        return gl.cond(
            gl.sum(x) > 1.0, lambda: halved_square_norm(x) + 1.0, lambda: gl.sum(gl.sin(x))
        )

    xs = np.linspace(-1.0, 1.5, 18).reshape(6, 3)
    assert_lanes(staged(mode, gl.vmap(fn))(gl.tensor(xs)), lanewise(fn, [xs]))
    grads = staged(mode, gl.vmap(gl.grad(fn)))(gl.tensor(xs))
    assert_lanes(grads, lanewise(gl.grad(fn), [xs]))
    taken = xs.sum(axis=1) > 1.0
    assert taken.any() and not taken.all()
    want = np.where(taken[:, None], xs, np.cos(xs))  # the rule's half gradient where taken
    np.testing.assert_allclose(np.asarray(grads), want, rtol=1e-12)
    after = staged(mode, gl.grad(lambda v: gl.sum(gl.vmap(fn)(v))))(gl.tensor(xs))
    np.testing.assert_allclose(np.asarray(after), want, rtol=1e-12)


@gl.custom_jvp
def cube_root(a: Any) -> Any:
    """Newton's x^3 = a, per lane its own trips; differentiated implicitly by its rule."""

    def body(x: Any) -> Any:
        return x - (x * x * x - a) / (3.0 * x * x)

    return gl.while_loop(lambda x: gl.abs(x * x * x - a) > 1e-12 * a, body, a)


@cube_root.defjvp
def _cube_root_jvp(primals: Any, tangents: Any) -> Any:
    (a,), (t,) = primals, tangents
    x = cube_root(a)
    return x, t / (3.0 * x * x)


@pytest.mark.parametrize("mode", ["eager", "graph", "jit", "xla"])
def test_an_implicitly_differentiated_newton_solve_per_lane(mode: str) -> None:
    # The rule's function holds a loop whose trips differ per lane: the loop node is batched
    # with a live mask, each lane making its own trips.
    a = np.array([0.5, 2.0, 8.0, 27.0, 1e3])
    np.testing.assert_allclose(
        np.asarray(staged(mode, gl.vmap(cube_root))(gl.tensor(a))), np.cbrt(a), rtol=1e-12
    )
    got = staged(mode, gl.vmap(gl.grad(cube_root)))(gl.tensor(a))
    np.testing.assert_allclose(np.asarray(got), 1.0 / (3.0 * np.cbrt(a) ** 2), rtol=1e-10)
    hess = staged(mode, gl.vmap(gl.grad(gl.grad(cube_root))))(gl.tensor(a))
    np.testing.assert_allclose(np.asarray(hess), -2.0 / (9.0 * np.cbrt(a) ** 5), rtol=1e-8)


@gl.custom_jvp
def safe_branches(x: Any, k: Any) -> Any:
    """Branches chosen per lane inside a rule's function; an untaken branch is NaN there."""
    return gl.switch_case(
        k, [lambda: gl.sqrt(x), lambda: gl.log(-x), lambda: x * x], default=lambda: x * 0.5
    )


@safe_branches.defjvp
def _safe_branches_jvp(primals: Any, tangents: Any) -> Any:
    (x, k), (t, _) = primals, tangents
    slope = gl.switch_case(
        k,
        [lambda: 0.5 / gl.sqrt(x), lambda: 1.0 / x, lambda: 2.0 * x],
        default=lambda: x * 0.0 + 0.5,
    )
    return safe_branches(x, k), slope * t


@pytest.mark.parametrize("mode", ["graph", "jit"])
def test_branches_chosen_per_lane_inside_a_rule_run_on_their_lanes_only(mode: str) -> None:
    xs = np.array([4.0, -2.0, 3.0, 1.5, -0.5])
    ks = np.array([0, 1, 2, 7, 1], dtype=np.int32)  # 7: out of range, the default
    got = staged(mode, gl.vmap(safe_branches))(gl.tensor(xs), gl.tensor(ks))
    assert_lanes(got, lanewise(safe_branches, [xs, ks]))
    g = gl.grad(safe_branches)
    grads = staged(mode, gl.vmap(g))(gl.tensor(xs), gl.tensor(ks))
    assert np.all(np.isfinite(np.asarray(grads)))
    assert_lanes(grads, lanewise(g, [xs, ks]))


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_recompute_grad_inside_vmap(mode: str) -> None:
    def fn(x: Any) -> Any:
        def block(y: Any) -> Any:
            # a loop whose trips are the same in every lane, and a branch chosen per lane
            y = gl.fori_loop(0, 3, lambda i, v: v * 0.9 + gl.sin(v) * 0.1, y)
            return gl.cond(gl.sum(y) > 0, lambda: gl.sin(y) * y, lambda: gl.cos(y))

        return gl.sum(gl.recompute_grad(block)(x) * x)

    xs = f64(5, 3)
    g = gl.grad(fn)
    assert_lanes(staged(mode, gl.vmap(g))(gl.tensor(xs)), lanewise(g, [xs]))


def test_a_custom_rule_in_a_loop_whose_lanes_finish_apart() -> None:
    # Found by the vmap fuzzer: a gather made inside the rule's unrecorded forward pass was
    # reused by the body's recorded ops, cutting the loop variable off from the tape.
    def fn(x: Any, n: Any) -> Any:
        def body(i: Any, h: Any) -> Any:
            return i + 1, halved_square_norm(h) * h * 0.5 + h * 0.3

        return gl.sum(gl.while_loop(lambda i, h: i < n, body, (0, x))[1])

    xs, ns = f64(3, 2) * 0.5, np.array([1, 2, 3], dtype=np.int32)
    got = gl.vmap(gl.grad(fn))(gl.tensor(xs), gl.tensor(ns))
    assert_lanes(got, lanewise(gl.grad(fn), [xs, ns]))


def test_keyword_arguments_are_mapped_over_axis_0() -> None:
    xs, scales = f64(4, 3), f64(4)
    got = gl.vmap(lambda x, scale=1.0: x * scale)(gl.tensor(xs), scale=gl.tensor(scales))
    np.testing.assert_array_equal(np.asarray(got), xs * scales[:, None])


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_scan_and_fori_loop_inside_vmap(mode: str) -> None:
    xs = f64(4, 5)

    def fn(x: Any) -> Any:
        _, ys = gl.scan(lambda c, xi: (c * 0.5 + xi, gl.sin(c) * xi), x[0] * 0.0, x)
        return gl.fori_loop(0, 3, lambda i, v: v * 0.8 + gl.sin(v), ys)

    assert_lanes(staged(mode, gl.vmap(fn))(gl.tensor(xs)), lanewise(fn, [xs]))
    g = gl.grad(lambda x: gl.sum(fn(x)))
    assert_lanes(staged(mode, gl.vmap(g))(gl.tensor(xs)), lanewise(g, [xs]))


def test_a_mismatch_inside_vmap_names_one_lanes_shapes() -> None:
    with pytest.raises(gl.errors.ShapeError, match=r"shapes \[2\] and \[4\]"):
        gl.vmap(gl.add)(gl.ones((3, 2)), gl.ones((3, 4)))


# ---- ported from JAX's lax_control_flow_test batching cases --------------------------------------


def test_while_loop_batched_carry_with_an_unbatched_bound() -> None:
    # testWhileLoopBatched-like: the carry batched, the limit the same in every lane.
    def fun(x: Any) -> Any:
        return gl.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2.0 + 1.0), (0, x))

    xs = np.array([0.0, 1.0, 2.0, 3.0])
    i, v = gl.vmap(fun)(gl.tensor(xs))
    np.testing.assert_array_equal(np.asarray(i), [3, 3, 3, 3])
    np.testing.assert_array_equal(np.asarray(v), xs * 8.0 + 7.0)


def test_while_loop_batched_bound_unbatched_carry() -> None:
    # The carry starts the same in every lane; the bound (and so the trips) is per lane.
    def fun(n: Any) -> Any:
        return gl.while_loop(lambda i, v: i < n, lambda i, v: (i + 1, v + v), (0, gl.ones(2)))

    ns = np.array([0, 1, 4], dtype=np.int32)
    i, v = gl.vmap(fun)(gl.tensor(ns))
    np.testing.assert_array_equal(np.asarray(i), ns)
    np.testing.assert_array_equal(np.asarray(v), np.stack([np.ones(2) * 2.0**n for n in ns]))


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_cond_batched_operands_unbatched_predicate(mode: str) -> None:
    # testCondBatched: only the operands are batched.
    def fun(flag: Any, x: Any) -> Any:
        return gl.cond(flag, lambda: (x, gl.sin(x)), lambda: (-x, gl.cos(x)))

    xs = f64(5)
    for flag in (True, False):
        got = staged(mode, gl.vmap(fun, in_axes=(None, 0)))(gl.tensor(flag), gl.tensor(xs))
        assert_lanes(got, lanewise(fun, [flag, xs], (None, 0)), exact=True)


def test_switch_batched_index_and_operands_pytree_out_axes() -> None:
    # testSwitchBatched with a pytree output and out_axes per leaf.
    def fun(i: Any, x: Any) -> Any:
        return gl.switch_case(i, [lambda: {"a": x, "b": x * 2.0}, lambda: {"a": -x, "b": x * x}])

    idx, xs = np.array([0, 1, 1, 0]), f64(4, 3)
    got = gl.vmap(fun, out_axes={"a": 0, "b": 1})(gl.tensor(idx), gl.tensor(xs))
    want = lanewise(fun, [idx, xs])
    np.testing.assert_array_equal(np.asarray(got["a"]), want["a"])
    np.testing.assert_array_equal(np.asarray(got["b"]), want["b"].T)


def test_nested_vmap_of_a_data_dependent_loop() -> None:
    # Each lane of the inner vmap loops its own number of times; the outer maps over inputs.
    def fun(n: Any, x: Any) -> Any:
        return gl.while_loop(lambda i, v: i < n, lambda i, v: (i + 1, v * 0.5), (0, x))[1]

    ns, xs = np.array([1, 2, 3], dtype=np.int32), f64(2, 3)
    got = gl.vmap(gl.vmap(fun, in_axes=(0, 0)), in_axes=(None, 0))(gl.tensor(ns), gl.tensor(xs))
    want = np.stack([xs[r] * 0.5**ns for r in range(2)])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-15)


@pytest.mark.parametrize("mode", ["graph", "jit", "xla"])
def test_vmap_of_a_graph_or_compiled_function_batches_inside_it(mode: str) -> None:
    # jax.vmap(jax.jit(f)): the function is compiled with the vmap inside it, so its loop
    # batches as a traced one does (each lane its own trips), and runs as a graph or module.
    if mode == "xla":
        pytest.importorskip("jax")
    a = np.array([1.0, 8.0, 27.0, 1000.0, 2.0, 0.001])
    fn = staged(mode, newton)
    before = gl._core.frame_statistics()
    x, k = gl.vmap(fn)(gl.tensor(a))
    ran = gl._core.frame_statistics()
    want_x, want_k = lanewise(newton, [a])
    np.testing.assert_array_equal(np.asarray(k), want_k)
    np.testing.assert_allclose(np.asarray(x), want_x, rtol=1e-12)
    if mode == "graph":  # on the executor, not run eagerly
        runs = ("program_runs", "buffer_runs", "native_runs")
        assert sum(ran[r] - before[r] for r in runs) >= 1
    # Again, with other values: the same compiled function.
    x, k = gl.vmap(fn)(gl.tensor(a[::-1].copy()))
    np.testing.assert_array_equal(np.asarray(k), want_k[::-1])
    assert len(fn._over_lanes) == 1
    # Per-example gradients through it, and the gradient of the batch.
    want = lanewise(gl.grad(lambda a: newton(a)[0]), [a])
    per_lane = gl.vmap(gl.grad(lambda a: fn(a)[0]))(gl.tensor(a))
    np.testing.assert_allclose(np.asarray(per_lane), want, rtol=1e-12)
    total = gl.grad(lambda a: gl.sum(gl.vmap(fn)(a)[0]))(gl.tensor(a))
    np.testing.assert_allclose(np.asarray(total), want, rtol=1e-12)


def test_vmap_of_a_graph_function_with_unbatched_keyword_and_python_arguments() -> None:
    @gl.function
    def solve(a: Any, x0: Any, tol: float = 1e-12) -> Any:
        def body(x: Any, k: Any) -> Any:
            return x - (x * x * x - a) / (3.0 * x * x), k + 1

        more = lambda x, k: gl.abs(x * x * x - a) > tol * a  # noqa: E731
        return gl.while_loop(more, body, (x0, gl.tensor(0)))

    def one(a: Any, x0: Any, tol: float = 1e-12) -> Any:
        return solve._fn(a, x0, tol=tol)

    a, x0 = np.array([1.0, 8.0, 27.0, 3.5]), gl.tensor(3.0, dtype=gl.float64)
    for tol in (1e-12, 1e-4):
        got = gl.vmap(lambda a, tol=tol: solve(a, x0=x0, tol=tol))(gl.tensor(a))
        assert_lanes(got, lanewise(lambda a, tol=tol: one(a, x0, tol), [a]), exact=True)
    got = gl.vmap(solve, in_axes=(0, None))(gl.tensor(a), x0)
    assert_lanes(got, lanewise(lambda a: one(a, x0), [a]), exact=True)
    # Lanes of two nested calls at once, and lanes the function closes over: run as eagerly.
    grid = np.array([[1.0, 8.0], [27.0, 0.5]])
    got = gl.vmap(gl.vmap(lambda a: solve(a, x0)))(gl.tensor(grid))
    want = [lanewise(lambda a: one(a, x0), [row]) for row in grid]
    assert_lanes(got, tuple(np.stack([w[i] for w in want]) for i in range(2)), exact=True)
    got = gl.vmap(lambda a: gl.function(lambda y: solve(a, y))(x0))(gl.tensor(a))
    assert_lanes(got, lanewise(lambda a: one(a, x0), [a]), exact=True)


@pytest.mark.parametrize(
    "name",
    ["solve", "grad_of_solve", "grad_of_scan", "jacrev", "hessian", "at_set"],
)
def test_vmap_of_a_graph_function_of_solver_numerics(name: str) -> None:
    # The function's own vmap is the only one active inside it: gl.linalg's batch axes and
    # transforms' lanes are the compiled function's, not the caller's.
    a, b = f64(4, 3, 3) + 3.0 * np.eye(3), f64(4, 3)
    scan = lambda x: gl.scan(lambda c, v: (c * v + 1.0, c), gl.tensor(1.0, dtype=gl.float64), x)  # noqa: E731
    fns = {
        "solve": (lambda a, b: gl.linalg.solve(a, b), [a, b]),
        "grad_of_solve": (gl.grad(lambda a, b: gl.sum(gl.linalg.solve(a, b))), [a, b]),
        "grad_of_scan": (gl.grad(lambda x: gl.sum(scan(x)[1])), [b]),
        "jacrev": (gl.jacrev(lambda x: gl.sin(x) * x[0]), [b]),
        "hessian": (gl.hessian(lambda x: gl.sum(gl.sin(x) * x[0])), [b]),
        "at_set": (lambda x: x.at[1].set(x[0] * 2.0), [b]),
    }
    fn, args = fns[name]
    got = gl.vmap(gl.function(fn))(*map(gl.tensor, args))
    assert_lanes(got, lanewise(fn, args))


@pytest.mark.parametrize("mode", CONTROL_MODES)
def test_per_example_gradients_through_a_custom_linear_solve(mode: str) -> None:
    # Its inverse is a custom rule whose value is zeros, the same in every lane: each lane's
    # cotangent is still its own (it was summed over the lanes, silently).
    m = gl.tensor(np.array([[3.0, 1.0, 0.0], [1.0, 4.0, 1.0], [0.0, 1.0, 5.0]]))

    def loss(b: Any) -> Any:
        x = gl.custom_linear_solve(
            lambda v: gl.matmul(m, v * (1.0 + b * b)),
            b,
            lambda mv, r: gl.linalg.solve(m, r) / (1.0 + b * b),
            lambda vm, r: gl.linalg.solve(gl.transpose(m), r / (1.0 + b * b)),
        )
        return gl.sum(x * x * b)

    bs = f64(4, 3)
    got = staged(mode, gl.vmap(gl.grad(loss)))(gl.tensor(bs))
    np.testing.assert_allclose(np.asarray(got), lanewise(gl.grad(loss), [bs]), rtol=1e-12)
    for i in (0, 3):
        check_grads(loss, [bs[i]], order=1, modes=("grad",))


def test_a_custom_gradient_whose_output_is_the_same_in_every_lane() -> None:
    @gl.custom_gradient
    def flat(x: Any) -> Any:
        return gl.zeros_like(x) + 1.0, lambda dy: dy * 2.0

    def loss(x: Any) -> Any:
        return gl.sum(flat(x) * x)

    xs = f64(4, 3)
    got = gl.vmap(gl.grad(loss))(gl.tensor(xs))
    np.testing.assert_allclose(np.asarray(got), lanewise(gl.grad(loss), [xs]), rtol=1e-15)


def test_jacrev_of_a_function_that_vmaps_a_custom_gradient() -> None:
    # jacrev's own vmap (over cotangents) runs the custom gradient, recorded under the inner
    # vmap: each row keeps its lanes (they were summed into every row, silently).
    @gl.custom_gradient
    def tripled(x: Any) -> Any:
        return x * 3.0, lambda dy: dy * 3.0

    def rows(x: Any) -> Any:
        return gl.vmap(lambda t: gl.sum(tripled(x * t) * gl.cos(x)))(gl.tensor(np.eye(3) + 0.5))

    x = gl.tensor(np.array([0.5, -0.2, 0.9]))
    want = np.stack([np.asarray(gl.grad(lambda x, i=i: rows(x)[i])(x)) for i in range(3)])
    np.testing.assert_allclose(np.asarray(gl.jacrev(rows)(x)), want, rtol=1e-14)
    plain = lambda x: gl.vmap(lambda t: gl.sum(x * t * 3.0 * gl.cos(x)))(gl.tensor(np.eye(3) + 0.5))  # noqa: E731
    np.testing.assert_allclose(want, np.asarray(gl.jacrev(plain)(x)), rtol=1e-14)
