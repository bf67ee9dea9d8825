"""Numerical gradient table: one row per differentiable op (and operator form), several shapes
each (broadcasting, size-0 and size-1 dimensions), checked to first and second order against
central finite differences (see gradcheck.py).

Under `gl.jit` the rows' programs (each row's gradient and Hessian-vector product, and its
tangents) are compiled GROUP rows to a module, each row checked on its own results.

Domains keep finite differences valid: log/sqrt/pow bases positive, relu/abs and division away
from 0, maximum/minimum operands and max/min reduction elements apart from each other.
"""

from __future__ import annotations

import functools
import itertools
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import gradloop as gl
from gradcheck import (
    Program,
    check_grads,
    check_tangents,
    gradient_program,
    run_alone,
    tangent_program,
)

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Row:
    op: str
    fn: Callable[..., gl.Tensor]
    shapes: tuple[Shape, ...]
    domain: tuple[str, ...] | str = "real"
    tol: tuple[float, float, float] = (1e-6, 1e-5, 1e-6)  # atol, rtol, eps

    @property
    def label(self) -> str:
        return self.op + "-" + ",".join("x".join(map(str, s)) or "()" for s in self.shapes)


def sample(domain: str, shape: Shape, rng: np.random.Generator) -> np.ndarray:
    if domain == "real":
        return rng.uniform(-2.0, 2.0, shape)
    if domain == "pos":
        return rng.uniform(0.5, 2.0, shape)
    if domain == "away0":  # |x| >= 0.3: no kink of relu/abs/sign, no pole of 1/x
        return np.where(rng.uniform(size=shape) < 0.5, -1.0, 1.0) * rng.uniform(0.3, 2.0, shape)
    if domain in ("even", "odd"):  # an "even" value is >= 0.2 from every "odd" one
        centre = 2.0 * rng.integers(-2, 2, shape) + (1.0 if domain == "odd" else 0.0)
        return centre + rng.uniform(-0.4, 0.4, shape)
    if domain == "unit":  # inside arcsin's, arccos's and arctanh's domain, away from its ends
        return rng.uniform(-0.8, 0.8, shape)
    if domain == "above1":  # arccosh's
        return rng.uniform(1.2, 3.0, shape)
    if domain in ("mod_a", "mod_b"):  # a / b at least 0.15 from an integer: no jump of fmod
        sign = np.where(rng.uniform(size=shape) < 0.5, -1.0, 1.0)
        if domain == "mod_b":
            return sign * rng.uniform(1.97, 2.03, shape)
        return sign * (2.0 * rng.integers(0, 3, shape) + rng.uniform(0.4, 1.6, shape))
    if domain == "distinct":  # elements >= 0.3 apart: no ties for max/min
        n = int(np.prod(shape))
        values = 0.5 * rng.permutation(n) - 0.25 * n + rng.uniform(-0.1, 0.1, n)
        return values.reshape(shape)
    raise ValueError(domain)


UNARY_SHAPES: tuple[Shape, ...] = ((), (4,), (2, 3), (0, 3), (1, 2, 1))
BINARY_SHAPES: tuple[tuple[Shape, Shape], ...] = (
    ((), ()),
    ((3,), (3,)),
    ((2, 3), (3,)),
    ((2, 1), (1, 3)),
    ((), (2, 2)),
    ((1,), (3,)),
    ((0, 3), (1, 3)),
    ((2, 0), (2, 1)),
)


#: Fewer shapes for the elementwise functions whose broadcasting and empty-tensor handling is
#: the shared macro's, already checked by the rows above over every shape.
FEW_UNARY_SHAPES: tuple[Shape, ...] = ((), (2, 3))
FEW_BINARY_SHAPES: tuple[tuple[Shape, Shape], ...] = (((3,), (3,)), ((2, 1), (1, 3)))


def unary(
    op: str,
    fn: Callable[..., gl.Tensor],
    domain: str = "real",
    shapes: tuple[Shape, ...] = UNARY_SHAPES,
) -> list[Row]:
    return [Row(op, fn, (s,), domain) for s in shapes]


def binary(
    op: str,
    fn: Callable[..., gl.Tensor],
    domain: tuple[str, str] = ("real", "real"),
    shapes: tuple[tuple[Shape, Shape], ...] = BINARY_SHAPES,
) -> list[Row]:
    return [Row(op, fn, pair, domain) for pair in shapes]


