"""Smoke tests of the raw tracing API of `gradloop._core` (what `@gl.function` is built on):
traces, inner frames and captures, If/While emission, running a ConcreteFunction, variables,
and the errors of symbolic tensors."""

import operator
import re
import threading

import numpy as np
import pytest

import gradloop as gl
from gradloop import _core, errors


@pytest.fixture(autouse=True)
def _no_trace_left_behind():
    yield
    assert not _core.trace_active(), "a test left a trace active"
    _core.trace_abort()


SYMBOLIC = re.escape("is a symbolic tensor inside @gl.function; its value is only known")


def f32(*shape):
    return (gl.float32, shape)


def test_straight_line_trace_runs_like_numpy():
    (x,) = _core.trace_begin("f", [f32(3)])
    assert _core.trace_active()
    assert x.is_symbolic and x.shape == (3,) and x.dtype == gl.float32
    y = gl.sum(gl.sin(x) * x)
    assert y.is_symbolic and y.shape == ()
    fn = _core.trace_finish([y])
    assert not _core.trace_active()
    assert fn.num_params == 1 and fn.captured_inputs == []
    fn.graph.verify()
    assert fn.graph.entry == "f" and fn.graph.function_names() == ["f"]
    assert fn.count_nodes("sin") == 1 and fn.count_nodes("mul") == 1
    text = str(fn.graph)
    assert "func @f(" in text and "sin(" in text
    # Nodes carry the user's source line (this file), not gradloop's.
    assert "test_trace_core.py" in text
    xs = np.array([0.3, -1.2, 2.5], dtype=np.float32)
    (out,) = fn([gl.tensor(xs)])
    assert not out.is_symbolic
    np.testing.assert_allclose(out.numpy(), np.sum(np.sin(xs) * xs), rtol=1e-6)


def test_unknown_dimensions_and_symbolic_repr():
    x, n = _core.trace_begin("f", [f32(None, 2), (gl.int32, ())])
    assert x.shape == (None, 2) and x.size is None and x.ndim == 2
    assert repr(x) == "<gl.Tensor symbolic shape=(None, 2) dtype=float32>"
    assert str(n) == "<gl.Tensor symbolic shape=() dtype=int32>"
    with pytest.raises(errors.ControlFlowError, match="symbolic"):
        len(x)
    y = x * 2.0
    fn = _core.trace_finish([y, gl.zeros_like(x)])
    for rows in (1, 4):
        a = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
        out, zeros = fn([gl.tensor(a), gl.tensor(0, dtype=gl.int32)])
        np.testing.assert_array_equal(out.numpy(), a * 2)
        np.testing.assert_array_equal(zeros.numpy(), np.zeros_like(a))


def test_concrete_tensors_are_captured_inputs():
    w = gl.tensor([1.0, 2.0, 3.0])
    (x,) = _core.trace_begin("f", [f32(3)])
    y = x * w + 0.5
    fn = _core.trace_finish([y])
    (captured,) = fn.captured_inputs
    np.testing.assert_array_equal(captured.numpy(), w.numpy())
    (out,) = fn([gl.tensor([1.0, 1.0, 1.0])])
    np.testing.assert_array_equal(out.numpy(), [1.5, 2.5, 3.5])


def _cond_branches(x, c, w):
    """then: sum(x * x * w), else: sum(c + sin(x)): captures of x, c, w in different orders."""
    _core.trace_push("then", [])
    then_branch = _core.trace_pop([gl.sum(x * x * w)])
    _core.trace_push("else", [])
    else_branch = _core.trace_pop([gl.sum(c + gl.sin(x))])
    return then_branch, else_branch


def test_emit_if_unifies_captures_of_both_branches_and_differentiates():
    w = gl.tensor([2.0, 3.0])
    p, x, c = _core.trace_begin("f", [(gl.bool_, ()), f32(2), f32(2)])
    tape = _core.Tape()
    tape.push()
    tape.watch(x)
    then_branch, else_branch = _cond_branches(x, c, w)
    assert then_branch.name == "then" and else_branch.name == "else"
    assert len(then_branch.captures) == 2 and len(else_branch.captures) == 2
    assert all(t.is_symbolic for t in else_branch.captures)
    (r,) = _core.emit_if(p, then_branch, else_branch)
    tape.pop()
    (g,) = tape.gradient([r], [x])
    fn = _core.trace_finish([r, g])
    fn.graph.verify()
    assert fn.count_nodes("if") >= 2  # the forward If and its gradient If

    xs = np.array([0.7, -1.3], dtype=np.float32)
    cs = np.array([0.4, 2.0], dtype=np.float32)
    ws = w.numpy()
    for pred in (True, False):
        out, grad = fn([gl.tensor(pred), gl.tensor(xs), gl.tensor(cs)])
        if pred:
            want, want_grad = np.sum(xs * xs * ws), 2 * xs * ws
        else:
            want, want_grad = np.sum(cs + np.sin(xs)), np.cos(xs)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
        np.testing.assert_allclose(grad.numpy(), want_grad, rtol=1e-6)


