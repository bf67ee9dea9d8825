"""Variables in compiled mode: a compiled function takes the Variables' values on entry and
returns the final values of those it may assign, which `gl.jit` stores back. Every program runs
eagerly, as a graph and compiled (llvm-cpu), each on its own Variables starting from the same
values, and all three must agree on the results and on the Variables afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import gradloop as gl

#: IREE compiles (or hundreds of programs): `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

pytest.importorskip("iree.compiler", reason="compiled mode needs iree-base-compiler")

MODES = ("eager", "graph", "jit")


def f64(*values: float) -> gl.Tensor:
    return gl.tensor(np.array(values, dtype=np.float64))


def leaves(x: object) -> list[np.ndarray]:
    if isinstance(x, (tuple, list)):
        return [v for item in x for v in leaves(item)]
    return [np.asarray(x)]


def run(make, initial, calls):
    """For each mode: fresh Variables holding `initial`, `fn = make(*variables)` (wrapped for
    the mode), then `fn(*args)` for each `args` of `calls`. Returns, per mode, the results of
    every call and the Variables' values after each call."""
    out = {}
    for mode in MODES:
        variables = [gl.Variable(np.array(v)) for v in initial]
        fn = make(*variables)
        fn = {"eager": fn, "graph": gl.function(fn), "jit": gl.jit(fn)}[mode]
        seen = []
        for args in calls:
            seen.append((leaves(fn(*args)), [v.numpy().copy() for v in variables]))
        out[mode] = seen
    return out


def assert_modes_agree(make, initial, calls, rtol=1e-12):
    out = run(make, initial, calls)
    for mode in ("graph", "jit"):
        for (results, values), (want_results, want_values) in zip(
            out[mode], out["eager"], strict=True
        ):
            for got, want in zip(results + values, want_results + want_values, strict=True):
                assert got.dtype == want.dtype and got.shape == want.shape, mode
                np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-14, err_msg=mode)
    return out


def test_a_variable_read_is_the_value_at_each_call_not_a_constant() -> None:
    w = gl.Variable(np.array([0.5, -2.0]))
    f = gl.jit(lambda x: x * w + gl.sin(w.read()))
    x = f64(1.0, 3.0)
    np.testing.assert_allclose(np.asarray(f(x)), [0.5 + np.sin(0.5), -6.0 + np.sin(-2.0)])
    w.assign(np.array([1.0, 1.0]))
    np.testing.assert_allclose(np.asarray(f(x)), [1.0 + np.sin(1.0), 3.0 + np.sin(1.0)])
    concrete = f._function.concrete_function(x)
    assert concrete.assigned_variables == []  # read only: no output for it


def test_reads_and_assignments_keep_program_order() -> None:
    def make(v):
        def f(x):
            before = v.read()
            v.assign(x)
            after = v.read() * 2.0
            v.assign_add(before)
            return before, after

        return f

    assert_modes_agree(make, [[1.0, 2.0]], [(f64(5.0, 6.0),), (f64(-1.0, 0.5),)])


def test_an_assignment_in_a_cond_happens_only_in_the_branch_taken() -> None:
    def make(v, hits):
        def f(x):
            def grow():
                v.assign(v * 2.0 + x)
                hits.assign_add(1)
                return v.read().sum()

            return gl.cond(x.sum() > 0, grow, lambda: v.read().sum() - 1.0)

        return f

    calls = [(f64(1.0, 2.0),), (f64(-3.0, 1.0),), (f64(0.5, 0.5),)]
    out = assert_modes_agree(make, [[1.0, 1.0], np.int32(0)], calls)
    assert [int(values[1]) for _, values in out["jit"]] == [1, 1, 2]


def test_an_assignment_in_a_switch_case_follows_the_index() -> None:
    def make(v):
        def f(k):
            return gl.switch_case(
                k,
                [
                    lambda: v.assign_add(1.0).read(),
                    lambda: v.read() * 10.0,
                    lambda: v.assign(v * -1.0).read(),
                ],
            )

        return f

    calls = [(gl.tensor(k),) for k in (0, 2, 1, 7, -1, 0)]
    assert_modes_agree(make, [np.float64(0.25)], calls)


def test_a_counter_in_a_while_loop_is_assigned_once_per_iteration() -> None:
    def make(counter, total):
        def f(x, limit):
            def body(v):
                counter.assign_add(1)
                total.assign(total + v.sum())
                return v * 1.5 + 0.1

            return gl.while_loop(lambda v: v.sum() < limit, body, x)

        return f

    calls = [(f64(0.1, 0.2), gl.tensor(50.0, dtype=gl.float64)), (f64(1.0, 1.0), f64(1.0)[0])]
    out = assert_modes_agree(make, [np.int32(0), np.float64(0.0)], calls)
    trips = [int(values[0]) for _, values in out["jit"]]
    assert trips[0] > 5 and trips[1] == trips[0]  # the second call starts from 2.0 >= 1.0


