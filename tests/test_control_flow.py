"""Eager cond / switch_case / while_loop: semantics, gradients (checked against central finite
differences in float64, see gradcheck.py) and the errors of every bad argument."""

from __future__ import annotations

import inspect
from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradloop as gl
from gradcheck import check_grads

ERR = gl.errors.ControlFlowError
HERE = r"test_control_flow\.py:\d+"
Pair = namedtuple("Pair", ["a", "b"])


def f64(*values: float) -> gl.Tensor:
    return gl.tensor(np.array(values, dtype=np.float64))


def scalar(x: float) -> gl.Tensor:
    return gl.tensor(x, dtype=gl.float64)


# ---- cond ----------------------------------------------------------------------------------------


def test_cond_runs_only_the_taken_branch() -> None:
    ran = []
    out = gl.cond(gl.tensor(True), lambda: ran.append("t") or 1.0, lambda: ran.append("f") or 2.0)
    assert ran == ["t"] and float(out) == 1.0 and isinstance(out, gl.Tensor)
    out = gl.cond(False, lambda: ran.append("t") or 1.0, lambda: ran.append("f") or 2.0)
    assert ran == ["t", "f"] and float(out) == 2.0


def test_cond_returns_nested_structures() -> None:
    x = f64(1.0, 2.0)
    out = gl.cond(
        x.sum() > 0, lambda: {"s": x * 2, "p": (x, None)}, lambda: {"s": x, "p": (x, None)}
    )
    assert set(out) == {"s", "p"} and out["p"][1] is None
    np.testing.assert_allclose(out["s"].numpy(), [2.0, 4.0])


@pytest.mark.parametrize("x", [[0.3, 0.7, -0.2], [-0.5, -0.1, 0.2]])
def test_cond_gradients(x: list[float]) -> None:
    # f(x) = sin(x) * x if sum(x) > 0 else exp(x) * sum(x)
    def f(t: gl.Tensor) -> gl.Tensor:
        return gl.cond(t.sum() > 0, lambda: gl.sin(t) * t, lambda: gl.exp(t) * t.sum())

    check_grads(f, [np.array(x)], order=2)


def test_nested_cond_gradients() -> None:
    def f(t: gl.Tensor) -> gl.Tensor:
        inner = lambda: gl.cond(t[0] > 0, lambda: t * t, lambda: -t)  # noqa: E731
        return gl.cond(t.sum() > 0, inner, lambda: gl.tanh(t))

    check_grads(f, [np.array([0.4, 0.1])], order=2)
    check_grads(f, [np.array([-0.4, 0.9])], order=2)


@pytest.mark.parametrize(
    ("pred", "what"),
    [
        (1, "int 1"),
        (gl.tensor([True, False]), r"bool\[2\]"),
        (gl.tensor(1.0), r"float32\[\]"),
        ("yes", "str"),
    ],
)
def test_cond_rejects_bad_predicates(pred: object, what: str) -> None:
    with pytest.raises(ERR, match=rf"cond: pred must be a scalar bool.*{what}.*{HERE}"):
        gl.cond(pred, lambda: 1.0, lambda: 2.0)


def test_cond_rejects_non_callables_and_bad_outputs() -> None:
    with pytest.raises(ERR, match="cond: false_fn must be callable"):
        gl.cond(True, lambda: 1.0, 2.0)
    with pytest.raises(
        ERR, match=r"cond: the output of true_fn at \[1\]\['k'\] must be a tensor; got str"
    ):
        gl.cond(True, lambda: (1.0, {"k": "text"}), lambda: (1.0, {"k": 2.0}))


def test_errors_name_the_users_line() -> None:
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(ERR, match=rf"test_control_flow\.py:{line}\)"):
        gl.cond(gl.tensor(2), lambda: 1.0, lambda: 2.0)


def test_errors_inside_a_body_name_the_nested_call() -> None:
    def body(x: gl.Tensor) -> gl.Tensor:
        return gl.cond(x, lambda: x, lambda: x)  # line reported: this one

    line = inspect.getsourcelines(body)[1] + 1
    with pytest.raises(ERR, match=rf"cond: pred .*test_control_flow\.py:{line}\)"):
        gl.while_loop(lambda x: True, body, scalar(1.0))


def test_branch_outputs_must_agree_when_several_are_checked() -> None:
    from gradloop import _validate

    a, b = gl.tensor(1.0), gl.tensor([1.0, 2.0])
    with pytest.raises(
        ERR, match=r"false_fn at <root> has shape \[2\] but .* true_fn has shape \[\]"
    ):
        _validate.check_branch_outputs("cond", [("true_fn", a), ("false_fn", b)])
    with pytest.raises(ERR, match=r"dtype float64 .* dtype float32"):
        _validate.check_branch_outputs("cond", [("true_fn", a), ("false_fn", scalar(1.0))])
    with pytest.raises(ERR, match=r"different structures: at \[1\]"):
        _validate.check_branch_outputs("cond", [("true_fn", (a, a)), ("false_fn", (a, (a,)))])


