"""Every op of the op table through the emitter and back through the importer: a traced
program's MLIR (`gl.to_mlir`), imported again and run on the graph interpreter
(`_core.mlir_run_reference`), gives what the program itself gives there. So the importer's
inverse of each op's StableHLO (its row in `import/table.rs`) is checked against the op
table's own emission, on values that reach the special cases (negative, zero and large
operands, rounding ties, NaN and infinities)."""

from __future__ import annotations

import numpy as np
import pytest

import gradloop as gl
from gradloop import _core

iree_ir = pytest.importorskip("iree.compiler.ir")

RNG = np.random.default_rng(0)
SPECIAL = np.array([-2.5, -0.5, 0.0, -0.0, 1.5, 2.5, -1e300, 1e300, np.inf, -np.inf, np.nan, 3.0])
X = gl.tensor(SPECIAL.reshape(2, 6))
Y = gl.tensor(RNG.uniform(0.5, 2.0, (2, 6)))
V = gl.tensor(RNG.uniform(-1.0, 1.0, (5,)))
INDEX = gl.tensor(2, dtype=gl.int32)
TAKEN = np.array([0, 3, 3], dtype=np.int32)

#: An op that traced Python programs never produce, and why.
UNREACHED = {
    # `zeros_like`/`ones_like` of a tensor whose shape is known only at run time; traced
    # programs have static shapes (the Rust emitter's tests cover its dynamic form).
    "fill_like": "dynamic shapes only",
    # factorisation kernels: graphs hold them as composite calls, whose loops are emitted
    # (test_linalg_kernels.py)
    "lu_factor": "kernel of a composite",
    "lu_permutation": "kernel of a composite",
    "lu_solve": "kernel of a composite",
    "triangular_solve": "kernel of a composite",
    "cholesky": "kernel of a composite",
    "householder_qr": "kernel of a composite",
    # a traced batched construct's bucket gather: a composite too, whose prefix sum is
    # emitted (test_vmap_buckets.py compiles it)
    "pack_indices": "kernel of a composite",
}


def elementwise(x, y):
    return (
        gl.neg(x), gl.exp(y), gl.log(y), gl.sin(y), gl.cos(y), gl.tanh(x), gl.sigmoid(x),
        gl.relu(x), gl.sqrt(y), gl.abs(x), gl.sign(x), gl.floor(x), gl.ceil(x), gl.round(x),
        x + y, x - y, x * y, x / y, gl.pow(y, x), gl.pow(x, 2.0), gl.pow(x, 3.0),
        gl.maximum(x, y), gl.minimum(x, y), _core.identity(x),
        gl.tan(x), gl.log1p(y), gl.expm1(x), gl.arctan2(x, y - 1.0), gl.fmod(x, y),
        gl.remainder(x, y), gl.floor_divide(x, y),
        _core.bitcast_convert(_core.bitcast_convert(x, gl.int64) + 1, gl.float64),
        _core.quotient(gl.cast(x, gl.int64), gl.cast(y * 3.0, gl.int64)),
        gl.bitwise_and(_core.bitcast_convert(x, gl.int64), 0x7FFF_FFFF_FFFF_FFFF),
        gl.bitwise_or(gl.cast(y * 8.0, gl.int32), 5), gl.bitwise_xor(gl.cast(x * 8.0, gl.int64), 3),
    )  # fmt: skip


def composed(x, y):
    """Ops that pure StableHLO writes as compositions: read back, they agree to rounding."""
    return (
        gl.arcsin(y - 1.0), gl.arccos(y - 1.0), gl.arctan(x), gl.sinh(x), gl.cosh(x),
        gl.arcsinh(x), gl.arccosh(y + 0.5), gl.arctanh(y - 1.0), _core.quotient(x, y), gl.erf(x),
    )  # fmt: skip


def logic(x, y):
    p, q = x < y, x >= 0.5
    return (
        gl.equal(x, y), gl.not_equal(x, x), x <= y, x > y, gl.logical_and(p, q),
        gl.logical_or(p, q), gl.logical_not(p), gl.where(p, x, y),
        gl.cast(y * 3.0, gl.int32), gl.cast(y * 3.0, gl.int64), gl.cast(p, gl.float64),
        gl.cast(x, gl.float32), gl.cast(gl.cast(y * 3.0, gl.int32), gl.float64),
    )  # fmt: skip


def creation(x, y):
    return (gl.zeros((2, 6), gl.float64) + y, gl.ones_like(x), gl.arange(4), gl.stop_gradient(x))


