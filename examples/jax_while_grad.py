"""A JAX user's script: `jax.grad` of a projectile flown with drag until it lands.

JAX cannot reverse-differentiate the `lax.while_loop` (its trip count depends on the angle).
`gradloop.jax.differentiable` exports the function, differentiates its StableHLO with gradloop
and hands the gradient back to JAX: `jax.grad`, `jax.jit` and `jax.value_and_grad` then work,
and a few steps of gradient descent fit the launch angle to a target range.

Usage: python examples/jax_while_grad.py  (needs JAX: pip install 'gradloop[jax]')
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

import gradloop as gl

jax.config.update("jax_enable_x64", True)

DT, G, DRAG, SPEED = 0.01, 9.81, 0.05, 30.0


def step(s):
    """One Euler step with quadratic drag of the state (x, y, vx, vy)."""
    x, y, vx, vy = s
    speed = jnp.sqrt(vx * vx + vy * vy)
    return (
        x + DT * vx,
        y + DT * vy,
        vx - DT * DRAG * speed * vx,
        vy - DT * (G + DRAG * speed * vy),
    )


def flight_range(theta):
    """Where the projectile lands: Euler steps with quadratic drag until it comes down (the
    number of steps depends on theta)."""
    start = (jnp.asarray(0.0), jnp.asarray(0.0), SPEED * jnp.cos(theta), SPEED * jnp.sin(theta))
    x, y, vx, vy = lax.while_loop(lambda s: s[1] >= 0.0, step, start)
    return x - vx * y / vy  # back along the last step to y = 0: smooth in theta


def loss(theta, target):
    return (flight_range(theta) - target) ** 2


def main() -> None:
    theta, target = 0.3, 24.0
    try:
        jax.grad(loss)(theta, target)
    except ValueError as e:
        print(f"jax.grad refuses: {str(e).splitlines()[0][:100]}...")

    fit = jax.jit(jax.value_and_grad(gl.jax.differentiable(loss)))
    for k in range(10):
        value, grad = fit(theta, target)
        print(
            f"step {k}: theta = {theta:.4f}, range = {float(flight_range(theta)):7.3f} m, "
            f"loss = {float(value):9.4f}, d loss/d theta = {float(grad):9.3f}"
        )
        theta = theta - 1e-3 * float(grad)
    print(
        f"fitted: theta = {theta:.4f} rad lands at {float(flight_range(theta)):.3f} m "
        f"(target {target} m)"
    )


if __name__ == "__main__":
    main()