_rng = np.random.default_rng(1234)


def _cond(shape: Shape) -> gl.Tensor:
    return gl.tensor(_rng.uniform(size=shape) < 0.5)


def _where_rows() -> list[Row]:
    cases = [
        ((2, 3), (2, 3), (2, 3)),
        ((3,), (2, 3), ()),
        ((2, 1), (1, 3), (2, 3)),
        ((0, 3), (0, 3), (3,)),
    ]
    rows = []
    for c_shape, x_shape, y_shape in cases:
        c = _cond(c_shape)
        rows.append(Row("where", lambda x, y, c=c: gl.where(c, x, y), (x_shape, y_shape)))
    return rows


def _reduction_rows() -> list[Row]:
    rows = []
    for name, fn in (("sum", gl.sum), ("mean", gl.mean)):
        for shape, axis, keep in (
            ((2, 3, 4), None, False),
            ((2, 3, 4), 0, False),
            ((2, 3, 4), -1, True),
            ((2, 3, 4), (0, 2), False),
            ((2, 3, 4), (-3, 1), True),
            ((), None, False),
            ((1,), 0, False),
            ((0, 3), 1, False),
        ):
            rows.append(
                Row(
                    f"{name}{axis}{'k' if keep else ''}",
                    lambda x, f=fn, a=axis, k=keep: f(x, axis=a, keepdims=k),
                    (shape,),
                )
            )
    rows.append(Row("sum_zero_size_all", lambda x: gl.sum(x), ((0, 3),)))
    for name, fn in (("max", gl.max), ("min", gl.min)):
        for shape, axis, keep in (
            ((2, 3, 4), None, False),
            ((2, 3, 4), 1, False),
            ((2, 3, 4), (0, 2), True),
            ((3, 4), -1, False),
            ((1,), None, False),
        ):
            rows.append(
                Row(
                    f"{name}{axis}{'k' if keep else ''}",
                    lambda x, f=fn, a=axis, k=keep: f(x, axis=a, keepdims=k),
                    (shape,),
                    "distinct",
                )
            )
    rows.append(Row("method_sum", lambda x: x.sum(axis=1), ((2, 3),)))
    rows.append(Row("method_mean", lambda x: x.mean(), ((2, 3),)))
    rows.append(Row("method_max", lambda x: x.max(axis=0, keepdims=True), ((3, 2),), "distinct"))
    rows.append(Row("method_min", lambda x: x.min(axis=-1), ((3, 2),), "distinct"))
    return rows


def _matmul_rows() -> list[Row]:
    shapes = [
        ((3, 4), (4, 2)),
        ((1, 1), (1, 1)),
        ((2, 3, 4), (4, 5)),
        ((2, 1, 3, 4), (3, 4, 2)),
        ((4,), (4, 2)),
        ((3, 4), (4,)),
        ((4,), (4,)),
        ((2, 3, 4), (4,)),
        ((3, 0), (0, 2)),
        ((0, 3), (3, 2)),
    ]
    rows = [Row("matmul", gl.matmul, pair) for pair in shapes]
    rows.append(Row("op_matmul", lambda a, b: a @ b, ((2, 3), (3, 2))))
    return rows


def _layout_rows() -> list[Row]:
    rows = [
        Row("reshape", lambda x: gl.reshape(x, (3, 2)), ((2, 3),)),
        Row("reshape", lambda x: gl.reshape(x, (6,)), ((2, 3),)),
        Row("reshape", lambda x: gl.reshape(x, (1, 1)), ((),)),
        Row("reshape", lambda x: gl.reshape(x, (3, 0)), ((0, 3),)),
        Row("reshape_infer", lambda x: gl.reshape(x, (2, -1)), ((4, 3),)),
        Row("method_reshape", lambda x: x.reshape(2, 2, 2), ((8,),)),
        Row("transpose", lambda x: gl.transpose(x), ((2, 3),)),
        Row("transpose", lambda x: gl.transpose(x, (2, 0, 1)), ((2, 3, 4),)),
        Row("transpose", lambda x: gl.transpose(x, (1, 0, 2)), ((1, 0, 2),)),
        Row("method_T", lambda x: x.T, ((3, 2),)),
        Row("broadcast_to", lambda x: gl.broadcast_to(x, (2, 3)), ((3,),)),
        Row("broadcast_to", lambda x: gl.broadcast_to(x, (2, 4)), ((2, 1),)),
        Row("broadcast_to", lambda x: gl.broadcast_to(x, (3, 2)), ((),)),
        Row("broadcast_to", lambda x: gl.broadcast_to(x, (2, 1, 3)), ((1, 3),)),
        Row("broadcast_to", lambda x: gl.broadcast_to(x, (0, 3)), ((1, 3),)),
    ]
    for shapes, axis in (
        (((2, 3), (1, 3)), 0),
        (((2, 3), (2, 2)), 1),
        (((2, 3), (2, 1), (2, 2)), -1),
        (((0, 3), (2, 3)), 0),
        (((4,), (2,)), 0),
    ):
        rows.append(
            Row(
                f"concatenate{axis}",
                lambda *xs, a=axis: gl.concatenate(list(xs), axis=a),
                shapes,
            )
        )
    for shapes, axis in (
        (((3,), (3,)), 0),
        (((2, 3),) * 3, 1),
        (((2, 3),) * 2, -1),
        (((2, 0),) * 2, 0),
        (((),) * 2, 0),
    ):
        rows.append(Row(f"stack{axis}", lambda *xs, a=axis: gl.stack(list(xs), axis=a), shapes))
    return rows