def test_a_training_step_under_jit_matches_eager_over_several_steps() -> None:
    xs = np.linspace(-1.0, 1.0, 8)
    ys = np.sin(2.0 * xs)

    def make(w, b):
        def step(x, y, lr):
            with gl.GradientTape() as tape:
                wv, bv = w.read(), b.read()
                # A refinement loop between the parameters and the loss.
                h = gl.while_loop(
                    lambda i, h: i < 3, lambda i, h: (i + 1, gl.tanh(h * wv + bv) + x * 0.1), (0, x)
                )[1]
                loss = ((h - y) ** 2).mean()
            gw, gb = tape.gradient(loss, [w, b])
            w.assign(w - lr * gw)
            b.assign_sub(lr * gb)
            return loss

        return step

    args = (gl.tensor(xs), gl.tensor(ys), gl.tensor(0.1, dtype=gl.float64))
    out = assert_modes_agree(make, [np.float64(0.5), np.float64(-0.1)], [args] * 5, rtol=1e-10)
    losses = [float(results[0]) for results, _ in out["jit"]]
    assert losses == sorted(losses, reverse=True)  # it trains: each step sees the last update


def test_gradients_with_respect_to_variables_used_in_branches_and_loops() -> None:
    # Graph mode differentiates with respect to the reads at the function's top level (a read
    # inside a branch or loop body is a value of that body), so the bodies close over them.
    def make(w, scale):
        def f(x):
            with gl.GradientTape(persistent=True) as tape:
                wv, sv = w.read(), scale.read()
                y = gl.cond(x.sum() > 0, lambda: gl.sin(x * wv) * sv, lambda: x * wv * wv)
                s = gl.while_loop(lambda i, s: i < 4, lambda i, s: (i + 1, s * wv + x), (0, x))[1]
                total = s.sum()
                loss = y.sum() + total
            # `scale` is used in one branch only: a zero gradient when the other runs.
            g = tape.gradient(loss, [w, scale], unconnected_gradients="zero")
            return (*g, tape.gradient(total, w))

        return f

    calls = [(f64(0.3, 0.2),), (f64(-0.7, 0.1),)]
    assert_modes_agree(make, [[0.8, -0.4], np.float64(1.5)], calls)


def test_assigning_in_a_loop_condition_is_a_clear_compile_error() -> None:
    v = gl.Variable(0.0, dtype=gl.float64)

    def f(n):
        return gl.while_loop(lambda i: (v.assign_add(1.0), i < n)[1], lambda i: i + 1, 0)

    with pytest.raises(gl.errors.CompileError, match="condition"):
        gl.jit(f)(gl.tensor(3))


def test_exported_modules_take_variables_after_the_arguments(tmp_path) -> None:
    tool = os.path.join(os.path.dirname(sys.executable), "iree-run-module")
    tool = tool if os.path.exists(tool) else (shutil.which("iree-run-module") or tool)
    w = gl.Variable(np.array([0.5, -1.0]))
    steps = gl.Variable(np.int32(0))
    scale = gl.Variable(np.float64(3.0))  # only read: an input, no output

    def model(x):
        steps.assign_add(1)
        w.assign(w * x)
        return (w * scale).sum()

    text = gl.to_mlir(model, f64(2.0, 4.0))
    assert (
        "func.func @model(%arg0: tensor<2xf64>, %arg1: tensor<i32>, %arg2: tensor<2xf64>," in text
    )
    path = gl.export(model, f64(2.0, 4.0), path=tmp_path / "model.vmfb")
    out = subprocess.run(
        [
            tool,
            f"--module={path}",
            "--function=model",
            "--device=local-task",
            "--input=2xf64=2.0 4.0",
            "--input=i32=7",  # steps, in the order the function first used them
            "--input=2xf64=0.5 -1.0",  # w
            "--input=f64=3.0",  # scale
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    results = [line.split("=", 1)[1].strip() for line in out.splitlines() if "=" in line]
    # The result, then the final values of the assigned Variables: steps, then w.
    assert len(results) == 3, out
    np.testing.assert_allclose(float(results[0]), 3.0 * (1.0 - 4.0))
    assert int(results[1]) == 8
    np.testing.assert_allclose([float(t) for t in results[2].split()], [1.0, -4.0])
    assert float(w.numpy()[0]) == 0.5  # exporting runs nothing


def _update(x, v, h):
    def grow():
        nv = v * 2.0 + x
        return nv.sum(), nv, h + 1

    return gl.cond(x.sum() > 0, grow, lambda: (v.sum() - 1.0, v, h))


def _switch(x, v, h, k):
    return gl.switch_case(
        k, [lambda: (v.sum(), v, h), lambda: (x.sum(), v * 2.0, h + 1), lambda: (x.sum(), v, h)]
    )


@pytest.mark.parametrize(
    ("fn", "extra"),
    [
        (_update, ()),
        (_switch, (0,)),
        (_switch, (1,)),
        (_switch, (2,)),
    ],
)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_branches_passing_several_inputs_through_unchanged(fn, extra, sign) -> None:
    # The pattern threaded Variables produce everywhere: one branch computes every result, the
    # other passes inputs through, int32 and float64 scalars side by side (the VM register
    # mix `rust/core/src/mlir/scalar.rs` carries at one width).
    args = (f64(sign, 2.0 * sign), f64(1.0, 1.0), gl.tensor(np.int32(4)))
    args += tuple(gl.tensor(k) for k in extra)
    for got, want in zip(leaves(gl.jit(fn)(*args)), leaves(fn(*args)), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
