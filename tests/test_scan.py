"""`gl.scan` (JAX's `lax.scan` over `while_loop`): values against the Python loop it stands
for, forward and reverse, with structured carries, inputs and outputs, no input, no output and
no step; gradients against central finite differences (second order too) in every mode; the
step traced once to learn its outputs' shapes without running it; bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from gradcheck import check_grads
from runners import staged

MODES = ("eager", "executor", "compiled")
XS = np.random.default_rng(3).standard_normal((6, 2))
W = np.array([[0.8, -0.3], [0.2, 0.9]])


def cell(carry, x):
    h, total = carry
    h = gl.tanh(gl.matmul(W, h) + x)
    return (h, total + gl.sum(h)), {"h": h, "norm": gl.sum(h * h)}


def cell_np(carry, x):
    h, total = carry
    h = np.tanh(W @ h + x)
    return (h, total + h.sum()), {"h": h, "norm": np.sum(h * h)}


def reference(h0, xs, reverse=False):
    carry, ys = (h0, 0.0), []
    for x in xs[::-1] if reverse else xs:
        carry, y = cell_np(carry, x)
        ys.append(y)
    ys = ys[::-1] if reverse else ys
    return carry, {k: np.stack([y[k] for y in ys]) for k in ("h", "norm")}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("reverse", [False, True])
def test_values_are_the_python_loop_s(mode: str, reverse: bool) -> None:
    h0 = np.array([0.1, -0.4])

    def run(h0, xs):
        return gl.scan(cell, (h0, gl.tensor(0.0, dtype=gl.float64)), xs, reverse=reverse)

    (h, total), ys = staged(mode, run)(gl.tensor(h0), gl.tensor(XS))
    (want_h, want_total), want_ys = reference(h0, XS, reverse)
    np.testing.assert_allclose(np.asarray(h), want_h, rtol=1e-13)
    np.testing.assert_allclose(float(total), want_total, rtol=1e-13)
    for k in ("h", "norm"):
        np.testing.assert_allclose(np.asarray(ys[k]), want_ys[k], rtol=1e-13)


@pytest.mark.parametrize("mode", MODES)
def test_no_input_no_output_and_no_step(mode: str) -> None:
    def run(x):
        count, powers = gl.scan(lambda c, _: (c * 2.0, c), x, length=4)
        last, nothing = gl.scan(lambda c, _: (c + 1.0, None), x, length=3)
        empty_carry, empty = gl.scan(lambda c, x: (c + x, c * x), x, gl.zeros([0], gl.float64))
        return count, powers, last, empty_carry, empty, nothing is None

    x = gl.tensor(1.5, dtype=gl.float64)
    count, powers, last, empty_carry, empty, no_output = staged(mode, run)(x)
    assert float(count) == 24.0 and float(last) == 4.5 and float(empty_carry) == 1.5
    np.testing.assert_array_equal(np.asarray(powers), [1.5, 3.0, 6.0, 12.0])
    assert np.asarray(empty).shape == (0,)
    assert bool(no_output)


def loss(w, h0, xs):
    def step(h, x):
        h = gl.tanh(gl.matmul(w, h) + x)
        return h, gl.sum(h * x)

    h, ys = gl.scan(step, h0, xs)
    return gl.sum(h) + gl.sum(ys * ys)


def test_gradients_match_finite_differences() -> None:
    check_grads(loss, [W, np.array([0.1, -0.4]), XS], order=2, modes=("tape", "grad", "graph"))


def test_gradients_with_checkpoints_and_reverse_match_finite_differences() -> None:
    def checkpointed(w, xs):
        def step(h, x):
            h = gl.tanh(gl.matmul(w, h) + x)
            return h, h

        h, ys = gl.scan(step, gl.ones([2], gl.float64), xs, reverse=True, checkpoints=2)
        return gl.sum(ys * ys) + gl.sum(h)

    check_grads(checkpointed, [W, XS], order=1, modes=("tape", "grad", "graph"))


@pytest.mark.slow
def test_compiled_gradients_match_finite_differences() -> None:
    check_grads(loss, [W, np.array([0.1, -0.4]), XS], order=1, modes=("compiled",))


def test_forward_mode_matches_reverse_mode() -> None:
    args = [gl.tensor(W), gl.tensor(np.array([0.1, -0.4])), gl.tensor(XS)]
    direction = gl.tensor(np.ones_like(XS))
    _, tangent = gl.jvp(lambda xs: loss(args[0], args[1], xs), (args[2],), (direction,))
    g = gl.grad(loss, argnums=2)(*args)
    np.testing.assert_allclose(float(tangent), float(gl.sum(g)), rtol=1e-12)


def test_the_step_runs_once_per_trip() -> None:
    """The shapes of the outputs come from tracing the step, which runs no side effect."""
    calls = []
    v = gl.Variable(gl.tensor(0.0, dtype=gl.float64))

    def step(c, x):
        calls.append(1)
        v.assign_add(x)
        return c + x, c

    carry, ys = gl.scan(step, gl.tensor(0.0, dtype=gl.float64), gl.tensor(np.arange(4.0)))
    assert float(v.read()) == 6.0 and float(carry) == 6.0
    np.testing.assert_array_equal(np.asarray(ys), [0.0, 0.0, 1.0, 3.0])
    assert len(calls) == 4 + 1  # the trips, and the trace that finds y's shape


def test_pure_stablehlo_gradient_is_emitted() -> None:
    args = [gl.tensor(W), gl.tensor(np.array([0.1, -0.4])), gl.tensor(XS)]
    text = gl.to_mlir(gl.grad(loss), *args, dialect="stablehlo")
    assert "stablehlo.while" in text and "scf." not in text


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: gl.scan(lambda c, x: (c, x), 0.0, gl.ones([3]), length=4), "disagree"),
        (lambda: gl.scan(lambda c, x: (c, x), 0.0, (gl.ones([3]), gl.ones([2]))), "disagree"),
        (lambda: gl.scan(lambda c, x: (c, x), 0.0), "give xs or length"),
        (lambda: gl.scan(lambda c, x: (c, x), 0.0, gl.tensor(1.0)), "leading axis"),
        (lambda: gl.scan(lambda c, x: c, 0.0, gl.ones([3])), "pair"),
    ],
)
def test_bad_arguments_raise(call, match: str) -> None:
    with pytest.raises(gl.errors.InvalidArgumentError, match=match):
        call()
