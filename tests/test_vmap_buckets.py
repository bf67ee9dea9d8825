"""Traced `vmap` of control flow over many lanes, at the sizes where constructs run in buckets:
a branch in the smallest bucket that holds its lanes, a loop's live lanes gathered into smaller
buckets as lanes finish. Each result is compared with the function run lane by lane (values bit
for bit where the ops are elementwise, trip counts exactly, gradients within rounding), and the
graphs are checked to hold the smaller constructs."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import gradloop as gl
from gradcheck import check_grads

RNG = np.random.default_rng(5454)
LANES = 400


def per_lane(fn: Any, *args: np.ndarray) -> Any:
    outs = [fn(*(gl.tensor(a[k]) for a in args)) for k in range(args[0].shape[0])]
    flat = [gl.nest.flatten(o) for o in outs]
    stacked = [np.stack([np.asarray(f[i]) for f in flat]) for i in range(len(flat[0]))]
    return gl.nest.pack_sequence_as(outs[0], stacked)


def heavy_tailed(lanes: int = LANES) -> np.ndarray:
    """Cube roots to find: most lanes near their root, a few decades away."""
    far = RNG.random(lanes) < 0.05
    return np.where(far, 10.0 ** RNG.uniform(2, 12, lanes), 1.0 + RNG.uniform(0, 0.1, lanes))


def newton(a: Any, limit: int | None = None, checkpoints: int | None = None) -> Any:
    def body(i: Any, x: Any) -> Any:
        return i + 1, x - (x * x * x - a) / (3.0 * x * x)

    def cond(i: Any, x: Any) -> Any:
        return gl.abs(x * x * x - a) > 1e-12 * a

    start = (gl.tensor(0), a)
    return gl.while_loop(cond, body, start, maximum_iterations=limit, checkpoints=checkpoints)


def while_sizes(graph: Any) -> list[int]:
    """The lanes of each `while` node's first variable in a graph's text."""
    text = str(graph)
    return [int(m) for m in re.findall(r"= while\(.*?\) \{.*?\} : \(\w+\[(\d+)", text)]


@pytest.mark.parametrize(
    ("limit", "checkpoints"),
    [(None, None), (12, None), (2, None), (None, 2)],
    ids=["to_the_end", "limit_in_a_later_bucket", "limit_before_lanes_fit", "checkpoints"],
)
def test_a_loop_over_many_lanes_makes_each_lanes_trips_in_smaller_buckets(
    limit: int | None, checkpoints: int | None
) -> None:
    a = heavy_tailed()
    want_trips, want_x = per_lane(lambda a: newton(a, limit, checkpoints), a)
    root = lambda a: newton(a, limit, checkpoints)[1]  # noqa: E731
    want_grad = per_lane(gl.grad(root), a)
    value = gl.function(gl.vmap(lambda a: newton(a, limit, checkpoints)))
    trips, x = value(gl.tensor(a))
    np.testing.assert_array_equal(np.asarray(trips), want_trips)
    np.testing.assert_array_equal(np.asarray(x), want_x)
    grad = gl.function(gl.vmap(gl.grad(root)))(gl.tensor(a))
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-12)
    # the loop runs over every lane, then over 100 and 25 of them (a quarter at a time)
    assert while_sizes(value.graph(gl.tensor(a))) == [LANES, 100, 25]


def test_a_loop_whose_lanes_all_finish_early_skips_its_smaller_buckets() -> None:
    a = 1.0 + RNG.uniform(0, 0.1, LANES)  # every lane a few trips
    trips, x = gl.function(gl.vmap(newton))(gl.tensor(a))
    want_trips, want_x = per_lane(newton, a)
    np.testing.assert_array_equal(np.asarray(trips), want_trips)
    np.testing.assert_array_equal(np.asarray(x), want_x)


def test_gradients_through_buckets_match_finite_differences() -> None:
    a = 10.0 ** RNG.uniform(-1, 3, 80)  # 4 to 40 trips

    def decay(a: Any) -> Any:
        def body(i: Any, x: Any) -> Any:
            return i + 1, x * 0.7 + 0.01 * gl.sin(a)

        return gl.while_loop(lambda i, x: x > 0.1, body, (gl.tensor(0), a * 10.0))[1]

    def total(a: Any) -> Any:
        return gl.sum(gl.vmap(decay)(a) ** 2)

    check_grads(total, (a,), rtol=1e-6, modes=("graph",))


def test_a_switch_over_many_lanes_runs_each_branch_in_the_bucket_that_holds_its_lanes() -> None:
    # Few lanes take the log (NaN on every other lane's negative input) and the long chain.
    x = RNG.normal(size=(LANES, 3))
    index = np.where(RNG.random(LANES) < 0.9, 0, np.where(RNG.random(LANES) < 0.5, 1, 2))
    index = index.astype(np.int32)
    x[index == 1] = np.abs(x[index == 1]) + 0.1

    def chain(v: Any) -> Any:
        for _ in range(20):
            v = gl.sin(v) * 1.01
        return v

    def one(i: Any, v: Any) -> Any:
        return gl.switch_case(i, [lambda: v * 2.0, lambda: gl.log(v), lambda: chain(v)])

    def loss(i: Any, v: Any) -> Any:
        return gl.sum(one(i, v) ** 2)

    value = gl.function(gl.vmap(one))
    np.testing.assert_array_equal(
        np.asarray(value(gl.tensor(index), gl.tensor(x))), per_lane(one, index, x)
    )
    grad = gl.function(gl.vmap(gl.grad(loss, argnums=1)))(gl.tensor(index), gl.tensor(x))
    grad = np.asarray(grad)
    assert np.isfinite(grad).all()
    np.testing.assert_allclose(grad, per_lane(gl.grad(loss, argnums=1), index, x), rtol=1e-12)
    text = str(value.graph(gl.tensor(index), gl.tensor(x)))
    # each branch's case: every lane, 100 lanes, 25 lanes, or none
    assert len(re.findall(r"= case\(", text)) == 3
    assert "f64[25, 3]" in text and "f64[100, 3]" in text


def test_a_construct_inside_a_bucketed_loop_runs_on_stand_ins() -> None:
    a = heavy_tailed()

    def damped(a: Any) -> Any:
        def body(i: Any, x: Any) -> Any:
            step = (x * x * x - a) / (3.0 * x * x)
            step = gl.cond(gl.abs(step) > x, lambda: 0.5 * step, lambda: step)
            return i + 1, x - step

        def cond(i: Any, x: Any) -> Any:
            return gl.abs(x * x * x - a) > 1e-12 * a

        return gl.while_loop(cond, body, (gl.tensor(0), a))

    trips, x = gl.function(gl.vmap(damped))(gl.tensor(a))
    want_trips, want_x = per_lane(damped, a)
    np.testing.assert_array_equal(np.asarray(trips), want_trips)
    np.testing.assert_array_equal(np.asarray(x), want_x)
    grad = gl.function(gl.vmap(gl.grad(lambda a: damped(a)[1])))(gl.tensor(a))
    want = per_lane(gl.grad(lambda a: damped(a)[1]), a)
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-12)


def test_forward_mode_and_grad_of_vmap_through_buckets() -> None:
    a = heavy_tailed()
    root = lambda a: newton(a)[1]  # noqa: E731
    slope = per_lane(gl.grad(root), a)
    tangent = np.linspace(0.5, 1.5, LANES)
    _, out = gl.function(lambda a, t: gl.jvp(gl.vmap(root), (a,), (t,)))(
        gl.tensor(a), gl.tensor(tangent)
    )
    np.testing.assert_allclose(np.asarray(out), slope * tangent, rtol=1e-12)
    total = gl.function(gl.grad(lambda a: gl.sum(gl.vmap(root)(a))))(gl.tensor(a))
    np.testing.assert_allclose(np.asarray(total), slope, rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["iree", "xla", "xla_loop_buckets"])
def test_buckets_compile(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if backend.startswith("xla"):
        pytest.importorskip("jax")
    # XLA's loops run masked unless asked for buckets (its branches bucket either way)
    monkeypatch.setattr(gl.batching, "XLA_LOOP_BUCKETS", backend == "xla_loop_buckets")
    a = heavy_tailed(64)
    index = (a > 2.0).astype(np.int32)

    def one(i: Any, a: Any) -> Any:
        x = newton(a)[1]
        return gl.switch_case(i, [lambda: x * 2.0, lambda: gl.log(x)])

    jit = gl.jit if backend == "iree" else (lambda f: gl.jit(f, backend="xla"))
    got = jit(gl.vmap(one))(gl.tensor(index), gl.tensor(a))
    np.testing.assert_allclose(np.asarray(got), per_lane(one, index, a), rtol=1e-14)
    grad = jit(gl.vmap(gl.grad(one, argnums=1)))(gl.tensor(index), gl.tensor(a))
    want = per_lane(gl.grad(one, argnums=1), index, a)
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-12)


@pytest.mark.slow
def test_xla_runs_loops_over_lanes_masked_and_graph_mode_in_buckets() -> None:
    pytest.importorskip("jax")
    a = gl.tensor(heavy_tailed())
    value = lambda a: newton(a)[1]  # noqa: E731
    masked = gl.jit(gl.vmap(value), backend="xla")
    # XLA fuses the trip (a multiply-add may round once): within an ulp of each lane alone
    np.testing.assert_allclose(np.asarray(masked(a)), per_lane(value, np.asarray(a)), rtol=1e-15)
    assert masked.mlir(a).count("stablehlo.while") == 1
    assert while_sizes(gl.function(gl.vmap(value)).graph(a)) == [LANES, 100, 25]
