"""Programs of the JAX solver libraries users bring, exported by JAX and differentiated by
gradloop (`gl.jax.differentiable`): Diffrax's adaptive ODE solve, a Lineax iterative solve and an
Optimistix root find, each against the library's own gradient and central differences.

What their exports hold beyond the control flow: Equinox's `nextafter` (bitcasts and integer
`and`), `x.at[i].set(row)` as a one-window scatter, and `stablehlo.case`."""

import diffrax
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx
import pytest
from jax import lax
from tests.gradcheck import numerical_gradient

import gradloop.jax as gj

jax.config.update("jax_enable_x64", True)


def decay(y0, k):
    """Dopri5 with a PID step-size controller, `throw=False`: Diffrax's adaptive solve."""
    term = diffrax.ODETerm(lambda t, y, args: -args * y + jnp.sin(t) * y[::-1])
    sol = diffrax.diffeqsolve(
        term,
        diffrax.Dopri5(),
        t0=0.0,
        t1=2.0,
        dt0=0.1,
        y0=y0,
        args=k,
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8),
        throw=False,
        max_steps=256,
    )
    return jnp.sum(sol.ys[-1] ** 2)


def test_diffrax_adaptive_solve_s_gradient_is_diffrax_s():
    y0, k = jnp.array([1.0, 0.5]), jnp.array(0.7)
    value, ours = jax.value_and_grad(gj.differentiable(decay), argnums=(0, 1))(y0, k)
    theirs = jax.grad(decay, argnums=(0, 1))(y0, k)
    np.testing.assert_allclose(float(value), float(decay(y0, k)), rtol=1e-12)
    for got, want in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-7, atol=1e-10)
    (fd,) = numerical_gradient(lambda v: float(decay(jnp.asarray(v), k)), [np.asarray(y0)])
    np.testing.assert_allclose(np.asarray(ours[0]), fd, rtol=1e-5)


def cg_solve(a, b):
    """Lineax's conjugate gradients on a positive definite operator (a loop to a tolerance)."""
    spd = a @ a.T + 4.0 * jnp.eye(a.shape[0])
    op = lx.MatrixLinearOperator(spd, lx.positive_semidefinite_tag)
    sol = lx.linear_solve(op, b, solver=lx.CG(rtol=1e-13, atol=1e-13), throw=False)
    return jnp.sum(sol.value**2)


def test_lineax_cg_solve_s_gradient_is_lineax_s():
    rng = np.random.default_rng(0)
    a, b = jnp.asarray(rng.standard_normal((4, 4))), jnp.asarray(rng.standard_normal(4))
    ours = jax.grad(gj.differentiable(cg_solve), argnums=(0, 1))(a, b)
    theirs = jax.grad(cg_solve, argnums=(0, 1))(a, b)
    for got, want in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-9)


def cube_root(a):
    """Optimistix's Newton on y^3 = a, elementwise on a scalar (its Jacobian solve is 1 x 1)."""
    sol = optx.root_find(
        lambda y, a: y**3 - a,
        optx.Newton(rtol=1e-12, atol=1e-12),
        jnp.ones_like(a),
        args=a,
        throw=False,
    )
    return sol.value


@pytest.mark.parametrize("a", [2.0, 27.0, 0.3])
def test_optimistix_newton_root_s_derivative_is_optimistix_s(a):
    got = float(jax.grad(gj.differentiable(cube_root))(a))
    want = float(jax.grad(cube_root)(a))
    np.testing.assert_allclose(float(gj.differentiable(cube_root)(a)), a ** (1 / 3), rtol=1e-10)
    np.testing.assert_allclose(got, want, rtol=1e-7)
    np.testing.assert_allclose(got, (1 / 3) * a ** (-2 / 3), rtol=1e-7)


def ring_write(x, i):
    """`x.at[i].set(row)` with a scalar index: JAX writes a one-window scatter."""
    return jnp.sum(jnp.sin(x.at[i].set(x[0] * 3.0)) * jnp.arange(1.0, 7.0).reshape(3, 2))


@pytest.mark.parametrize("i", [0, 2, 5, -1])
def test_a_one_window_set_scatter_is_read_with_jax_s_bounds(i):
    """In bounds, the row is written; out of bounds, a scatter skips the update (JAX
    normalises a negative Python index itself; a traced one out of range is skipped)."""
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 2)))
    index = jnp.asarray(i, dtype=jnp.int32)
    f = lambda x: ring_write(x, index)  # noqa: E731
    np.testing.assert_allclose(float(gj.differentiable(f)(x)), float(f(x)), rtol=1e-13)
    np.testing.assert_allclose(
        np.asarray(jax.grad(gj.differentiable(f))(x)), np.asarray(jax.grad(f)(x)), rtol=1e-12
    )


