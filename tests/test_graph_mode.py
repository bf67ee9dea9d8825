"""Graph mode (`@gl.function`): tracing, retracing, captures, If/Case/While nodes, Variables,
symbolic gradients, and errors. Every program is also run eagerly and the two must agree.
(Gradient checks against finite differences of every eager control-flow test also run in graph
mode: see gradcheck.py, mode "graph".)"""

from __future__ import annotations

import re
from collections import namedtuple

import numpy as np
import pytest

import gradloop as gl
from gradcheck import check_grads, numerical_gradient

Pair = namedtuple("Pair", ["a", "b"])
HERE = r"test_graph_mode\.py:\d+"


def f64(*values: float) -> gl.Tensor:
    return gl.tensor(np.array(values, dtype=np.float64))


def leaves(x: object) -> list[np.ndarray]:
    if isinstance(x, dict):
        return [v for k in sorted(x) for v in leaves(x[k])]
    if isinstance(x, (tuple, list)):
        return [v for item in x for v in leaves(item)]
    return [np.asarray(x)]


def assert_same_in_both_modes(fn, *args) -> None:
    eager = fn(*args)
    graph = gl.function(fn)(*args)
    assert type(eager) is type(graph)
    for e, g in zip(leaves(eager), leaves(graph), strict=True):
        assert e.dtype == g.dtype and e.shape == g.shape
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=0)


# ---- programs that must agree in both modes -----------------------------------------------------


def nested_structures(x):
    return gl.cond(
        x.sum() > 0, lambda: {"s": x * 2, "p": Pair(x, x + 1)}, lambda: {"s": x, "p": Pair(x, -x)}
    )


def switch_with_default(x, k):
    return gl.switch_case(k, [lambda: x * 2, lambda: gl.sin(x)], default=lambda: x - 100)


def switch_without_default(x, k):
    return gl.switch_case(k, {0: lambda: x * 2, 1: lambda: gl.sin(x), 2: lambda: gl.cos(x)})


def integer_steps(n):
    # integer-only state with a data-dependent trip count
    def body(i, m):
        return i + 1, gl.where(m > 50, m - 37, 3 * m + 1)

    return gl.while_loop(lambda i, m: m != 40, body, (0, n), maximum_iterations=500)


def dict_loop(x):
    out = gl.while_loop(
        lambda s: s["i"] < 5, lambda s: {"i": s["i"] + 1, "v": s["v"] * 1.1}, {"i": 0, "v": x}
    )
    return out["v"]


def nested_loops(x):
    def outer(i, v):
        _, v = gl.while_loop(lambda j, w: j <= i, lambda j, w: (j + 1, gl.sin(w) + w * 0.5), (0, v))
        return i + 1, v

    return gl.while_loop(lambda i, v: i < 3, outer, (0, x))[1]


def loop_with_cond(x):
    def body(i, v):
        return i + 1, gl.cond(v.sum() > 1.0, lambda: v * 0.5, lambda: v + 0.7)

    return gl.while_loop(lambda i, v: i < 6, body, (0, x))


def bounded_loop(x):
    return gl.while_loop(lambda v: True, lambda v: v * v, x, maximum_iterations=3)


def indexing_in_a_loop(xs):
    def body(t, acc):
        return t + 1, acc + xs[t] * xs[t]

    return gl.while_loop(lambda t, acc: t < xs.shape[0], body, (0, gl.zeros_like(xs[0])))[1]


