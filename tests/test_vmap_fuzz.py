"""`gl.vmap` around random programs (`program_fuzz.py`): nested `cond`, `switch_case` and
`while_loop` whose predicates, branch indices and trip counts differ per lane, closures,
`checkpoints`, scans, solves and custom rules. Each batched value and per-example gradient is
compared with the program run one lane at a time, eagerly and in graph mode, under one `vmap`
and under two nested ones (predicates that differ over both levels at once); a few compiled, by
`gl.jit` on XLA (where jaxlib is installed) and IREE. Programs that assign a Variable are left
out: inside `vmap` that is an error by contract (`test_vmap.py` checks it)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings

import gradloop as gl
from gradloop import batching
from program_fuzz import N, Program, assigns, forward_ok, programs

# a smoke test of the generator in `make test`: `make fuzz` searches (thousands of programs)
EXAMPLES = int(os.environ.get("GRADLOOP_VMAP_FUZZ_EXAMPLES", "100"))
# compiled, each program is a compile (`make fuzz` draws more)
COMPILED_EXAMPLES = int(os.environ.get("GRADLOOP_VMAP_FUZZ_COMPILED_EXAMPLES", "6"))
SEED = int(os.environ.get("GRADLOOP_FUZZ_SEED", "20261206"))
LANES = 4


def _batchable(spec: Any) -> Any:
    """`spec` with its loops assigning no Variable (a Variable holds one value, not one per
    lane), so that every drawn program is run."""
    if spec[0] == "leaf":
        return spec
    if spec[0] in ("add", "mul"):
        return (spec[0], tuple(_batchable(p) for p in spec[1]))
    if spec[0] == "cond":
        return ("cond", spec[1], tuple(_batchable(p) for p in spec[2]))
    if spec[0] == "switch":
        return ("switch", [_batchable(p) for p in spec[1]], spec[2])
    kind, body, offset, bound, extra, _assign, *rest = spec
    return (kind, _batchable(body), offset, bound, extra, False, *rest)


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(SEED)
    return rng.uniform(-1.2, 1.2, (LANES, N))


def _per_lane(fn: Any, xs: np.ndarray) -> np.ndarray:
    return np.stack([np.asarray(fn(gl.tensor(x))) for x in xs])


@seed(SEED)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
@given(programs(max_leaves=6, heavy=True))
def test_vmap_of_random_programs_is_each_lane_run_alone(spec: Any) -> None:
    spec = _batchable(spec)
    assert not assigns(spec)
    program = Program(spec)
    xs = _inputs()
    value = _per_lane(program, xs)
    grad = _per_lane(gl.grad(program), xs)
    forward = forward_ok(spec)  # no custom_gradient leaf (it has no forward-mode rule)
    tangent = _per_lane(_tangent(program), xs) if forward else None
    for mode in ["eager", "graph", "vmap_of_graph"]:
        batched_value = gl.vmap(program)
        batched_grad = gl.vmap(gl.grad(program))
        batched_tangent = gl.vmap(_tangent(program))
        if mode == "graph":
            batched_value, batched_grad = gl.function(batched_value), gl.function(batched_grad)
            batched_tangent = gl.function(batched_tangent)
        if mode == "vmap_of_graph":  # each function compiled with the vmap inside it
            batched_value = gl.vmap(gl.function(program))
            batched_grad = gl.vmap(gl.function(gl.grad(program)))
            batched_tangent = gl.vmap(gl.function(_tangent(program)))
        got = np.asarray(batched_value(gl.tensor(xs)))
        np.testing.assert_allclose(got, value, rtol=1e-12, atol=1e-13, err_msg=f"{mode}: {spec}")
        got = np.asarray(batched_grad(gl.tensor(xs)))
        np.testing.assert_allclose(got, grad, rtol=1e-10, atol=1e-12, err_msg=f"{mode}: {spec}")
        if forward:
            got = np.asarray(batched_tangent(gl.tensor(xs)))
            err = f"{mode}: {spec}"
            np.testing.assert_allclose(got, tangent, rtol=1e-10, atol=1e-12, err_msg=err)
    # An empty batch: no trip and no branch run, and the results have the lanes' shapes and
    # dtypes (eagerly, and traced for the value).
    empty = gl.tensor(xs[:0])
    for batched, want in [
        (gl.vmap(program), value),
        (gl.vmap(gl.grad(program)), grad),
        (gl.function(gl.vmap(program)), value),
    ]:
        got = np.asarray(batched(empty))
        assert got.shape == (0, *want.shape[1:]) and got.dtype == want.dtype, (got, spec)
    # jacrev of a function that vmaps the program: jacrev's own vmap (over cotangents) runs
    # the gradients recorded under the program's (custom rules' included)
    scales = np.array([1.0, -0.7, 0.4, 1.3])[:LANES]
    rows = lambda x: gl.vmap(program)(x[None, :] * gl.tensor(scales)[:, None])  # noqa: E731
    want = _per_lane(gl.grad(program), xs[0] * scales[:, None]) * scales[:, None]
    if np.isfinite(want).all():  # else a row's zero cotangents meet a lane's inf: NaN, as IEEE says
        got = np.asarray(gl.jacrev(rows)(gl.tensor(xs[0])))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=f"jacrev: {spec}")


def _tangent(program: Any) -> Any:
    """The program's forward-mode derivative along a fixed direction."""
    direction = np.linspace(-1.0, 1.0, N)
    return lambda x: gl.jvp(program, (x,), (gl.tensor(direction),))[1]


