"""`gradloop.jax`: `jax.grad` through JAX's own data-dependent loops, which JAX refuses, with
gradloop's VJP of the exported module (`with_vjp`, `differentiable`). Each gradient is checked
against central finite differences in float64 and, where the same program is written in
gradloop, against gradloop's own gradient; a program JAX can differentiate itself gives JAX's
gradient to 1e-12."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="gradloop.jax needs JAX (gradloop[jax])")
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import gradloop as gl  # noqa: E402
import gradloop.jax as gj  # noqa: E402

pytestmark = pytest.mark.slow


def central(f, x, eps=1e-6):
    """Central finite differences of a scalar function of a float64 array (or pytree leaf)."""
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(-1)
    out = np.zeros_like(flat)
    for k in range(flat.size):
        e = np.zeros_like(flat)
        e[k] = eps
        out[k] = (f((flat + e).reshape(x.shape)) - f((flat - e).reshape(x.shape))) / (2 * eps)
    return out.reshape(x.shape)


def halving(x):
    """Halve until below a threshold: the trip count depends on x."""
    y = lax.while_loop(lambda y: jnp.sum(y * y) > 0.01, lambda y: y * 0.5 + 0.01 * jnp.sin(y), x)
    return jnp.sum(y**3) * 1e4


def gl_halving(x):
    y = gl.while_loop(lambda y: gl.sum(y * y) > 0.01, lambda y: y * 0.5 + 0.01 * gl.sin(y), (x,))[0]
    return gl.sum(y**3) * 1e4


def newton(a):
    """sqrt(a) by Newton's method to a tolerance."""

    def body(s):
        x, _ = s
        nxt = 0.5 * (x + a / x)
        return nxt, jnp.abs(nxt - x)

    x, _ = lax.while_loop(lambda s: s[1] > 1e-12, body, (a, jnp.asarray(1.0)))
    return x


def projectile(theta):
    """A projectile flown with drag until it lands; the range."""
    dt, g, k = 0.01, 9.81, 0.05

    def body(s):
        px, py, vx, vy = s
        speed = jnp.sqrt(vx * vx + vy * vy)
        return px + dt * vx, py + dt * vy, vx - dt * k * speed * vx, vy - dt * (g + k * speed * vy)

    v = 30.0
    s = (0.0, 0.0, v * jnp.cos(theta), v * jnp.sin(theta))
    s = lax.while_loop(lambda s: s[1] >= 0.0, body, jax.tree_util.tree_map(jnp.asarray, s))
    return s[0]


def rnn(w, h0):
    """h <- tanh(W h) until the running sum of |h|^2 passes 3; a switch and a cond inside."""

    def body(s):
        h, total, i = s
        h = jnp.tanh(w @ h + 0.1)
        k = jnp.clip(jnp.floor(jnp.abs(jnp.sum(h)) * 2.0), 0, 2).astype(jnp.int32)
        h = lax.switch(k, [lambda h: h, lambda h: h * 0.9, lambda h: jnp.sin(h)], h)
        h = lax.cond(total > 1.0, lambda h: h * 1.01, lambda h: h, h)
        return h, total + jnp.sum(h * h), i + 1

    h, _, _ = lax.while_loop(lambda s: s[1] < 3.0, body, (h0, 0.0, 0))
    return jnp.sum(h)


def gl_newton(a):
    def body(x, _):
        nxt = 0.5 * (x + a / x)
        return nxt, gl.abs(nxt - x)

    x, _ = gl.while_loop(lambda x, d: d > 1e-12, body, (a, gl.tensor(1.0, dtype=gl.float64)))
    return x


def gl_rnn(w, h0):
    def body(h, total, i):
        h = gl.tanh(gl.matmul(w, h[:, None])[:, 0] + 0.1)
        k = gl.cast(gl.minimum(gl.maximum(gl.floor(gl.abs(gl.sum(h)) * 2.0), 0.0), 2.0), gl.int32)
        h = gl.switch_case(k, [lambda: h, lambda: h * 0.9, lambda: gl.sin(h)])
        h = gl.cond(total > 1.0, lambda: h * 1.01, lambda: h)
        return h, total + gl.sum(h * h), i + 1

    zero = gl.tensor(0.0, dtype=gl.float64)
    h, _, _ = gl.while_loop(lambda h, t, i: t < 3.0, body, (h0, zero, gl.tensor(0)))
    return gl.sum(h)