@pytest.mark.parametrize(
    ("fn", "args"),
    [
        (nested_structures, (f64(1.0, 2.0),)),
        (nested_structures, (f64(-1.0, 0.5),)),
        (switch_with_default, (f64(0.3, 0.4), gl.tensor(1))),
        (switch_with_default, (f64(0.3, 0.4), gl.tensor(7))),
        (switch_with_default, (f64(0.3, 0.4), gl.tensor(-1, dtype=gl.int64))),
        (switch_without_default, (f64(0.3), gl.tensor(9))),
        (switch_without_default, (f64(0.3), gl.tensor(2**40, dtype=gl.int64))),
        (integer_steps, (gl.tensor(27),)),
        (dict_loop, (f64(0.5, 2.0),)),
        (nested_loops, (f64(0.3, 1.1),)),
        (loop_with_cond, (f64(0.2, 0.3),)),
        (bounded_loop, (f64(0.9, 1.05),)),
        (indexing_in_a_loop, (f64(1.0, 2.0, 3.0),)),
    ],
)
def test_programs_agree_with_eager_mode(fn, args) -> None:
    assert_same_in_both_modes(fn, *args)


# ---- tracing ------------------------------------------------------------------------------------


def test_traces_once_per_signature_and_python_values_are_static() -> None:
    calls = []

    @gl.function
    def f(x, scale):
        calls.append(scale)
        return x * scale

    x = f64(1.0, 2.0)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(f(x, 2.0)), [2.0, 4.0])
    assert calls == [2.0] and f.trace_count == 1
    f(f64(5.0, 6.0), 2.0)  # same signature: no retrace
    f(x, 3.0)  # a new Python value retraces
    f(gl.tensor([1.0, 2.0, 3.0]), 2.0)  # a new shape (and dtype) retraces
    assert f.trace_count == 3


def test_tuples_and_lists_of_tensors_keep_their_own_traces() -> None:
    """Calls with tensors and tuples or lists of them find their trace by dtypes, shapes and
    containers alone (no flattening); each container, length and shape is its own signature."""

    def step(params, x):
        return sum(p * x for p in params), x + 1.0

    f, jitted = gl.function(step), gl.jit(step)
    x = f64(1.0, 2.0)
    calls = [
        ((f64(1.0, 1.0), f64(2.0, 3.0)), x),
        ([f64(1.0, 1.0), f64(2.0, 3.0)], x),  # a list: another signature
        ((f64(4.0, 5.0), f64(6.0, 7.0)), f64(3.0, 4.0)),  # same signature as the first
        ((f64(1.0, 1.0),), x),  # another length
        ((gl.tensor([1.0, 2.0]),), gl.tensor([1.0, 2.0])),  # float32
    ]
    for params, y in calls:
        want = step(params, y)
        for got in (f(params, y), jitted(params, y)):
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
    assert f.trace_count == 4


def test_many_retraces_warn() -> None:
    f = gl.function(lambda x, k: x * k)
    x = f64(1.0)
    with pytest.warns(gl.errors.RetracingWarning, match="traced 6 times"):
        for k in range(6):
            f(x, k)


def test_the_graph_has_functional_control_flow_and_captures() -> None:
    w = f64(0.5, -0.5)  # closed over: a captured input

    @gl.function
    def f(x):
        y = gl.cond(x.sum() > 0, lambda: x * w, lambda: x - w)
        return gl.while_loop(lambda v: v.sum() < 10.0, lambda v: v * 2.0 + 1.0, y)

    x = f64(1.0, 2.0)
    text = str(f.graph(x))
    assert "if(" in text and "while(" in text, text
    assert f.concrete_function(x).captured_inputs[0] is not None
    assert len(f.concrete_function(x).captured_inputs) == 1
    np.testing.assert_allclose(np.asarray(f(x)), np.asarray(f.python_function(x)))


def test_a_python_bool_predicate_branches_at_trace_time() -> None:
    traced = []

    @gl.function
    def f(x, flag):
        return gl.cond(
            flag, lambda: traced.append("t") or x + 1, lambda: traced.append("f") or x - 1
        )

    f(f64(1.0), True)
    assert traced == ["t"]
    assert "if(" not in str(f.graph(f64(1.0), True))