def test_integer_and_of_nextafter_is_read():
    """jnp.nextafter masks the sign bit with an integer `and`; the bits carry no derivative
    (an integer path), so `d(nextafter(t) t)/dt` is `nextafter(t)`."""

    def nudged(t):
        return lax.nextafter(t, jnp.inf) * t

    for t in (0.75, -2.5, 3.0):  # not 0: XLA flushes the denormal nextafter(0) to zero
        t = jnp.asarray(t)
        np.testing.assert_allclose(float(gj.differentiable(nudged)(t)), float(nudged(t)), rtol=0)
        got = float(jax.grad(gj.differentiable(nudged))(t))
        np.testing.assert_allclose(got, float(lax.nextafter(t, jnp.inf)), rtol=0)


# --- JAX's LAPACK custom calls, read as gl.linalg's loops -----------------------------------


def _pair(shape_a, shape_b, dtype=np.float64):
    rng = np.random.default_rng(sum(shape_a) + len(shape_b))
    n = shape_a[-1]
    a = rng.standard_normal(shape_a) + n * np.eye(n)
    return jnp.asarray(a.astype(dtype)), jnp.asarray(rng.standard_normal(shape_b).astype(dtype))


def _same_gradients(f, args, rtol=1e-10, atol=1e-12):
    argnums = tuple(range(len(args)))
    value, ours = jax.value_and_grad(gj.differentiable(f), argnums=argnums)(*args)
    theirs = jax.grad(f, argnums=argnums)(*args)
    np.testing.assert_allclose(float(value), float(f(*args)), rtol=rtol)
    for got, want in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [((3, 3), (3,)), ((4, 4), (4, 2)), ((6, 6), (6, 3)), ((2, 3, 3), (2, 3, 1))],
)
def test_jnp_solve_s_getrf_and_trsm_are_read(shape_a, shape_b):
    _same_gradients(lambda a, b: jnp.sum(jnp.sin(jnp.linalg.solve(a, b))), _pair(shape_a, shape_b))


def test_float32_solve_is_read():
    a, b = _pair((3, 3), (3,), np.float32)
    _same_gradients(lambda a, b: jnp.sum(jnp.linalg.solve(a, b) ** 2), (a, b), rtol=2e-4, atol=1e-5)


def test_cholesky_s_potrf_is_read():
    a, _ = _pair((4, 4), (4,))
    _same_gradients(lambda a: jnp.sum(jnp.linalg.cholesky(a @ a.T + jnp.eye(4)) ** 3), (a,))


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("trans", [0, 1])
@pytest.mark.parametrize("left", [True, False])
def test_every_triangular_solve_form_is_read(lower, trans, left):
    a, b = _pair((3, 3), (3, 2) if left else (2, 3))

    def f(a, b):
        x = lax.linalg.triangular_solve(
            a, b, left_side=left, lower=lower, transpose_a=bool(trans), unit_diagonal=not lower
        )
        return jnp.sum(jnp.cos(x))

    _same_gradients(f, (a, b))


def test_lu_factor_and_lu_solve_are_read():
    from jax.scipy import linalg as jsl

    a, b = _pair((4, 4), (4,))
    _same_gradients(lambda a, b: jnp.sum(jsl.lu_solve(jsl.lu_factor(a), b) ** 2), (a, b))


def newton_system(a):
    """Optimistix's Newton on a 3-dimensional system: its steps are LU solves (getrf, trsm)."""

    def fn(y, a):
        return jnp.stack(
            [y[0] ** 3 + y[1] - a[0], y[1] ** 3 - y[2] - a[1], y[2] ** 3 + y[0] - a[2]]
        )

    sol = optx.root_find(fn, optx.Newton(rtol=1e-12, atol=1e-12), jnp.ones(3), args=a, throw=False)
    return jnp.sum(sol.value**2)


def test_optimistix_newton_system_s_gradient_is_optimistix_s():
    _same_gradients(newton_system, (jnp.asarray([2.0, 1.5, 3.0]),), rtol=1e-7, atol=1e-10)


