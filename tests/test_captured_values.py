"""Values a construct closes over are inputs of it for every derivative, and custom rules compose
with every transform: regressions for derivatives that were silently wrong (a checkpointed loop
run eagerly dropped what its body closes over; `hessian` through a `custom_jvp` rule dropped
what the rule computes from the primal), for a reverse-mode error through `recompute_grad` of a
`custom_gradient` function, and for allocations that aborted the process. Every derivative is
checked against central finite differences of the function (not of its rules) in float64."""

from __future__ import annotations

import ast
import subprocess
import sys

import numpy as np
import pytest

import gradloop as gl
from runners import staged

X = 0.7
EPS = 1e-6


def central(f, x: float) -> float:
    return (float(f(x + EPS)) - float(f(x - EPS))) / (2 * EPS)


def t64(v) -> gl.Tensor:
    return gl.tensor(np.asarray(v, dtype=np.float64))


# ---- a checkpointed loop's body closes over what is differentiated ------------------------------


def orbit(r, x0, ckpt, n=5):
    def body(i, x):
        return i + 1, r * x * (1.0 - x) + 0.01 * gl.sin(x)  # r is closed over, not carried

    _, x = gl.while_loop(lambda i, x: i < n, body, (gl.tensor(0), x0), checkpoints=ckpt)
    return gl.sum(x * x)


def orbit_np(r: float, x: float, n: int = 5) -> float:
    for _ in range(n):
        x = r * x * (1.0 - x) + 0.01 * np.sin(x)
    return x * x


@pytest.mark.parametrize("mode", ["eager", "executor"])
@pytest.mark.parametrize("ckpt", [None, 1, 2, 3])
def test_closed_over_scalar_gets_its_gradient(mode, ckpt):
    x0 = t64(0.3)
    got = float(staged(mode, gl.grad(lambda r: orbit(r, x0, ckpt)))(t64(2.5)))
    want = central(lambda r: orbit_np(r, 0.3), 2.5)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_closed_over_scalar_on_a_tape_and_second_order():
    r, x0 = t64(2.5), t64(0.3)
    with gl.GradientTape() as tape:
        tape.watch(r)
        y = orbit(r, x0, 2)
    np.testing.assert_allclose(float(tape.gradient(y, r)), central(lambda r: orbit_np(r, 0.3), 2.5))
    d1 = lambda r: central(lambda s: orbit_np(s, 0.3), r)  # noqa: E731
    want = central(d1, 2.5)
    for second in [
        gl.grad(gl.grad(lambda r: orbit(r, x0, 2))),
        gl.hessian(lambda r: orbit(r, x0, 2)),
        lambda r: gl.jvp(gl.grad(lambda r: orbit(r, x0, 2)), (r,), (gl.ones_like(r),))[1],
    ]:
        np.testing.assert_allclose(float(second(r)), want, rtol=1e-4)


def test_values_computed_from_closed_over_tensors_inside_the_body():
    """`w2 = w * 2` inside the body runs on concrete tensors only: it is traced, not run at
    once, so that the loop stays a function of `w`."""
    w, x0 = t64([0.5, -0.25]), t64([0.3, 0.6])

    def f(w, ckpt):
        def body(i, x):
            w2 = w * 2.0
            return i + 1, gl.tanh(w2 * x + gl.sum(w))

        return gl.sum(gl.while_loop(lambda i, x: i < 4, body, (0, x0), checkpoints=ckpt)[1])

    want = np.asarray(gl.grad(lambda w: f(w, None))(w))
    got = np.asarray(gl.grad(lambda w: f(w, 2))(w))
    np.testing.assert_array_equal(got, want)
    assert np.abs(want).min() > 0


def test_closed_over_tensor_in_a_cond_in_a_checkpointed_loop():
    a = t64(1.3)

    def f(a, ckpt):
        def body(i, x):
            return i + 1, gl.cond(x > 0.5, lambda: x * a - 0.4, lambda: gl.sin(x * a) + 0.3)

        return gl.while_loop(lambda i, x: i < 6, body, (0, t64(0.2)), checkpoints=ckpt)[1]

    def f_np(a):
        x = 0.2
        for _ in range(6):
            x = x * a - 0.4 if x > 0.5 else np.sin(x * a) + 0.3
        return x

    for ckpt in [None, 2]:
        g = gl.grad(lambda a, ckpt=ckpt: f(a, ckpt))
        np.testing.assert_allclose(float(g(a)), central(f_np, 1.3))