def test_jax_refuses_and_gradloop_differentiates_halving() -> None:
    x = np.array([0.9, -0.4, 0.7])
    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work"):
        jax.grad(halving)(x)
    got = np.asarray(jax.grad(gj.differentiable(halving))(x))
    np.testing.assert_allclose(got, central(lambda v: float(halving(v)), x), rtol=1e-6)
    own = np.asarray(gl.grad(gl_halving)(gl.tensor(x)))
    np.testing.assert_allclose(got, own, rtol=1e-12)


def test_each_gradient_call_reuses_one_vjp_module(monkeypatch) -> None:
    # JAX asks for the VJP at every backward pass and compiles each new module it calls: a VJP
    # built per call cost an XLA compile per gradient (about a second) in a training loop.
    built = []
    original = gj._vjp
    monkeypatch.setattr(gj, "_vjp", lambda *a: built.append(1) or original(*a))
    grad = jax.grad(gj.differentiable(halving))
    x = np.array([0.9, -0.4, 0.7])
    first = np.asarray(grad(x))
    for scale in (1.1, 0.8):
        got = np.asarray(grad(scale * x))
        np.testing.assert_allclose(got, central(lambda v: float(halving(v)), scale * x), rtol=1e-6)
    assert len(built) == 1
    np.testing.assert_array_equal(np.asarray(grad(x)), first)


@pytest.mark.parametrize(
    ("fn", "x"), [(newton, 2.3), (projectile, 0.7)], ids=["newton", "projectile"]
)
def test_scalar_loops_against_finite_differences(fn, x) -> None:
    got = float(jax.grad(gj.differentiable(fn))(x))
    want = float(central(lambda v: float(fn(float(v))), np.float64(x), eps=1e-6))
    # the projectile's range moves in steps of dt where the landing trip changes
    np.testing.assert_allclose(got, want, rtol=1e-5 if fn is newton else 2e-2)
    if fn is newton:
        np.testing.assert_allclose(got, 0.5 / np.sqrt(x), rtol=1e-10)
        own = float(gl.grad(gl_newton)(gl.tensor(x, dtype=gl.float64)))
        np.testing.assert_allclose(got, own, rtol=1e-12)


@pytest.mark.parametrize("trips", [30, 2500], ids=["rows", "past-the-rows"])
def test_a_loop_within_its_rows_and_one_past_them(trips) -> None:
    """An exported loop with no bound gets a row per trip up to 2,048 trips, the checkpointed
    form from the start past them: both against finite differences and gradloop's own."""

    def pendulums(x, n):
        def body(s):
            i, q, p = s
            p = p - 0.01 * jnp.sin(q)
            return i + 1, q + 0.01 * p, p

        _, q, p = lax.while_loop(lambda s: s[0] < n, body, (0, x, x * 0.5))
        return jnp.sum(q**3 + p)

    x = np.array([0.5, -0.25])
    got = np.asarray(jax.jit(jax.grad(gj.differentiable(pendulums)))(x, trips))
    np.testing.assert_allclose(got, central(lambda v: float(pendulums(v, trips)), x), rtol=1e-6)

    def own(x):
        def body(i, q, p):
            p = p - 0.01 * gl.sin(q)
            return i + 1, q + 0.01 * p, p

        _, q, p = gl.while_loop(lambda i, q, p: i < trips, body, (gl.tensor(0), x, x * 0.5))
        return gl.sum(q**3 + p)

    np.testing.assert_allclose(got, np.asarray(gl.grad(own)(gl.tensor(x))), rtol=1e-12)


