"""Cases ported from TensorFlow's `pfor` control-flow tests (`parallel_for/control_flow_ops_test`
and its XLA variant): a loop whose trip count is a per-iteration length (one of them zero), a
loop whose condition is the same in every lane, a Variable read in a loop body, a loop written
with its own done-mask (what pfor needs to stay compilable), Jacobians of a loop's output by
vectorised gradients, and `cond` with a predicate that differs per lane or not. `pfor(loop_fn,
n)` is `gl.vmap` over the iteration index; each case is checked against the function run one
lane at a time, in eager, graph and compiled mode, and its gradients likewise."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gradloop as gl
from test_vmap import assert_lanes, lanewise, staged

MODES = ["eager", "graph", "jit"]
RNG = np.random.default_rng(76891)


def summed_prefix(x_i: Any, length_i: Any) -> Any:
    """`sum(x_i[:length_i])` by a loop of `length_i` trips (TF's `test_stateless_while`)."""

    def body(j: Any, t: Any) -> Any:
        return j + 1, t + gl.take(x_i, gl.reshape(j, (1,)), axis=0)[0]

    return gl.while_loop(lambda j, t: j < length_i, body, (gl.tensor(0), gl.zeros((), x_i.dtype)))


@pytest.mark.parametrize("mode", MODES)
def test_a_loop_of_a_per_lane_length_including_zero(mode: str) -> None:
    x = RNG.uniform(size=(3, 5))
    lengths = np.array([4, 0, 2], dtype=np.int32)
    got = staged(mode, gl.vmap(summed_prefix))(gl.tensor(x), gl.tensor(lengths))
    assert_lanes(got, lanewise(summed_prefix, [x, lengths]))
    np.testing.assert_array_equal(np.asarray(got[0]), lengths)
    np.testing.assert_allclose(np.asarray(got[1]), [x[0, :4].sum(), 0.0, x[2, :2].sum()])
    # each lane's gradient: ones on its prefix, zeros past it (and everywhere for length 0)
    grad = gl.grad(lambda x_i, n: summed_prefix(x_i, n)[1])
    g = np.asarray(staged(mode, gl.vmap(grad))(gl.tensor(x), gl.tensor(lengths)))
    np.testing.assert_array_equal(g, (np.arange(5) < lengths[:, None]).astype(float))


@pytest.mark.parametrize("mode", MODES)
def test_a_loop_whose_condition_is_the_same_in_every_lane(mode: str) -> None:
    # TF's `test_while_unstacked_condition`: the body adds the lane's own index
    def loop_fn(i: Any) -> Any:
        return gl.while_loop(lambda j, x: j < 4, lambda j, x: (j + 1, x + i), (0, gl.tensor(0)))

    got = staged(mode, gl.vmap(loop_fn))(gl.tensor(np.arange(3, dtype=np.int32)))
    np.testing.assert_array_equal(np.asarray(got[0]), [4, 4, 4])
    np.testing.assert_array_equal(np.asarray(got[1]), [0, 4, 8])


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_variable_read_in_the_loop_body(mode: str) -> None:
    # TF's `test_while_with_variable`: reading is per-lane-agnostic, assigning is refused
    v = gl.Variable(gl.tensor(5.0, dtype=gl.float64))

    def loop_fn(x: Any) -> Any:
        return gl.while_loop(lambda j, t: j < 4, lambda j, t: (j + 1, t + v.value + x), (0, x))[1]

    xs = np.array([0.0, 1.0, -2.0])
    got = staged(mode, gl.vmap(loop_fn))(gl.tensor(xs))
    np.testing.assert_allclose(np.asarray(got), xs + 4 * (5.0 + xs))


@pytest.mark.parametrize("mode", MODES)
def test_a_loop_with_its_own_done_mask_equals_the_plain_loop(mode: str) -> None:
    # TF's `test_while_force_unstacked_condition`: the loop written as pfor's XLA route needs it
    # (a done flag carried, the values kept by `where` once done) gives the plain loop's values
    # and gradients per lane
    def masked(x_i: Any, length_i: Any) -> Any:
        def body(going: Any, j: Any, t: Any) -> Any:
            going = gl.logical_and(going, j < length_i)
            step = t + gl.take(x_i, gl.reshape(gl.minimum(j, 4), (1,)), axis=0)[0]
            return going, gl.where(going, j + 1, j), gl.where(going, step, t)

        start = (gl.tensor(True), gl.tensor(0), gl.zeros((), x_i.dtype))
        return gl.while_loop(lambda going, j, t: going, body, start)[1:]

    x = RNG.uniform(size=(3, 5))
    lengths = np.array([4, 0, 2], dtype=np.int32)
    args = (gl.tensor(x), gl.tensor(lengths))
    assert_lanes(staged(mode, gl.vmap(masked))(*args), staged(mode, gl.vmap(summed_prefix))(*args))
    grads = [
        staged(mode, gl.vmap(gl.grad(lambda a, n, f=f: f(a, n)[1])))(*args)
        for f in (masked, summed_prefix)
    ]
    np.testing.assert_allclose(np.asarray(grads[0]), np.asarray(grads[1]), rtol=1e-14)


@pytest.mark.parametrize("mode", MODES)
def test_a_loops_jacobian_by_vectorised_gradients(mode: str) -> None:
    # TF's `test_while_jacobian`: out = x @ y @ y @ y @ y by a loop; row i of the Jacobian is
    # the gradient of out[:, i], all rows at once
    x = RNG.uniform(size=(1, 2))
    y = RNG.uniform(size=(2, 2))
    yt = gl.tensor(y)

    def out(x: Any) -> Any:
        return gl.while_loop(lambda i, o: i < 4, lambda i, o: (i + 1, gl.matmul(o, yt)), (0, x))[1]

    def row(e: Any, x: Any) -> Any:
        return gl.grad(lambda x: gl.sum(out(x) * e))(x)

    rows = staged(mode, gl.vmap(row, in_axes=(0, None)))(gl.tensor(np.eye(2)[:, None, :]), x)
    y4 = np.linalg.matrix_power(y, 4)
    np.testing.assert_allclose(np.asarray(rows).reshape(2, 2), y4.T, rtol=1e-12)
    np.testing.assert_allclose(
        np.asarray(staged(mode, gl.jacrev(out))(gl.tensor(x))).reshape(2, 2), y4.T, rtol=1e-12
    )


def branchy(x_i: Any, p_i: Any) -> Any:
    return gl.cond(p_i, lambda: gl.sqrt(x_i) * 2.0, lambda: gl.log(-x_i + 1.0))


@pytest.mark.parametrize("mode", MODES)
def test_cond_with_a_predicate_per_lane_and_one_for_all(mode: str) -> None:
    # TF's `test_cond_stacked` / `test_cond_unstacked`: an untaken branch's NaN (sqrt of a
    # negative, log of a non-positive) reaches neither value nor gradient
    x = np.array([0.25, -3.0, 4.0, -0.5])
    p = x > 0
    got = staged(mode, gl.vmap(branchy))(gl.tensor(x), gl.tensor(p))
    assert_lanes(got, lanewise(branchy, [x, p]))
    g = staged(mode, gl.vmap(gl.grad(branchy)))(gl.tensor(x), gl.tensor(p))
    assert np.all(np.isfinite(np.asarray(g)))
    assert_lanes(g, lanewise(gl.grad(branchy), [x, p]))
    same = staged(mode, gl.vmap(branchy, in_axes=(0, None)))(gl.tensor(np.abs(x)), gl.tensor(True))
    np.testing.assert_allclose(np.asarray(same), np.sqrt(np.abs(x)) * 2.0, rtol=1e-14)