def _take_rows() -> list[Row]:
    i32, i64 = np.int32, np.int64
    cases = [
        # a repeated index accumulates its gradient; -1 wraps around
        ((5,), np.array([0, 2, 2, -1], i32), 0),
        ((3, 4), np.array([[0, 1], [3, 0]], i64), 1),
        ((3, 4), np.array([2, -3], i32), -2),
        ((3, 4), np.array(1, i32), 0),
        ((2, 3), np.array([4, 0, -1], i64), None),  # axis None: the flattened tensor
        ((3, 2), np.zeros((0,), i32), 0),
    ]
    return [Row(f"take{axis}", _take(gl.tensor(idx), axis), (shape,)) for shape, idx, axis in cases]


def _take(indices: gl.Tensor, axis: int | None) -> Callable[[gl.Tensor], gl.Tensor]:
    return lambda x: gl.take(x, indices, axis=axis)


def _index_text(index: object) -> str:
    """`x[...]` as written: slices as a:b:c, None, ..., tensors as t(v)."""
    items = index if isinstance(index, tuple) else (index,)
    parts = []
    for i in items:
        if isinstance(i, slice):
            parts.append(":".join("" if v is None else str(v) for v in (i.start, i.stop, i.step)))
        elif isinstance(i, gl.Tensor):
            parts.append(f"t({i.item()}:{i.dtype.name})")
        else:
            parts.append("..." if i is Ellipsis else str(i))
    return "x[" + ",".join(parts) + "]"


def _index_rows() -> list[Row]:
    t, s, E = gl.tensor, slice, Ellipsis
    cases = [
        (
            (5,),
            (
                1,
                -1,
                s(1, 4),
                s(None, None, -1),
                s(None, None, 2),
                s(-2, None, -2),
                None,
                s(10, None),
            ),
        ),
        (
            (3, 4),
            (
                1,
                (s(None), -1),
                (s(1, None), s(None, None, -2)),
                (None, s(None), 1),
                (E, 0),
            ),
        ),
        ((3, 4), ((0, None, s(1, 3)),)),
        (
            (2, 3, 4),
            (
                (E, s(1, 3)),
                (1, E, s(None, None, -1)),
                (s(None), None, s(None, None, 2), -1),
            ),
        ),
        # a scalar int tensor: a dynamic (data-dependent) slice
        ((5,), (t(2), t(0, dtype=gl.int64))),
        ((3, 4), (t(2), (t(1), s(1, None)), (s(None), t(3)))),
    ]
    return [
        Row(_index_text(i), lambda x, i=i: x[i], (shape,))
        for shape, indexes in cases
        for i in indexes
    ]


def _cast_roundtrip(x: gl.Tensor) -> gl.Tensor:
    y = gl.cast(x, gl.float32)
    return gl.cast(y * y, gl.float64)


# float32 rounding limits the precision of differences through float32: larger step and tolerance
_F32_TOL = (2e-3, 1e-3, 1e-2)