def test_emit_case_runs_the_chosen_branch_and_the_last_when_out_of_range():
    i, x = _core.trace_begin("f", [(gl.int32, ()), f32(2)])
    branches = []
    for k in range(3):
        _core.trace_push(f"b{k}", [])
        branches.append(_core.trace_pop([x * float(k + 1)]))
    (r,) = _core.emit_case(i, branches)
    fn = _core.trace_finish([r])
    xs = gl.tensor([1.0, -2.0])
    for index, factor in [(0, 1), (1, 2), (2, 3), (7, 3), (-1, 3)]:
        (out,) = fn([gl.tensor(index, dtype=gl.int32), xs])
        np.testing.assert_array_equal(out.numpy(), xs.numpy() * factor)


def _counting_loop(n, maximum_iterations=None):
    """i, acc = 0, 1.0; while i < n: i, acc = i + 1, acc * 2."""
    loop_types = [(gl.int32, ()), f32()]
    i, _ = _core.trace_push("cond", loop_types)
    cond = _core.trace_pop([i < n])
    i, acc = _core.trace_push("body", loop_types)
    body = _core.trace_pop([i + 1, acc * 2.0])
    assert [t.is_symbolic for t in cond.captures] == [True]  # n
    assert body.captures == []
    init = [gl.zeros((), dtype=gl.int32), gl.tensor(1.0)]
    return _core.emit_while(cond, body, init, maximum_iterations, 10)


def test_emit_while_counts_to_a_data_dependent_bound():
    (n,) = _core.trace_begin("count", [(gl.int32, ())])
    i, acc = _counting_loop(n)
    fn = _core.trace_finish([i, acc])
    fn.graph.verify()
    assert fn.count_nodes("while") == 1
    for k in (0, 1, 5):
        i, acc = fn([gl.tensor(k, dtype=gl.int32)])
        assert int(i) == k and float(acc) == 2.0**k


def test_emit_while_maximum_iterations():
    (n,) = _core.trace_begin("count", [(gl.int32, ())])
    i, acc = _counting_loop(n, maximum_iterations=3)
    fn = _core.trace_finish([i, acc])
    i, acc = fn([gl.tensor(10, dtype=gl.int32)])
    assert int(i) == 3 and float(acc) == 8.0


def test_dynamic_index_with_a_symbolic_scalar():
    w = gl.tensor([10.0, 20.0, 30.0])
    xs, k = _core.trace_begin("f", [f32(4, 2), (gl.int32, ())])
    row = xs[k]
    assert row.is_symbolic and row.shape == (2,)
    fn = _core.trace_finish([row, w[k], xs[1:, ::-1][0]])
    a = np.arange(8, dtype=np.float32).reshape(4, 2)
    for index in (0, 2, 3):
        row, wk, sliced = fn([gl.tensor(a), gl.tensor(index, dtype=gl.int32)])
        np.testing.assert_array_equal(row.numpy(), a[index])
        assert float(wk) == w.numpy()[min(index, 2)]  # a dynamic index is clamped
        np.testing.assert_array_equal(sliced.numpy(), a[1:, ::-1][0])