def test_loop_gradients_stack_only_what_they_need() -> None:
    # x <- sin(x) * c + x: sin's gradient needs x, and mul's gradient with respect to c needs
    # sin(x); c is loop invariant. Differentiated with respect to x alone, sin(x) is not stacked.
    def f(x, c, n):
        return gl.while_loop(lambda i, v: i < n, lambda i, v: (i + 1, gl.sin(v) * c + v), (0, x))[
            1
        ].sum()

    args = (f64(0.3, -0.8), f64(0.5, 0.2), gl.tensor(4))
    for argnums, pushes in [(0, 1), ((0, 1), 2), (1, 2)]:
        g = gl.function(gl.grad(f, argnums=argnums))
        assert g.concrete_function(*args).graph.count_nodes("stack_push") == pushes
        want = leaves(gl.grad(f, argnums=argnums)(*args))
        for got, w in zip(leaves(g(*args)), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-12)


def test_two_tapes_differentiate_one_loop_with_respect_to_different_inputs() -> None:
    # The inner tape watches x only, so its loop gradient skips c; the outer tape then asks
    # for c through the same loop and gets a loop gradient of its own.
    def f(x, c):
        with gl.GradientTape() as outer:
            outer.watch(c)
            with gl.GradientTape() as inner:
                inner.watch(x)
                body = lambda i, v: (i + 1, gl.sin(v) * c + v)  # noqa: E731
                y = gl.while_loop(lambda i, v: i < 3, body, (0, x))[1].sum()
            gx = inner.gradient(y, x)
        gc = outer.gradient(y, c)
        return gx, gc

    args = (f64(0.3, -0.8), f64(0.5, 0.2))
    graph, eager = gl.function(f)(*args), f(*args)
    for got, want in zip(leaves(graph), leaves(eager), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)

    # and both against central differences in float64
    def y(x, c):
        body = lambda i, v: (i + 1, gl.sin(v) * c + v)  # noqa: E731
        return gl.while_loop(lambda i, v: i < 3, body, (0, x))[1].sum()

    x, c = (np.asarray(a) for a in args)
    want_gx, want_gc = numerical_gradient(lambda x, c: y(x, c), [x, c])
    np.testing.assert_allclose(np.asarray(graph[0]), want_gx, rtol=1e-7)
    np.testing.assert_allclose(np.asarray(graph[1]), want_gc, rtol=1e-7)


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_gradients_of_data_dependent_loops_match_eager_mode(n: int) -> None:
    a = gl.tensor(0.999, dtype=gl.float64)

    def f(x, limit):
        return gl.while_loop(
            lambda i, v: i < limit, lambda i, v: (i + 1, v * a + gl.sin(v) * 1e-3), (0, x)
        )[1].sum()

    args = (f64(0.3, -0.8), gl.tensor(n))
    eager = gl.value_and_grad(f, argnums=0)(*args)
    graph = gl.function(gl.value_and_grad(f, argnums=0))(*args)
    for e, g in zip(eager, graph, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-12)


def test_second_derivatives_through_cond_switch_and_while_in_graph_mode() -> None:
    def f(x):
        y = gl.cond(x.sum() > 0, lambda: gl.sin(x) * x, lambda: gl.exp(x))
        k = gl.cast(x[0] > 0.5, gl.int32)
        y = gl.switch_case(k, [lambda: y * y, lambda: gl.tanh(y)])
        return gl.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 0.5 + gl.sin(v)), (0, y))[
            1
        ]

    for x in ([0.3, 0.7], [0.9, -0.2], [-0.5, -0.4]):
        check_grads(f, [np.array(x)], order=2, modes=("graph",))


# ---- Variables --------------------------------------------------------------------------------


def test_variable_side_effects_follow_the_branch_taken_and_each_iteration() -> None:
    v = gl.Variable(0.0, dtype=gl.float64)

    @gl.function
    def f(p, n):
        gl.cond(p, lambda: v.assign_add(1.0).read(), lambda: v.assign_add(100.0).read())
        gl.while_loop(lambda i: i < n, lambda i: (v.assign_add(10.0), i + 1)[1], 0)
        return v.read()

    assert float(f(gl.tensor(True), gl.tensor(0))) == 1.0
    assert float(f(gl.tensor(False), gl.tensor(3))) == 131.0
    assert float(v.read()) == 131.0
    assert f.trace_count == 1