def lu_solve_lineax(a, b):
    sol = lx.linear_solve(lx.MatrixLinearOperator(a), b, solver=lx.LU(), throw=False)
    return jnp.sum(sol.value**2)


def test_lineax_lu_solve_s_gradient_is_lineax_s():
    _same_gradients(lu_solve_lineax, _pair((4, 4), (4,)))


def test_gl_mlir_grad_reads_lapack_calls_into_pure_stablehlo():
    import gradloop as gl

    a, b = _pair((3, 3), (3,))
    text = jax.export.export(jax.jit(lambda a, b: jnp.sum(jnp.linalg.solve(a, b))))(
        a, b
    ).mlir_module()
    assert "lapack_dgetrf_ffi" in text
    out = gl.mlir.grad(text, wrt=(0, 1), dialect="stablehlo")
    assert "func.func @main_grad" in out
    assert "custom_call" not in out, "the calls became gl.linalg's loops, in @main too"
    assert "func.func private @gl_lapack_getrf_0" in out


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4)])
def test_qr_s_geqrf_and_orgqr_are_read(shape):
    a = jnp.asarray(np.random.default_rng(2).standard_normal(shape))

    def f(a):
        q, r = jnp.linalg.qr(a)
        return jnp.sum(jnp.sin(q) * 2.0) + jnp.sum(r**2)

    _same_gradients(f, (a,), rtol=1e-9, atol=1e-11)


def test_an_unread_lapack_call_is_an_error_naming_it():
    """LU of a rectangular matrix is not read."""
    from jax.scipy import linalg as jsl

    import gradloop as gl

    a = jnp.asarray(np.random.default_rng(2).standard_normal((4, 3)))
    text = jax.export.export(jax.jit(lambda a: jnp.sum(jsl.lu(a)[2])))(a).mlir_module()
    with pytest.raises(gl.errors.CompileError, match="square"):
        gl.mlir.grad(text)


# --- the gathers that vmap and multi-axis indexing write ---------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "vmap_take",
        "two_axes",
        "batched_rows",
        "negative",
    ],
)
def test_point_gathers_are_read(case):
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((4, 5, 6)))
    i = jnp.asarray([3, 0, 2, 9], dtype=jnp.int32)  # 9: past the end, clamped as XLA does
    if case == "vmap_take":

        def f(x):
            return jnp.sum(jnp.sin(jax.vmap(lambda x, i: x[i])(x[:, :, 0], i)))
    elif case == "two_axes":

        def f(x):
            return jnp.sum(jnp.sin(x[i[:3], 2]) * jnp.arange(6.0))
    elif case == "batched_rows":

        def f(x):
            return jnp.sum(jnp.cos(jax.vmap(lambda m, k: m[k, 1:4])(x, i % 5)))
    else:

        def f(x):
            j = jnp.asarray([-1, 3, 2], dtype=jnp.int32)  # JAX's exported code wraps -1
            return jnp.sum(jnp.sin(x[j, j % 5]))

    _same_gradients(f, (x,), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("case", ["vmap_add", "vmap_set", "two_axes_set", "repeated_set"])
def test_point_scatters_are_read(case):
    rng = np.random.default_rng(6)
    x = jnp.asarray(rng.standard_normal((4, 5, 6)))
    v = jnp.asarray(rng.standard_normal((4, 6)))
    i = jnp.asarray([3, 0, 2, 9], dtype=jnp.int32)  # 9: out of bounds, skipped
    if case == "vmap_add":

        def f(x, v):
            return jnp.sum(jnp.sin(jax.vmap(lambda m, k, r: m.at[k].add(r))(x, i, v)))
    elif case == "vmap_set":

        def f(x, v):
            return jnp.sum(jnp.sin(jax.vmap(lambda m, k, r: m.at[k % 5].set(r * 2.0))(x, i, v)))
    elif case == "two_axes_set":

        def f(x, v):
            return jnp.sum(jnp.sin(x.at[i[:3], 2].set(v[:3])) * jnp.arange(6.0))
    else:
        # a repeated index: the last update wins, as XLA's CPU code has it

        def f(x, v):
            j = jnp.asarray([1, 3, 1, 1], dtype=jnp.int32)
            return jnp.sum(jnp.sin(x.at[j, 0].set(v * jnp.arange(1.0, 5.0)[:, None])))

    _same_gradients(f, (x, v), rtol=1e-12, atol=1e-13)
