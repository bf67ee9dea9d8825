"""Bad inputs raise the right `gl.errors` class, with a message that names the op, the offending
shapes or dtypes, and the user's source line (this file).

Shapes may be printed as [2, 3] or (2, 3); `shape_re` accepts both.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

import gradloop as gl

E = gl.errors


def shape_re(*dims: int) -> str:
    """A regex for a shape printed either way: [2, 3] / (2, 3), [4] / (4,), [] / ()."""
    return r"[\[(]" + ", ".join(str(d) for d in dims) + (r",?" if len(dims) == 1 else "") + r"[\])]"


@contextmanager
def raises(cls: type[BaseException], *patterns: str) -> Iterator[None]:
    """Expects `cls`, whose message matches every regex in `patterns` and names this file."""
    with pytest.raises(cls) as info:
        yield
    message = str(info.value)
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not found in error message {message!r}"
    assert "test_errors.py" in message, f"the user's source line is missing from {message!r}"


def f32(*shape: int) -> gl.Tensor:
    return gl.tensor(np.ones(shape, np.float32))


def f64(*shape: int) -> gl.Tensor:
    return gl.tensor(np.ones(shape, np.float64))


def i32(*shape: int) -> gl.Tensor:
    return gl.tensor(np.ones(shape, np.int32))


def b(*shape: int) -> gl.Tensor:
    return gl.tensor(np.ones(shape, np.bool_))


def test_hierarchy() -> None:
    assert issubclass(E.ShapeError, ValueError) and issubclass(E.ShapeError, E.GradloopError)
    assert issubclass(E.DTypeError, TypeError) and issubclass(E.DTypeError, E.GradloopError)
    assert issubclass(E.IndexError, builtins.IndexError) and issubclass(
        E.IndexError, E.GradloopError
    )
    assert issubclass(E.GradientError, E.GradloopError)


# ---- shapes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "fn"),
    [
        ("add", lambda x, y: gl.add(x, y)),
        ("add", lambda x, y: x + y),
        ("sub", lambda x, y: y - x),
        ("mul", lambda x, y: gl.mul(x, y)),
        ("div", lambda x, y: x / y),
        ("pow", lambda x, y: x**y),
        ("maximum", lambda x, y: gl.maximum(x, y)),
        ("less", lambda x, y: x < y),
        ("equal", lambda x, y: gl.equal(x, y)),
    ],
)
def test_broadcast_mismatch(op: str, fn) -> None:
    with raises(E.ShapeError, op, shape_re(2, 3), shape_re(4)):
        fn(f32(2, 3), f32(4))


def test_shape_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        gl.add(f32(2, 3), f32(3, 2))


def test_where_mismatch() -> None:
    with raises(E.ShapeError, "where", shape_re(3)):
        gl.where(b(2), f32(3), f32(3))


@pytest.mark.parametrize(
    ("a", "b_", "shapes"),
    [
        ((2, 3), (4, 5), ((2, 3), (4, 5))),
        ((3,), (4,), ((3,), (4,))),
        ((2, 2, 3), (2, 2), ((2, 2, 3), (2, 2))),
    ],
)
def test_matmul_mismatch(a: tuple, b_: tuple, shapes: tuple) -> None:
    with raises(E.ShapeError, "matmul", shape_re(*shapes[0]), shape_re(*shapes[1])):
        gl.matmul(f32(*a), f32(*b_))


def test_matmul_batch_mismatch() -> None:
    with raises(E.ShapeError, "matmul"):
        f32(2, 3, 4) @ f32(3, 4, 5)


def test_matmul_of_scalars() -> None:
    with pytest.raises((E.ShapeError, E.InvalidArgumentError)):
        gl.matmul(f32(), f32(3))


def test_reshape_wrong_size() -> None:
    with raises(E.ShapeError, "reshape", shape_re(2, 3), shape_re(4)):
        gl.reshape(f32(2, 3), (4,))


def test_reshape_wrong_size_with_unknown_dim() -> None:
    with raises(E.ShapeError, "reshape", shape_re(2, 3)):
        f32(2, 3).reshape(4, -1)


def test_reshape_two_unknown_dims() -> None:
    with raises(ValueError, "reshape"):
        gl.reshape(f32(2, 3), (-1, -1))


def test_broadcast_to_incompatible() -> None:
    with raises(E.ShapeError, "broadcast_to", shape_re(3), shape_re(2, 4)):
        gl.broadcast_to(f32(3), (2, 4))
    with raises(E.ShapeError, "broadcast_to", shape_re(2, 3), shape_re(3)):
        gl.broadcast_to(f32(2, 3), (3,))  # broadcasting never drops dimensions


def test_concatenate_mismatch() -> None:
    with raises(E.ShapeError, "concatenate", shape_re(2, 4)):
        gl.concatenate([f32(2, 3), f32(2, 4)], axis=0)
    with raises(E.ShapeError, "concatenate"):
        gl.concatenate([f32(2, 3), f32(3)], axis=0)
    with raises(E.DTypeError, "concatenate", "float64"):
        gl.concatenate([f32(2), f64(2)])


def test_stack_mismatch() -> None:
    # the message is about the user's call: stack, and the shapes it was given
    with raises(E.ShapeError, "stack", shape_re(2, 3), shape_re(2, 4)):
        gl.stack([f32(2, 3), f32(2, 4)])


# ---- dtypes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["exp", "log", "sin", "cos", "tanh", "sigmoid", "sqrt"])
def test_float_only_unary_on_int(op: str) -> None:
    with raises(E.DTypeError, op, "int32", shape_re(2)):
        getattr(gl, op)(i32(2))


@pytest.mark.parametrize("op", ["neg", "abs", "exp", "relu"])
def test_numeric_unary_on_bool(op: str) -> None:
    with raises(E.DTypeError, op, "bool"):
        getattr(gl, op)(b(2))


def test_logical_on_floats() -> None:
    with raises(E.DTypeError, "logical_and", "float32"):
        gl.logical_and(f32(2), f32(2))
    with raises(E.DTypeError, "logical_or", "float32"):
        f32(2) | f32(2)
    with raises(E.DTypeError, "logical_not", "float64"):
        ~f64(2)


def test_div_on_ints() -> None:
    with raises(E.DTypeError, "div", "int32"):
        gl.div(i32(2), i32(2))
    with raises(E.DTypeError, "div", "int32"):
        i32(2) / 2


def test_mean_on_ints() -> None:
    with raises(E.DTypeError, "mean", "int32"):
        gl.mean(i32(2, 2))


def test_mixed_dtypes_name_both() -> None:
    with raises(E.DTypeError, "add", "float32", "float64"):
        f32(2) + f64(2)
    with raises(E.DTypeError, "matmul", "float32", "float64"):
        f32(2, 2) @ f64(2, 2)


def test_python_float_with_int_tensor() -> None:
    with raises(E.DTypeError, "mul", "int32"):
        i32(3) * 0.5


def test_where_condition_must_be_bool() -> None:
    with raises(E.DTypeError, "where", "float32"):
        gl.where(f32(2), f32(2), f32(2))


def test_dtype_error_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        gl.exp(i32(2))


def test_unknown_dtype() -> None:
    with pytest.raises(E.DTypeError):
        gl.cast(f32(2), "float16")
    with pytest.raises(E.DTypeError):
        gl.tensor(np.zeros(2, np.float16))


# ---- axes and indices -----------------------------------------------------------------------


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axis", [2, -3, (0, 5)])
def test_reduction_axis_out_of_range(op: str, axis: object) -> None:
    bad = axis[1] if isinstance(axis, tuple) else axis
    with raises(E.IndexError, op, str(bad)):
        getattr(gl, op)(f32(2, 3), axis=axis)


def test_repeated_axis() -> None:
    with raises(ValueError, "sum"):
        gl.sum(f32(2, 3), axis=(0, 0))


@pytest.mark.parametrize(
    ("op", "fn"),
    [
        ("concatenate", lambda: gl.concatenate([f32(2, 3), f32(2, 3)], axis=2)),
        ("stack", lambda: gl.stack([f32(2, 3), f32(2, 3)], axis=3)),
        ("take", lambda: gl.take(f32(2, 3), gl.tensor([0]), axis=-3)),
        ("transpose", lambda: gl.transpose(f32(2, 3), (0, 2))),
        ("expand_dims", lambda: gl.expand_dims(f32(2, 3), 4)),
    ],
)
def test_bad_axis(op: str, fn) -> None:
    with raises(E.GradloopError, op):
        fn()


def test_transpose_not_a_permutation() -> None:
    with raises(ValueError, "transpose"):
        gl.transpose(f32(2, 3), (0, 0))
    with raises(ValueError, "transpose"):
        gl.transpose(f32(2, 3, 4), (1, 0))


@pytest.mark.parametrize(
    ("shape", "index", "bad", "size"),
    [((5,), 5, "5", 5), ((5,), -6, "-6", 5), ((3, 4), (1, 4), "4", 4), ((3, 4), (-4, 0), "-4", 3)],
)
def test_index_out_of_range(shape: tuple, index: object, bad: str, size: int) -> None:
    # the message names the bad index and the tensor's shape, or the size of the indexed axis
    with raises(E.IndexError, bad, rf"{shape_re(*shape)}|size {size}\b"):
        f32(*shape)[index]


def test_too_many_indices() -> None:
    with raises(E.IndexError, shape_re(3, 4)):
        f32(3, 4)[0, 0, 0]
    with pytest.raises(E.IndexError):
        f32(3, 4)[..., 0, ...]


def test_index_with_bad_tensor() -> None:
    with pytest.raises(E.GradloopError):
        f32(3)[gl.tensor(1.0)]
    with pytest.raises(E.GradloopError):
        f32(3)[gl.tensor([0, 1])]


def test_take_out_of_range() -> None:
    with raises(E.IndexError, "take", "3"):
        gl.take(f32(3), gl.tensor([0, 3]), axis=0)
    with raises(E.IndexError, "take", "-4"):
        gl.take(f32(3), gl.tensor([-4]), axis=0)


def test_index_error_is_builtin_index_error() -> None:
    with pytest.raises(builtins.IndexError):
        f32(2)[2]


# ---- gradients ------------------------------------------------------------------------------


def test_gradient_with_respect_to_int_tensor() -> None:
    x = gl.tensor([1, 2, 3])
    with raises(E.GradientError, "int32"):
        with gl.GradientTape() as tape:
            tape.watch(x)
            y = gl.sum(x * x)
        tape.gradient(y, x)


def test_grad_with_respect_to_int_tensor() -> None:
    with raises(E.GradientError, "int32"):
        gl.grad(lambda v: gl.sum(v * v))(gl.tensor([1, 2, 3]))


def test_non_persistent_tape_used_twice() -> None:
    x = f64(3)
    with gl.GradientTape() as tape:
        tape.watch(x)
        y = gl.sum(x * x)
    tape.gradient(y, x)
    with raises(E.GradientError):
        tape.gradient(y, x)


def test_persistent_tape_can_be_reused() -> None:
    x = f64(3)
    with gl.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = gl.sum(x * x)
    g1, g2 = tape.gradient(y, x), tape.gradient(y, x)
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g2))


def test_grad_of_non_scalar_output() -> None:
    with raises(E.GradientError, shape_re(3)):
        gl.grad(lambda v: v * v)(f64(3))