def test_stateful_ops_keep_program_order() -> None:
    v = gl.Variable([1.0, 2.0], dtype=gl.float64)

    @gl.function
    def f(x):
        before = v.read()
        v.assign(x)
        after = v.read()
        v.assign_add(before)  # unused result: kept because it is a side effect
        return before, after

    before, after = f(f64(5.0, 6.0))
    np.testing.assert_allclose(np.asarray(before), [1.0, 2.0])
    np.testing.assert_allclose(np.asarray(after), [5.0, 6.0])
    np.testing.assert_allclose(np.asarray(v.read()), [6.0, 8.0])


def test_gradients_with_respect_to_variables_inside_a_function() -> None:
    w = gl.Variable([0.5, -1.0], dtype=gl.float64)

    def loss(x):
        with gl.GradientTape() as tape:
            wv = w.read()  # read at the function's top level: the loop closes over the value
            y = gl.while_loop(lambda i, s: i < 3, lambda i, s: (i + 1, s * wv + x), (0, x))[1].sum()
        return tape.gradient(y, w)

    x = f64(0.3, 0.2)
    np.testing.assert_allclose(np.asarray(gl.function(loss)(x)), np.asarray(loss(x)), rtol=1e-12)


# ---- errors -------------------------------------------------------------------------------------


def test_branches_must_agree_and_errors_name_the_users_line() -> None:
    @gl.function
    def f(x):
        return gl.cond(x.sum() > 0, lambda: x, lambda: gl.cast(x, gl.float32))

    with pytest.raises(gl.errors.ControlFlowError, match=f"dtype.*{HERE}"):
        f(f64(1.0))


def test_symbolic_values_cannot_be_read_while_tracing() -> None:
    @gl.function
    def f(x):
        if x.sum() > 0:  # a Python `if` needs the value: use gl.cond
            return x
        return -x

    with pytest.raises(gl.errors.ControlFlowError, match=r"gl\.cond"):
        f(f64(1.0))

    @gl.function
    def g(x):
        return x.numpy()

    with pytest.raises(gl.errors.ControlFlowError, match="symbolic"):
        g(f64(1.0))


def test_values_from_inside_a_branch_cannot_escape() -> None:
    leaked = []

    @gl.function
    def f(x):
        gl.cond(x.sum() > 0, lambda: leaked.append(x * 2) or x, lambda: x)
        return leaked[0] + 1

    with pytest.raises(gl.errors.ControlFlowError, match="cannot be used outside"):
        f(f64(1.0))


def test_a_failed_trace_leaves_no_trace_behind() -> None:
    @gl.function
    def bad(x):
        return gl.while_loop(lambda v: v.sum() < 1, lambda v: gl.concatenate([v, v]), x)

    with pytest.raises(gl.errors.ControlFlowError, match="shape"):
        bad(f64(0.1))
    assert re.search("trace", repr(bad))
    np.testing.assert_allclose(np.asarray(gl.function(lambda x: x + 1)(f64(1.0))), [2.0])


def test_prune_keeps_fetches_and_side_effects() -> None:
    v = gl.Variable(0.0, dtype=gl.float64)

    @gl.function
    def f(x):
        v.assign_add(1.0)
        return gl.sin(x), gl.cos(x) * 2.0

    g = f.graph(f64(0.5))
    pruned = gl.prune(g, [0])
    assert pruned.count_nodes("cos") == 0 and pruned.count_nodes("sin") == 1
    assert pruned.count_nodes("assign_variable") == 1
    pruned.verify()
    assert str(gl.inline(g)) == str(g)  # no calls to inline in a traced graph
    with pytest.raises(gl.errors.IndexError):
        gl.prune(g, [5])
