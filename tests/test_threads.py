"""Eager ops and graph functions called from several Python threads at once.

The thread that imports gradloop (Python's main thread) is worker 0 of the kernels' thread pool
(`rust/core/src/pool.rs`). These tests call ops whose work is split over the pool from other
threads while the main thread sits in Python, where it serves no pool work: every call must
still finish, with the same values as on one thread.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np

import gradloop as gl

TIMEOUT_S = 120


def run_in_threads(fn, count: int) -> list:
    """fn(i) on `count` threads started together; their results, or the first exception."""
    results: list = [None] * count
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def target(i: int) -> None:
        try:
            start.wait()
            results[i] = fn(i)
        except BaseException as e:  # reraised on the main thread
            errors.append(e)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]
    return results


def run_python(code: str) -> str:
    """What `code` prints, run by this interpreter in a child process (which must succeed)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_split_products_and_maps_from_threads_match_numpy():
    rng = np.random.default_rng(0)
    # A 64x512 @ 512x512 product and a 2^19-element map both split over the pool.
    a = rng.standard_normal((64, 512))
    w = rng.standard_normal((512, 512))
    x = rng.standard_normal(1 << 19).astype(np.float32)

    def work(i: int):
        scale = float(i + 1)
        product = gl.matmul(gl.tensor(a * scale), gl.transpose(gl.tensor(w), (1, 0)))
        mapped = gl.exp(gl.tensor(x) * np.float32(0.5 / scale))
        return product.numpy(), mapped.numpy()

    for i, (product, mapped) in enumerate(run_in_threads(work, 4)):
        scale = float(i + 1)
        np.testing.assert_allclose(product, (a * scale) @ w.T, rtol=1e-12, atol=1e-10)
        np.testing.assert_allclose(mapped, np.exp(x * np.float32(0.5 / scale)), rtol=2e-6)


def test_gradients_of_a_product_from_threads_match_one_thread():
    # The gradient's products read an operand transposed (g @ w^T, h^T @ g), which large
    # products copy into row-major order first.
    rng = np.random.default_rng(1)
    h = gl.tensor(rng.standard_normal((64, 512)))
    ws = [gl.tensor(rng.standard_normal((512, 512)) / 20) for _ in range(3)]

    def loss(h, w):
        return gl.sum(gl.tanh(gl.matmul(h, w)) ** 2)

    grad = gl.grad(loss, argnums=(0, 1))
    want = [[g.numpy() for g in grad(h, w)] for w in ws]
    got = run_in_threads(lambda i: [g.numpy() for g in grad(h, ws[i])], 3)
    for gs, ws_want in zip(got, want, strict=True):
        for g, w in zip(gs, ws_want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_first_calls_of_a_graph_function_from_threads_finish_and_match_numpy():
    # Several threads making a function's first call at once: one builds its executor while
    # the others wait. Waiting with the GIL held deadlocked the builder, so a child process
    # runs it, where a hang is a timeout rather than a stuck test session.
    code = """
import threading
import numpy as np, gradloop as gl

@gl.function
def settle(x):
    def body(i, x):
        return i + 1, gl.tanh(gl.matmul(x, gl.transpose(x, (1, 0))) / 64.0)
    _, y = gl.while_loop(lambda i, x: i < 5, body, (gl.tensor(0), x))
    return gl.sum(y)

xs = [np.random.default_rng(i).standard_normal((64, 64)) for i in range(4)]
got = [None] * 4
start = threading.Barrier(4)
def run(i):
    start.wait()
    got[i] = float(settle(gl.tensor(xs[i])))
threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
for x, value in zip(xs, got):
    y = x
    for _ in range(5):
        y = np.tanh(y @ y.T / 64.0)
    assert abs(value - y.sum()) <= 1e-10 * abs(y.sum()), (value, y.sum())
print("ok")
"""
    assert run_python(code) == "ok"


def test_importing_from_another_thread_leaves_the_pool_to_rayon():
    # The pool is not built around a thread that may exit: imported from a worker thread that
    # then ends, gradloop's split kernels still run from the main thread.
    code = """
import threading
def load():
    import gradloop
t = threading.Thread(target=load); t.start(); t.join()
import numpy as np, gradloop as gl
a = np.arange(64 * 512, dtype=np.float64).reshape(64, 512) / 1e4
w = np.arange(512 * 512, dtype=np.float64).reshape(512, 512) / 1e5
got = gl.matmul(gl.tensor(a), gl.transpose(gl.tensor(w), (1, 0))).numpy()
assert np.allclose(got, a @ w.T, rtol=1e-12), "wrong product"
print("ok")
"""
    assert run_python(code) == "ok"
