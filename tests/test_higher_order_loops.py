"""Third-order reverse mode through loops that index with their counter, in every mode.

At the third order a loop's stack is read by two loops (the gradient loop recorded at the
second order and its augmented copy), so its cotangent is the sum of two cotangent stacks
(`stack_add`): checked on scalar and vector elements, on IREE's list and buffer forms of stacks,
against eager mode and against central differences of the second derivative.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from gradcheck import numerical_gradient
from gradloop import _iree_build
from runners import staged

MODES = ("executor", "frames", "interpreter", "compiled")


def product(v):
    """The product of the rows of `v`, by a loop that reads `v[i]`."""

    def body(i, p):
        return i + 1, p * v[i]

    start = gl.ones_like(v[0])
    return gl.while_loop(lambda i, p: i < v.shape[0], body, (0, start))[1]


def scalar_program(x):
    return product(gl.stack([x, x**2, gl.sin(x)]))


def vector_program(x):
    rows = gl.stack([x, x * x, gl.sin(x) + 1.0])
    return gl.sum(product(rows) * gl.tensor(np.array([1.0, -0.5])))


def wide_vector_program(x):
    """`vector_program` on six elements: compiled mode keeps them on the device (four or fewer
    are host scalars)."""
    rows = gl.stack([x, x * x, gl.sin(x) + 1.0])
    return gl.sum(product(rows) * gl.tensor(np.linspace(1.0, -0.5, 6)))


CASES = [
    (scalar_program, np.float64(0.7)),
    (vector_program, np.array([0.7, -0.4])),
]


def third(fn):
    """`grad` of a scalar of the second derivative, and that scalar: three reverse passes."""
    first = gl.grad(fn)
    second = gl.grad(lambda x: gl.sum(first(x) * 0.75))
    scalar = lambda x: gl.sum(second(x) * 1.25)  # noqa: E731
    return gl.grad(scalar), scalar


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("fn", "x"), CASES, ids=["scalar rows", "vector rows"])
def test_third_order_gradient_through_a_loop_indexed_by_its_counter(mode, fn, x) -> None:
    g3, g2 = third(fn)
    eager = np.asarray(g3(gl.tensor(x)))
    fd = numerical_gradient(lambda z: float(g2(gl.tensor(z))), [np.asarray(x)])[0]
    np.testing.assert_allclose(eager, fd, rtol=1e-6, atol=1e-8)
    got = np.asarray(staged(mode, g3)(gl.tensor(x)))
    np.testing.assert_allclose(got, eager, rtol=1e-10, atol=1e-12)


@pytest.mark.long
@pytest.mark.parametrize("lists", [True, False], ids=["lists", "buffers"])
def test_third_order_runs_right_in_every_form_iree_compiles(lists) -> None:
    # Each form of the module, not only the first that runs: IREE 3.13 miscompiled an earlier
    # emission of the stack sum in its scf form (`_workarounds`: `stack_add_without_branches`).
    from gradloop import _runtime

    g3, _ = third(wide_vector_program)
    x = gl.tensor(np.linspace(0.7, -0.4, 6))
    want = np.asarray(g3(x))
    concrete = gl.function(g3).concrete_function(x)
    captured = [np.asarray(t) for t in concrete.captured_inputs]
    forms = [f for f in _iree_build.forms_for("llvm-cpu") if f.list_stacks == lists]
    forms = [f for f in forms if f.yield_barriers == "all" and not f.workaround_flags]
    assert len(forms) == 4
    ran = []
    for form in forms:
        mlir, _facts = concrete.mlir_module(
            list_stacks=form.list_stacks,
            yield_barriers=form.yield_barriers,
            unroll_loops=form.unroll_loops,
        )
        assert "scf.for" in mlir  # the stack sum
        try:
            vmfb = _iree_build.compile_mlir(mlir, "llvm-cpu", False, form.cf, (), True)
        except gl.errors.CompileError:
            continue  # IREE refuses some forms (gl.jit then tries the next)
        entry = _runtime.Function(vmfb, "local-sync", concrete.graph.entry)
        got = entry(np.asarray(x), *captured)[0]
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=str(form))
        ran.append(form)
    assert ran, "no form compiled"
