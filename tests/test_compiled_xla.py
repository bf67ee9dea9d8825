"""`gl.jit(fn, backend="xla")`: the function's pure StableHLO compiled by XLA through jaxlib.

Values, gradients (loops with data-dependent trip counts, branches), second order and forward
mode against graph mode; Variables threaded through as with IREE; one compile per signature;
`gl.export(..., format="stablehlo")` artifacts run on XLA; every refusal a `gl.errors`
exception."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

import gradloop as gl
from gradcheck import numerical_gradient

jax = pytest.importorskip("jax", reason="backend='xla' runs on jaxlib (gradloop[jax])")


def f64(*v):
    return gl.tensor(np.array(v, dtype=np.float64))


def xla(fn):
    return gl.jit(fn, backend="xla")


def orbit(x, n):
    def body(i, x):
        return i + 1, 0.9 * x + 0.1 * gl.sin(x) * gl.cos(2.0 * x)

    return gl.while_loop(lambda i, x: i < n, body, (gl.tensor(0), x))[1]


def branchy(x):
    """A loop whose trip count and branches depend on the data."""

    def body(i, s):
        s = gl.cond(gl.sum(s) > 0.0, lambda: s * 1.1 - 0.2, lambda: gl.tanh(s) + 0.3)
        s = gl.switch_case(i % 3, [lambda: s, lambda: s * s * 0.5, lambda: gl.sin(s)])
        return i + 1, s

    def more(i, s):
        return gl.logical_and(i < 20, gl.sum(s * s) < 50.0)

    return gl.sum(gl.while_loop(more, body, (gl.tensor(0), x))[1] ** 2)


def assert_close(got, want, rtol=1e-10):
    got = got if isinstance(got, (tuple, list)) else [got]
    want = want if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-12)


def test_values_and_loop_gradients_match_graph_mode_and_finite_differences() -> None:
    x, n = f64(0.3, -0.8, 1.2), gl.tensor(7)
    assert_close(xla(orbit)(x, n), gl.function(orbit)(x, n))
    grad = gl.grad(branchy)
    got = xla(grad)(x)
    assert_close(got, gl.function(grad)(x))
    fd = numerical_gradient(lambda a: float(branchy(gl.tensor(a))), [np.asarray(x)])[0]
    np.testing.assert_allclose(np.asarray(got), fd, rtol=1e-6, atol=1e-8)


def test_second_order_and_forward_mode_match_graph_mode() -> None:
    x = f64(0.3, -0.8, 1.2)
    hessian_vector = lambda x: gl.grad(lambda x: gl.sum(gl.grad(branchy)(x) * f64(1, 2, 3)))(x)  # noqa: E731
    assert_close(xla(hessian_vector)(x), gl.function(hessian_vector)(x))
    tangent = lambda x: gl.jvp(branchy, (x,), (f64(0.5, -1.0, 2.0),))  # noqa: E731
    assert_close(xla(tangent)(x), gl.function(tangent)(x))
    assert_close(xla(gl.hessian(branchy))(x), gl.function(gl.hessian(branchy))(x))


def test_float32_and_integer_results_keep_their_dtypes() -> None:
    x = gl.tensor(np.linspace(0.0, 1.0, 16).astype(np.float32))
    got = xla(lambda x, n: (orbit(x, n), n * 2))(x, gl.tensor(1000))
    want = gl.function(lambda x, n: (orbit(x, n), n * 2))(x, gl.tensor(1000))
    assert_close(got, want, rtol=1e-5)


def test_variables_are_read_and_assigned_as_with_iree() -> None:
    v = gl.Variable(gl.tensor(1.0, dtype=gl.float64))
    w = gl.tensor(2.0, dtype=gl.float64)

    def step(y):
        v.assign_add(gl.sum(y) * w)
        return gl.grad(lambda z: gl.sum(orbit(z, gl.tensor(5)) ** 2))(y) + v.read()

    y = f64(0.3, 0.5)
    fn = xla(step)
    first = np.asarray(fn(y))
    assert float(np.asarray(v.read())) == pytest.approx(1.0 + 1.6)
    second = np.asarray(fn(y))  # the assigned value goes into the next call
    assert float(np.asarray(v.read())) == pytest.approx(1.0 + 3.2)
    np.testing.assert_allclose(second - first, 1.6, rtol=1e-12)
    v.assign(gl.tensor(1.0, dtype=gl.float64))
    assert_close(gl.function(step)(y), first)


def test_one_compile_per_signature() -> None:
    fn = xla(orbit)
    for _ in range(3):
        fn(f64(0.1, 0.2), gl.tensor(3))
    fn(f64(0.1, 0.2, 0.3), gl.tensor(3))
    assert fn.backend == "xla"
    assert len(fn._compiled) == 2


def test_a_stablehlo_export_runs_on_xla(tmp_path) -> None:
    from gradloop import _xla

    x = f64(0.3, -0.8, 1.2)
    path = gl.export(gl.grad(branchy), x, path=tmp_path / "grad.stablehlo", format="stablehlo")
    run = _xla.load(path.read_bytes())
    assert_close([gl.tensor(r) for r in run(np.asarray(x))], gl.function(gl.grad(branchy))(x))
    # JAX's own artifacts name their public function main
    spec = jax.ShapeDtypeStruct((3,), np.float32)
    exported = jax.export.export(jax.jit(lambda v: jax.numpy.sin(v) * 2.0))(spec)
    v = np.array([0.1, 0.2, 0.3], np.float32)
    (got,) = _xla.load(exported.mlir_module_serialized)(v)
    np.testing.assert_allclose(got, np.sin(v) * 2.0, rtol=1e-6)


def test_an_artifact_called_with_the_wrong_arguments_says_which(tmp_path) -> None:
    from gradloop import _xla

    x = f64(0.3, -0.8, 1.2)
    path = gl.export(gl.grad(branchy), x, path=tmp_path / "grad.stablehlo", format="stablehlo")
    run = _xla.load(path.read_bytes())
    with pytest.raises(gl.errors.InvalidArgumentError, match=r"argument 0: expected float64\[3\]"):
        run(np.zeros(3, np.float32))
    with pytest.raises(gl.errors.InvalidArgumentError, match="expected 1 arguments, got 2"):
        run(np.zeros(3), np.zeros(3))


def test_the_jax_export_route_agrees_where_jaxlibs_client_is_missing(monkeypatch) -> None:
    """A jaxlib without the client interface compiles through `jax.export` instead."""
    from gradloop import _xla

    x = f64(0.3, -0.8, 1.2)
    direct = xla(gl.grad(branchy))
    want = direct(x)
    client = _xla._ClientExecutable
    assert isinstance(next(iter(direct._compiled.values()))._call, client)

    def missing(*args, **kwargs):
        raise _xla._NoClient

    monkeypatch.setattr(_xla, "_ClientExecutable", missing)
    fallback = xla(gl.grad(branchy))
    assert_close(fallback(x), want)
    assert not isinstance(next(iter(fallback._compiled.values()))._call, client)


def test_refusals_are_gradloop_errors(monkeypatch) -> None:
    with pytest.raises(gl.errors.InvalidArgumentError, match="unknown backend"):
        gl.jit(orbit, backend="tpu-please")
    with pytest.raises(gl.errors.InvalidArgumentError, match="unknown target"):
        gl.jit(orbit, target="vulkan-spirv", backend="xla")
    with pytest.raises(gl.errors.InvalidArgumentError, match="tiered"):
        gl.jit(orbit, tiered=True, backend="xla")
    if not any(d.platform == "gpu" for d in jax.devices()):
        with pytest.raises(gl.errors.InvalidArgumentError, match="no cuda device"):
            gl.jit(orbit, target="cuda", backend="xla")
    monkeypatch.setitem(sys.modules, "jax", None)  # as if jaxlib were not installed
    with pytest.raises(gl.errors.InvalidArgumentError, match=r"gradloop\[jax\]"):
        gl.jit(orbit, backend="xla")


def test_results_read_in_place_outlive_the_function_and_its_inputs() -> None:
    # XLA's result buffers become the tensors' memory (read in place): they must stay valid
    # after the compiled function, its cache and the arguments are gone
    import gc

    fn = xla(lambda x: (gl.sin(x) * 2.0, x + 1.0))
    values = [np.linspace(0.0, 1.0, 5000) * k for k in range(4)]
    results = [fn(gl.tensor(v)) for v in values]
    del fn
    gc.collect()
    for v, (a, b) in zip(values, results, strict=True):
        want = gl.sin(gl.tensor(v)) * 2.0
        np.testing.assert_allclose(np.asarray(a), np.asarray(want), rtol=1e-14, atol=1e-15)
        np.testing.assert_array_equal(np.asarray(b), v + 1.0)
        assert not np.asarray(a).flags.writeable


def test_signatures_read_from_the_header_agree_with_the_parsed_module() -> None:
    from gradloop import _xla

    def one(x):
        return gl.sum(x)

    def many(x, n, flag):
        y = gl.cast(x, gl.float32) * 2.0
        return y, n + 1, gl.logical_not(flag), x > 0.0

    def nothing():
        return gl.tensor(np.arange(6, dtype=np.int64).reshape(2, 3))

    cases = [
        (one, (f64(1.0, 2.0),)),
        (many, (gl.tensor(np.ones((2, 3))), gl.tensor(3), gl.tensor(True))),
        (nothing, ()),
    ]
    for fn, args in cases:
        text = gl.to_mlir(fn, *args, dialect="stablehlo")
        name = fn.__name__
        assert re.search(_xla._HEADER.format(name=name), text), text[:300]
        assert _xla._types(text, name) == _xla._parsed_types(text, name)


def test_executables_are_cached_on_disk_and_a_torn_entry_is_compiled_again(
    tmp_path, monkeypatch
) -> None:
    # As IREE's modules are: the next process reads what this one compiled.
    monkeypatch.setenv("GRADLOOP_CACHE_DIR", str(tmp_path))
    x = f64(0.3, 0.7, 1.1)
    want = np.asarray(gl.function(gl.grad(lambda x: gl.sum(orbit(x, gl.tensor(4)))))(x))

    def compiled():
        return np.asarray(xla(gl.grad(lambda x: gl.sum(orbit(x, gl.tensor(4)))))(x))

    np.testing.assert_allclose(compiled(), want, rtol=1e-12)
    (entry,) = tmp_path.glob("*.xla")
    written = entry.stat().st_ino
    np.testing.assert_allclose(compiled(), want, rtol=1e-12)
    assert entry.stat().st_ino == written, "read from the cache, not compiled and written again"
    entry.write_bytes(b"not an executable")
    np.testing.assert_allclose(compiled(), want, rtol=1e-12)
    assert entry.read_bytes() != b"not an executable", "a torn entry is compiled and replaced"
