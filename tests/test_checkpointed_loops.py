"""`while_loop(..., checkpoints=c)`: gradients in bounded memory, equal to the stacks' gradients.

The checkpointed gradient runs the same ops again from kept states, so eagerly and in graph mode
it must give the stacks' gradient bit for bit; under `gl.jit` the two are different programs
compiled by IREE (1e-12 relative in float64). Trip counts cover the schedule's regimes: none,
one, c, c + 1, the last trip of the binomial placement ((c+1)(c+2)/2 - 1, u below) and past it.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from gradcheck import check_grads
from runners import staged

RNG = np.random.default_rng(7)
W0 = RNG.standard_normal((4, 4)) * 0.4
X0 = np.linspace(-1.0, 1.0, 4)


def rnn(c, W, x, n):
    """h <- tanh(W h + 0.1) for n trips (n a tensor: the trip count is data); sum(h^2)."""

    def body(i, h):
        return i + 1, gl.tanh(gl.matmul(W, h[:, None])[:, 0] + 0.1)

    _, h = gl.while_loop(lambda i, h: i < n, body, (gl.tensor(0), x), checkpoints=c)
    return gl.sum(h * h)


def gradient(mode, c, n):
    g = gl.grad(lambda W, x, n: rnn(c, W, x, n), argnums=(0, 1))
    return [np.asarray(t) for t in staged(mode, g)(gl.tensor(W0), gl.tensor(X0), gl.tensor(n))]


def u(c):
    return (c + 1) * (c + 2) // 2 - 1


@pytest.mark.parametrize("mode", ["eager", "executor"])
@pytest.mark.parametrize("c", [1, 2, 3])
def test_gradients_equal_the_stacks_bit_for_bit(mode, c):
    for n in sorted({0, 1, 2, c, c + 1, u(c), u(c) + 1, 5 * c * c + 7}):
        want = gradient(mode, None, n)
        got = gradient(mode, c, n)
        for a, b in zip(want, got, strict=True):
            assert np.array_equal(a, b), f"{mode} c={c} n={n}: {np.abs(a - b).max()}"


@pytest.mark.slow
@pytest.mark.parametrize("c", [1, 3])
def test_compiled_gradients_match_the_stacks(c):
    for n in [0, 1, c + 1, u(c) + 1, 40]:
        want = gradient("executor", None, n)
        got = gradient("compiled", c, n)
        for a, b in zip(want, got, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-300, err_msg=f"c={c} n={n}")


def test_interpreter_agrees():
    for n in [0, 3, 11]:
        want = gradient("executor", None, n)
        got = gradient("interpreter", 2, n)
        for a, b in zip(want, got, strict=True):
            assert np.array_equal(a, b)


def test_eager_loop_is_staged_once_not_run_per_trip():
    """Eagerly under a tape the loop is traced once and run as graph mode's transform: the
    body's Python runs once for 200 trips, and the gradient equals the stacks' bit for bit."""
    calls = []

    def f(W, x):
        def body(i, h):
            calls.append(1)
            return i + 1, gl.tanh(gl.matmul(W, h[:, None])[:, 0] + 0.1)

        _, h = gl.while_loop(lambda i, h: i < 200, body, (gl.tensor(0), x), checkpoints=4)
        return gl.sum(h * h)

    got = gl.grad(f, argnums=(0, 1))(gl.tensor(W0), gl.tensor(X0))
    assert len(calls) == 1
    want = gradient("eager", None, 200)
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a, np.asarray(b))


def _second_order_fn(c):
    def f(W, x):
        def body(i, h):
            return i + 1, gl.tanh(gl.matmul(W, h[:, None])[:, 0] * 0.9 + 0.1)

        cond = lambda i, h: gl.logical_and(i < 9, gl.sum(h * h) < 50.0)  # noqa: E731
        _, h = gl.while_loop(cond, body, (gl.tensor(0), x), checkpoints=c)
        return gl.sum(h * h * h)

    return f


@pytest.mark.parametrize("c", [1, 2])
def test_second_order_against_finite_differences(c):
    check_grads(_second_order_fn(c), [W0, X0], order=2, modes=("tape", "grad", "graph"))


def test_hessian_and_jvp_through_a_checkpointed_loop():
    f = lambda x: _second_order_fn(2)(gl.tensor(W0), x)  # noqa: E731
    g = lambda x: _second_order_fn(None)(gl.tensor(W0), x)  # noqa: E731
    x = gl.tensor(X0)
    np.testing.assert_array_equal(np.asarray(gl.hessian(f)(x)), np.asarray(gl.hessian(g)(x)))
    t = gl.tensor(np.ones(4))
    got = gl.jvp(f, (x,), (t,))[1]
    want = gl.jvp(g, (x,), (t,))[1]
    assert np.array_equal(np.asarray(got), np.asarray(want))
    traced = gl.function(lambda x: gl.hessian(f)(x))(x)
    np.testing.assert_allclose(np.asarray(traced), np.asarray(gl.hessian(g)(x)), rtol=1e-12)


def bounded_rnn(c, m, W, x, n):
    """`rnn` with `maximum_iterations=m`: with c >= m every state has its own row (no
    schedule); trips stop at n or at m."""

    def body(i, h):
        return i + 1, gl.tanh(gl.matmul(W, h[:, None])[:, 0] + 0.1)

    _, h = gl.while_loop(
        lambda i, h: i < n, body, (gl.tensor(0), x), maximum_iterations=m, checkpoints=c
    )
    return gl.sum(h * h * h)


@pytest.mark.parametrize("mode", ["eager", "executor", "interpreter"])
def test_a_bound_within_the_checkpoints_keeps_a_row_per_trip(mode):
    # zero trips, fewer than the bound, the bound exactly (the loop stops at m, not n)
    for m, c in [(4, 4), (4, 9), (1, 1), (0, 3)]:
        for n in sorted({0, 1, max(m - 1, 0), m, m + 3}):

            def grads(c, m=m, n=n):
                g = gl.grad(lambda W, x: bounded_rnn(c, m, W, x, gl.tensor(n)), argnums=(0, 1))
                return [np.asarray(t) for t in staged(mode, g)(gl.tensor(W0), gl.tensor(X0))]

            for a, b in zip(grads(None), grads(c), strict=True):
                assert np.array_equal(a, b), f"{mode} m={m} c={c} n={n}"
    # no schedule: a row per trip (the user's checkpoints bound memory in states: state rows)
    g = gl.grad(lambda W, x: bounded_rnn(4, 4, W, x, gl.tensor(7)), argnums=(0, 1))
    text = str(gl.function(g).graph(gl.tensor(W0), gl.tensor(X0)))
    assert "_dense_grad" in text and "_ckpt_" not in text
    check_grads(
        lambda W, x: bounded_rnn(5, 5, W, x, gl.tensor(7)),
        [W0, X0],
        order=2,
        modes=("tape", "grad", "graph"),
    )


def _nested(c_outer, c_inner):
    def f(x):
        def inner(j, h):
            return j + 1, gl.sin(h) * 1.1 + 0.05

        def outer(i, h):
            _, h = gl.while_loop(
                lambda j, h: j < gl.minimum(i, 2) + 1, inner, (0, h), checkpoints=c_inner
            )
            return i + 1, gl.cond(gl.sum(h) > 0.0, lambda: h * 0.9, lambda: h * h)

        _, h = gl.while_loop(lambda i, h: i < 7, outer, (0, x), checkpoints=c_outer)
        return gl.sum(h)

    return f


@pytest.mark.parametrize("mode", ["eager", "executor"])
def test_nested_loops_and_branches_in_the_body(mode):
    x = gl.tensor(X0)
    want = np.asarray(staged(mode, gl.grad(_nested(None, None)))(x))
    for cs in [(2, 1), (1, None), (None, 3), (3, 3)]:
        got = np.asarray(staged(mode, gl.grad(_nested(*cs)))(x))
        assert np.array_equal(got, want), cs
    check_grads(_nested(2, 1), [X0], order=1, modes=("grad", "graph"))


@pytest.mark.parametrize("mode", ["eager", "executor"])
def test_switch_case_maximum_iterations_and_variables_read(mode):
    v = gl.Variable(np.array([0.5, -0.25, 1.0, 2.0]))

    def f(x, c):
        def body(i, h):
            index = gl.cast(gl.sum(h) > 0.0, gl.int32) + gl.cast(i > 4, gl.int32)
            h = gl.switch_case(index, [lambda: h * v.read(), lambda: gl.cos(h), lambda: h + 1.0])
            return i + 1, h

        _, h = gl.while_loop(
            lambda i, h: gl.sum(h) < 1e6, body, (0, x), maximum_iterations=10, checkpoints=c
        )
        return gl.sum(h * h)

    for c in [None, 2]:
        run = staged(mode, lambda x, c=c: gl.grad(lambda v_, x: f(x, c), argnums=(0, 1))(v, x))
        got = [np.asarray(t) for t in run(gl.tensor(X0))]
        if c is None:
            want = got
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert np.abs(want[0]).max() > 0  # the Variable's gradient flows


def test_custom_rules_in_the_body():
    @gl.custom_gradient
    def scaled(x):
        return x * 2.0, lambda g: g * 3.0  # a deliberately "wrong" rule: it must be honoured

    @gl.custom_jvp
    def cube(x):
        return x * x * x

    @cube.defjvp
    def _(primals, tangents):
        (x,), (t,) = primals, tangents
        return cube(x), 3.0 * x * x * t

    def f(x, c):
        def body(i, h):
            return i + 1, cube(scaled(h)) * 0.1

        return gl.sum(gl.while_loop(lambda i, h: i < 4, body, (0, x), checkpoints=c)[1])

    x = gl.tensor(X0 * 0.5)
    for mode in ["eager", "executor"]:
        want = np.asarray(staged(mode, gl.grad(lambda x: f(x, None)))(x))
        got = np.asarray(staged(mode, gl.grad(lambda x: f(x, 2)))(x))
        assert np.array_equal(got, want), mode


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, None.__class__, "4"])
def test_bad_checkpoints_name_the_argument(bad):
    value = gl.tensor(3) if bad is None.__class__ else bad
    with pytest.raises(gl.errors.ControlFlowError, match="checkpoints"):
        gl.while_loop(lambda h: h < 10.0, lambda h: h * 2.0, gl.tensor(1.0), checkpoints=value)


@pytest.mark.parametrize("mode", ["eager", "executor"])
def test_a_body_that_assigns_a_variable_is_refused(mode):
    v = gl.Variable(0.0)

    def f(x):
        def body(h):
            v.assign_add(1.0)
            return h * 2.0

        return gl.while_loop(lambda h: h < 10.0, body, x, checkpoints=2)

    with pytest.raises(gl.errors.ControlFlowError, match="assigns a Variable"):
        staged(mode, gl.grad(f))(gl.tensor(1.0))


def test_without_a_tape_the_loop_just_runs():
    out = gl.while_loop(lambda h: h < 10.0, lambda h: h * 2.0, gl.tensor(1.0), checkpoints=1)
    assert float(out) == 16.0
    traced = gl.function(
        lambda x: gl.while_loop(lambda h: h < 10.0, lambda h: h * 2.0, x, checkpoints=1)
    )
    assert float(traced(gl.tensor(1.0))) == 16.0
    assert "checkpoints=1" in str(traced.graph(gl.tensor(1.0)))


# ---- imported MLIR ------------------------------------------------------------------------------


@pytest.mark.slow
def test_imported_mlir_gradient_with_checkpoints(tmp_path):
    pytest.importorskip("iree.compiler", reason="MLIR import needs iree-base-compiler")
    from test_mlir_import import Compiled, fixture, gradloop_command

    text = fixture("long_loop")
    stacked = gl.mlir.grad(text, wrt=(0, 1))
    kept = gl.mlir.grad(text, wrt=(0, 1), checkpoints=3)
    assert "util.list" in stacked and "util.list" not in kept  # static shapes only
    args = [np.float64(0.1), np.float64(0.01)]
    want = Compiled(stacked)("main_grad", *args)
    got = Compiled(kept)("main_grad", *args)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    with pytest.raises(gl.errors.ControlFlowError, match="checkpoints"):
        gl.mlir.grad(text, checkpoints=0)
    src, out = tmp_path / "f.mlir", tmp_path / "g.mlir"
    src.write_text(text)
    r = gradloop_command("grad", str(src), "-o", str(out), "--wrt", "0,1", "--checkpoints", "3")
    assert r.returncode == 0, r.stderr
    assert "util.list" not in out.read_text()
    np.testing.assert_allclose(Compiled(out.read_text())("main_grad", *args), want, rtol=1e-12)


# ---- memory -------------------------------------------------------------------------------------

MEMORY_PROGRAM = """
import sys
import numpy as np
import gradloop as gl