# ---- switch_case ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "expected"), [(0, 10.0), (1, 11.0), (2, 12.0), (7, 99.0), (-1, 99.0)]
)
def test_switch_case_picks_a_branch_or_the_default(index: int, expected: float) -> None:
    fns = [lambda: 10.0, lambda: 11.0, lambda: 12.0]
    assert float(gl.switch_case(index, fns, default=lambda: 99.0)) == expected
    as_dict = dict(enumerate(fns))
    assert (
        float(gl.switch_case(gl.tensor(index, dtype=gl.int64), as_dict, default=lambda: 99.0))
        == expected
    )


@pytest.mark.parametrize("index", [5, -3])
def test_switch_case_out_of_range_runs_the_last_branch(index: int) -> None:
    ran = []
    fns = [lambda: ran.append(0) or 0.0, lambda: ran.append(1) or 1.0]
    assert float(gl.switch_case(gl.tensor(index, dtype=gl.int32), fns)) == 1.0
    assert ran == [1]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_switch_case_gradients(index: int) -> None:
    def f(t: gl.Tensor) -> gl.Tensor:
        return gl.switch_case(index, [lambda: t * t, lambda: gl.sin(t), lambda: gl.exp(t) * 3.0])

    check_grads(f, [np.array([0.2, -0.7])], order=2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1.0, [lambda: 1.0]), r"branch_index must be a scalar int32/int64 .* float 1\.0"),
        ((True, [lambda: 1.0]), "branch_index must be .* bool True"),
        ((gl.tensor([0, 1]), [lambda: 1.0]), r"branch_index must be .* int32\[2\]"),
        ((0, []), "branch_fns must not be empty"),
        ((0, [1.0]), r"branch_fns\[0\] must be callable"),
        (
            (0, {0: lambda: 1.0, 2: lambda: 2.0}),
            r"branch_fns dict keys must be 0\.\.1 without gaps; got \[0, 2\]",
        ),
        ((0, {"a": lambda: 1.0}), "branch_fns dict keys must be ints"),
        ((0, lambda: 1.0), "branch_fns must be a list"),
        ((0, [lambda: 1.0], 3), "default must be callable; got int 3"),
    ],
)
def test_switch_case_rejects_bad_arguments(args: tuple, message: str) -> None:
    with pytest.raises(ERR, match=rf"switch_case: {message}.*{HERE}"):
        gl.switch_case(*args)


# ---- while_loop: semantics -----------------------------------------------------------------------


def test_while_loop_spreads_tuples_and_lists() -> None:
    out = gl.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2.0), (0, scalar(1.0)))
    assert isinstance(out, tuple) and int(out[0]) == 3 and float(out[1]) == 8.0
    out = gl.while_loop(lambda i, x: i < 3, lambda i, x: [i + 1, x * 2.0], [0, scalar(1.0)])
    assert isinstance(out, list) and float(out[1]) == 8.0


def test_while_loop_passes_a_tensor_or_dict_whole() -> None:
    out = gl.while_loop(lambda x: x < 10.0, lambda x: x * 3.0, scalar(1.0))
    assert float(out) == 27.0
    out = gl.while_loop(
        lambda d: d["i"] < 2, lambda d: {"i": d["i"] + 1, "x": d["x"] + 1.0}, {"x": 0.5, "i": 0}
    )
    assert set(out) == {"i", "x"} and float(out["x"]) == 2.5


def test_while_loop_keeps_namedtuples_and_nesting() -> None:
    init = Pair(a=0, b={"x": f64(1.0, 2.0)})
    out = gl.while_loop(lambda a, b: a < 2, lambda a, b: (a + 1, {"x": b["x"] * 2.0}), init)
    assert isinstance(out, Pair)
    np.testing.assert_allclose(out.b["x"].numpy(), [4.0, 8.0])


def test_while_loop_converts_python_and_numpy_loop_vars() -> None:
    i, x, y = gl.while_loop(
        lambda i, x, y: i < 2, lambda i, x, y: (i + 1, x + 1.0, y), (0, 1.5, np.ones(2))
    )
    assert x.dtype == gl.float32 and y.dtype == gl.float64 and i.dtype in (gl.int32, gl.int64)
    assert float(x) == 3.5
    # Python scalars returned by the body adapt to their loop variable's dtype
    i, x = gl.while_loop(
        lambda i, x: i < 1, lambda i, x: (1, 0.25), (gl.tensor(0, dtype=gl.int64), x)
    )
    assert i.dtype == gl.int64 and x.dtype == gl.float32 and float(x) == 0.25


