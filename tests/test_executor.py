"""The frame executor as users meet it: `gl.lower`'s dataflow text, lazy and non-strict
execution (what it runs that the strict reference interpreter would not, and the reverse), side
effects, parallel iterations and threads, errors. Values are checked against eager mode and the
interpreter; the differential fuzzer (`test_fuzz_modes.py`) covers random programs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import gradloop as gl
from gradloop import errors
from runners import run_on


@pytest.fixture
def runner():
    """Runs a callable with graphs on the named runner, restoring the session's afterwards."""
    return run_on


def collatz_steps(n):
    def body(n, steps):
        half = gl.cast(gl.cast(n, gl.float64) * 0.5, gl.int32)
        n = gl.cond(half * 2 == n, lambda: half, lambda: 3 * n + 1)
        return n, steps + 1

    return gl.while_loop(lambda n, steps: n > 1, body, (n, gl.tensor(0)))[1]


def test_lower_shows_the_five_primitives_and_a_frame_per_loop():
    def two_loops(x):
        def inner(i, y):
            return i + 1, gl.cond(gl.sum(y) > 0, lambda: y * 0.5, lambda: y + 1.0)

        def outer(j, y):
            return j + 1, gl.while_loop(lambda i, y: i < 3, inner, (0, y))[1]

        return gl.while_loop(lambda j, y: j < 4, outer, (0, x))[1]

    graph = gl.function(two_loops).graph(gl.tensor(np.ones(3)))
    lowered = gl.lower(graph)
    text = str(lowered)
    for name in ("switch", "merge", "enter", "exit", "next_iteration"):
        assert lowered.count_nodes(name) > 0, text
        assert f"= {name}(" in text
    assert lowered.num_frames == 2
    assert "frame 2 in 1" in text, "the inner loop's frame sits inside the outer one's"
    assert lowered.count_nodes("call") == 0 and "while(" not in text and "if(" not in text


def test_an_op_nothing_needs_never_runs(runner):
    def f(x, i):
        unused = gl.take(x, i, axis=0)  # out of range: fails if it runs
        del unused
        return x * 2.0

    staged = gl.function(f)
    x, bad = gl.tensor(np.array([1.0, 2.0, 3.0])), gl.tensor(np.array([5]))
    np.testing.assert_array_equal(np.asarray(runner("executor", staged, x, bad)), [2.0, 4.0, 6.0])
    with pytest.raises(errors.IndexError, match="out of bounds"):
        runner("interpreter", staged, x, bad)  # the reference is strict


def test_an_op_in_the_untaken_branch_never_runs(runner):
    def f(x, i, p):
        return gl.cond(p, lambda: gl.take(x, i, axis=0), lambda: x[:1] + 1.0)

    staged = gl.function(f)
    x, bad = gl.tensor(np.array([1.0, 2.0, 3.0])), gl.tensor(np.array([5]))
    for name in ("executor", "frames", "interpreter"):
        out = runner(name, staged, x, bad, gl.tensor(False))
        np.testing.assert_array_equal(np.asarray(out), [2.0])
        with pytest.raises(errors.IndexError, match="out of bounds"):
            runner(name, staged, x, bad, gl.tensor(True))


def test_side_effects_run_exactly_once_in_program_order():
    v = gl.Variable(gl.tensor(1.0, dtype=gl.float64))

    @gl.function
    def f(x, p):
        v.assign_add(x)  # nothing reads it afterwards: kept as a side effect
        gl.cond(p, lambda: v.assign(v.read() * 10.0), lambda: v.read())

        def body(i):
            v.assign_add(gl.tensor(1.0, dtype=gl.float64))
            return i + 1

        gl.while_loop(lambda i: i < 3, body, gl.tensor(0), parallel_iterations=10)
        return x

    f(gl.tensor(2.0, dtype=gl.float64), gl.tensor(True))
    assert float(v.read()) == (1.0 + 2.0) * 10.0 + 3.0
    f(gl.tensor(2.0, dtype=gl.float64), gl.tensor(False))
    assert float(v.read()) == 33.0 + 2.0 + 3.0


