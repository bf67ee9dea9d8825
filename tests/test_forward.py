"""Forward mode: `gl.jvp`, `linearize`, `jacfwd`, `jacrev`, `hessian`, `custom_jvp`, through
`cond`, `switch_case` and data-dependent `while_loop`s, eagerly, traced (`gl.function` on each
graph runner) and compiled (`gl.jit`, on IREE and on XLA); everything against central finite
differences in float64 or against reverse mode. The per-op tangent rules are checked in
`test_op_gradients.py`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings

import gradloop as gl
from gradcheck import numerical_gradient
from program_fuzz import Program, forward_ok, is_pure, programs
from runners import run_on, staged

X = np.array([0.41, -0.23, 0.37])
V = np.array([0.7, -1.1, 0.4])

RUNNERS = ("executor", "frames", "interpreter")


MODES = ("eager", *RUNNERS, "compiled")


def directional(fn, x: np.ndarray, v: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    plus = np.asarray(fn(gl.tensor(x + eps * v)))
    minus = np.asarray(fn(gl.tensor(x - eps * v)))
    return (plus - minus) / (2 * eps)


def loop_program(x: gl.Tensor) -> gl.Tensor:
    """A data-dependent loop (its trip count depends on x) with a cond and a switch inside."""

    def body(i, h):
        h = gl.cond(gl.sum(h) > 0.0, lambda: gl.sin(h) * 0.9 + x * 0.1, lambda: h * h - 0.2)
        index = gl.cast(gl.abs(h[0]) * 3.0, gl.int32)
        h = gl.switch_case(index, [lambda: h + 0.1, lambda: gl.tanh(h), lambda: h * 0.5])
        return i + 1, h

    n = gl.cast(gl.abs(gl.sum(x)) * 10.0, gl.int32) + 2
    return gl.while_loop(lambda i, h: i < n, body, (gl.tensor(0, dtype=gl.int32), x))[1]


# ---- jvp through control flow, in every mode ------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_jvp_through_a_data_dependent_loop_matches_finite_differences(mode: str) -> None:
    run = staged(mode, lambda x, v: gl.jvp(loop_program, (x,), (v,)))
    y, t = run(gl.tensor(X), gl.tensor(V))
    np.testing.assert_allclose(np.asarray(y), np.asarray(loop_program(gl.tensor(X))), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(t), directional(loop_program, X, V), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("mode", MODES)
def test_hessian_through_a_data_dependent_loop(mode: str) -> None:
    def loss(x):
        return gl.sum(loop_program(x) ** 3)

    got = np.asarray(staged(mode, gl.hessian(loss))(gl.tensor(X)))
    # each column: the directional difference of the gradient
    grad = gl.grad(loss)
    expected = np.stack([directional(grad, X, e) for e in np.eye(3)], axis=1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got, got.T, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("mode", ("eager", "frames", "compiled"))
def test_reverse_over_forward_through_a_loop(mode: str) -> None:
    def directional_derivative(x):
        return gl.sum(gl.jvp(loop_program, (x,), (gl.tensor(V),))[1])

    got = np.asarray(staged(mode, gl.grad(directional_derivative))(gl.tensor(X)))
    expected = numerical_gradient(lambda x: float(directional_derivative(gl.tensor(x))), [X])[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ("eager", "frames", "compiled"))
def test_loop_with_maximum_iterations_and_integer_state(mode: str) -> None:
    def f(x):
        def body(i, count, h):
            return i + 1, count + 2, h * gl.cos(h) + x

        _, count, h = gl.while_loop(
            lambda i, c, h: gl.sum(h) < 5.0,
            body,
            (gl.tensor(0, dtype=gl.int32), gl.tensor(0, dtype=gl.int64), x),
            maximum_iterations=7,
        )
        return h, count

    (_, count), (th, tcount) = staged(mode, lambda x, v: gl.jvp(f, (x,), (v,)))(
        gl.tensor(X), gl.tensor(V)
    )
    assert tcount is None  # integers have no tangent
    assert count.dtype == gl.int64
    np.testing.assert_allclose(
        np.asarray(th), directional(lambda x: f(x)[0], X, V), rtol=1e-6, atol=1e-8
    )


# ---- jvp and vjp agree on random programs ----------------------------------------------------


def _everything(program: Program) -> Any:
    """`<grad, v>` by forward and by reverse mode, a Hessian-vector product three ways (forward
    over reverse, reverse over reverse, reverse over forward) and `v H v` (forward over
    forward)."""
    v = gl.tensor(V)

    def everything(x):
        jvp = lambda y: gl.jvp(program, (y,), (v,))[1]  # noqa: E731
        t = jvp(x)
        g = gl.grad(program)(x)
        _, hv_fwd = gl.jvp(gl.grad(program), (x,), (v,))  # forward over reverse
        hv_rev = gl.grad(lambda y: gl.sum(gl.grad(program)(y) * v))(x)  # reverse over reverse
        hv_rf = gl.grad(jvp)(x)  # reverse over forward
        _, vhv = gl.jvp(jvp, (x,), (v,))  # forward over forward
        return t, gl.sum(g * v), hv_fwd, hv_rev, hv_rf, vhv

    return everything


def _jvp_vjp(program: Program, stage) -> list[Any]:
    """`_everything` of `program` run as `stage` runs it."""
    program.reset()
    t, gv, hf, hr, hrf, vhv = stage(_everything(program))(gl.tensor(X))
    return [float(t), float(gv), *map(np.asarray, (hf, hr, hrf)), float(vhv)]


def _nodes(fn: Any) -> int:
    graph = gl.function(fn).graph(gl.tensor(X))
    return sum(graph.num_nodes(f) for f in graph.function_names())


def _assert_derivatives_grow_linearly(program: Program) -> None:
    # Each derivative's graph is a few times the program's, whatever the constructs' nesting:
    # a transform that builds a construct's functions again for each enclosing construct
    # grows exponentially with the nesting (jvp of jvp made 395,799 nodes of a 68-node program).
    program.reset()
    plain = _nodes(program)
    program.reset()
    derived = _nodes(_everything(program))
    assert derived <= 100 * plain + 2000, (derived, plain)


def _check_program(spec, modes) -> None:
    program = Program(spec)
    eager = _jvp_vjp(program, lambda f: f)
    np.testing.assert_allclose(eager[0], eager[1], rtol=1e-9, atol=1e-12, err_msg=str(spec))
    for k, what in [(3, "reverse over reverse"), (4, "reverse over forward")]:
        np.testing.assert_allclose(
            eager[k], eager[2], rtol=1e-8, atol=1e-11, err_msg=f"{what}: {spec}"
        )
    np.testing.assert_allclose(
        eager[5],
        np.dot(eager[2], V),
        rtol=1e-8,
        atol=1e-11,
        err_msg=f"forward over forward: {spec}",
    )
    if is_pure(spec):  # rules that are true derivatives: finite differences agree
        program.reset()
        fd = float(np.dot(numerical_gradient(lambda x: float(program(gl.tensor(x))), [X])[0], V))
        np.testing.assert_allclose(eager[0], fd, rtol=1e-5, atol=1e-6, err_msg=str(spec))
    for mode in modes:
        if mode == "compiled":
            stage = gl.jit
        elif mode == "xla":

            def stage(fn):
                return gl.jit(fn, backend="xla")

        else:

            def stage(fn, mode=mode):
                traced = gl.function(fn)
                return lambda *a: run_on(mode, traced, *a)

        got = _jvp_vjp(program, stage)
        names = ("jvp", "vjp", "hvp fwd", "hvp rev", "hvp rev/fwd", "vHv fwd/fwd")
        for what, e, g in zip(names, eager, got, strict=True):
            np.testing.assert_allclose(
                g, e, rtol=1e-7, atol=1e-10, err_msg=f"{mode} {what} != eager: {spec}"
            )


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
        database=None,
    )


FUZZ_SEED = int(os.environ.get("GRADLOOP_FUZZ_SEED", "20261126"))


def test_jvp_and_vjp_agree_on_random_programs_in_graph_mode() -> None:
    @seed(FUZZ_SEED)
    @_settings(25)
    @given(spec=programs().filter(forward_ok))
    def check(spec) -> None:
        _check_program(spec, ("frames", "interpreter"))
        _assert_derivatives_grow_linearly(Program(spec))

    check()


@pytest.mark.long
@pytest.mark.timeout(1200)  # 150-180 s on a 2-core VM, one module of up to 45,000 lines
def test_jvp_and_vjp_agree_on_random_programs_compiled() -> None:
    @seed(FUZZ_SEED + 1)
    @_settings(6)
    @given(spec=programs(max_leaves=5, heavy=False).filter(forward_ok))
    def check(spec) -> None:
        _check_program(spec, ("compiled",))

    check()


@pytest.mark.long
def test_jvp_and_vjp_agree_on_random_programs_on_xla() -> None:
    pytest.importorskip("jax", reason="backend='xla' runs on jaxlib (gradloop[jax])")

    @seed(FUZZ_SEED + 2)
    @_settings(10)
    @given(spec=programs(max_leaves=5, heavy=False).filter(forward_ok))
    def check(spec) -> None:
        _check_program(spec, ("xla",))

    check()


# ---- the API --------------------------------------------------------------------------------


def test_jvp_takes_nested_structures_and_gives_none_for_integers() -> None:
    def f(p, n):
        return {"y": p["a"] * gl.sin(p["b"][0]), "n": n * 2, "z": gl.sum(p["b"][1])}

    a, b0, b1 = (gl.tensor(np.array(v)) for v in ([1.0, 2.0], [0.5, 0.25], [3.0]))
    ta, tb0, tb1 = (gl.tensor(np.array(v)) for v in ([0.1, 0.2], [1.0, -1.0], [2.0]))
    n = gl.tensor(3, dtype=gl.int32)
    out, tan = gl.jvp(f, ({"a": a, "b": [b0, b1]}, n), ({"a": ta, "b": [tb0, tb1]}, None))
    assert set(tan) == {"y", "n", "z"} and tan["n"] is None
    expected = np.array([0.1, 0.2]) * np.sin([0.5, 0.25]) + np.array([1.0, 2.0]) * np.cos(
        [0.5, 0.25]
    ) * np.array([1.0, -1.0])
    np.testing.assert_allclose(np.asarray(tan["y"]), expected, rtol=1e-12)
    np.testing.assert_allclose(float(tan["z"]), 2.0)
    assert int(out["n"]) == 6


def test_an_output_nothing_perturbs_has_zero_tangent() -> None:
    x = gl.tensor(X)
    _, (t_const, t_x) = gl.jvp(lambda x: (gl.ones_like(x) * 2.0, x), (x,), (gl.tensor(V),))
    np.testing.assert_array_equal(np.asarray(t_const), np.zeros(3))
    np.testing.assert_array_equal(np.asarray(t_x), V)


def test_the_callers_tensor_keeps_no_tangent() -> None:
    x = gl.tensor(X)
    captured = []
    gl.jvp(lambda y: captured.append(y) or y * 2.0, (x,), (gl.tensor(V),))
    # x itself is not the perturbed value: a later jvp that closes over it sees a constant
    _, t = gl.jvp(lambda y: y * x, (gl.tensor(X),), (gl.tensor(V),))
    np.testing.assert_allclose(np.asarray(t), V * X)


@pytest.mark.parametrize(
    "primals, tangents, error, text",
    [
        ((np.ones(3),), (np.ones(2),), gl.errors.GradientError, "tangent"),
        ((np.ones(3),), (None,), gl.errors.GradientError, "None"),
        ((np.ones(3),), (np.ones(3), np.ones(3)), gl.errors.InvalidArgumentError, "2 tangents"),
        (np.ones(3), np.ones(3), gl.errors.InvalidArgumentError, "tuples"),
        (
            (gl.tensor(np.array([1, 2], dtype=np.int32)),),
            (np.ones(2),),
            gl.errors.GradientError,
            "no tangent",
        ),
    ],
)
def test_jvp_rejects_bad_tangents(primals, tangents, error, text) -> None:
    with pytest.raises(error, match=text):
        gl.jvp(lambda *a: a[0] * 2, primals, tangents)


def test_linearize_matches_jvp() -> None:
    y, f_jvp = gl.linearize(loop_program, gl.tensor(X))
    np.testing.assert_allclose(np.asarray(y), np.asarray(loop_program(gl.tensor(X))))
    for v in (V, np.array([1.0, 0.0, 0.0])):
        expected = gl.jvp(loop_program, (gl.tensor(X),), (gl.tensor(v),))[1]
        np.testing.assert_allclose(np.asarray(f_jvp(gl.tensor(v))), np.asarray(expected))


@pytest.mark.parametrize("mode", ("eager", "frames", "compiled"))
def test_jacfwd_and_jacrev_agree_with_finite_differences(mode: str) -> None:
    def f(x, w):
        return gl.tanh(gl.matmul(w, x)) * gl.sum(x), gl.sum(w * w)

    x = gl.tensor(X)
    w = gl.tensor(np.arange(6.0).reshape(2, 3) * 0.1)
    fwd = staged(mode, gl.jacfwd(f, argnums=(0, 1)))(x, w)
    rev = staged(mode, gl.jacrev(f, argnums=(0, 1)))(x, w)
    assert np.asarray(fwd[0][0]).shape == (2, 3) and np.asarray(fwd[0][1]).shape == (2, 2, 3)
    assert np.asarray(fwd[1][1]).shape == (2, 3)
    for out in range(2):
        for arg in range(2):
            np.testing.assert_allclose(
                np.asarray(fwd[out][arg]), np.asarray(rev[out][arg]), rtol=1e-12, atol=1e-14
            )
    # d first output / dx, column by column
    cols = [directional(lambda x: f(x, w)[0], X, e) for e in np.eye(3)]
    np.testing.assert_allclose(np.asarray(fwd[0][0]), np.stack(cols, axis=-1), rtol=1e-6)


@pytest.mark.parametrize("n", (3, 70))
def test_traced_jacfwd_unrolled_or_batched_matches_eager(n: int) -> None:
    # a traced jacfwd unrolls up to 64 columns and batches wider inputs through vmap
    def f(x):
        def body(i, v):
            return i + 1, gl.sin(v) * x + 0.1 * v

        _, v = gl.while_loop(lambda i, v: i < 3, body, (gl.tensor(0), x))
        return v[: n - 1] * gl.sum(x)

    x = gl.tensor(np.linspace(0.1, 0.9, n))
    traced = np.asarray(gl.function(gl.jacfwd(f))(x))
    eager = np.asarray(gl.jacfwd(f)(x))
    rev = np.asarray(gl.jacrev(f)(x))
    assert traced.shape == (n - 1, n)
    np.testing.assert_allclose(traced, eager, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(traced, rev, rtol=1e-12, atol=1e-14)
    e = np.eye(n)[n // 2]
    column = directional(f, np.linspace(0.1, 0.9, n), e)
    np.testing.assert_allclose(traced[:, n // 2], column, rtol=1e-6)


def test_hessian_of_a_quadratic_form_is_exact() -> None:
    a = np.array([[2.0, 0.5, 0.0], [0.5, 1.0, -0.3], [0.0, -0.3, 3.0]])
    at = gl.tensor(a)
    h = gl.hessian(lambda x: 0.5 * gl.sum(x * gl.matmul(at, x)))(gl.tensor(X))
    np.testing.assert_allclose(np.asarray(h), a, rtol=1e-13)


def test_forward_mode_composes_with_itself() -> None:
    # d3/dx3 sin(x) = -cos(x), as jvp of jvp of jvp
    def d(f):
        return lambda x: gl.jvp(f, (x,), (gl.ones_like(x),))[1]

    x = gl.tensor(np.array([0.3, 1.2]))
    np.testing.assert_allclose(np.asarray(d(d(d(gl.sin)))(x)), -np.cos([0.3, 1.2]), rtol=1e-12)


# ---- custom rules ----------------------------------------------------------------------------


@gl.custom_jvp
def log1pexp(x):
    return gl.log(1.0 + gl.exp(x))


@log1pexp.defjvp
def _log1pexp_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return log1pexp(x), t * gl.sigmoid(x)  # stable where exp(x) overflows


@pytest.mark.parametrize("mode", ("eager", "frames", "compiled"))
def test_custom_jvp_rule_is_used(mode: str) -> None:
    x = gl.tensor(np.array([1.0, 800.0]))
    run = staged(mode, lambda x, v: gl.jvp(log1pexp, (x,), (v,)))
    _, t = run(x, gl.ones_like(x))
    np.testing.assert_allclose(np.asarray(t), 1.0 / (1.0 + np.exp(-np.array([1.0, 800.0]))))
    # without the rule the derivative at 800 is nan (inf / inf)
    _, plain = gl.jvp(lambda x: gl.log(1.0 + gl.exp(x)), (x,), (gl.ones_like(x),))
    assert np.isnan(np.asarray(plain)[1])


@gl.custom_jvp
def doubled_sin(x):
    return gl.sin(x)


@doubled_sin.defjvp
def _doubled_sin_jvp(primals, tangents):
    # deliberately twice the true derivative, so that ignoring the rule shows
    return doubled_sin(primals[0]), 2.0 * gl.cos(primals[0]) * tangents[0]


@pytest.mark.parametrize("mode", ("eager", "frames", "compiled"))
def test_reverse_mode_transposes_the_custom_jvp_rule(mode: str) -> None:
    x = gl.tensor(np.array([1.0, 800.0]))
    g = staged(mode, gl.grad(lambda x: gl.sum(log1pexp(x))))(x)
    np.testing.assert_allclose(np.asarray(g), 1.0 / (1.0 + np.exp(-np.array([1.0, 800.0]))))
    g = staged(mode, gl.grad(lambda x: gl.sum(doubled_sin(x) * x)))(x)
    expected = 2.0 * np.cos([1.0, 800.0]) * [1.0, 800.0] + np.sin([1.0, 800.0])
    np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-12)


@pytest.mark.parametrize("mode", ("eager", "frames"))
def test_second_order_reverse_mode_differentiates_the_rule(mode: str) -> None:
    x = gl.tensor(np.array([0.5, -1.0]))
    loss = lambda x: gl.sum(log1pexp(x))  # noqa: E731
    s = 1.0 / (1.0 + np.exp(-np.array([0.5, -1.0])))
    h = staged(mode, gl.hessian(loss))(x)
    np.testing.assert_allclose(np.asarray(h), np.diag(s * (1 - s)), rtol=1e-12, atol=1e-15)
    d2 = staged(mode, gl.grad(lambda y: gl.sum(gl.grad(loss)(y))))(x)
    np.testing.assert_allclose(np.asarray(d2), s * (1 - s), rtol=1e-12)


def test_custom_jvp_second_order_goes_through_its_rule() -> None:
    x = gl.tensor(np.array([0.5, -1.0]))
    d2 = gl.jvp(lambda y: gl.jvp(log1pexp, (y,), (gl.ones_like(y),))[1], (x,), (gl.ones_like(x),))[
        1
    ]
    s = 1.0 / (1.0 + np.exp(-np.array([0.5, -1.0])))
    np.testing.assert_allclose(np.asarray(d2), s * (1 - s), rtol=1e-12)


def test_custom_jvp_without_a_rule_is_a_clear_error() -> None:
    @gl.custom_jvp
    def f(x):
        return x * 2.0

    np.testing.assert_allclose(np.asarray(f(gl.tensor(X))), 2 * X)
    with pytest.raises(gl.errors.GradientError, match="defjvp"):
        gl.jvp(f, (gl.tensor(X),), (gl.tensor(V),))


@pytest.mark.parametrize("mode", ("eager", "frames"))
def test_custom_gradient_is_an_error_in_forward_mode(mode: str) -> None:
    @gl.custom_gradient
    def f(x):
        return x * 2.0, lambda dy: dy * 2.0

    run = staged(mode, lambda x, v: gl.jvp(f, (x,), (v,)))
    with pytest.raises(gl.errors.GradientError, match="custom_jvp"):
        run(gl.tensor(X), gl.tensor(V))


def test_recompute_grad_runs_as_it_is_in_forward_mode() -> None:
    f = gl.recompute_grad(lambda x: gl.sin(x) * x)
    _, t = gl.jvp(f, (gl.tensor(X),), (gl.tensor(V),))
    np.testing.assert_allclose(np.asarray(t), (np.cos(X) * X + np.sin(X)) * V, rtol=1e-12)


@pytest.mark.parametrize("mode", ("eager", "frames"))
def test_assigning_a_value_with_a_tangent_is_an_error(mode: str) -> None:
    var = gl.Variable(np.zeros(3))

    def f(x):
        var.assign(x * 2.0)
        return x

    with pytest.raises(gl.errors.GradientError, match="Variables"):
        staged(mode, lambda x, v: gl.jvp(f, (x,), (v,)))(gl.tensor(X), gl.tensor(V))


@pytest.mark.parametrize("mode", ("eager", "compiled"))
def test_jit_inside_jvp_and_grad_is_differentiated(mode: str) -> None:
    # a gl.jit function called under a tape or inside jvp runs its ops, not its module
    f = gl.jit(lambda x: gl.sum(gl.sin(x) * x))
    x = gl.tensor(X)
    expected = np.dot(np.cos(X) * X + np.sin(X), V)
    _, t = staged(mode, lambda x, v: gl.jvp(f, (x,), (v,)))(x, gl.tensor(V))
    np.testing.assert_allclose(float(t), expected, rtol=1e-12)
    g = staged(mode, gl.grad(f))(x)
    np.testing.assert_allclose(np.asarray(g), np.cos(X) * X + np.sin(X), rtol=1e-12)


# ---- memory -----------------------------------------------------------------------------------

_RSS = textwrap.dedent(
    """
    import sys, numpy as np, gradloop as gl
    trips, mode = int(sys.argv[1]), sys.argv[2]

    def f(x, n):
        def body(i, h):
            return i + 1, gl.sin(h) * 0.5 + x * 0.1
        return gl.while_loop(lambda i, h: i < n, body, (gl.tensor(0, dtype=gl.int64), x))[1]

    def forward(x, v, n):
        return gl.jvp(lambda x: f(x, n), (x,), (v,))[1]

    def reverse(x, v, n):  # the control: a tape keeps every trip's values
        with gl.GradientTape() as tape:
            tape.watch(x)
            y = gl.sum(f(x, n) * v)
        return tape.gradient(y, x)

    stage = {"frames": gl.function, "compiled": gl.jit}.get(mode, lambda fn: fn)
    run = stage(reverse if mode == "reverse" else forward)
    x = gl.tensor(np.linspace(-1.0, 1.0, 64))
    run(x, gl.ones_like(x), gl.tensor(2, dtype=gl.int64))  # traced and compiled, 2 trips

    def status_kb(field):
        with open("/proc/self/status") as status:
            return next(int(ln.split()[1]) for ln in status if ln.startswith(field + ":"))

    # The peak starts again from the current size (Linux's clear_refs): a peak reached before
    # the call (imports, the warm-up) cannot hide the call's own growth.
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    before = status_kb("VmRSS")
    t = run(x, gl.ones_like(x), gl.tensor(trips, dtype=gl.int64))
    after = status_kb("VmHWM")
    assert np.all(np.isfinite(np.asarray(t)))
    print(after - before)
    """
)


def _peak_growth_kib(mode: str, trips: int) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _RSS, str(trips), mode],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return int(out.stdout.split()[-1])


#: The peak-memory tests reset the peak with Linux's /proc/self/clear_refs.
_PEAK_RESET = pytest.mark.skipif(
    not os.path.exists("/proc/self/clear_refs"),
    reason="measures peak memory with Linux's /proc/self/clear_refs (a peak reset)",
)


@_PEAK_RESET
@pytest.mark.parametrize("mode, trips", [("compiled", 10**6), ("frames", 10**5), ("eager", 10**5)])
def test_a_long_loop_runs_in_constant_memory_in_forward_mode(mode: str, trips: int) -> None:
    # Each trip's state is 64 float64s (512 bytes): kept for every trip, 10^5 trips would hold
    # 50 MB, as reverse mode's tape does (the control below). Forward mode keeps none.
    growth = _peak_growth_kib(mode, trips)
    assert growth < 8 * 1024, f"peak RSS grew by {growth} KiB over {trips} trips"


@_PEAK_RESET
def test_the_memory_measure_sees_a_tape_grow() -> None:
    growth = _peak_growth_kib("reverse", 10**5)
    assert growth > 40 * 1024, f"a tape over 10^5 trips grew the peak RSS by only {growth} KiB"


def test_fuzz_found_forward_over_reverse_through_a_rule_with_an_intermediate() -> None:
    # The rule's `sin(t)` was computed outside its accumulator while an inner tape recorded it:
    # forward over reverse dropped its dependence on the primal.
    _check_program(("leaf", "sin_sin"), ("frames", "interpreter", "compiled"))


def _nested_on_the_fly(inner: str):
    """custom_jvps made while the function runs, nested inside each other: `h` closes over the
    outer function's `x` and over `g`'s argument `z`, `g` over `x`; an inner transform (`inner`)
    differentiates through `g`'s rule and the outer one through everything those rules close
    over (JAX's pattern of rules that close over tracers of an enclosing transform)."""

    def outer(x):
        def inner_fn(y):
            @gl.custom_jvp
            def g(z):
                @gl.custom_jvp
                def h(u):
                    return gl.sin(u) * x * z

                @h.defjvp
                def h_jvp(p, t):
                    (u,), (du,) = p, t
                    return h(u), gl.cos(u) * x * z * du

                return h(z)

            @g.defjvp
            def g_jvp(p, t):
                (z,), (dz,) = p, t
                return g(z), (gl.cos(z) * z + gl.sin(z)) * x * dz

            return g(y)

        if inner == "grad":
            return gl.grad(lambda y: gl.sum(inner_fn(y)))(x * 2.0)
        return gl.jvp(inner_fn, (x * 2.0,), (gl.ones_like(x),))[1]

    return outer


@pytest.mark.parametrize("inner", ["grad", "jvp"])
@pytest.mark.parametrize("mode", MODES)
def test_nested_on_the_fly_custom_jvps_closing_over_each_other(mode: str, inner: str) -> None:
    outer = _nested_on_the_fly(inner)

    def reference(x):  # d/dy of sum(sin(y) x y) at y = 2x
        y = 2.0 * x
        return x * (np.cos(y) * y + np.sin(y))

    x = np.array([0.7, -0.4])
    np.testing.assert_allclose(np.asarray(staged(mode, outer)(gl.tensor(x))), reference(x))
    want = directional(reference, x, np.ones(2))
    got = staged(mode, lambda x: gl.jvp(outer, (x,), (gl.ones_like(x),))[1])(gl.tensor(x))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    got = staged(mode, gl.grad(lambda x: gl.sum(outer(x))))(gl.tensor(x))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)  # the Jacobian is diagonal