def test_closed_over_tensor_under_forward_mode_with_a_tape():
    """A tape records while an accumulator perturbs only what the body closes over."""
    r, x0 = t64(2.5), t64(0.3)
    with gl.GradientTape():
        _, t = gl.jvp(lambda r: orbit(r, x0, 2), (r,), (gl.ones_like(r),))
    np.testing.assert_allclose(float(t), central(lambda r: orbit_np(r, 0.3), 2.5), rtol=1e-6)


# ---- custom rules with every transform ----------------------------------------------------------


@gl.custom_jvp
def sin_sin(x):
    return gl.sin(gl.sin(x))


@sin_sin.defjvp
def _sin_sin_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    s = gl.sin(x)  # an intermediate computed from the primal
    return gl.sin(s), gl.cos(s) * gl.cos(x) * t


def sin_sin_np(x: float) -> float:
    return np.sin(np.sin(x))


@pytest.mark.parametrize("mode", ["eager", "executor"])
def test_second_order_through_a_custom_jvp_rule(mode):
    want = central(lambda x: central(sin_sin_np, x), X)
    x = t64(X)
    for second in [
        gl.hessian(sin_sin),
        lambda x: gl.jvp(gl.grad(sin_sin), (x,), (gl.ones_like(x),))[1],
        gl.grad(gl.grad(sin_sin)),
        gl.jacfwd(gl.grad(sin_sin)),
    ]:
        np.testing.assert_allclose(float(staged(mode, second)(x)), want, rtol=1e-5)


@gl.custom_gradient
def square(x):
    return x * x, lambda g: 2.0 * x * g


@pytest.mark.parametrize("mode", ["eager", "executor", "compiled"])
def test_reverse_mode_through_recompute_grad_of_a_custom_gradient(mode):
    f = lambda x: gl.sum(gl.recompute_grad(lambda x: square(gl.sin(x)))(x))  # noqa: E731
    got = float(staged(mode, gl.grad(f))(t64(X)))
    np.testing.assert_allclose(got, central(lambda x: np.sin(x) ** 2, X), rtol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "executor"])
def test_forward_mode_through_recompute_grad_in_loops_and_conds(mode):
    layer = gl.recompute_grad(lambda h: gl.sin(h) * 1.1)

    def loop(x):
        return gl.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, layer(h)), (0, x))[1]

    def branch(x):
        return gl.cond(x > 0.0, lambda: layer(x) * 2.0, lambda: layer(x))

    def loop_np(x):
        for _ in range(3):
            x = np.sin(x) * 1.1
        return x

    for fn, ref in [(loop, loop_np), (branch, lambda x: 2.2 * np.sin(x))]:
        jvp = staged(mode, lambda x, fn=fn: gl.jvp(fn, (x,), (gl.ones_like(x),))[1])
        np.testing.assert_allclose(float(jvp(t64(X))), central(ref, X), rtol=1e-6)


@pytest.mark.parametrize(
    "rule",
    [
        lambda p, t: (gl.sin(p[0]), t[0], t[0]),  # three values
        lambda p, t: (gl.sin(p[0]), gl.ones((3,), dtype=gl.float64)),  # tangent of a wrong shape
        lambda p, t: (gl.ones((2,), dtype=gl.float64), gl.ones((2,), dtype=gl.float64)),  # primal
    ],
)
@pytest.mark.parametrize("how", ["grad", "graph loop grad"])
def test_malformed_custom_jvp_rules_raise_type_errors(rule, how):
    @gl.custom_jvp
    def f(x):
        return gl.sin(x)

    f.defjvp(rule)
    x = t64(X)
    if how == "grad":
        run = gl.grad(f)
    else:
        loop = lambda x: gl.while_loop(lambda i, h: i < 2, lambda i, h: (i + 1, f(h)), (0, x))[1]  # noqa: E731
        run = gl.function(gl.grad(loop))
    with pytest.raises(TypeError, match=r"custom_jvp\(f\)") as caught:
        run(x)
    assert isinstance(caught.value, gl.errors.GradientTypeError)
    assert "test_captured_values.py" in str(caught.value)