def test_variable_handle_eager():
    v = _core.VariableHandle(gl.tensor([1.0, 2.0]))
    assert v.dtype == gl.float32 and v.shape == (2,)
    v.assign(gl.tensor([3.0, 4.0]))
    np.testing.assert_array_equal(v.read().numpy(), [3.0, 4.0])
    v.assign_add(1.0)
    np.testing.assert_array_equal(v.read().numpy(), [4.0, 5.0])
    with pytest.raises(errors.DTypeError):
        v.assign(gl.tensor([1, 2]))
    with pytest.raises(errors.ShapeError):
        v.assign(gl.tensor([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(v.read().numpy(), [4.0, 5.0])


def test_variable_handle_traced_reads_and_writes_act_when_the_function_runs():
    v = _core.VariableHandle(gl.tensor([1.0, 2.0]))
    (x,) = _core.trace_begin("f", [f32(2)])
    before = v.read()
    assert before.is_symbolic
    v.assign_add(x)
    after = v.read()
    fn = _core.trace_finish([before, after])
    # Tracing changed nothing.
    np.testing.assert_array_equal(v.read().numpy(), [1.0, 2.0])
    (captured,) = fn.captured_inputs
    assert isinstance(captured, _core.VariableHandle) and captured.same(v)
    assert fn.count_nodes("assign_add_variable") == 1 and fn.count_nodes("read_variable") == 2
    fn.graph.verify()
    b, a = fn([gl.tensor([10.0, 20.0])])
    np.testing.assert_array_equal(b.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(a.numpy(), [11.0, 22.0])
    b, a = fn([gl.tensor([10.0, 20.0])])
    np.testing.assert_array_equal(b.numpy(), [11.0, 22.0])
    np.testing.assert_array_equal(v.read().numpy(), [21.0, 42.0])

    (x,) = _core.trace_begin("g", [f32(2)])
    v.assign(x)
    fn = _core.trace_finish([])
    assert fn([gl.tensor([5.0, 6.0])]) == []
    np.testing.assert_array_equal(v.read().numpy(), [5.0, 6.0])


def test_values_of_symbolic_tensors_raise_control_flow_errors():
    x, i = _core.trace_begin("f", [f32(3), (gl.int32, ())])
    try:
        s = gl.sum(x)
        for what in (
            x.numpy,
            lambda: np.asarray(x),
            x.tolist,
            s.item,
            lambda: bool(s),
            lambda: float(s),
            lambda: int(i),
            lambda: operator.index(i),
            lambda: [0, 1, 2][i],
        ):
            with pytest.raises(errors.ControlFlowError, match=SYMBOLIC):
                what()
    finally:
        _core.trace_abort()
    assert not _core.trace_active()
    # A symbolic tensor kept after its trace ended cannot be computed with.
    with pytest.raises(errors.ControlFlowError):
        gl.sin(x)


def test_trace_state_errors():
    with pytest.raises(errors.ControlFlowError):
        _core.trace_push("b", [])
    with pytest.raises(errors.ControlFlowError):
        _core.trace_pop([])
    with pytest.raises(errors.ControlFlowError):
        _core.trace_finish([])
    _core.trace_begin("f", [])
    with pytest.raises(errors.ControlFlowError, match="already being traced"):
        _core.trace_begin("g", [])
    with pytest.raises(errors.ControlFlowError):
        _core.trace_pop([])  # no inner frame is open
    _core.trace_abort()
    _core.trace_abort()  # never fails
    # Leaking a value out of an inner frame is refused.
    (x,) = _core.trace_begin("f", [f32(2)])
    _core.trace_push("inner", [])
    leaked = gl.sin(x)
    _core.trace_pop([leaked])
    with pytest.raises(errors.ControlFlowError):
        _core.trace_finish([leaked])
    assert not _core.trace_active()


def test_concrete_function_calls_check_arguments_and_report_run_time_errors():
    a, b = _core.trace_begin("f", [f32(None), f32(None)])
    y = a + b
    fn = _core.trace_finish([y])
    with pytest.raises(errors.InvalidArgumentError, match="takes 2 arguments"):
        fn([gl.tensor([1.0])])
    with pytest.raises(errors.DTypeError):
        fn([gl.tensor([1, 2]), gl.tensor([1, 2])])
    with pytest.raises(errors.ShapeError) as info:
        fn([gl.tensor([1.0, 2.0]), gl.tensor([1.0, 2.0, 3.0])])
    message = str(info.value)
    assert "in @f" in message and "test_trace_core.py:" in message
    _core.trace_begin("g", [])
    try:
        with pytest.raises(errors.ControlFlowError):
            fn([gl.tensor([1.0]), gl.tensor([1.0])])
    finally:
        _core.trace_abort()


def test_the_active_trace_belongs_to_its_thread():
    _core.trace_begin("f", [f32(2)])
    seen = {}

    def other():
        seen["active"] = _core.trace_active()
        seen["value"] = gl.sin(gl.zeros(2)).numpy().tolist()

    try:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert gl.zeros(2).is_symbolic  # creation ops inside a trace are nodes
    finally:
        _core.trace_abort()
    assert seen == {"active": False, "value": [0.0, 0.0]}