ROWS: list[Row] = [
    *unary("neg", gl.neg),
    *unary("exp", gl.exp),
    *unary("log", gl.log, "pos"),
    *unary("sin", gl.sin),
    *unary("cos", gl.cos),
    *unary("tanh", gl.tanh),
    *unary("sigmoid", gl.sigmoid),
    *unary("relu", gl.relu, "away0"),
    *unary("sqrt", gl.sqrt, "pos"),
    *unary("abs", gl.abs, "away0"),
    *unary("tan", gl.tan, "unit", FEW_UNARY_SHAPES),
    *unary("arcsin", gl.arcsin, "unit", FEW_UNARY_SHAPES),
    *unary("arccos", gl.arccos, "unit", FEW_UNARY_SHAPES),
    *unary("arctan", gl.arctan, "real", FEW_UNARY_SHAPES),
    *unary("sinh", gl.sinh, "real", FEW_UNARY_SHAPES),
    *unary("cosh", gl.cosh, "real", FEW_UNARY_SHAPES),
    *unary("arcsinh", gl.arcsinh, "real", FEW_UNARY_SHAPES),
    *unary("arccosh", gl.arccosh, "above1", FEW_UNARY_SHAPES),
    *unary("arctanh", gl.arctanh, "unit", FEW_UNARY_SHAPES),
    *unary("log1p", gl.log1p, "pos", FEW_UNARY_SHAPES),
    *unary("expm1", gl.expm1, "real", FEW_UNARY_SHAPES),
    *unary("erf", gl.erf, "real", FEW_UNARY_SHAPES),
    *unary("square", gl.square, "real", FEW_UNARY_SHAPES),
    *unary("clip", lambda x: gl.clip(x, -0.5, 0.5), "away0", FEW_UNARY_SHAPES),
    *binary("arctan2", gl.arctan2, ("real", "away0"), FEW_BINARY_SHAPES),
    *binary("fmod", gl.fmod, ("mod_a", "mod_b"), FEW_BINARY_SHAPES),
    *binary("remainder", gl.remainder, ("mod_a", "mod_b"), FEW_BINARY_SHAPES),
    *binary("hypot", gl.hypot, ("away0", "away0"), FEW_BINARY_SHAPES),
    *binary("add", gl.add),
    *binary("sub", gl.sub),
    *binary("mul", gl.mul),
    *binary("div", gl.div, ("real", "away0")),
    *binary("pow", gl.pow, ("pos", "real")),
    *binary("maximum", gl.maximum, ("even", "odd")),
    *binary("minimum", gl.minimum, ("odd", "even")),
    *_where_rows(),
    *_reduction_rows(),
    *_matmul_rows(),
    *_layout_rows(),
    *_take_rows(),
    *_index_rows(),
    Row("cast_f32_roundtrip", _cast_roundtrip, ((2, 3),), tol=_F32_TOL),
    Row("cast_f64_identity", lambda x: gl.cast(x, gl.float64) * x, ((3,),)),
    Row("op_add", lambda x, y: x + y, ((2, 3), (3,))),
    Row("op_sub", lambda x, y: x - y, ((2, 1), (3,))),
    Row("op_mul", lambda x, y: x * y, ((3,), (2, 3))),
    Row("op_div", lambda x, y: x / y, ((2, 3), (2, 3)), ("real", "away0")),
    Row("op_pow", lambda x, y: x**y, ((3,), (2, 3)), ("pos", "real")),
    Row("op_neg", lambda x: -x, ((2, 3),)),
    Row("op_abs", lambda x: abs(x), ((2, 3),), "away0"),
    Row("op_scalar_mul", lambda x: x * 3.0 + 1, ((2, 3),)),
    Row("op_scalar_rsub", lambda x: 2.0 - x, ((3,),)),
    Row("op_scalar_rdiv", lambda x: 1.5 / x, ((3,),), "away0"),
    Row("op_scalar_square", lambda x: x**2, ((2, 3),)),
    Row("op_scalar_cube", lambda x: x**3.0, ((4,),)),
    Row("op_scalar_rpow", lambda x: 2.0**x, ((4,),)),
    Row("fan_out", lambda x: x * x + gl.sin(x) * x - gl.exp(x) / (1.0 + x * x), ((2, 3),)),
    Row(
        "composite",
        lambda x, y: gl.tanh(x @ y) * gl.sigmoid(gl.sum(x, axis=1, keepdims=True)),
        ((2, 3), (3, 2)),
    ),
]


def _args(row: Row) -> list[np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(row.label.encode()))
    domains = row.domain if isinstance(row.domain, tuple) else (row.domain,) * len(row.shapes)
    return [sample(d, s, rng) for d, s in zip(domains, row.shapes, strict=True)]