def test_an_rnn_with_switch_and_cond_under_jit_and_pytrees() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 4)) * 0.4
    h0 = rng.standard_normal(4) * 0.3
    params = {"w": w, "h0": h0}
    loss = gj.differentiable(lambda p: rnn(p["w"], p["h0"]))
    got = jax.jit(jax.grad(loss))(params)
    fd_w = central(lambda v: float(rnn(v, h0)), w)
    fd_h = central(lambda v: float(rnn(w, v)), h0)
    np.testing.assert_allclose(np.asarray(got["w"]), fd_w, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(np.asarray(got["h0"]), fd_h, rtol=1e-5, atol=1e-8)
    own = gl.grad(gl_rnn, argnums=(0, 1))(gl.tensor(w), gl.tensor(h0))
    np.testing.assert_allclose(np.asarray(got["w"]), np.asarray(own[0]), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(got["h0"]), np.asarray(own[1]), rtol=1e-12)
    value, grads = jax.value_and_grad(loss)(params)
    np.testing.assert_allclose(float(value), float(rnn(w, h0)), rtol=1e-12)
    out, pullback = jax.vjp(loss, params)
    np.testing.assert_allclose(float(out), float(value), rtol=1e-12)
    (back,) = pullback(jnp.asarray(2.0))
    np.testing.assert_allclose(np.asarray(back["w"]), 2 * np.asarray(grads["w"]), rtol=1e-12)


def test_nested_loops_and_float32() -> None:
    def nested(x):
        def outer(s):
            j, y = s
            y = lax.while_loop(lambda z: jnp.sum(z * z) < 4.0 + j, lambda z: z * 1.2 + 0.05, y)
            return j + 1, y * 0.8

        return jnp.sum(lax.while_loop(lambda s: s[0] < 3, outer, (0, x))[1] ** 2)

    x = np.array([0.3, 0.6])
    got = np.asarray(jax.grad(gj.differentiable(nested))(x))
    np.testing.assert_allclose(got, central(lambda v: float(nested(v)), x), rtol=1e-6)
    x32 = x.astype(np.float32)
    got32 = jax.grad(gj.differentiable(nested))(x32)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(np.asarray(got32), got, rtol=1e-4)


def test_what_jax_differentiates_itself_comes_out_the_same() -> None:
    def scanned(x):
        def step(c, _):
            return jnp.sin(c) * 1.1 + 0.1, c

        return jnp.sum(lax.scan(step, x, None, length=7)[0] ** 2)

    def fori(x):
        return jnp.sum(lax.fori_loop(0, 5, lambda i, y: y * jnp.cos(y) + i * 0.1, x))

    x = np.array([0.2, -0.5, 0.9])
    for fn in (scanned, fori):
        got = np.asarray(jax.grad(gj.differentiable(fn))(x))
        np.testing.assert_allclose(got, np.asarray(jax.grad(fn)(x)), rtol=1e-12, atol=1e-15)


def test_serialized_with_its_vjp_and_second_order() -> None:
    def grow(x):
        return lax.while_loop(lambda y: y < 20.0, lambda y: y * 1.5 + jnp.sin(y), x) ** 2

    spec = jax.ShapeDtypeStruct((), jnp.float64)
    exported = gj.with_vjp(jax.export.export(jax.jit(grow))(spec))
    back = jax.export.deserialize(exported.serialize(vjp_order=2))
    x = 0.7
    first = lambda v: float(grow(v))  # noqa: E731
    fd = float(central(first, np.float64(x), eps=1e-5))
    np.testing.assert_allclose(float(jax.grad(back.call)(x)), fd, rtol=1e-6)
    fd2 = float(central(lambda v: float(central(first, v, eps=1e-5)), np.float64(x), eps=1e-4))
    np.testing.assert_allclose(float(jax.grad(jax.grad(back.call))(x)), fd2, rtol=1e-4)
    np.testing.assert_allclose(
        float(jax.jit(jax.grad(jax.grad(exported.call)))(x)),
        float(jax.grad(jax.grad(back.call))(x)),
        rtol=1e-12,
    )


def test_with_vjp_takes_an_exported() -> None:
    with pytest.raises(gl.errors.InvalidArgumentTypeError, match=r"jax\.export\.Exported"):
        gj.with_vjp(lambda x: x)


def test_the_example_fits_the_angle() -> None:
    """`examples/jax_while_grad.py`: JAX's refusal, then a fit through gradloop's gradient,
    which agrees with finite differences of the (smoothly interpolated) landing point."""
    import pathlib
    import subprocess
    import sys

    script = pathlib.Path(__file__).resolve().parent.parent / "examples" / "jax_while_grad.py"
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True, timeout=600
    ).stdout
    assert "jax.grad refuses: Reverse-mode differentiation does not work" in out
    landed = float(out.split("lands at ")[1].split(" m")[0])
    assert abs(landed - 24.0) < 0.05, out
    sys.path.insert(0, str(script.parent))
    try:
        from jax_while_grad import flight_range
    finally:
        sys.path.remove(str(script.parent))
    got = float(jax.grad(gj.differentiable(flight_range))(0.3))
    want = float(central(lambda v: float(flight_range(float(v))), np.float64(0.3), eps=1e-6))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def nextafter_up(t):
    """Equinox's `nextafter` for t > 0, as Diffrax nudges its times: one more in the bits."""
    bits = lax.bitcast_convert_type(t, jnp.int64)
    return lax.bitcast_convert_type(bits + 1, jnp.float64)