def test_zero_iterations_and_bare_body_results() -> None:
    calls = []
    out = gl.while_loop(lambda x: x < 0.0, lambda x: calls.append(1) or x, scalar(3.0))
    assert float(out) == 3.0 and not calls
    # one loop var in a list: the body may return it bare
    (out,) = gl.while_loop(lambda x: x < 5.0, lambda x: x + 1.0, [scalar(0.0)])
    assert float(out) == 5.0


@pytest.mark.parametrize(
    "limit", [0, 2, gl.tensor(2, dtype=gl.int32), gl.tensor(5, dtype=gl.int64)]
)
def test_maximum_iterations_stops_the_loop(limit: object) -> None:
    evaluated = []

    def cond(i: gl.Tensor) -> bool:
        return evaluated.append(int(i)) or True

    out = gl.while_loop(cond, lambda i: i + 1, 0, maximum_iterations=limit)
    assert int(out) == int(limit)
    assert evaluated == list(range(int(limit)))  # cond is not evaluated once the limit is hit


# ---- while_loop: gradients -----------------------------------------------------------------------


@pytest.mark.parametrize("x", [[0.9, 1.3], [2.0, 3.5], [40.0, 30.0]])
def test_data_dependent_trip_count_gradients(x: list[float]) -> None:
    # x <- x * 1.5 + sin(x) while sum(x*x) < 100: the trip count depends on x (0 for the last)
    def f(t: gl.Tensor) -> gl.Tensor:
        return gl.while_loop(lambda v: (v * v).sum() < 100.0, lambda v: v * 1.5 + gl.sin(v), t)

    check_grads(f, [np.array(x)], order=2)


def test_loop_carried_tuple_gradients() -> None:
    # a running product and sum over 4 iterations: p = x**4 * c, s = sum_k x**k
    def f(x: gl.Tensor, c: gl.Tensor) -> gl.Tensor:
        _, p, s = gl.while_loop(
            lambda i, p, s: i < 4, lambda i, p, s: (i + 1, p * x, s + p), (0, c, gl.zeros_like(x))
        )
        return p + gl.tanh(s)

    check_grads(f, [np.array([0.7, -0.4]), np.array([1.2, 0.5])], order=2)


def test_nested_loop_gradients() -> None:
    # the inner trip count depends on the outer counter: 1 + 2 + 3 steps of v <- sin(v) + v * 0.5
    def f(t: gl.Tensor) -> gl.Tensor:
        def outer_body(i: gl.Tensor, v: gl.Tensor) -> tuple:
            _, v = gl.while_loop(
                lambda j, w: j <= i, lambda j, w: (j + 1, gl.sin(w) + w * 0.5), (0, v)
            )
            return i + 1, v

        return gl.while_loop(lambda i, v: i < 3, outer_body, (0, t))[1]

    check_grads(f, [np.array([0.3, 1.1])], order=2)


def test_loop_inside_cond_inside_loop_gradients() -> None:
    def f(t: gl.Tensor) -> gl.Tensor:
        def body(i: gl.Tensor, v: gl.Tensor) -> tuple:
            v = gl.cond(i < 1, lambda: v * v, lambda: gl.cos(v))
            return i + 1, v

        return gl.while_loop(lambda i, v: i < 3, body, (0, t))[1]

    check_grads(f, [np.array([0.6, -0.8])], order=2)


def test_maximum_iterations_gradients() -> None:
    # unbounded cond, 3 iterations: x -> x**8
    def f(t: gl.Tensor) -> gl.Tensor:
        return gl.while_loop(lambda v: True, lambda v: v * v, t, maximum_iterations=3)

    check_grads(f, [np.array([0.9, 1.05])], order=2)


def test_third_derivative_through_a_loop() -> None:
    # f(x) = x**8 after three squarings; f'''(x) = 336 x**5
    f = lambda x: gl.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * v), (0, x))[1]  # noqa: E731
    x = scalar(1.1)
    np.testing.assert_allclose(float(gl.grad(gl.grad(gl.grad(f)))(x)), 336 * 1.1**5, rtol=1e-10)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 8), x0=st.floats(0.5, 1.5))
def test_random_trip_counts_match_the_unrolled_loop(n: int, x0: float) -> None:
    # v <- v * a + sin(v) repeated n times; compare with the same ops unrolled in Python
    a = scalar(0.9)

    def looped(x: gl.Tensor) -> gl.Tensor:
        return gl.while_loop(lambda i, v: i < n, lambda i, v: (i + 1, v * a + gl.sin(v)), (0, x))[1]

    def unrolled(x: gl.Tensor) -> gl.Tensor:
        for _ in range(n):
            x = x * a + gl.sin(x)
        return x

    x = scalar(x0)
    for g in (gl.grad, lambda f: gl.grad(gl.grad(f))):
        np.testing.assert_allclose(float(g(looped)(x)), float(g(unrolled)(x)), rtol=1e-12)
    assert float(looped(x)) == float(unrolled(x))


