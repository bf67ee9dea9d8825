"""gl.Variable: state, assignment checks, operators, and gradients through reads (TensorFlow's
semantics: the gradient w.r.t. a Variable sums the gradients of the values read from it while a
tape recorded; assignment is not differentiable)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import gradloop as gl
from gradloop import _recording


def f64(*values: float) -> gl.Tensor:
    return gl.tensor(np.array(values, dtype=np.float64))


def test_create_read_and_inspect() -> None:
    v = gl.Variable([1.0, 2.0], name="w")
    assert v.dtype == gl.float32 and v.shape == (2,) and v.ndim == 1 and v.name == "w"
    assert v.trainable
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(v), [1.0, 2.0])
    assert np.asarray(v, dtype=np.float64).dtype == np.float64
    assert isinstance(v.read(), gl.Tensor) and isinstance(v.value, gl.Tensor)
    assert "gl.Variable 'w'" in repr(v) and "float32" in repr(v)


def test_initial_values() -> None:
    assert gl.Variable(3, dtype=gl.float64).dtype == gl.float64
    assert gl.Variable(lambda: gl.zeros([2, 3])).shape == (2, 3)
    src = gl.Variable(f64(1.0))
    assert gl.Variable(src).dtype == gl.float64
    with pytest.raises(
        gl.errors.DTypeError, match="Variable 'x': the initial value is float64, not float32"
    ):
        gl.Variable(f64(1.0), dtype=gl.float32, name="x")


def test_initial_tensor_is_not_the_stored_tensor() -> None:
    # a fresh identity: gradients w.r.t. the initial tensor never reach through the Variable
    t = f64(2.0)
    v = gl.Variable(t)
    assert v.read() is not t
    with gl.GradientTape() as tape:
        tape.watch(t)
        y = v * t
    assert float(tape.gradient(y, t)) == 2.0


def test_assign_and_assign_add() -> None:
    v = gl.Variable(f64(1.0, 2.0))
    before = v.read()
    assert v.assign(f64(5.0, 6.0)) is v
    assert v.read() is not before
    v.assign([7.0, 8.0])
    v.assign_add(1.0)
    v.assign_add(f64(0.5, 0.5))
    v.assign_sub(gl.Variable(f64(1.0, 1.0)))
    np.testing.assert_array_equal(v.numpy(), [7.5, 8.5])


def test_assigning_the_same_tensor_gives_a_fresh_identity() -> None:
    t = f64(1.0)
    v = gl.Variable(t)
    v.assign(t)
    first = v.read()
    v.assign(t)
    assert v.read() is not first and v.read() is not t


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (
            gl.tensor([1.0, 2.0]),
            gl.errors.DTypeError,
            "Variable 'w': cannot assign a float32 value to a float64 variable",
        ),
        (
            f64(1.0, 2.0, 3.0),
            gl.errors.ShapeError,
            r"Variable 'w': cannot assign a value of shape \(3,\) to a variable of shape \(2,\)",
        ),
        (f64(1.0), gl.errors.ShapeError, r"shape \(1,\)"),
    ],
)
def test_assign_checks_dtype_and_shape(value: gl.Tensor, error: type, message: str) -> None:
    v = gl.Variable(f64(1.0, 2.0), name="w")
    with pytest.raises(error, match=message):
        v.assign(value)
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])  # unchanged


def test_assign_add_checks_too() -> None:
    v = gl.Variable(gl.tensor([1, 2], dtype=gl.int32), name="n")
    v.assign_add(1)
    np.testing.assert_array_equal(v.numpy(), [2, 3])
    with pytest.raises(
        gl.errors.DTypeError, match="Variable 'n': cannot add a float value to a int32 variable"
    ):
        v.assign_add(0.5)
    with pytest.raises(gl.errors.ShapeError, match="Variable 'n'"):
        v.assign_add(gl.tensor([[1, 1], [1, 1]], dtype=gl.int32))


def test_operators_act_on_the_value() -> None:
    v = gl.Variable(f64(1.0, 2.0))
    w = gl.Variable(f64(3.0, 4.0))
    np.testing.assert_array_equal((v * 2).numpy(), [2.0, 4.0])
    np.testing.assert_array_equal((2 - v).numpy(), [1.0, 0.0])
    np.testing.assert_array_equal((v + w).numpy(), [4.0, 6.0])
    np.testing.assert_array_equal((-v).numpy(), [-1.0, -2.0])
    np.testing.assert_array_equal((v < 1.5).numpy(), [True, False])
    assert float(v[1]) == 2.0 and len(v) == 2
    assert float(gl.Variable(2.5)) == 2.5


def test_variables_hash_and_compare_by_identity() -> None:
    v, w = gl.Variable(1.0), gl.Variable(1.0)
    assert v == v and v != w
    assert len({v, w, v}) == 2
    assert {v: 1}[v] == 1


def test_gradient_sums_over_reads() -> None:
    v = gl.Variable(f64(3.0))
    with gl.GradientTape() as tape:
        y = v * v + v.read() * 2.0  # three reads of one value: d/dv = 2v + 2
    assert float(tape.gradient(y, v)) == 8.0
    assert tape.watched_variables() == (v,)


def test_gradient_after_assignment_counts_every_value_read() -> None:
    # y = a * 2 + b with a the value before and b the value after assign(a * 3): TensorFlow gives
    # 2 + 1 = 3, since assignment is not differentiable (the read of b does not lead back to a).
    v = gl.Variable(f64(1.0))
    with gl.GradientTape() as tape:
        a = v.read()
        v.assign(a * 3.0)
        y = a * 2.0 + v.read()
    assert float(tape.gradient(y, v)) == 3.0


def test_unread_and_untrainable_variables() -> None:
    v = gl.Variable(f64(1.0))
    frozen = gl.Variable(f64(2.0), trainable=False)
    with gl.GradientTape(persistent=True) as tape:
        y = frozen * 3.0
    assert tape.gradient(y, v) is None and tape.gradient(y, frozen) is None
    assert float(tape.gradient(y, v, unconnected_gradients="zero")) == 0.0
    assert tape.watched_variables() == ()
    with gl.GradientTape() as tape:
        tape.watch(frozen)
        y = frozen * 3.0
    assert float(tape.gradient(y, frozen)) == 3.0
    assert tape.watched_variables() == (frozen,)


def test_reads_outside_the_tape_are_not_seen() -> None:
    v = gl.Variable(f64(2.0))
    before = v.read()
    with gl.GradientTape() as tape:
        y = before * 5.0
    assert tape.gradient(y, v) is None


def test_int_variables_have_no_gradient() -> None:
    n = gl.Variable(3)
    with gl.GradientTape() as tape:
        y = gl.cast(n.read(), gl.float32) * 2.0
    with pytest.raises(gl.errors.GradientError, match="has dtype int32"):
        tape.gradient(y, n)


def test_variables_in_nested_structures_of_sources() -> None:
    v, w = gl.Variable(f64(1.0)), gl.Variable(f64(2.0))
    x = f64(3.0)
    with gl.GradientTape() as tape:
        tape.watch(x)
        y = v * w * x
    g = tape.gradient(y, {"v": v, "rest": (w, x)})
    assert float(g["v"]) == 6.0 and float(g["rest"][0]) == 3.0 and float(g["rest"][1]) == 2.0


def test_side_effects_only_in_the_taken_branch() -> None:
    v = gl.Variable(0.0)
    for pred, expected in [(True, 1.0), (False, -1.0), (gl.tensor(True), 0.0)]:
        gl.cond(pred, lambda: v.assign_add(1.0), lambda: v.assign_sub(2.0))
        assert float(v.numpy()) == expected
    hits = [gl.Variable(0) for _ in range(3)]
    for i in [0, 2, 2, 9]:
        gl.switch_case(i, [lambda k=k: hits[k].assign_add(1) for k in range(3)])
    assert [int(h.numpy()) for h in hits] == [1, 0, 3]


def test_variable_updated_inside_a_loop() -> None:
    total = gl.Variable(0.0)
    gl.while_loop(
        lambda i: i < 4, lambda i: (total.assign_add(gl.cast(i, gl.float32)), i + 1)[1], 0
    )
    assert float(total.numpy()) == 6.0


def test_gradient_through_reads_inside_control_flow() -> None:
    # y = v**3 via a loop that multiplies by v twice: dy/dv = 3 v**2
    v = gl.Variable(1.5, dtype=gl.float64)
    with gl.GradientTape() as tape:
        y = gl.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, v * a), (0, v.read()))[1]
        z = gl.cond(y > 0.0, lambda: y * 1.0, lambda: v * y)
    assert float(tape.gradient(z, v)) == pytest.approx(3 * 1.5**2)


def test_variables_with_grad_and_nested_tapes() -> None:
    v = gl.Variable(f64(2.0))
    with gl.GradientTape() as outer:
        with gl.GradientTape() as inner:
            y = v * (v * v)
        g = inner.gradient(y, v)  # 3 v**2, recorded by the outer tape
    assert float(g) == 12.0
    assert float(outer.gradient(g, v)) == 12.0  # 6 v


def test_tensor_op_variable_reads_the_variable() -> None:
    v = gl.Variable(f64(2.0))
    x = f64(3.0)
    with gl.GradientTape() as tape:
        y = x * v
    assert y.dtype == gl.float64
    assert float(tape.gradient(y, v)) == 3.0


def test_stop_gradient_over_structures_with_variables() -> None:
    x = gl.tensor(2.0, dtype=gl.float64)
    v = gl.Variable(f64(1.0))
    with gl.GradientTape(persistent=True) as tape:
        tape.watch(x)
        s = gl.autodiff.stop_gradient({"a": x * x, "b": [x, v]})
        y = s["a"] * x + s["b"][0] + s["b"][1].sum()
    assert set(s) == {"a", "b"} and isinstance(s["b"], list)
    assert float(tape.gradient(y, x)) == 4.0  # only the unstopped factor x
    assert tape.gradient(y, v) is None


def test_registry_of_tapes_that_see_variable_reads() -> None:
    with gl.GradientTape() as a:
        with gl.GradientTape() as b:
            assert _recording.recording_tapes() == [a, b]
            with _recording.paused():
                assert _recording.recording_tapes() == [] and not gl._core.any_tape_active()
        assert _recording.recording_tapes() == [a]
    assert _recording.recording_tapes() == [] and not gl._core.any_tape_active()


def test_reads_on_other_threads_are_not_seen() -> None:
    v = gl.Variable(1.0)
    with gl.GradientTape() as tape:
        reader = threading.Thread(target=v.read)
        reader.start()
        reader.join()
    assert tape.watched_variables() == ()
