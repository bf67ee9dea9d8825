"""Function transforms see argument positions and pytree leaves, not tensor identities.

`gl.grad(lambda a, b: a + 2*b, argnums=(0, 1))(x, x)` is `(1, 2)`, as in JAX and `torch.func`:
each position is its own input even when two hold the same tensor. (A `GradientTape` keeps
TensorFlow's semantics: one watched tensor, one gradient, checked last.) Every transform, in
every mode, against the same transform given distinct copies of the tensor.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from runners import staged

X = np.array([0.3, -0.8])
MODES = ("eager", "executor", "frames", "interpreter", "compiled")


def f2(a, b):
    """Linear in a and b with different coefficients, through a loop over b."""
    return gl.sum(a + 2.0 * b) + gl.sum(
        gl.while_loop(lambda i, s: i < 2, lambda i, s: (i + 1, s * b), (0, a))[1]
    )


def both(result) -> list[np.ndarray]:
    return [np.asarray(r) for r in gl.nest.flatten(result)]


def same(fn) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """`fn` on the same tensor in both places, and on two distinct copies of it."""
    x = gl.tensor(X)
    return both(fn(x, x)), both(fn(gl.tensor(X.copy()), gl.tensor(X.copy())))


def check(fn) -> None:
    aliased, distinct = same(fn)
    assert len(aliased) == len(distinct)
    for a, d in zip(aliased, distinct, strict=True):
        np.testing.assert_allclose(a, d, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_grad_of_the_same_tensor_in_two_positions_is_one_gradient_per_position(mode) -> None:
    g = staged(mode, lambda a, b: gl.grad(lambda a, b: gl.sum(a + 2.0 * b), argnums=(0, 1))(a, b))
    x = gl.tensor(X)
    ga, gb = g(x, x)
    np.testing.assert_allclose(np.asarray(ga), np.ones(2))
    np.testing.assert_allclose(np.asarray(gb), 2 * np.ones(2))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "transform",
    [
        lambda f: gl.grad(f, argnums=(0, 1)),
        lambda f: gl.value_and_grad(f, argnums=(0, 1)),
        lambda f: gl.jacrev(f, argnums=(0, 1)),
        lambda f: gl.jacfwd(f, argnums=(0, 1)),
        lambda f: gl.hessian(f, argnums=(0, 1)),
        lambda f: gl.grad(
            lambda a, b: gl.sum(gl.grad(f, argnums=(0, 1))(a, b)[1] * a), argnums=(0, 1)
        ),
    ],
    ids=["grad", "value_and_grad", "jacrev", "jacfwd", "hessian", "grad_of_grad"],
)
def test_every_transform_treats_aliased_arguments_as_distinct(mode, transform) -> None:
    check(staged(mode, transform(f2)))


@pytest.mark.parametrize("mode", MODES)
def test_jvp_and_linearize_with_aliased_primals(mode) -> None:
    t1, t2 = gl.tensor(np.array([1.0, 0.0])), gl.tensor(np.array([0.0, 1.0]))
    check(staged(mode, lambda a, b: gl.jvp(f2, (a, b), (t1, t2))))
    check(staged(mode, lambda a, b: gl.linearize(f2, a, b)[1](t1, t2)))


@pytest.mark.parametrize("mode", MODES)
def test_a_pytree_holding_one_tensor_in_several_leaves(mode) -> None:
    def loss(tree):
        return gl.sum(tree["a"] * 3.0 + tree["b"] ** 2)

    def aliased(x, y):
        return gl.grad(loss)({"a": x, "b": y})

    check(staged(mode, aliased))
    x = gl.tensor(X)
    g = staged(mode, aliased)(x, x)
    np.testing.assert_allclose(np.asarray(g["a"]), 3 * np.ones(2))
    np.testing.assert_allclose(np.asarray(g["b"]), 2 * X)


@pytest.mark.parametrize("mode", MODES)
def test_custom_rules_called_with_one_tensor_twice(mode) -> None:
    @gl.custom_gradient
    def scaled(a, b):
        return a + 2.0 * b, lambda g: (g, 2.0 * g)

    @gl.custom_jvp
    def cj(a, b):
        return a + 2.0 * b

    @cj.defjvp
    def _(primals, tangents):
        return cj(*primals), tangents[0] + 2.0 * tangents[1]

    @gl.recompute_grad
    def rc(a, b):
        return gl.sin(a) + 2.0 * b

    for op in (scaled, cj, rc):
        check(staged(mode, gl.grad(lambda a, b, op=op: gl.sum(op(a, b)), argnums=(0, 1))))
        # one tensor in both places, differentiated as that tensor: the sum of both uses
        g = staged(mode, gl.grad(lambda a, op=op: gl.sum(op(a, a))))(gl.tensor(X))
        want = 1.0 + 2.0 if op is not rc else np.cos(X) + 2.0
        np.testing.assert_allclose(np.asarray(g), want * np.ones(2), rtol=1e-12)
    check(staged(mode, lambda a, b: gl.jvp(cj, (a, b), (gl.ones_like(a), gl.zeros_like(b)))))


def test_a_gradient_tape_keeps_one_gradient_per_watched_tensor() -> None:
    x = gl.tensor(X)
    with gl.GradientTape() as tape:
        tape.watch(x)
        y = gl.sum(x + 2.0 * x)
    ga, gb = tape.gradient(y, [x, x])
    np.testing.assert_allclose(np.asarray(ga), 3 * np.ones(2))
    np.testing.assert_allclose(np.asarray(gb), 3 * np.ones(2))


# ---- errors at the API edge: gradloop's classes, and the builtin JAX's users catch ----------


def test_mismatched_tangents_and_arguments_are_type_errors_too() -> None:
    x = gl.tensor(X)
    f = lambda a: gl.sin(a)  # noqa: E731
    cases = [
        (lambda: gl.jvp(f, x, x), gl.errors.InvalidArgumentError),  # not tuples
        (lambda: gl.jvp(f, (x,), [x, x]), gl.errors.InvalidArgumentError),
        (lambda: gl.jvp(lambda t: t["a"], ({"a": x},), ([x],)), gl.errors.InvalidArgumentError),
        (lambda: gl.jvp(f, (x,), (gl.tensor(X.astype(np.float32)),)), gl.errors.GradientError),
        (lambda: gl.jvp(f, (x,), (None,)), gl.errors.GradientError),
        (lambda: gl.linearize(f, x)[1](1), gl.errors.GradientError),  # a Python int tangent
        (lambda: gl.linearize(f, x)[1](np.array([1, 2])), gl.errors.GradientError),
        (lambda: gl.grad(lambda a: gl.sum(a), argnums=0.0)(x), gl.errors.InvalidArgumentError),
        (lambda: gl.jacfwd(f, argnums=(0.0,))(x), gl.errors.InvalidArgumentError),
    ]
    for call, cls in cases:
        with pytest.raises(cls) as caught:
            call()
        assert isinstance(caught.value, TypeError), caught.value
    # a shape mismatch is a value error, as in JAX
    with pytest.raises(gl.errors.GradientError) as caught:
        gl.jvp(f, (x,), (gl.tensor(np.ones(3)),))
    assert not isinstance(caught.value, TypeError)
    # a float tangent given as a numpy array is converted
    out = gl.linearize(f, x)[1](np.array([1.0, 0.0]))
    np.testing.assert_allclose(np.asarray(out), [np.cos(X[0]), 0.0])