@settings(max_examples=20, deadline=None)
@given(x0=st.floats(0.01, 50.0))
def test_random_data_dependent_trip_count(x0: float) -> None:
    # doubling until x >= 100: n = ceil(log2(100 / x)) doublings, so dx_n/dx = 2**n
    f = lambda t: gl.while_loop(lambda v: v < 100.0, lambda v: v * 2.0, t)  # noqa: E731
    out, g = gl.value_and_grad(f)(scalar(x0))
    n = 0
    while x0 * 2**n < 100.0:
        n += 1
    assert float(g) == 2.0**n and float(out) == x0 * 2**n


# ---- while_loop: errors --------------------------------------------------------------------------


def _grow(x: gl.Tensor) -> gl.Tensor:
    return x * 2.0 if x.sum() < 3.0 else gl.concatenate([x, x])


PAIR = (0, scalar(1.0))
BODY_ERRORS = [
    (lambda i, x: (i + 1,), PAIR, r"at <root> expected a tuple of 2 items, got a tuple of 1 items"),
    (lambda i, x: (i + 1, (x, x)), PAIR, r"at \[1\] expected a leaf \(Tensor\), got a tuple of 2"),
    (lambda i, x: (i + 1, "x"), PAIR, r"body output at \[1\] must be a tensor; got str"),
    (
        lambda i, x: (0.5, x),
        PAIR,
        r"at \[0\] has dtype float32 but the loop variable has dtype int32",
    ),
    (
        lambda i, d: (i + 1, {"x": gl.cast(d["x"], gl.float32)}),
        (0, {"x": scalar(1.0)}),
        r"body output at \[1\]\['x'\] has dtype float32 but the loop variable has dtype float64 "
        r"\(iteration 0\) \(body: <lambda> at .*test_control_flow.py:\d+\)",
    ),
    (
        lambda i, x: (i + 1, _grow(x)),
        (0, f64(1.0, 0.5)),
        r"at \[1\] has shape \[4\] but .* shape \[2\] \(iteration 1\).*shape_invariants is not",
    ),
]


@pytest.mark.parametrize(("body", "init", "message"), BODY_ERRORS)
def test_body_output_errors(body: object, init: tuple, message: str) -> None:
    with pytest.raises(ERR, match=f"while_loop: .*{message}.*{HERE}"):
        gl.while_loop(lambda i, x: i < 2, body, init)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"maximum_iterations": -1}, "maximum_iterations must be >= 0; got -1"),
        ({"maximum_iterations": 2.0}, "maximum_iterations must be None, an int or a scalar int"),
        ({"maximum_iterations": gl.tensor([1, 2])}, "maximum_iterations must be None"),
        ({"parallel_iterations": 0}, "parallel_iterations must be a positive int; got 0"),
        ({"parallel_iterations": True}, "parallel_iterations must be a positive int; got bool"),
        ({"parallel_iterations": gl.tensor(3)}, "parallel_iterations must be a positive int"),
    ],
)
def test_loop_option_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ERR, match=rf"while_loop: {message}.*{HERE}"):
        gl.while_loop(lambda x: x < 1.0, lambda x: x + 1.0, scalar(0.0), **kwargs)


def test_cond_result_must_be_a_scalar_bool() -> None:
    with pytest.raises(ERR, match=r"the result of cond must be a scalar bool .* got bool\[2\]"):
        gl.while_loop(lambda x: x < 1.0, lambda x: x + 1.0, f64(0.0, 0.0))
    with pytest.raises(ERR, match=r"the result of cond must be a scalar bool .* got float64\[\]"):
        gl.while_loop(lambda x: x, lambda x: x + 1.0, scalar(0.0))


def test_bad_loop_vars_and_functions() -> None:
    with pytest.raises(ERR, match="loop_vars must hold at least one tensor"):
        gl.while_loop(lambda: True, lambda: (), ())
    with pytest.raises(ERR, match=r"loop variable at \[1\] must be a tensor; got str"):
        gl.while_loop(lambda i, s: i < 1, lambda i, s: (i, s), (0, "s"))
    with pytest.raises(ERR, match="while_loop: body must be callable"):
        gl.while_loop(lambda x: True, None, scalar(0.0))
    with pytest.raises(ERR, match="while_loop: cond must be callable"):
        gl.while_loop(1, lambda x: x, scalar(0.0))
