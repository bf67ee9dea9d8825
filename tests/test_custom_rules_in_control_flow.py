"""`gl.custom_jvp` and `gl.recompute_grad` functions called inside `while_loop` bodies and
`cond` branches, differentiated in forward mode (jvp, linearize, jacfwd) and both ways
(hessian) in every mode; plain calls of custom_jvp functions, which trace their rules without
running them and fail only when a derivative is asked."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from gradcheck import numerical_gradient
from runners import staged

MODES = ("eager", "executor", "frames", "interpreter", "compiled")


@gl.custom_jvp
def triple(x):
    """3x, whose rule says its tangent is 2t: a rule the derivative of the code cannot give."""
    return 3.0 * x


@triple.defjvp
def _triple_jvp(primals, tangents):
    return triple(primals[0]), 2.0 * tangents[0]


@gl.custom_jvp
def triple_by_its_rule(x):
    """`triple` whose rule computes the value itself rather than calling the function: traced
    in a branch or loop body, only the call's node carries the rule to the construct's
    tangent (the code's own derivative, 3t, came out)."""
    return 3.0 * x


@triple_by_its_rule.defjvp
def _triple_by_its_rule_jvp(primals, tangents):
    return 3.0 * primals[0], 2.0 * tangents[0]


def in_loop(x):
    return gl.while_loop(lambda i, c: i < 1, lambda i, c: (i + 1, triple(c)), (0, x))[1]


def its_rule_in_loop(x):
    body = lambda i, c: (i + 1, triple_by_its_rule(c))  # noqa: E731
    return gl.while_loop(lambda i, c: i < 1, body, (0, x))[1]


def its_rule_in_branch(x):
    return gl.cond(gl.sum(x) > 0.0, lambda: triple_by_its_rule(x), lambda: x)


def in_branch(x):
    return gl.cond(gl.sum(x) > 0.0, lambda: triple(x), lambda: x)


def twice_in_loop(x):
    return gl.while_loop(lambda i, c: i < 2, lambda i, c: (i + 1, triple(c) * c), (0, x))[1]


@gl.recompute_grad
def wobble(x):
    return gl.sin(x) * x + 0.5 * x


def recomputed_in_loop(x):
    return gl.while_loop(
        lambda i, c: i < 3,
        lambda i, c: (i + 1, gl.cond(gl.sum(c) > 0.0, lambda: wobble(c), lambda: c * 0.5)),
        (0, x),
    )[1]


def plain_recomputed(x):
    def body(i, c):
        return i + 1, gl.cond(gl.sum(c) > 0.0, lambda: gl.sin(c) * c + 0.5 * c, lambda: c * 0.5)

    return gl.while_loop(lambda i, c: i < 3, body, (0, x))[1]


X = np.array([0.7, 0.4])
T = np.array([1.0, -0.5])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("fn", "want"),
    [
        (in_loop, lambda x, t: (3 * x, 2 * t)),
        (in_branch, lambda x, t: (3 * x, 2 * t)),
        # d(3c * c) by the rule: 2t * c + 3c * t, twice
        (twice_in_loop, None),
        (its_rule_in_loop, lambda x, t: (3 * x, 2 * t)),
        (its_rule_in_branch, lambda x, t: (3 * x, 2 * t)),
    ],
    ids=["loop", "branch", "two trips", "rule's own value, loop", "rule's own value, branch"],
)
def test_jvp_through_a_custom_jvp_inside_control_flow_uses_its_rule(mode, fn, want) -> None:
    x, t = gl.tensor(X), gl.tensor(T)
    value, tangent = staged(mode, lambda x, t: gl.jvp(fn, (x,), (t,)))(x, t)
    eager_value, eager_tangent = gl.jvp(fn, (x,), (t,))
    if want is not None:
        wv, wt = want(X, T)
        np.testing.assert_allclose(np.asarray(eager_value), wv, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(eager_tangent), wt, rtol=1e-12)
    else:
        c, tc = X, T
        for _ in range(2):
            c, tc = 3 * c * c, 2 * tc * c + 3 * c * tc
        np.testing.assert_allclose(np.asarray(eager_tangent), tc, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(value), np.asarray(eager_value), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(tangent), np.asarray(eager_tangent), rtol=1e-12)
    lin = staged(mode, lambda x, t: gl.linearize(fn, x)[1](t))(x, t)
    np.testing.assert_allclose(np.asarray(lin), np.asarray(eager_tangent), rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_jacfwd_and_jacrev_of_a_custom_jvp_in_a_loop_agree(mode) -> None:
    x = gl.tensor(X)
    fwd = staged(mode, gl.jacfwd(twice_in_loop))(x)
    rev = staged(mode, gl.jacrev(twice_in_loop))(x)
    np.testing.assert_allclose(np.asarray(fwd), np.asarray(rev), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(fwd), np.asarray(gl.jacfwd(twice_in_loop)(x)), rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_recompute_grad_inside_control_flow_in_forward_mode_and_hessian(mode) -> None:
    x, t = gl.tensor(X), gl.tensor(T)
    value, tangent = staged(mode, lambda x, t: gl.jvp(recomputed_in_loop, (x,), (t,)))(x, t)
    want_value, want_tangent = gl.jvp(plain_recomputed, (x,), (t,))
    np.testing.assert_allclose(np.asarray(value), np.asarray(want_value), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(tangent), np.asarray(want_tangent), rtol=1e-12)
    loss = lambda x: gl.sum(recomputed_in_loop(x) ** 2)  # noqa: E731
    hess = staged(mode, gl.hessian(loss))(x)
    fd = np.stack(
        [
            numerical_gradient(lambda z, k=k: float(gl.grad(loss)(gl.tensor(z))[k]), [X])[0]
            for k in range(2)
        ]
    )
    np.testing.assert_allclose(np.asarray(hess), fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("mode", MODES)
def test_hessian_through_a_custom_jvp_in_a_loop(mode) -> None:
    loss = lambda x: gl.sum(twice_in_loop(x))  # noqa: E731
    np.testing.assert_allclose(
        np.asarray(staged(mode, gl.hessian(loss))(gl.tensor(X))),
        np.asarray(gl.hessian(loss)(gl.tensor(X))),
        rtol=1e-12,
    )


@gl.custom_jvp
def pair(x):
    return {"a": 3.0 * x, "b": x * x}


@pair.defjvp
def _pair_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return pair(x), {"a": 3.0 * t, "b": 2.0 * x * t}


@gl.custom_jvp
def malformed(x):
    return 3.0 * x


@malformed.defjvp
def _malformed_jvp(primals, tangents):
    return malformed(primals[0])  # not (outputs, tangents)


@pytest.mark.parametrize("mode", MODES)
def test_a_custom_jvp_returning_a_dict_runs_and_differentiates(mode) -> None:
    x, t = gl.tensor(X), gl.tensor(T)
    out = staged(mode, pair)(x)
    np.testing.assert_allclose(np.asarray(out["a"]), 3 * X)
    np.testing.assert_allclose(np.asarray(out["b"]), X * X)
    _, tangent = staged(mode, lambda x, t: gl.jvp(pair, (x,), (t,)))(x, t)
    np.testing.assert_allclose(np.asarray(tangent["b"]), 2 * X * T)
    g = staged(mode, gl.grad(lambda x: gl.sum(pair(x)["a"] + pair(x)["b"])))(x)
    np.testing.assert_allclose(np.asarray(g), 3 + 2 * X)


@pytest.mark.parametrize("mode", MODES)
def test_a_malformed_rule_fails_only_when_a_derivative_is_asked(mode) -> None:
    x, t = gl.tensor(X), gl.tensor(T)
    np.testing.assert_allclose(np.asarray(staged(mode, malformed)(x)), 3 * X)
    np.testing.assert_allclose(np.asarray(staged(mode, in_loop_of(malformed))(x)), 3 * X)
    with pytest.raises(gl.errors.GradientError, match=r"custom_jvp\(malformed\)"):
        staged(mode, lambda x, t: gl.jvp(malformed, (x,), (t,)))(x, t)
    with pytest.raises(gl.errors.GradientError, match=r"custom_jvp\(malformed\)"):
        staged(mode, lambda x, t: gl.jvp(in_loop_of(malformed), (x,), (t,)))(x, t)
    with pytest.raises(gl.errors.GradientError, match=r"custom_jvp\(malformed\)"):
        staged(mode, gl.grad(lambda x: gl.sum(malformed(x))))(x)


def in_loop_of(f):
    def fn(x):
        return gl.while_loop(lambda i, c: i < 1, lambda i, c: (i + 1, f(c)), (0, x))[1]

    return fn