@pytest.mark.parametrize("parallel", [1, 2, 10])
def test_parallel_iterations_do_not_change_values_or_gradients(parallel, runner):
    def f(x):
        def body(i, acc):
            y = gl.tanh(x * gl.cast(i, gl.float64) + acc)
            return i + 1, acc + gl.sum(y * y)

        init = (gl.tensor(0), gl.tensor(0.0, dtype=gl.float64))
        cond = lambda i, acc: acc < 25.0  # noqa: E731
        return gl.while_loop(cond, body, init, parallel_iterations=parallel)[1]

    x = gl.tensor(np.array([0.3, -0.5, 0.9]))
    want_value, want_grad = f(x), gl.grad(f)(x)
    staged, staged_grad = gl.function(f), gl.function(gl.grad(f))
    for name in ("executor", "frames", "interpreter"):
        np.testing.assert_allclose(float(runner(name, staged, x)), float(want_value), rtol=1e-12)
        got = np.asarray(runner(name, staged_grad, x))
        np.testing.assert_allclose(got, np.asarray(want_grad), rtol=1e-10, atol=1e-12)


def test_data_dependent_trip_counts_agree_with_eager(runner):
    staged = gl.function(collatz_steps)
    for n in (1, 6, 27, 97):
        want = int(collatz_steps(gl.tensor(n)))
        for name in ("executor", "frames", "interpreter"):
            assert int(runner(name, staged, gl.tensor(n))) == want, name


def test_errors_name_the_iteration_and_the_users_line(runner):
    def f(x, idx):
        def body(i, acc):
            return i + 1, acc + gl.take(x, gl.reshape(idx[i], (1,)), axis=0)

        return gl.while_loop(lambda i, acc: i < 4, body, (gl.tensor(0), x[:1]))[1]

    staged = gl.function(f)
    x = gl.tensor(np.array([1.0, 2.0, 3.0]))
    idx = gl.tensor(np.array([0, 2, 9, 1]))  # index 9 fails in iteration 2
    messages = []
    for name in ("executor", "frames", "interpreter"):
        with pytest.raises(errors.IndexError) as info:
            runner(name, staged, x, idx)
        messages.append(str(info.value))
    assert "in iteration 2" in messages[0] and "test_executor.py" in messages[0], messages[0]
    assert messages[0] == messages[1] == messages[2]


@pytest.mark.parametrize("rows", ((2, 0, 2, -1, 2), ((1, -3), (1, 1))))
def test_a_gather_and_its_scatter_in_a_loop_agree_with_numpy(runner, rows):
    # the compiled frames' take and scatter_add write straight into their buffers; repeated and
    # negative indices, one element a row and several
    idx = np.array(rows)

    def f(x):
        def body(i, acc):
            return i + 1, acc + gl.sum(gl.take(x, gl.tensor(idx), axis=0) * gl.cast(i + 1, x.dtype))

        return gl.while_loop(lambda i, acc: i < 3, body, (gl.tensor(0), gl.zeros((), x.dtype)))[1]

    for shape in ((3,), (3, 2)):
        x_np = np.arange(float(np.prod(shape))).reshape(shape) + 0.5
        x = gl.tensor(x_np)
        want = 6.0 * np.take(x_np, idx, axis=0).sum()
        grad_want = np.zeros_like(x_np)
        np.add.at(grad_want, idx.reshape(-1) % shape[0], 6.0)
        staged, staged_grad = gl.function(f), gl.function(gl.grad(f))
        for name in ("executor", "frames", "interpreter"):
            np.testing.assert_allclose(float(runner(name, staged, x)), want, rtol=1e-14)
            got = np.asarray(runner(name, staged_grad, x))
            np.testing.assert_allclose(got, grad_want, rtol=1e-14, err_msg=name)


def test_gradloop_num_threads_sets_the_executors_threads():
    code = "import gradloop as gl; print(gl._core.executor_threads())"
    env = {**os.environ, "GRADLOOP_NUM_THREADS": "3"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3"


def test_the_runner_is_validated():
    with pytest.raises(errors.InvalidArgumentError, match="executor"):
        gl._core.set_graph_runner("fast")