def _nested(x: Any, depth: int) -> Any:
    """`depth` conds and loops nested in each other, each closing over `x`."""
    if depth == 0:
        return gl.sin(x) * x
    inner = lambda: _nested(x * 0.9, depth - 1)  # noqa: E731
    if depth % 2:
        return gl.cond(gl.sum(x) > -10.0, inner, lambda: gl.cos(x))
    body = lambda i, y: (i + 1, y + _nested(x, depth - 1) * 0.1)  # noqa: E731
    return gl.while_loop(lambda i, y: i < 2, body, (gl.tensor(0), x))[1]


def test_forward_mode_through_nested_constructs_grows_linearly_with_the_nesting() -> None:
    # Each construct's tangent is built from its functions' nodes once. Tangents built inline
    # while a branch or body was traced (by the accumulators outside it) were differentiated
    # again by every enclosing construct: jvp of jvp of five nested constructs made 10^5 nodes.
    v = gl.tensor(V)

    def second(x: Any) -> Any:
        first = lambda y: gl.jvp(lambda z: gl.sum(_nested(z, 5)), (y,), (v,))[1]  # noqa: E731
        return gl.jvp(first, (x,), (v,))[1]

    graph = gl.function(second).graph(gl.tensor(X))
    nodes = sum(graph.num_nodes(f) for f in graph.function_names())
    plain = gl.function(lambda x: gl.sum(_nested(x, 5))).graph(gl.tensor(X))
    assert nodes < 12 * sum(plain.num_nodes(f) for f in plain.function_names()), nodes
    # v H v against central differences of the gradient along v
    eps = 1e-5
    grad = lambda x: np.asarray(gl.grad(lambda z: gl.sum(_nested(z, 5)))(gl.tensor(x)))  # noqa: E731
    numeric = np.dot(grad(X + eps * V) - grad(X - eps * V), V) / (2 * eps)
    for got in (gl.function(second)(gl.tensor(X)), second(gl.tensor(X))):
        np.testing.assert_allclose(float(got), numeric, rtol=1e-6)
