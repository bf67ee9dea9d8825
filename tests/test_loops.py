"""`gl.fori_loop` (JAX's `lax.fori_loop` over `while_loop`): values against the Python loop it
stands for, gradients against central finite differences in float64, in every mode; bounds as
ints or data-dependent tensors, structured values, an empty range, `checkpoints`."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from runners import staged

MODES = ("eager", "executor", "compiled")
EPS = 1e-6


def step(i, val):
    x, total = val
    x = x * 0.9 + 0.1 * gl.sin(x * gl.cast(i, gl.float64))
    return x, total + gl.sum(x * x)


def step_np(i, val):
    x, total = val
    x = x * 0.9 + 0.1 * np.sin(x * i)
    return x, total + np.sum(x * x)


def reference(x, lower, upper):
    val = (x, 0.0)
    for i in range(lower, upper):
        val = step_np(i, val)
    return val


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("lower", "upper"), [(0, 6), (3, 7), (5, 5), (4, 2)])
def test_values_are_the_python_loop_s(mode: str, lower: int, upper: int) -> None:
    x = np.array([0.3, -0.7, 1.1])

    def run(x, lo, hi):
        return gl.fori_loop(lo, hi, step, (x, gl.tensor(0.0, dtype=gl.float64)))

    got = staged(mode, run)(gl.tensor(x), gl.tensor(lower), gl.tensor(upper))
    want = reference(x, lower, upper)
    np.testing.assert_allclose(np.asarray(got[0]), want[0], rtol=1e-13)
    np.testing.assert_allclose(float(got[1]), want[1], rtol=1e-13)
    # Python int bounds give the same
    got = staged(mode, lambda x: gl.fori_loop(lower, upper, step, (x, gl.zeros([], gl.float64))))(
        gl.tensor(x)
    )
    np.testing.assert_allclose(np.asarray(got[0]), want[0], rtol=1e-13)


@pytest.mark.parametrize("checkpoints", [None, 2])
@pytest.mark.parametrize("mode", MODES)
def test_gradient_through_a_data_dependent_upper_bound(mode: str, checkpoints) -> None:
    def loss(x):
        n = gl.cast(gl.abs(gl.sum(x)) * 4.0, gl.int32) + 2  # the trip count depends on x
        val = (x, gl.tensor(0.0, dtype=gl.float64))
        return gl.fori_loop(0, n, step, val, checkpoints=checkpoints)[1]

    def loss_np(x):
        n = int(abs(x.sum()) * 4.0) + 2
        return reference(x, 0, n)[1]

    x = np.array([0.3, -0.7, 1.1])
    got = np.asarray(staged(mode, gl.grad(loss))(gl.tensor(x)))
    want = np.array([(loss_np(x + EPS * e) - loss_np(x - EPS * e)) / (2 * EPS) for e in np.eye(3)])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