def nudged_steps(y):
    def body(s):
        t, y = s
        t = nextafter_up(t + 0.1)
        return t, y * 0.9 + 0.1 * jnp.sin(y) * t

    _, y = lax.while_loop(lambda s: s[0] < 1.0, body, (jnp.asarray(0.0), y))
    return jnp.sum(y**2)


def test_bitcast_convert_in_a_loop_s_times_is_read_and_differentiated() -> None:
    x = np.array([0.8, -0.3])
    got = np.asarray(jax.grad(gj.differentiable(nudged_steps))(x))
    np.testing.assert_allclose(got, central(lambda v: float(nudged_steps(v)), x), rtol=1e-6)
    assert float(nextafter_up(1.0)) == 1.0 + np.finfo(np.float64).eps


def cube_root(a, p):
    """x^3 = a * scale by Newton's method, scaled by w: the trip count depends on a; the trip
    count itself is an integer output."""

    def body(s):
        x, k = s
        return x - (x**3 - a * p["scale"]) / (3 * x * x), k + 1

    more = lambda s: jnp.abs(s[0] ** 3 - a * p["scale"]) > 1e-12 * a  # noqa: E731
    x, k = lax.while_loop(more, body, (a + 1.0, 0))
    return x * p["w"], k


def test_vmap_of_the_function_and_of_its_gradients() -> None:
    # jax.vmap(jax.grad(f)) through a loop whose trips differ per example: JAX cannot batch a
    # call of an exported module, so the batched function is exported itself.
    f = gj.differentiable(cube_root)
    root = lambda a, p: f(a, p)[0]  # noqa: E731
    a = jnp.array([1.0, 8.0, 27.0, 1000.0])
    p = {"scale": jnp.array(2.0), "w": jnp.array(1.5)}
    x, k = jax.vmap(f, in_axes=(0, None))(a, p)
    for i in range(4):  # each example as run alone: its root and its own trip count
        xi, ki = f(a[i], p)
        assert int(k[i]) == int(ki)
        np.testing.assert_allclose(float(x[i]), float(xi), rtol=1e-15)
    per_example = jax.vmap(jax.grad(root), in_axes=(0, None))(a, p)
    want = 1.5 * 2.0 / (3.0 * np.cbrt(2.0 * np.asarray(a)) ** 2)
    np.testing.assert_allclose(np.asarray(per_example), want, rtol=1e-10)
    jitted = jax.jit(jax.vmap(jax.grad(root), in_axes=(0, None)))(a, p)
    np.testing.assert_allclose(np.asarray(jitted), want, rtol=1e-10)
    of_params = jax.vmap(jax.grad(root, argnums=1), in_axes=(0, None))(a, p)
    np.testing.assert_allclose(np.asarray(of_params["w"]), np.cbrt(2.0 * np.asarray(a)), rtol=1e-10)
    summed = jax.grad(lambda a: jnp.sum(jax.vmap(root, in_axes=(0, None))(a, p)))(a)
    np.testing.assert_allclose(np.asarray(summed), want, rtol=1e-10)
    nested = jax.vmap(jax.vmap(jax.grad(root), in_axes=(0, None)), in_axes=(0, None))
    got = nested(a.reshape(2, 2), p)
    np.testing.assert_allclose(np.asarray(got), want.reshape(2, 2), rtol=1e-10)
    second = jax.vmap(jax.grad(jax.grad(root)), in_axes=(0, None))(a, p)
    want2 = 1.5 * 2.0 ** (1 / 3) * (-2 / 9) * np.asarray(a) ** (-5 / 3)
    np.testing.assert_allclose(np.asarray(second), want2, rtol=1e-8)


def test_second_order_of_a_function_with_an_integer_output() -> None:
    # The VJP module of a VJP takes no argument for the integer output's float0 cotangent.
    f = gj.differentiable(cube_root)
    p = {"scale": jnp.array(2.0), "w": jnp.array(1.5)}
    got = jax.grad(jax.grad(lambda a: f(a, p)[0]))(8.0)
    want = 1.5 * 2.0 ** (1 / 3) * (-2 / 9) * 8.0 ** (-5 / 3)
    np.testing.assert_allclose(float(got), want, rtol=1e-8)