@pytest.mark.parametrize(
    "rule",
    [
        lambda p, t: (gl.sin(p[0]), gl.ones((3,), dtype=gl.float64)),  # tangent's shape
        lambda p, t: (gl.ones((2,), dtype=gl.float64), gl.ones((2,), dtype=gl.float64)),  # primal
        lambda p, t: gl.sin(p[0]),  # not a pair
    ],
)
def test_malformed_rule_under_forward_mode_is_a_type_error(rule):
    @gl.custom_jvp
    def f(x):
        return gl.sin(x)

    f.defjvp(rule)
    with pytest.raises(gl.errors.GradientTypeError, match=r"custom_jvp\(f\): .*rule"):
        gl.jvp(f, (t64(X),), (t64(1.0),))


# ---- allocations the machine cannot give --------------------------------------------------------

_ALLOCATIONS = {
    "ones": "gl.ones(10**12)",
    "zeros": "gl.zeros((10**6, 10**6))",
    "arange": "gl.arange(-10**12, 3)",
    "broadcast_to": "gl.broadcast_to(gl.tensor([1.0]), (10**6, 10**6))",
    "graph": "gl.function(lambda x: gl.zeros((10**6, 10**6)) + x)(gl.tensor(1.0))",
    "overflow": "gl.zeros((2**62, 4))",
}


@pytest.mark.parametrize("name", sorted(_ALLOCATIONS))
def test_an_allocation_too_large_raises_and_the_process_lives(name):
    """In a child process: an abort there fails the test instead of killing the suite."""
    code = (
        "import gradloop as gl\n"
        "x = gl.tensor([1.0, 2.0])\n"
        "try:\n"
        f"    {_ALLOCATIONS[name]}\n"
        "except MemoryError as e:\n"
        "    assert isinstance(e, gl.errors.ResourceExhaustedError), type(e)\n"
        "    print('raised:', e)\n"
        "print('alive', float(gl.sum(x)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "raised:" in done.stdout and "bytes" in done.stdout, done.stdout
    assert "<string>" in done.stdout  # the user's line
    assert "alive 3.0" in done.stdout


@pytest.mark.parametrize("mode", ["eager", "executor", "compiled"])
def test_recompute_grad_differentiates_what_its_function_closes_over(mode):
    w0 = np.array([[0.5, 0.1], [-0.3, 0.8]])
    x = t64([0.7, -0.2])

    def f(w):
        layer = gl.recompute_grad(lambda h: gl.tanh(gl.matmul(w, h[:, None])[:, 0]))  # w closed
        h = gl.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, layer(h)), (0, x))[1]
        return gl.sum(h)

    def f_np(w):
        h = np.array([0.7, -0.2])
        for _ in range(3):
            h = np.tanh(w @ h)
        return h.sum()

    want = np.zeros_like(w0)
    for idx in np.ndindex(*w0.shape):
        e = np.zeros_like(w0)
        e[idx] = EPS
        want[idx] = (f_np(w0 + e) - f_np(w0 - e)) / (2 * EPS)
    got = np.asarray(staged(mode, gl.grad(f))(t64(w0)))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
    tangent = staged(mode, lambda w: gl.jvp(f, (w,), (gl.ones_like(w),))[1])(t64(w0))
    np.testing.assert_allclose(float(tangent), want.sum(), rtol=1e-6)


_GROWING_LOOP = """
import resource
import numpy as np
import gradloop as gl

def vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

limit = vm_bytes() + (2 << 30)  # 2 GiB more address space than the process has now
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
x = gl.tensor(np.linspace(0.0, 1.0, 1 << 17))  # 1 MiB kept per trip

def loss(x):
    def body(i, h):
        return i + 1, gl.sin(h) * 1.0001
    return gl.sum(gl.while_loop(lambda i, h: i < 100000, body, (0, x))[1])

run = {mode}
try:
    run(x)
except MemoryError as e:
    assert isinstance(e, gl.errors.ResourceExhaustedError), type(e)
    print("raised:", e)
print("alive", float(gl.sum(x[:2] * 0.0 + 1.5)))
"""


@pytest.mark.parametrize(
    "mode", ["gl.grad(loss)", "gl.function(gl.grad(loss))"], ids=["eager tape", "graph stacks"]
)
def test_a_loop_whose_gradient_outgrows_memory_raises(mode):
    """The eager tape and graph mode's stacks grow by small allocations; each checks, as it
    doubles, that the machine could give as much again, and stops with an error while the
    kernels still have room (in a child process with 2 GiB of address space to spare)."""
    code = _GROWING_LOOP.replace("{mode}", mode)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "raised:" in done.stdout and "bytes" in done.stdout, done.stdout
    assert "checkpoints" in done.stdout  # the way out is named
    assert "alive 3.0" in done.stdout