#: Rows whose compiled programs (gradients and tangents) are one `gl.jit` module: IREE's cost
#: is mostly per module, about 0.2 s however small, against some 0.05 s per function in it.
GROUP = 24


@functools.cache
def _group(k: int) -> dict[tuple[int, str], tuple[Program, Sequence[gl.Tensor]]] | None:
    """Group `k`'s programs and their results, run as one module; None where IREE refuses it
    (each row then compiles alone, and the one refused says so)."""
    programs: dict[tuple[int, str], Program] = {}
    for index in range(k * GROUP, min(len(ROWS), (k + 1) * GROUP)):
        args = _args(ROWS[index])
        programs[index, "gradient"] = gradient_program(ROWS[index].fn, args, order=2)
        programs[index, "tangent"] = tangent_program(ROWS[index].fn, args)
    sizes: list[int] = []
    starts = [0, *itertools.accumulate(len(p.inputs) for p in programs.values())]

    def everything(*flat: gl.Tensor) -> tuple[gl.Tensor, ...]:
        results: list[gl.Tensor] = []
        sizes.clear()
        for program, start, end in zip(programs.values(), starts[:-1], starts[1:], strict=True):
            out = program.fn(*flat[start:end])
            sizes.append(len(out))
            results.extend(out)
        return tuple(results)

    try:
        results = gl.jit(everything)(*[t for p in programs.values() for t in p.inputs])
    except gl.errors.CompileError:
        return None
    ends = list(itertools.accumulate(sizes))
    return {
        key: (program, results[end - size : end])
        for (key, program), size, end in zip(programs.items(), sizes, ends, strict=True)
    }


