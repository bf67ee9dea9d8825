"""Compiled frames (fused loops compiled to machine code and kernels on buffers) against their
register programs, through the public graph mode: the same bits every way, and the switch that
chooses.

The whole suite already runs in check mode (`conftest.py`); these tests run each way on its own
and compare, and check the switch itself."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl


@pytest.fixture
def frames_mode():
    yield gl._core.set_compiled_frames
    gl._core.set_compiled_frames("check")


#: Which tier of fused frames each mode runs (`_core.frame_statistics`'s runs), and the tiers
#: it never runs ("on" steps a root frame on buffers until it has run twice: `CompiledFrame`).
TIER_RUNS = {"on": "native_runs", "buffers": "buffer_runs", "off": "program_runs"}
NEVER = {
    "on": ("program_runs",),
    "buffers": ("native_runs", "program_runs"),
    "off": ("native_runs", "buffer_runs"),
}


def runs_since(before: dict[str, int]) -> dict[str, int]:
    now = gl._core.frame_statistics()
    return {k: now[k] - before[k] for k in now}


def each_way(fn, *args):
    """`fn(*args)` with frames as machine code, stepped on buffers and as interpreted programs
    (numpy arrays); the first two must agree bit for bit, and the first is returned. Each mode
    must have run its loops on its own tier (`TIER_RUNS`), and on none it never runs."""
    out = {}
    for mode in ("on", "buffers", "off"):
        gl._core.set_compiled_frames(mode)
        fn(*args)  # a root frame gets machine code only when it runs again
        before = gl._core.frame_statistics()
        out[mode] = [np.asarray(v) for v in gl.nest.flatten(fn(*args))]
        ran = runs_since(before)
        assert ran[TIER_RUNS[mode]] > 0, (mode, ran)
        assert all(ran[k] == 0 for k in NEVER[mode]), (mode, ran)
    gl._core.set_compiled_frames("check")
    for a, b in zip(out["on"], out["buffers"], strict=True):
        np.testing.assert_array_equal(a, b)
    return out["on"], out["off"]


def tiny_loop(x, n):
    def body(i, x):
        return i + 1, 0.999 * x + 0.001 * gl.sin(x)

    return gl.while_loop(lambda i, x: i < n, body, (gl.tensor(0, dtype=gl.int32), x))[1]


def branchy_loss(w, xs):
    """A loop with a cond, a reduction, a slice and a product, and its gradient's stacks."""

    def body(t, h, acc):
        x = xs[t]
        h = gl.tanh(gl.matmul(h, w) + x)
        acc = gl.cond(gl.sum(h) > 0.0, lambda: acc + gl.sum(h[:2] ** 2.0), lambda: acc - h[0])
        return t + 1, h, acc

    start = (gl.tensor(0, dtype=gl.int32), xs[0] * 0.0, gl.tensor(0.0, dtype=gl.float64))
    return gl.while_loop(lambda t, h, acc: t < 5, body, start)[2]


def test_the_switch_names_its_modes_and_refuses_others(frames_mode):
    assert gl._core.compiled_frames() == "check"
    for mode in ("on", "buffers", "off", "check"):
        frames_mode(mode)
        assert gl._core.compiled_frames() == mode
    with pytest.raises(gl.errors.InvalidArgumentError, match="set_compiled_frames"):
        frames_mode("fast")
    assert gl._core.compiled_frames() == "check"


def test_a_tiny_loop_gives_the_same_bits_compiled_and_interpreted(frames_mode):
    x = gl.tensor(np.linspace(0.1, 1.6, 16, dtype=np.float32))
    n = gl.tensor(257, dtype=gl.int32)
    on, off = each_way(gl.function(tiny_loop), x, n)
    np.testing.assert_array_equal(on[0], off[0])
    np.testing.assert_allclose(on[0], np.asarray(tiny_loop(x, n)), rtol=1e-5)