@contextlib.contextmanager
def small_buckets() -> Iterator[None]:
    """Buckets at every lane count the fuzzer draws: 8 lanes run in buckets of 4, 2 and 1 (the
    sizes the production thresholds give only past 64 lanes)."""
    saved = (batching._BUCKET_MIN_LANES, batching._BUCKET_MIN, batching._BUCKET_RATIO)
    batching._BUCKET_MIN_LANES, batching._BUCKET_MIN, batching._BUCKET_RATIO = 2, 1, 2
    try:
        yield
    finally:
        batching._BUCKET_MIN_LANES, batching._BUCKET_MIN, batching._BUCKET_RATIO = saved


@contextlib.contextmanager
def small_passes() -> Iterator[None]:
    """Machine code's passes over lanes (runs of elementwise ops computed as one loop) from 2
    elements and 2 ops: the fuzzer's few lanes take the code that production gives from 8
    elements and 4 ops, with its vector blocks and odd tails. The tests run frames in check
    mode, so each pass is compared bit for bit with the frame's register program."""
    saved = gl._core.fused_passes()
    gl._core.set_fused_passes(2, 2)
    try:
        yield
    finally:
        gl._core.set_fused_passes(*saved)


def test_vmap_of_random_programs_in_buckets_is_each_lane_run_alone() -> None:
    # Traced constructs over fewer lanes than the batch (each branch in the smallest bucket
    # that holds its lanes, a loop's live lanes gathered into smaller buckets as lanes finish),
    # their elementwise ops in passes over the lanes (24, 12, 6 and 3 elements).
    @seed(SEED + 3)
    @settings(
        max_examples=max(1, EXAMPLES // 2),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(programs(max_leaves=6, heavy=True))
    def check(spec: Any) -> None:
        program = Program(_batchable(spec))
        xs = np.concatenate([_inputs(), _inputs()[::-1] * -0.7])
        value = _per_lane(program, xs)
        grad = _per_lane(gl.grad(program), xs)
        with small_buckets(), small_passes():
            got = np.asarray(gl.function(gl.vmap(program))(gl.tensor(xs)))
            np.testing.assert_allclose(got, value, rtol=1e-12, atol=1e-13, err_msg=f"{spec}")
            got = np.asarray(gl.function(gl.vmap(gl.grad(program)))(gl.tensor(xs)))
            np.testing.assert_allclose(got, grad, rtol=1e-10, atol=1e-12, err_msg=f"{spec}")

    before = gl._core.frame_statistics()["fused_passes_compiled"]
    check()
    if EXAMPLES >= 20:
        # the draws reach the passes (a batched loop body holds chains of elementwise ops)
        assert gl._core.frame_statistics()["fused_passes_compiled"] > before


@seed(SEED + 2)
@settings(
    max_examples=max(1, EXAMPLES // 4),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
@given(programs(max_leaves=5, heavy=True))
def test_nested_vmap_of_random_programs_is_each_pair_of_lanes_run_alone(spec: Any) -> None:
    # Two levels: every predicate differs over both at once (each pair of lanes its own
    # branches and trips).
    program = Program(_batchable(spec))
    xs = np.stack([_inputs()[:3], _inputs()[1:] * -0.8])
    value = np.stack([_per_lane(program, row) for row in xs])
    grad = np.stack([_per_lane(gl.grad(program), row) for row in xs])
    for mode in ["eager", "graph"]:
        batched_value = gl.vmap(gl.vmap(program))
        batched_grad = gl.vmap(gl.vmap(gl.grad(program)))
        if mode == "graph":
            batched_value, batched_grad = gl.function(batched_value), gl.function(batched_grad)
        got = np.asarray(batched_value(gl.tensor(xs)))
        np.testing.assert_allclose(got, value, rtol=1e-12, atol=1e-13, err_msg=f"{mode}: {spec}")
        got = np.asarray(batched_grad(gl.tensor(xs)))
        np.testing.assert_allclose(got, grad, rtol=1e-10, atol=1e-12, err_msg=f"{mode}: {spec}")
    # Outer lanes over empty inner batches: each outer lane's constructs run over no lane.
    empty = gl.tensor(xs[:, :0])
    got = np.asarray(gl.vmap(gl.vmap(gl.grad(program)))(empty))
    assert got.shape == (2, 0, *grad.shape[2:]) and got.dtype == grad.dtype, (got, spec)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["xla", "iree"])
def test_vmap_of_random_programs_compiled_is_each_lane_run_alone(backend: str) -> None:
    if backend == "xla":
        pytest.importorskip("jax")

    @seed(SEED + 1)
    @settings(
        max_examples=COMPILED_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(programs(max_leaves=4, heavy=False))
    def check(spec: Any) -> None:
        program = Program(_batchable(spec))
        xs = _inputs()
        jit = (lambda f: gl.jit(f, backend="xla")) if backend == "xla" else gl.jit
        got = np.asarray(jit(gl.vmap(program))(gl.tensor(xs)))
        want = _per_lane(program, xs)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13, err_msg=f"{spec}")
        got = np.asarray(jit(gl.vmap(gl.grad(program)))(gl.tensor(xs)))
        want = _per_lane(gl.grad(program), xs)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=f"{spec}")

    check()


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_program_with_every_construct_batched(mode: str) -> None:
    leaf = ("leaf", "tanh")
    loop = ("while", ("leaf", "sin"), 1, 5, "overwritten", False, 2)
    spec = ("cond", 0.1, (("switch", [leaf, loop], True), ("add", (("leaf", "x"), loop))))
    program = Program(spec)
    xs = _inputs()
    fn = gl.vmap(gl.grad(program))
    fn = gl.function(fn) if mode == "graph" else fn
    np.testing.assert_allclose(
        np.asarray(fn(gl.tensor(xs))), _per_lane(gl.grad(program), xs), rtol=1e-10, atol=1e-12
    )