def _run_grouped(row: Row, kind: str) -> Callable[[Program], Any]:
    """How `row`'s `kind` program runs compiled: read from its group's module."""
    index = next(k for k, r in enumerate(ROWS) if r is row)

    def run(program: Program) -> Any:
        group = _group(index // GROUP)
        if group is None:
            return run_alone(program)
        grouped, results = group[index, kind]
        return grouped.read(results)

    return run


def _grouped_rows() -> list[Any]:
    """`ROWS` as parameters, each group's on one test process (`--dist loadgroup`): a group's
    module is compiled once, not once by each process that runs one of its rows."""
    return [
        pytest.param(r, id=r.label, marks=pytest.mark.xdist_group(f"op-rows-{k // GROUP}"))
        for k, r in enumerate(ROWS)
    ]


@pytest.mark.parametrize("row", _grouped_rows())
def test_gradient(row: Row) -> None:
    atol, rtol, eps = row.tol
    run = _run_grouped(row, "gradient")
    check_grads(row.fn, _args(row), order=2, atol=atol, rtol=rtol, eps=eps, run_compiled=run)


@pytest.mark.parametrize("row", _grouped_rows())
def test_tangent(row: Row) -> None:
    # each op's own tangent rule, to first and second order, eagerly, traced and compiled
    atol, rtol, eps = row.tol
    run = _run_grouped(row, "tangent")
    check_tangents(row.fn, _args(row), order=2, atol=atol, rtol=rtol, eps=eps, run_compiled=run)


def _sum_gradients(fn: Callable[..., gl.Tensor], args: list[np.ndarray]) -> list[gl.Tensor]:
    ts = [gl.tensor(a) for a in args]
    with gl.GradientTape() as tape:
        for t in ts:
            tape.watch(t)
        y = gl.sum(fn(*ts))
    return tape.gradient(y, ts, unconnected_gradients="zero")


@pytest.mark.parametrize(
    "row", [pytest.param(r, id=r.label) for r in ROWS if not r.op.startswith("cast")]
)
def test_float32_gradients(row: Row) -> None:
    # the same gradients in float32: float32 dtype, values close to the float64 ones
    rng = np.random.default_rng(zlib.crc32(row.label.encode()))
    domains = row.domain if isinstance(row.domain, tuple) else (row.domain,) * len(row.shapes)
    args = [np.asarray(sample(d, s, rng)) for d, s in zip(domains, row.shapes, strict=True)]
    expected = _sum_gradients(row.fn, args)
    got = _sum_gradients(row.fn, [a.astype(np.float32) for a in args])
    for g, e, a in zip(got, expected, args, strict=True):
        assert g.dtype == gl.float32 and g.shape == a.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", UNARY_SHAPES)
def test_sign_gradient_is_zero(shape: Shape) -> None:
    x = gl.tensor(np.asarray(sample("away0", shape, np.random.default_rng(0))))
    with gl.GradientTape() as tape:
        tape.watch(x)
        y = gl.sum(gl.sign(x) * x)  # d/dx (sign(x) x) = sign(x): sign itself contributes 0
    (g,) = tape.gradient(y, [x])
    np.testing.assert_array_equal(np.asarray(g), np.sign(np.asarray(x)))
    with gl.GradientTape() as tape:
        tape.watch(x)
        y = gl.sum(gl.sign(x))
    g = tape.gradient(y, x, unconnected_gradients="zero")
    assert g.shape == x.shape and g.dtype == gl.float64
    np.testing.assert_array_equal(np.asarray(g), np.zeros(shape))


NOT_DIFFERENTIABLE = {
    "equal": lambda x, y: gl.equal(x, y),
    "not_equal": lambda x, y: gl.not_equal(x, y),
    "less": lambda x, y: gl.less(x, y),
    "less_equal": lambda x, y: x <= y,
    "greater": lambda x, y: x > y,
    "greater_equal": lambda x, y: gl.greater_equal(x, y),
    "logical_and": lambda x, y: gl.logical_and(x > 0, y > 0),
    "logical_or": lambda x, y: gl.logical_or(x > 0, y > 0),
    "logical_not": lambda x, y: gl.logical_not(x > y),
    "cast_to_int": lambda x, y: gl.cast(x * y, gl.int32),
}


@pytest.mark.parametrize("name", sorted(NOT_DIFFERENTIABLE))
def test_not_differentiable_ops_are_unconnected(name: str) -> None:
    x, y = (
        gl.tensor([0.5, -1.0, 2.0], dtype=gl.float64),
        gl.tensor([1.0, -2.0, 2.0], dtype=gl.float64),
    )
    with gl.GradientTape(persistent=True) as tape:
        tape.watch(x)
        tape.watch(y)
        out = NOT_DIFFERENTIABLE[name](x, y)
        # through a float cast the result is usable downstream, still without a gradient
        loss = gl.sum(gl.cast(out, gl.float64) * 3.0)
    assert all(g is None for g in tape.gradient(out, [x, y]))
    assert all(g is None for g in tape.gradient(loss, [x, y]))
    zeros = tape.gradient(loss, [x, y], unconnected_gradients="zero")
    for z in zeros:
        assert z.shape == (3,) and z.dtype == gl.float64
        np.testing.assert_array_equal(np.asarray(z), np.zeros(3))


def test_comparison_inside_where_routes_gradient() -> None:
    # where(x > y, x * y, x): d/dx = y where x > y else 1; d/dy = x where x > y else 0
    xv, yv = np.array([0.5, -1.0, 2.0, 3.0]), np.array([1.0, -2.0, 1.5, 4.0])
    check_grads(lambda x, y: gl.where(x > y, x * y, x), [xv, yv])
    x, y = gl.tensor(xv), gl.tensor(yv)
    gx, gy = gl.grad(lambda a, b: gl.sum(gl.where(a > b, a * b, a)), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(np.asarray(gx), np.where(xv > yv, yv, 1.0))
    np.testing.assert_allclose(np.asarray(gy), np.where(xv > yv, xv, 0.0))


# ---- the checker itself can fail -------------------------------------------------------------


@gl.custom_gradient
def _square_wrong_first_order(x: gl.Tensor):
    return x * x, lambda g: g * 3.0 * x  # d/dx x^2 is 2x, not 3x


@gl.custom_gradient
def _square_wrong_second_order(x: gl.Tensor):
    # right first derivative 2x, but computed from a constant: its own derivative is lost
    return x * x, lambda g: g * 2.0 * gl.stop_gradient(x)


def test_checker_detects_wrong_first_order() -> None:
    with pytest.raises(AssertionError, match="order 1"):
        check_grads(_square_wrong_first_order, [np.array([0.5, -1.0, 2.0])], order=1)


def test_checker_detects_wrong_second_order() -> None:
    args = [np.array([0.5, -1.0, 2.0])]
    check_grads(_square_wrong_second_order, args, order=1)
    with pytest.raises(AssertionError, match="order 2"):
        check_grads(_square_wrong_second_order, args, order=2)
