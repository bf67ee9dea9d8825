"""Graph (`@gl.function`) and compiled (`gl.jit`) modes agree with eager mode: one test per
failure class once found (custom gradients in bodies, Variables read in bodies, `x ** c` on
negative bases, unread loop variables, bool scalars through control flow, nested `scf` that
IREE's stream passes rejected, a bool cast feeding a matmul), and each program the random
tester (`test_fuzz_modes.py`) shrank to."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from gradcheck import numerical_gradient
from program_fuzz import N
from test_fuzz_modes import check as check_at


def check(spec) -> None:
    """`spec` in every mode with a vector state of N elements (compiled mode holds it as host
    scalars) and of 2N (on the device, where most of the IREE bugs these programs found live).
    XLA runs the first only: pure StableHLO has no host scalars, so both widths are one form
    there."""
    check_at(spec)
    check_at(spec, width=2 * N, on_xla=False)


#: IREE compiles (or hundreds of programs): `make test-fast` leaves these out.
pytestmark = pytest.mark.slow


def f64(*v):
    return gl.tensor(np.array(v, dtype=np.float64))


def xla(fn):
    return gl.jit(fn, backend="xla")


def assert_modes_agree(fn, *args, rtol=1e-10):
    want = [np.asarray(t) for t in _leaves(fn(*args))]
    for stage in (gl.function, gl.jit, xla):
        got = [np.asarray(t) for t in _leaves(stage(fn)(*args))]
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-12)
    return want


def _leaves(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


@gl.custom_gradient
def square_grad_3(x):
    return x * x, lambda dy: dy * 3.0


def test_class1_custom_gradient_in_a_loop_body_and_a_branch_is_honoured() -> None:
    def loop(x):
        body = lambda i, x: (i + 1, square_grad_3(x))  # noqa: E731
        return gl.while_loop(lambda i, x: i < 2, body, (gl.tensor(0), x))[1]

    def branch(x):
        return gl.cond(x > 0, lambda: square_grad_3(x), lambda: x)

    x = gl.tensor(2.0, dtype=gl.float64)
    assert assert_modes_agree(gl.grad(loop), x)[0] == 9.0  # the true gradient would be 32
    assert assert_modes_agree(gl.grad(branch), x)[0] == 3.0


def test_class1_custom_gradient_closing_over_outer_tensors_to_second_order() -> None:
    w = f64(0.7, -1.3)

    @gl.custom_gradient
    def scaled(x):
        y = gl.exp(x) * w
        return y, lambda dy: dy * y * 0.5 + dy * x * w

    def f(x):
        body = lambda i, x: (i + 1, scaled(x) * 0.3)  # noqa: E731
        return gl.sum(gl.while_loop(lambda i, x: i < 3, body, (gl.tensor(0), x))[1] ** 2)

    x = f64(0.2, 0.4)
    assert_modes_agree(gl.grad(f), x)
    assert_modes_agree(gl.grad(lambda x: gl.sum(gl.grad(f)(x) * w)), x)


def test_class2_variables_read_in_bodies_get_gradients_to_second_order() -> None:
    v = gl.Variable(np.array([0.5, -1.5]))

    def step(i, z):
        return i + 1, z * 0.5 + gl.sum(gl.sin(v.read() * z))

    def first(x):
        with gl.GradientTape() as tape:
            y = gl.cond(gl.sum(x) > 0, lambda: gl.sum(v * x * v), lambda: gl.sum(x))
            z = gl.while_loop(lambda i, z: i < 3, step, (0, y))[1]
        return tape.gradient(z, v)

    def second(x):
        with gl.GradientTape() as outer:
            with gl.GradientTape() as inner:
                z = gl.while_loop(lambda i, z: i < 3, step, (0, gl.sum(x)))[1]
            g = inner.gradient(z, v)
            s = gl.sum(g * g)
        return outer.gradient(s, v)

    x = f64(0.3, 0.4)
    got = assert_modes_agree(first, x)[0]
    assert np.all(got != 0.0)
    assert_modes_agree(second, x)


def _each_mode(fn, reset, *args):
    """`fn(*args)` in eager, graph and compiled modes, `reset()` before each."""
    outs = []
    for stage in (lambda f: f, gl.function, gl.jit):
        reset()
        outs.append([np.asarray(t) for t in _leaves(stage(fn)(*args))])
    return outs


def test_class2_a_variable_read_in_a_nested_loop_sees_the_value_it_had_then() -> None:
    # The outer loop assigns the Variable after the inner loop reads it. The gradient reruns
    # the inner loop in the outer loop's backward pass; it read the Variable's final value
    # (a silent wrong gradient) until constructs that only read Variables read them before.
    v = gl.Variable(np.array([1.0, 2.0]))
    step = gl.tensor(np.array([0.5, 0.5]))

    def f(x):
        def body(i, s):
            inner = gl.while_loop(
                lambda j, t: j < 2, lambda j, t: (j + 1, t * gl.sin(v.read()) + x), (0, s)
            )[1]
            v.assign_add(step)
            return i + 1, inner

        return gl.sum(gl.while_loop(lambda i, s: i < 3, body, (0, x))[1] ** 2)

    def grads(x):
        with gl.GradientTape() as tape:
            tape.watch(x)
            y = f(x)
        return (y, *tape.gradient(y, [x, v]), v.read())

    v0, x0 = np.array([1.0, 2.0]), np.array([0.3, -0.2])

    def reset():
        v.assign(gl.tensor(v0))

    eager, graph, compiled = _each_mode(grads, reset, gl.tensor(x0))
    for got in (graph, compiled):
        for g, e in zip(got, eager, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-10)

    def value(x, v_init):
        v.assign(gl.tensor(v_init))
        return float(f(gl.tensor(x)))

    fd_x = numerical_gradient(lambda x: value(x, v0), [x0])[0]
    fd_v = numerical_gradient(lambda w: value(x0, w), [v0])[0]
    np.testing.assert_allclose(eager[1], fd_x, rtol=1e-6)
    np.testing.assert_allclose(eager[2], fd_v, rtol=1e-6)


def test_class2_a_loop_assigning_a_variable_nested_in_a_loop_and_a_cond_to_second_order() -> None:
    # A construct that assigns a Variable, nested in another, was a GradientError in graph and
    # compiled modes (its forward pass runs again in the outer gradient, and would assign
    # twice). Variables are now values inside control flow: read once before the outermost
    # construct, assigned once after it. The semantics are eager mode's: a read after an
    # assignment credits the Variable, and the value assigned gets no gradient through it.
    v = gl.Variable(np.array([0.4, -0.3]))
    acc = gl.Variable(np.zeros(2), trainable=False)

    def f(x):
        def outer(i, s):
            def inner(j, t):
                v.assign(v.read() * 0.9 + gl.sin(t) * x)  # x gets no gradient through v
                acc.assign_add(t)
                return j + 1, t * gl.tanh(v.read()) + x  # reads after the assignment

            t = gl.while_loop(lambda j, t: j < i + 1, inner, (0, s))[1]
            branch = gl.cond(gl.sum(t) > 0.0, lambda: t * v.read(), lambda: t - v.read())
            return i + 1, branch

        return gl.sum(gl.while_loop(lambda i, s: i < 3, outer, (0, x))[1] ** 2)

    def grads(x):
        with gl.GradientTape(persistent=True) as outer_tape:
            outer_tape.watch(x)
            with gl.GradientTape(persistent=True) as tape:
                tape.watch(x)
                y = f(x)
            gx, gv = tape.gradient(y, [x, v])
            h = gl.sum(gx * f64(0.3, -0.7))
        hx = outer_tape.gradient(h, x)
        return y, gx, gv, hx, v.read(), acc.read()

    def reset():
        v.assign(f64(0.4, -0.3))
        acc.assign(f64(0.0, 0.0))

    eager, graph, compiled = _each_mode(grads, reset, f64(0.3, -0.2))
    assert np.all(eager[2] != 0) and np.all(eager[3] != 0)
    for got in (graph, compiled):
        for g, e in zip(got, eager, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def test_class2_a_nested_loop_condition_that_assigns_a_variable_is_a_clear_error() -> None:
    # A loop condition's assignments have no form as values (the condition returns only the
    # predicate), so such a loop keeps its Variable; nested, its gradient would assign twice.
    v = gl.Variable(np.array([0.5]))

    def grads(x):
        def outer(i, s):
            def more(j, t):
                v.assign_add(f64(1.0))
                return j < 2

            t = gl.while_loop(more, lambda j, t: (j + 1, t * v.read()), (0, s))[1]
            return i + 1, t

        with gl.GradientTape() as tape:
            tape.watch(x)
            y = gl.sum(gl.while_loop(lambda i, s: i < 2, outer, (0, x))[1])
        return tape.gradient(y, x)

    assert np.isfinite(np.asarray(grads(f64(0.3)))).all()  # eager mode differentiates it
    v.assign(f64(0.5))
    with pytest.raises(gl.errors.GradientError, match="assigns a Variable in its loop condition"):
        gl.function(grads)(f64(0.3))
    assert np.asarray(v.read()).tolist() == [0.5]  # the failed trace changed nothing


def test_class2_a_read_in_a_branch_comes_before_a_later_assignment() -> None:
    # A cond that only reads a Variable was not ordered with the assignment after it: graph
    # mode read the assigned value.
    v = gl.Variable(np.array([1.0, 2.0]))

    def f(x):
        with gl.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = gl.sum(gl.cond(gl.sum(x) > 0, lambda: gl.sin(v.read()) * x, lambda: x))
        v.assign_add(gl.tensor(np.array([0.5, 0.5])))
        return y, tape.gradient(y, x), tape.gradient(y, v)

    def reset():
        v.assign(gl.tensor(np.array([1.0, 2.0])))

    eager, graph, compiled = _each_mode(f, reset, f64(0.3, -0.2))
    np.testing.assert_allclose(eager[0], np.sum(np.sin([1.0, 2.0]) * [0.3, -0.2]))
    for got in (graph, compiled):
        for g, e in zip(got, eager, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-10)


@pytest.mark.parametrize("power", [2.0, 3.0])
def test_class3_integer_powers_of_negative_bases_in_control_flow(power) -> None:
    x = f64(-2.0, -0.5, 0.0, 3.0)

    def f(x):
        y = gl.cond(gl.sum(x) < 100.0, lambda: x**power, lambda: x)
        return gl.sum(y)

    def loop(x):
        body = lambda i, y: (i + 1, y**power * 0.5)  # noqa: E731
        return gl.sum(gl.while_loop(lambda i, y: i < 2, body, (gl.tensor(0), x))[1])

    for fn in (f, loop):
        got = assert_modes_agree(gl.grad(fn), x)[0]
        assert np.all(np.isfinite(got))


def test_class3_pow_matches_the_kernel_on_special_values_when_compiled() -> None:
    bases = [-2.0, -0.5, -0.0, 0.0, 0.5, 2.0, np.inf, -np.inf, np.nan, -1.0, 1.0]
    exponents = [2.0, 3.0, -1.0, -2.0, 0.0, 0.5, -0.5, 2.5, np.inf, -np.inf, np.nan, -3.0]
    a, b = (gl.tensor(v) for v in np.array(np.meshgrid(bases, exponents)).reshape(2, -1))
    want = np.asarray(a**b)
    got = np.asarray(gl.jit(lambda a, b: a**b)(a, b))  # the exponent is not a constant
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    numbers = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]))
    np.testing.assert_allclose(got, want, rtol=1e-14)


def test_class4_loop_variables_whose_incoming_value_is_never_read() -> None:
    def previous(x):
        body = lambda i, v, prev: (i + 1, gl.sin(v) * 1.5, v)  # noqa: E731
        _, v, prev = gl.while_loop(lambda i, v, prev: i < 5, body, (0, x, x))
        return gl.sum(v * prev)

    def overwritten(x):
        body = lambda i, a, b: (i + 1, x, a * a)  # noqa: E731
        _, _a, b = gl.while_loop(lambda i, a, b: i < 3, body, (gl.tensor(0), x, x))
        return gl.sum(b)

    for fn in (previous, overwritten):
        assert_modes_agree(gl.grad(fn), f64(0.3, -0.8))


def test_class5_scalar_booleans_through_cond_switch_and_while() -> None:
    x = f64(1.5, -0.5)

    def by_cond(x):
        return gl.cond(gl.sum(x) > 0, lambda: gl.sum(x) > 1.0, lambda: gl.tensor(False))

    def by_switch(x):
        index = gl.cast(gl.sum(x), gl.int32)
        return gl.switch_case(index, [lambda: gl.sum(x) > 1.0, lambda: gl.tensor(True)])

    def by_loop(x):
        body = lambda i, b: (i + 1, gl.logical_not(b))  # noqa: E731
        return gl.while_loop(lambda i, b: i < 3, body, (gl.tensor(0), gl.sum(x) > 0))[1]

    for fn in (by_cond, by_switch, by_loop):
        assert_modes_agree(fn, x)


def cond_while_cond(x):
    """A cond around a loop whose body has a cond: IREE's stream passes refuse its second
    derivative as nested `scf` ("maximum iteration count exceeded in fixed point pipeline")."""

    def body(i, h):
        h2 = gl.cond(gl.sum(h) > 0.0, lambda: gl.sin(h) * 1.1, lambda: h * 0.9)
        return i + 1, h2

    def outer():
        return gl.while_loop(lambda i, h: i < 3, body, (gl.tensor(0), x))[1]

    return gl.sum(gl.cond(gl.sum(x) > -5.0, outer, lambda: x))


def test_class6_gradient_of_cond_while_cond_nesting_compiles() -> None:
    f = cond_while_cond
    assert_modes_agree(gl.grad(f), f64(0.3, -0.2))
    assert_modes_agree(gl.grad(lambda x: gl.sum(gl.grad(f)(x))), f64(0.3, -0.2))


def test_class6_nested_loops_with_an_argument_trip_count_and_vector_carry() -> None:
    def f(x, n):
        def outer(i, h):
            inner = gl.while_loop(lambda j, g: j < i, lambda j, g: (j + 1, gl.tanh(g)), (0, h))
            return i + 1, inner[1] * 1.1

        return gl.sum(gl.while_loop(lambda i, h: i < n, outer, (0, x))[1])

    assert_modes_agree(gl.grad(f), f64(0.3, -0.2, 0.1), gl.tensor(3))


def test_class7_a_cast_comparison_feeding_a_matmul_compiles() -> None:
    xs = gl.tensor(np.random.default_rng(0).standard_normal((5, 3)))
    positions = gl.cast(gl.arange(5), gl.float64)

    def f(w):
        def body(t, h):
            onehot = gl.cast(gl.abs(positions - gl.cast(t, gl.float64)) < 0.5, gl.float64)
            return t + 1, gl.tanh(h * w + onehot @ xs)

        init = (gl.tensor(0), gl.zeros((3,), dtype=gl.float64))
        return gl.sum(gl.while_loop(lambda t, h: t < 5, body, init)[1])

    assert_modes_agree(gl.grad(f), gl.tensor(0.5, dtype=gl.float64))


def test_fuzz_found_one_zero_gradient_yielded_twice_from_a_branch() -> None:
    # Shrunk by test_fuzz_modes: a branch yielding the same zero tensor for two results (an
    # unconnected Variable gradient beside a second-order gradient) failed in IREE's runtime.
    w = f64(0.2, -0.4, 0.6)
    v = gl.Variable(np.array([0.1, 0.2, -0.3]))

    def f(x):
        with gl.GradientTape(persistent=True) as outer:
            outer.watch(x)
            with gl.GradientTape(persistent=True) as tape:
                tape.watch(x)
                y = gl.sum(gl.cond(gl.sum(x * w) > 0.0, lambda: gl.tanh(x + w), lambda: x * w))
            gx, gv = tape.gradient(y, [x, v], unconnected_gradients="zero")
            h = gl.sum(gx * w)
        return y, gx, gv, outer.gradient(h, x, unconnected_gradients="zero")

    assert_modes_agree(f, f64(0.41, -0.23, 0.37))


def test_class1_a_bad_custom_gradient_in_a_traced_body_is_a_clear_error() -> None:
    @gl.custom_gradient
    def two_grads(x):
        return x * 2.0, lambda dy: (dy, dy)  # one argument, two gradients

    def f(x):
        body = lambda i, x: (i + 1, two_grads(x))  # noqa: E731
        return gl.sum(gl.while_loop(lambda i, x: i < 2, body, (0, x))[1])

    with pytest.raises(gl.errors.GradientError, match="returned 2 gradients for 1"):
        gl.function(gl.grad(f))(f64(0.5, 1.5))
    # The failed trace left nothing behind: the same thread traces again.
    np.testing.assert_allclose(np.asarray(gl.function(lambda x: x * 2.0)(f64(1.0))), [2.0])


# Programs the random tester shrank to (`program_fuzz.py` specs), each checked in every mode as
# the tester does: values, first- and second-order gradients, the assigned Variable.


@pytest.mark.long
def test_fuzz_found_a_variable_read_in_a_loop_inside_a_branch() -> None:
    # The branch's residual was the Variable's resource: it cannot be mirrored by the branch
    # not taken, so it now goes to the gradient node from outside the branch.
    check(("cond", 0.0, (("leaf", "x"), ("while", ("leaf", "v"), 0, None, "passthrough", False))))


def test_fuzz_found_a_loop_stack_yielded_by_a_branch_to_second_order() -> None:
    # The branch not taken yields an empty stack for the loop's saved values.
    check(("cond", 0.0, (("leaf", "x"), ("while", ("leaf", "x"), 0, None, "passthrough", True))))


@pytest.mark.long
def test_fuzz_found_an_assignment_in_a_nested_loop_is_an_error_not_run_twice() -> None:
    # The gradient of a loop nested in another loop reran the inner loop, assignments
    # included: the Variable was incremented twice. It is a clear error instead.
    inner = ("while", ("leaf", "x"), 0, None, "passthrough", True)
    check(("while", inner, 2, None, "passthrough", False))


def test_fuzz_found_equal_zero_gradients_yielded_by_a_branch() -> None:
    # IREE merged the equal zero constants a branch yields into one buffer yielded twice and
    # failed at run time (`OUT_OF_RANGE` in a dispatch); each goes through its own barrier.
    custom = ("cond", -0.05, (("leaf", "custom"), ("leaf", "custom")))
    product = ("mul", (("leaf", "w"), ("leaf", "x")))
    check(("mul", (("leaf", "x"), ("cond", 0.39, (custom, product)))))


def test_fuzz_found_a_variable_through_a_switch() -> None:
    # A barrier on every tensor a branch yields made IREE fail this one ("ref is null").
    check(("switch", [("leaf", "v")], True))


def test_fuzz_found_nested_switches_second_order_without_yield_barriers_miscompiled() -> None:
    # With plain branch yields IREE 3.13 returned garbage (-1.8e47) for one element of the
    # second-order gradient, with no error: the barrier form is tried first.
    inner = ("switch", [("leaf", "cube"), ("leaf", "sin"), ("leaf", "cube")], False)
    check(("switch", [inner, inner], True))


def test_fuzz_found_a_module_that_fails_with_indirect_command_buffers_in_every_form() -> None:
    # IREE 3.13 failed this one as it ran ("indirect buffer reference slot 0 is out range of
    # the declared binding capacity") in every stack, yield and scf/cf form, and ran it with
    # direct command buffers; the VM repair (`_vm_repair.py`) runs it in the first form.
    custom = ("cond", -0.05163753542907901, (("leaf", "custom"), ("leaf", "sin")))
    branch = ("cond", 0.38887440114084604, (custom, ("mul", (("leaf", "w"), ("leaf", "x")))))
    switch = ("switch", [("leaf", "f32"), ("leaf", "custom"), ("leaf", "cube")], True)
    check(("mul", (switch, branch)))


def test_fuzz_found_zero_gradients_through_a_switch_that_failed_in_every_form() -> None:
    # IREE 3.13 failed this one as it ran in every form and with every workaround flag ("ref is
    # null" in hal.buffer_view.create; "indirect buffer reference slot 0 is out range"); it ran
    # with the zeros written at the function's entry, a form the VM repair (`_vm_repair.py`)
    # retired.
    switch = ("switch", [("leaf", "sin"), ("leaf", "sigmoid"), ("leaf", "v")], True)
    check(("mul", (("leaf", "stop"), ("add", (switch, ("leaf", "cube"))))))


def test_fuzz_found_switches_that_fail_with_zeros_defined_in_a_branch() -> None:
    # IREE 3.13 failed this one as it ran in every form whose zero gradients are defined in
    # the branch ("ref is null" in hal.buffer_view.create; "indirect buffer reference slot 0
    # is out range"); the VM repair (`_vm_repair.py`) runs it in the first form.
    first = ("switch", [("leaf", "square"), ("leaf", "f32")], True)
    f32s = ("mul", (("leaf", "f32"), ("leaf", "f32")))
    vs = ("mul", (("leaf", "v"), ("leaf", "square")))
    sins = ("add", (("leaf", "f32"), ("leaf", "sin")))
    check(("mul", (first, ("switch", [f32s, vs, sins], True))))


def test_fuzz_found_switches_second_order_miscompiled_with_barriers_on_constants() -> None:
    # With a barrier on every repeated zero a branch yields, IREE 3.13 returned a wrong
    # second-order gradient (0.366 for 0.360), with no error: constants get no barrier in the
    # first form.
    product = ("mul", (("leaf", "tanh"), ("leaf", "cube")))
    check(("switch", [product, product, product], True))


def test_fuzz_found_a_cond_in_a_switch_miscompiled_without_a_barrier_on_every_result() -> None:
    # IREE 3.13 failed this one as it ran with barriers on repeated results, and returned a
    # wrong second-order gradient (-0.2411 for -0.2409) with them on repeated constants too,
    # and garbage without any: every tensor a branch yields goes through its own barrier in
    # the first form.
    inner = ("cond", -0.9576424632312155, (("leaf", "v"), ("leaf", "sigmoid")))
    branch = ("mul", (inner, ("add", (("leaf", "cube"), ("leaf", "sin")))))
    check(("switch", [branch, branch], True))


_TERM = (
    "mul",
    (("mul", (("leaf", "tanh"), ("leaf", "sin"))), ("add", (("leaf", "x"), ("leaf", "v")))),
)
#: No control flow: iree-compile 3.13 refused its second-order gradient ("'linalg.generic' op
#: write affecting operations on global resources are restricted to workgroup distributed
#: contexts") unless `--iree-dispatch-creation-fuse-multi-use=false`.
ONLY_WITHOUT_MULTI_USE_FUSION = ("add", (_TERM, _TERM))


def test_fuzz_found_a_module_that_compiles_only_without_multi_use_fusion() -> None:
    check(ONLY_WITHOUT_MULTI_USE_FUSION)


def test_fuzz_found_a_loop_hessian_that_failed_in_every_form() -> None:
    # IREE 3.13 failed this one as it ran in every form ("indirect buffer reference slot 0 is
    # out range", "ref is null"): a loop variable overwritten each trip, beside a float32 copy
    # of another and a flag, differentiated twice. The VM repair (`_vm_repair.py`) runs it.
    w = f64(0.5, -0.3, 0.2)
    cot = f64(0.3, -0.7, 0.5)

    def f(x):
        n = gl.minimum(gl.cast(gl.abs(gl.sum(x * w)) * 3.0, gl.int32), 2) + 2

        def body(i, h, flag, e, h32):
            new_h = (h - 0.2) ** 2 * 0.5 + h * 0.3
            h32 = gl.cast(new_h, gl.float32) + h32 * gl.tensor(0.5, dtype=gl.float32)
            return i + 1, new_h, gl.logical_not(flag), new_h * 0.5, h32

        init = (gl.tensor(0, dtype=gl.int32), x, gl.tensor(True), x * 0.25, gl.cast(x, gl.float32))
        _, h, flag, e, h32 = gl.while_loop(lambda i, *_: i < n, body, init, maximum_iterations=2)
        out = h + gl.where(flag, x, -x) * 0.1 + e * 0.2 + gl.cast(h32 > 0.0, gl.float64) * 0.1
        return gl.sum(gl.tanh(out))

    def everything(x):
        g = gl.grad(f)
        return f(x), g(x), gl.grad(lambda x: gl.sum(g(x) * cot))(x)

    x0 = np.array([0.41, -0.23, 0.37])
    _, gx, hx = assert_modes_agree(everything, gl.tensor(x0))
    fd = numerical_gradient(lambda x: float(f(gl.tensor(x))), [x0])[0]
    np.testing.assert_allclose(gx, fd, rtol=1e-6, atol=1e-8)
    directional = numerical_gradient(lambda x: float(gl.sum(gl.grad(f)(gl.tensor(x)) * cot)), [x0])[
        0
    ]
    np.testing.assert_allclose(hx, directional, rtol=1e-5, atol=1e-7)


_SWITCH = (
    "switch",
    [("add", (("leaf", "v"), ("leaf", "x"))), ("add", (("leaf", "cube"), ("leaf", "x")))],
    False,
)
_LOOP = ("while", ("leaf", "square"), 3, 2, "overwritten", "v")
#: IREE 3.13 failed this one as it ran in every form and with every flag ("indirect buffer
#: reference slot 0 is out range"): its bytecode passed one buffer (two loop-carried tensors
#: packed into one allocation) twice on a loop's entry branch and moved it out for the first,
#: leaving null for the second. The VM repair (`_vm_repair.py`) copies the repeat.
ONE_BUFFER_PASSED_TWICE = ("mul", (_SWITCH, ("cond", -0.838163042084838, (_LOOP, ("leaf", "x")))))


@pytest.mark.long
def test_fuzz_found_a_loop_entry_passing_one_buffer_twice() -> None:
    check(ONE_BUFFER_PASSED_TWICE)


#: The same encoder bug on a switch's branch, found when the program above stopped showing it
#: (its gradient carries fewer loop variables now): without the VM repair its second-order
#: gradient fails with "indirect buffer reference slot 0 is out range".
A_SWITCH_PASSING_ONE_BUFFER_TWICE = (
    "switch",
    [("leaf", "arctan"), ("leaf", "f32"), ("leaf", "cube")],
    True,
)


def test_fuzz_found_a_switch_passing_one_buffer_twice() -> None:
    check(A_SWITCH_PASSING_ONE_BUFFER_TWICE)


#: A cond over two switches whose branches are conds (the shrunk program); its gradient records
#: each inner cond's predicate beside the switch's branch index.
SWITCHES_OF_CONDS = (
    "cond",
    -0.12326178720848513,
    (
        (
            "switch",
            [
                ("cond", 0.0, (("leaf", "f32"), ("leaf", "x"))),
                ("cond", 0.0, (("leaf", "square"), ("leaf", "x"))),
            ],
            False,
        ),
        ("switch", [("leaf", "x"), ("cond", 0.0, (("leaf", "square"), ("leaf", "x")))], False),
    ),
)


def test_fuzz_found_a_predicate_overwritten_by_a_64_bit_move() -> None:
    # IREE 3.13 returned a wrong first-order gradient here in every form (the first-call check
    # caught it): its bytecode moved an i64 into a register pair before moving out the i32
    # predicate held in the pair's first half, so the predicate read back as false and the
    # gradient of the identity branch came back. The VM repair (`_vm_repair.py`) widens the
    # i32 arguments of blocks that also take i64s.
    check(SWITCHES_OF_CONDS)


@pytest.mark.long
def test_fuzz_found_a_checkpointed_loop_closing_over_the_loops_input() -> None:
    # Eagerly, a checkpointed loop's body closing over a differentiated scalar (made where the
    # loop is called) gave it no gradient: the loop is now staged with what it closes over as
    # inputs, and differentiated by graph mode's transform.
    check(("while", ("leaf", "outer"), 2, None, "passthrough", False, 1))


def test_fuzz_found_recompute_grad_closing_over_a_differentiated_value() -> None:
    # recompute_grad dropped the gradient of what its function closes over, in every mode.
    check(("leaf", "recompute_outer"))


@pytest.mark.long
def test_fuzz_found_a_variable_assigned_after_a_checkpointed_loop_read_it() -> None:
    # Eagerly, the checkpointed loop's gradient read the Variable when the gradient ran, after
    # the second loop had assigned it; it now reads the value the loop ran with.
    first = ("while", ("leaf", "v"), 2, None, "passthrough", False, 1)
    check(("add", (first, ("while", ("leaf", "x"), 2, None, "passthrough", "v", None))))