def reduce(x, y):
    return (gl.sum(y, axis=1), gl.max(x, axis=0), gl.min(y), gl.sum(gl.cast(y * 3.0, gl.int32)))


def layout(x, y):
    return (
        gl.matmul(y, gl.transpose(y)), gl.reshape(y, (3, 4)), gl.broadcast_to(y[0], (4, 6)),
        gl.concatenate([x, y], axis=0), y[:, 1:3], y[::-1],
    )  # fmt: skip


def index(v, i):
    return (v[i], v[1:4])


def gradients(v, i):
    # The gradients of a slice, an indexed read and relu: pad, dynamic_update_slice, relu_grad.
    return (gl.grad(lambda v: gl.sum(v[1:4] * 3.0) + v[i] * 2.0 + gl.sum(gl.relu(v) * v))(v),)


def gather(v, i):
    # take, and its gradient: scatter_add.
    taken = gl.take(gl.reshape(v[:4], (2, 2)), gl.tensor(TAKEN[:2] - 2), axis=1)
    return (taken, gl.grad(lambda v: gl.sum(gl.take(v, gl.tensor(TAKEN)) ** 2))(v))


CASES = [
    (elementwise, (X, Y)),
    (logic, (X, Y)),
    (composed, (X, Y)),
    (creation, (X, Y)),
    (reduce, (X, Y)),
    (layout, (X, Y)),
    (index, (V, INDEX)),
    (gradients, (V, INDEX)),
    (gather, (V, INDEX)),
]


def _generic(text: str) -> str:
    with iree_ir.Context():
        module = iree_ir.Module.parse(text)
        return module.operation.get_asm(print_generic_op_form=True, use_local_scope=True)


@pytest.mark.parametrize(("fn", "args"), CASES, ids=[fn.__name__ for fn, _ in CASES])
def test_the_importer_inverts_the_emitter(fn, args) -> None:
    want = [np.asarray(t) for t in gl.function(fn).concrete_function(*args)(list(args))]
    text = _generic(gl.to_mlir(fn, *args))
    got = [np.asarray(t) for t in _core.mlir_run_reference(text, fn.__name__, list(args))]
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{fn.__name__} result {k}"
        if fn is composed:
            np.testing.assert_allclose(g, w, rtol=1e-14, err_msg=f"composed result {k}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{fn.__name__} result {k}")


def test_the_cases_reach_every_op_of_the_table() -> None:
    reached = set()
    for fn, args in CASES:
        concrete = gl.function(fn).concrete_function(*args)
        reached |= {name for name in _core.op_names() if concrete.count_nodes(name)}
    assert set(_core.op_names()) - reached == set(UNREACHED)


GATHER_SCATTER = """
func.func @main(%x: tensor<5xf64>, %i: tensor<3x1xi32>, %u: tensor<3xf64>)
    -> (tensor<3xf64>, tensor<5xf64>) {
  %g = "stablehlo.gather"(%x, %i) {dimension_numbers = #stablehlo.gather<
      collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>,
      indices_are_sorted = false, slice_sizes = array<i64: 1>}
      : (tensor<5xf64>, tensor<3x1xi32>) -> tensor<3xf64>
  %s = "stablehlo.scatter"(%x, %i, %u) ({
  ^bb0(%a: tensor<f64>, %b: tensor<f64>):
    %t = stablehlo.add %a, %b : tensor<f64>
    stablehlo.return %t : tensor<f64>
  }) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<
      inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>,
      unique_indices = false} : (tensor<5xf64>, tensor<3x1xi32>, tensor<3xf64>) -> tensor<5xf64>
  return %g, %s : tensor<3xf64>, tensor<5xf64>
}
"""


def test_gather_clamps_and_scatter_skips_out_of_range_indices_as_stablehlo_does() -> None:
    # JAX's form: an explicit index vector dimension of size 1.
    x = np.array([10.0, 11.0, 12.0, 13.0, 14.0])
    i = np.array([[-1], [2], [9]], dtype=np.int32)
    u = np.array([1.0, 2.0, 3.0])
    g, s = _core.mlir_run_reference(_generic(GATHER_SCATTER), "main", [x, i, u])
    np.testing.assert_array_equal(np.asarray(g), [10.0, 12.0, 14.0])
    np.testing.assert_array_equal(np.asarray(s), x + np.array([0.0, 0.0, 2.0, 0.0, 0.0]))