_SIZED_CALLS = """
import resource
import gradloop as gl

for line in open("/proc/self/status"):
    if line.startswith("VmSize:"):
        limit = int(line.split()[1]) * 1024 + (1 << 30)  # 1 GiB to spare: large sizes fail fast
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
cases = {cases!r}
x = gl.tensor([1.0, 2.0])
made = {{
    "zeros": lambda s: gl.zeros(s),
    "ones": lambda s: gl.ones(s, dtype=gl.float64),
    "full": lambda s: gl.full(s, 1.5),
    "broadcast_to": lambda s: gl.broadcast_to(x[:1], s),
    "arange": lambda s: gl.arange(0, s[0] * (s[-1] if len(s) > 1 else 1)),
    "graph": lambda s: gl.function(lambda t: gl.zeros(s) + t)(gl.tensor(1.0)),
    "outer": lambda s: gl.zeros(s[:1] + (1,)) * gl.reshape(gl.zeros(s[-1:]), (1, s[-1])),
    "matmul": lambda s: gl.matmul(gl.ones((s[0], 1)), gl.ones((1, s[-1]))),
}}
counts = {{"made": 0, "memory": 0, "refused": 0}}
for name, shape in cases:
    try:
        made[name](tuple(shape))
        counts["made"] += 1
    except MemoryError as e:
        assert isinstance(e, gl.errors.ResourceExhaustedError), (name, shape, type(e))
        assert "bytes" in str(e), str(e)
        counts["memory"] += 1
    except gl.errors.GradloopError:
        counts["refused"] += 1  # a shape the op refuses for another reason (named, typed)
print(counts)
"""


def test_random_sizes_never_abort():
    """The bad-input draw of sizes: creation ops, broadcasts, products and graph mode over random
    shapes whose sizes span 0 to past what an address can count. Each call makes its tensor or
    raises a gradloop error (ResourceExhaustedError when too large), in one child process with 1 GiB
    of address space to spare that must survive them all."""
    rng = np.random.default_rng(52)
    dims = [0, 1, 7, 1000, 10**6, 10**9, 2**31, 2**40, 2**62]
    names = ["zeros", "ones", "full", "broadcast_to", "arange", "graph", "outer", "matmul"]
    cases = []
    for _ in range(120):
        rank = int(rng.integers(1, 4))
        shape = [int(dims[i]) for i in rng.integers(0, len(dims), rank)]
        cases.append((names[int(rng.integers(0, len(names)))], shape))
    code = _SIZED_CALLS.format(cases=cases)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert counts["made"] > 0 and counts["memory"] > 0, counts
    assert sum(counts.values()) == len(cases)


_SMALL_ALLOCATIONS = """
import resource
import numpy as np
import gradloop as gl

for line in open("/proc/self/status"):
    if line.startswith("VmSize:"):
        limit = int(line.split()[1]) * 1024 + (1 << 30)
x = gl.tensor(np.linspace(0.0, 1.0, 1 << 17))  # 1 MiB: below the size asked for in advance
step = {step}
kept = []
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
for attempt in range(2):  # the second: memory set aside again once the first results are freed
    try:
        while len(kept) < 100000:
            kept.append(step(x))
    except MemoryError as e:
        assert isinstance(e, gl.errors.ResourceExhaustedError), type(e)
        print("raised:", e)
    print("kept", len(kept))
    kept.clear()
print("alive", float(gl.sum(step(x)[:2] * 0.0 + 1.5)))
"""


@pytest.mark.parametrize(
    "step",
    [
        "gl.sin",
        "gl.function(lambda t: gl.sin(t) * 2.0)",
        "lambda t: gl.grad(lambda u: gl.sum(u * t))(t)",
    ],
    ids=["eager", "graph", "gradient"],
)
def test_small_allocations_that_exhaust_memory_raise(step):
    """Many results under the size asked for in advance, kept until the system refuses one:
    the allocator's reserve lets the op finish, and the op raises instead of the process
    aborting. Memory is usable again once the results are dropped."""
    code = _SMALL_ALLOCATIONS.replace("{step}", step)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("raised:") == 2 and "1048576 bytes" in done.stdout, done.stdout
    assert "<string>" in done.stdout  # the user's line
    assert "alive 3.0" in done.stdout, done.stdout
