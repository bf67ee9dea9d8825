"""`gl.set_flush_subnormals`: subnormals kept by default (numpy's values, eagerly and in graph
mode), flushed to zero on request (on the calling thread and on the worker threads that split a
large op), a loop gradient the same within rounding, and kept again once cleared. Each case runs
in a fresh process: the mode belongs to the threads, and the main thread's numpy sees it too."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

import gradloop as gl

# 1e-30 * 1e-10 is 1e-40: subnormal in float32. 2,000,000 elements split over the pool.
SCRIPT = r"""
import sys
import numpy as np
import gradloop as gl

supported = sys.argv[1] == "1"
n = 2_000_000
a, b = np.full(8, 1e-30, np.float32), np.full(8, 1e-10, np.float32)
big_a, big_b = np.full(n, 1e-30, np.float32), np.full(n, 1e-10, np.float32)
tiny = (a * b)[0]
assert 0 < tiny < np.finfo(np.float32).tiny
product = gl.function(lambda x, y: x * y)


def rnn_gradient(w, xs):
    def body(t, h):
        return t + 1, gl.tanh(h @ w + xs[t])

    def loss(w):
        start = (gl.tensor(0), gl.zeros((16,), dtype=gl.float32))
        _, h = gl.while_loop(lambda t, h: t < 300, body, start)
        return gl.sum(h)

    return gl.grad(loss)(w)


rng = np.random.default_rng(0)
w = gl.tensor((rng.standard_normal((16, 16)) * 0.05).astype(np.float32))
xs = gl.tensor(rng.standard_normal((300, 16)).astype(np.float32))
graph_gradient = gl.function(rnn_gradient)


def check_kept():
    assert not gl._core.flushes_subnormals()
    assert np.array_equal(np.asarray(gl.tensor(a) * gl.tensor(b)), a * b)
    assert np.array_equal(np.asarray(product(gl.tensor(a), gl.tensor(b))), a * b)
    assert np.array_equal(np.asarray(gl.tensor(big_a) * gl.tensor(big_b)), big_a * big_b)


check_kept()
kept = np.asarray(graph_gradient(w, xs))
assert gl.set_flush_subnormals(True) is supported
if supported:
    assert gl._core.flushes_subnormals()
    assert not np.asarray(gl.tensor(a) * gl.tensor(b)).any()
    assert not np.asarray(product(gl.tensor(a), gl.tensor(b))).any()
    assert not np.asarray(gl.tensor(big_a) * gl.tensor(big_b)).any()
    # a subnormal input reads as zero: 1e-40 * 1e10 would be 1e-30
    assert float(gl.tensor(np.float32(tiny)) * gl.tensor(np.float32(1e10))) == 0.0
    assert float(gl.tensor(1e-300) * gl.tensor(1e-10)) == 0.0  # float64 too
    flushed = np.asarray(graph_gradient(w, xs))
    eager = np.asarray(rnn_gradient(w, xs))
    np.testing.assert_allclose(flushed, kept, rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(eager, kept, rtol=1e-6, atol=1e-30)
    assert gl.set_flush_subnormals(False) is True
check_kept()

# From another thread: an error, not a wait for the main thread (a worker of the pool) that
# would never come, and nothing changed.
import threading

errors = []


def elsewhere():
    try:
        gl.set_flush_subnormals(True)
    except gl.errors.InvalidArgumentError as e:
        errors.append(str(e))


thread = threading.Thread(target=elsewhere)
thread.start()
thread.join(timeout=120)
assert not thread.is_alive(), "set_flush_subnormals hung on another thread"
assert len(errors) == supported, errors
assert not supported or "thread that imported gradloop" in errors[0], errors
check_kept()
print("subnormals ok")
"""


def test_subnormals_kept_by_default_flushed_on_request_and_kept_again() -> None:
    supported = platform.machine().lower() in ("x86_64", "amd64")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "1" if supported else "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "subnormals ok" in done.stdout


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_a_mode_that_is_not_a_bool_is_a_clear_error(bad: object) -> None:
    with pytest.raises(gl.errors.InvalidArgumentTypeError, match="enabled must be True or False"):
        gl.set_flush_subnormals(bad)  # type: ignore[arg-type]
    assert not gl._core.flushes_subnormals()