mode, trips = sys.argv[1], int(sys.argv[3])
c = None if sys.argv[2] == "stacks" else int(sys.argv[2])

def status_kb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

def loss(x, n):
    def body(i, h):
        return i + 1, gl.sin(h) * 0.999 + 0.001
    _, h = gl.while_loop(lambda i, h: i < n, body, (gl.tensor(0), x), checkpoints=c)
    return gl.sum(h)

grad = (gl.jit if mode == "jit" else gl.function)(gl.grad(loss))
x = gl.tensor(np.linspace(0.0, 1.0, 16))
small = np.asarray(grad(x, gl.tensor(100)))  # traced, compiled, buffers sized
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size starts again from the current one
before = status_kb("VmRSS")
out = np.asarray(grad(x, gl.tensor(trips)))
print(status_kb("VmHWM") - before, float(np.abs(out).sum()))
"""


def peak_growth_mb(mode: str, checkpoints: str, trips: int) -> tuple[float, float]:
    """How far a fresh process's resident memory peaks above its size before the gradient of
    `trips` trips (after a warm-up of 100), and the gradient's magnitude."""
    from peak_memory import peak_growth_mb as peak

    return peak(MEMORY_PROGRAM, mode, checkpoints, str(trips), timeout=1600)


@pytest.mark.slow
@pytest.mark.skipif(
    not __import__("os").path.exists("/proc/self/clear_refs"),
    reason="measures peak memory with Linux's /proc/self/clear_refs (a peak reset)",
)
# gl.jit at 1.2 * 10^5 trips: IREE's cost per trip (about 20 µs a body evaluation) makes 10^6
# minutes of a 2-core machine; the bound is the same at any trip count, and the stacks' 12 MB
# there still stand well clear of the checkpoints' 5.
@pytest.mark.long
@pytest.mark.parametrize(("mode", "trips"), [("graph", 1_000_000), ("jit", 120_000)])
@pytest.mark.timeout(1200)
def test_a_long_loop_in_bounded_memory(mode, trips):
    # Trips of a float64[16] state: the stacks keep over 100 bytes a trip of residuals (over
    # 100 MB at 10^6), the checkpointed gradient 100 states (13 KB) and the schedule's
    # bookkeeping.
    kept, g_kept = peak_growth_mb(mode, "100", trips)
    stacked, g_stacked = peak_growth_mb(mode, "stacks", trips)
    assert kept < 5, f"{mode}: checkpoints=100 grew the process by {kept:.1f} MB"
    assert stacked > 100 * trips / 1e6, f"{mode}: stacks grew the process by {stacked:.1f} MB"
    assert g_kept == pytest.approx(g_stacked, rel=1e-12)


def test_the_compiled_gradient_has_no_stack():
    # Static shapes only: the snapshots are [c + 1, ...] tensors, nothing grows.
    def loss(x, n, c):
        def body(i, h):
            return i + 1, gl.sin(h) * 0.999 + 0.001

        _, h = gl.while_loop(lambda i, h: i < n, body, (gl.tensor(0), x), checkpoints=c)
        return gl.sum(h)

    args = (gl.tensor(np.zeros(16)), gl.tensor(5))
    stacked = gl.to_mlir(gl.grad(lambda x, n: loss(x, n, None)), *args)
    kept = gl.to_mlir(gl.grad(lambda x, n: loss(x, n, 4)), *args)
    assert "util.list" in stacked
    assert "util.list" not in kept and "tensor<5x16xf64>" in kept