def test_a_loop_gradient_with_branches_and_stacks_gives_the_same_bits(frames_mode):
    rng = np.random.default_rng(3)
    w = gl.tensor(rng.standard_normal((4, 4)) * 0.5)
    xs = gl.tensor(rng.standard_normal((5, 4)))
    grad = gl.value_and_grad(branchy_loss)
    on, off = each_way(gl.function(grad), w, xs)
    for a, b in zip(on, off, strict=True):
        np.testing.assert_array_equal(a, b)
    eager = [np.asarray(v) for v in gl.nest.flatten(grad(w, xs))]
    for a, b in zip(on, eager, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    # And the gradient itself, by central differences on two entries.
    loss = gl.function(branchy_loss)
    w_np = np.asarray(w)
    for i, j in [(0, 1), (3, 2)]:
        step = np.zeros_like(w_np)
        step[i, j] = 1e-6
        up = float(np.asarray(loss(gl.tensor(w_np + step), xs)))
        down = float(np.asarray(loss(gl.tensor(w_np - step), xs)))
        np.testing.assert_allclose(on[1][i, j], (up - down) / 2e-6, rtol=1e-5, atol=1e-8)


def test_statistics_count_each_frame_compiled_to_machine_code_once(frames_mode):
    frames_mode("on")
    x = gl.tensor(np.linspace(0.1, 1.6, 16, dtype=np.float32))
    fn = gl.function(tiny_loop)
    before = gl._core.frame_statistics()
    for trips in (5, 9, 13):  # a root's frame gets machine code at its third run
        fn(x, gl.tensor(trips, dtype=gl.int32))
    ran = runs_since(before)
    assert ran["programs_compiled"] >= 1 and ran["buffer_frames_compiled"] >= 1, ran
    assert ran["native_frames_compiled"] >= 1 and ran["native_runs"] >= 1, ran
    assert ran["program_runs"] == 0, ran
    # Compiled once: later calls of the same signature run the same machine code.
    before = gl._core.frame_statistics()
    for trips in (2, 4, 6):
        fn(x, gl.tensor(trips, dtype=gl.int32))
    ran = runs_since(before)
    compiled = ("programs_compiled", "buffer_frames_compiled", "native_frames_compiled")
    assert all(ran[k] == 0 for k in compiled), ran
    assert ran["native_runs"] >= 3 and ran["buffer_runs"] == 0 and ran["program_runs"] == 0, ran


def newton_with_a_branch(a):
    """Newton's iteration for x^3 = a, a lane-dependent step size chosen by a `cond` in the
    body: batched over many lanes, its body is the chains of elementwise ops that machine code
    runs as passes over the lanes (one per branch and phase)."""

    def body(x, k):
        r = x * x * x - a
        step = gl.cond(k < 2, lambda: 0.5 * r / (3.0 * x * x), lambda: r / (3.0 * x * x))
        return x - step, k + 1

    more = lambda x, k: gl.abs(x * x * x - a) > 1e-12 * a  # noqa: E731
    return gl.while_loop(more, body, (a, gl.tensor(0)))


def test_batched_loops_over_many_lanes_give_the_same_bits_compiled_and_interpreted(frames_mode):
    a = gl.tensor(10.0 ** np.random.default_rng(5).uniform(-2.0, 3.0, 301))
    value = gl.vmap(newton_with_a_branch)
    grad = gl.vmap(gl.grad(lambda a: newton_with_a_branch(a)[0]))
    before = gl._core.frame_statistics()
    for fn in (value, grad):
        on, off = each_way(gl.function(fn), a)
        for x, y in zip(on, off, strict=True):
            np.testing.assert_array_equal(x, y)
    assert runs_since(before)["fused_passes_compiled"] >= 2  # a branch's chain, value and grad
    # Each lane as the loop run alone: its trips exactly, its root and derivative.
    roots, trips = (np.asarray(v) for v in gl.function(value)(a))
    slopes = np.asarray(gl.function(grad)(a))
    for lane in (0, 7, 150, 300):
        x, k = newton_with_a_branch(gl.tensor(np.asarray(a)[lane]))
        assert int(np.asarray(k)) == trips[lane]
        np.testing.assert_allclose(roots[lane], np.asarray(x), rtol=1e-14)
        np.testing.assert_allclose(slopes[lane], 1.0 / (3.0 * roots[lane] ** 2), rtol=1e-9)


def test_the_passes_thresholds_are_a_setting_that_checks_its_arguments():
    saved = gl._core.fused_passes()
    assert saved == (8, 4)
    for bad in [(1, 4), (65, 1), (0, 0)]:
        with pytest.raises(gl.errors.InvalidArgumentError, match="set_fused_passes"):
            gl._core.set_fused_passes(*bad)
        assert gl._core.fused_passes() == saved
    a = gl.tensor(10.0 ** np.random.default_rng(6).uniform(-2.0, 3.0, 7))
    fn = gl.function(gl.vmap(newton_with_a_branch))
    before = gl._core.frame_statistics()
    gl._core.set_fused_passes(2, 2)
    try:
        lowered = [np.asarray(v) for v in fn(a)]
    finally:
        gl._core.set_fused_passes(*saved)
    assert runs_since(before)["fused_passes_compiled"] >= 1  # 7 lanes: 3 blocks and a tail
    # the same bits as the same function compiled at the default thresholds
    default = gl.function(gl.vmap(newton_with_a_branch))(a)
    for got, want in zip(lowered, default, strict=True):
        np.testing.assert_array_equal(got, np.asarray(want))
