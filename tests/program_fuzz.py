"""Random nested control-flow programs for the differential tester (`test_fuzz_modes.py`).

A program is a tree drawn by hypothesis: expressions over a float64 vector `x` (the argument
differentiated), a closed-over tensor `w` and a Variable `v`, with `cond`, `switch_case` and
`while_loop` nested up to three deep. Predicates, branch indices and trip counts depend on the
data (zero trips included); loops carry an int32 counter, an int64 count, a bool flag toggled
with `logical_not`, the float state, a float32 copy, and variables that the body passes through,
overwrites each trip, never reads, or that are unused at the output; `maximum_iterations` is
drawn too, and an int32 vector. Leaves may go through `custom_gradient` (a deliberately scaled
gradient, so ignoring it shows), `custom_jvp` (a deliberately skewed rule, in forward and reverse
mode; a true rule that computes an intermediate from the primal; two made on the fly, one
closing over the other's argument), `recompute_grad` (also made on the fly, closing over a
differentiated value), code that closes over differentiated values of the enclosing construct
(its input, and a scalar computed from it where the construct is called: a loop body's
closures, which `checkpoints` must differentiate too), `stop_gradient`, `x ** 2`/`x ** 3`
(negative bases), a float32 detour, the transcendentals (`exp`, `log`, `sin`, `cos`, `tanh`,
`sigmoid`, whose vector maps machine code calls directly), and Variable reads; loop bodies may
`assign_add` to a second Variable or to the one the leaves read, forward the state into another
variable's place or make a variable a constant; a loop that assigns nothing may keep
`checkpoints` instead of stacks for its gradient.

`build(spec)` returns `(fn, pure)`: `fn(x)` gives a float64 scalar, and `pure` says whether the
program's gradient is its true derivative (no custom gradient or stop_gradient), so that it can
be checked against finite differences; impure programs are checked across modes against eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

import gradloop as gl

# The vector state's length: compiled mode holds it as host scalars (one of 2N on the device).
N = 3

LEAVES = (
    "x",
    "w",
    "v",
    "sin",
    "tanh",
    "square",
    "cube",
    "custom",
    "custom_jvp",
    "recompute",
    "stop",
    "f32",
    "sigmoid",
    "outer",
    "sin_sin",
    "recompute_outer",
    "nested_jvp",
    "arctan",
    "log1p",
    "arctan2",
    "hyperbolic",
    "at",
    "at_dynamic",
    "fori",
    "scan",
    "solve",
    "cholesky",
    "arrays",
    "implicit",
    "linear_solve",
    "exp_log",
)

#: Leaves whose derivative is not the code's (a custom rule that says otherwise, or none).
IMPURE_LEAVES = ("custom", "custom_jvp", "stop")


@gl.custom_gradient
def scaled_square(t):
    """`t * t` whose gradient is deliberately `3 * dy * t` (the true one is `2 * dy * t`)."""
    return t * t, lambda dy: dy * t * 3.0


@gl.custom_jvp
def skewed_sin(t):
    """`sin(t)` whose rule deliberately says `0.5 cos(t) dt` (reverse mode uses it too)."""
    return gl.sin(t)


@skewed_sin.defjvp
def _skewed_sin_jvp(primals, tangents):
    (t,), (dt,) = primals, tangents
    return skewed_sin(t), gl.cos(t) * dt * 0.5


@gl.recompute_grad
def recomputed(t):
    """`t * tanh(t)`, its gradient recomputed from `t` (the true derivative)."""
    return t * gl.tanh(t)


@gl.custom_jvp
def sin_sin(t):
    """`sin(sin(t))` with a true rule that computes an intermediate from the primal itself
    (`s = sin(t)`): forward over reverse must differentiate it."""
    return gl.sin(gl.sin(t))


@sin_sin.defjvp
def _sin_sin_jvp(primals, tangents):
    (t,), (dt,) = primals, tangents
    s = gl.sin(t)
    return gl.sin(s), gl.cos(s) * gl.cos(t) * dt


def recompute_outer(t, vec):
    """`t * tanh(t + vec)`, recomputed, from a function made on the fly that closes over
    `vec` (a differentiated value of the enclosing construct)."""
    return gl.recompute_grad(lambda u: u * gl.tanh(u + vec))(t)


def nested_jvp(t, scalar):
    """`sin(t) * scalar` through two `custom_jvp`s made on the fly, the inner one closing over
    the outer one's argument; their rules are true derivatives."""

    @gl.custom_jvp
    def outer(z, u):
        @gl.custom_jvp
        def inner(y):
            return gl.sin(y) * u  # closes over the outer function's argument

        @inner.defjvp
        def _inner_jvp(primals, tangents):
            (y,), (dy,) = primals, tangents
            return inner(y), gl.cos(y) * u * dy

        return inner(z)

    @outer.defjvp
    def _outer_jvp(primals, tangents):
        (z, u), (dz, du) = primals, tangents
        return outer(z, u), gl.cos(z) * u * dz + gl.sin(z) * du

    return outer(t, scalar)


def _newton(f, x0):
    def body(i, r):
        return i + 1, r - f(r) / gl.jvp(f, (r,), (gl.ones_like(r),))[1]

    return gl.while_loop(lambda i, r: i < 20, body, (gl.tensor(0), x0))[1]


def implicit_root(t):
    """The root `r` of `r^3 + r = t`, elementwise, through `custom_root` (a Newton loop its
    derivatives do not go through)."""
    return gl.custom_root(
        lambda r: r**3 + r - t, gl.zeros_like(t), _newton, lambda g, y: y / g(gl.ones_like(y))
    )


def diagonal_solve(t):
    """`t / (2 + sin t)` through `custom_linear_solve`: the operator closes over `t`, and the
    derivatives go through its solves, not through the answer's arithmetic."""
    scale = 2.0 + gl.sin(t)
    return gl.custom_linear_solve(
        lambda v: v * scale, t, lambda matvec, b: b / scale, symmetric=True
    )


#: Leaves whose compiled modules are large (loops with their own gradients and Newton steps):
#: the every-mode run leaves them to the graph-mode run and to their own compiled tests, so that
#: `make test`'s IREE compiles stay within its time.
HEAVY_LEAVES = ("fori", "scan", "solve", "cholesky", "implicit")


def _leaves(names: tuple[str, ...] = LEAVES) -> st.SearchStrategy[Any]:
    return st.sampled_from(names).map(lambda name: ("leaf", name))


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    pair = st.tuples(children, children)
    return st.one_of(
        st.tuples(st.just("add"), pair),
        st.tuples(st.just("mul"), pair),
        st.tuples(st.just("cond"), st.floats(-1.0, 1.0), pair),
        st.tuples(st.just("switch"), st.lists(children, min_size=1, max_size=3), st.booleans()),
        st.tuples(
            st.just("while"),
            children,
            st.integers(0, 3),  # trip count offset
            st.sampled_from([None, 0, 2, 5]),  # maximum_iterations
            # `unread` forwards the state into the extra variable's place; `constant` makes it
            # a constant each trip (an unrolled loop then selects between constants).
            st.sampled_from(["passthrough", "overwritten", "unread", "constant", "unused"]),
            # Assign in the body: nothing, the accumulating Variable, or the Variable `v` that
            # leaves read (later reads, and gradients' reruns, must see the new value).
            st.sampled_from([False, True, "v"]),
            # The gradient's memory: stacks, or this many checkpoints (a body that assigns
            # refuses them, so it keeps stacks).
            st.sampled_from([None, 1, 2, 5]),
        ),
    )


def programs(max_leaves: int = 8, heavy: bool = True) -> st.SearchStrategy[Any]:
    """Program trees, nested at most three control-flow constructs deep."""
    names = LEAVES if heavy else tuple(n for n in LEAVES if n not in HEAVY_LEAVES)
    return st.recursive(_leaves(names), _extend, max_leaves=max_leaves)


def depth(spec: Any) -> int:
    kind = spec[0]
    if kind == "leaf":
        return 0
    if kind in ("add", "mul"):
        return max(depth(c) for c in spec[1])
    if kind == "cond":
        return 1 + max(depth(c) for c in spec[2])
    if kind == "switch":
        return 1 + max(depth(c) for c in spec[1])
    return 1 + depth(spec[1])


def is_pure(spec: Any) -> bool:
    kind = spec[0]
    if kind == "leaf":
        return spec[1] not in IMPURE_LEAVES
    if kind in ("add", "mul", "cond"):
        return all(is_pure(c) for c in spec[-1])
    if kind == "switch":
        return all(is_pure(c) for c in spec[1])
    # An assignment is not differentiable, but what it stores reaches the output.
    return is_pure(spec[1]) and not spec[5]


def forward_ok(spec: Any) -> bool:
    """Whether every derivative kind applies: no `custom_gradient` leaf (it has no forward-mode
    rule) and no loop that assigns a Variable. Custom JVP rules and stop_gradient are fine."""
    kind = spec[0]
    if kind == "leaf":
        return spec[1] != "custom"
    if kind in ("add", "mul", "cond"):
        return all(forward_ok(c) for c in spec[-1])
    if kind == "switch":
        return all(forward_ok(c) for c in spec[1])
    return forward_ok(spec[1]) and not spec[5]


def assigns_in_nested_loop(spec: Any, nested: bool = False) -> bool:
    """Whether a loop that assigns the Variable sits inside another control-flow construct."""
    kind = spec[0]
    if kind == "leaf":
        return False
    if kind in ("add", "mul"):
        return any(assigns_in_nested_loop(c, nested) for c in spec[1])
    if kind == "cond":
        return any(assigns_in_nested_loop(c, True) for c in spec[2])
    if kind == "switch":
        return any(assigns_in_nested_loop(c, True) for c in spec[1])
    return (nested and bool(spec[5])) or assigns_in_nested_loop(spec[1], True)


CLOSING_LEAVES = ("outer", "recompute_outer", "nested_jvp")


def closes_over_in_checkpointed_loop(spec: Any, checkpointed: bool = False) -> bool:
    """Whether a leaf that closes over differentiated values sits in a checkpointed loop."""
    kind = spec[0]
    if kind == "leaf":
        return checkpointed and spec[1] in CLOSING_LEAVES
    if kind in ("add", "mul", "cond"):
        return any(closes_over_in_checkpointed_loop(c, checkpointed) for c in spec[-1])
    if kind == "switch":
        return any(closes_over_in_checkpointed_loop(c, checkpointed) for c in spec[1])
    drawn = spec[6:]
    kept = bool(drawn and drawn[0]) and not assigns(spec)
    return closes_over_in_checkpointed_loop(spec[1], checkpointed or kept)


def assigns(spec: Any) -> bool:
    """Whether a loop in `spec` assigns a Variable (a checkpointed loop around it refuses)."""
    kind = spec[0]
    if kind == "leaf":
        return False
    if kind in ("add", "mul", "cond"):
        return any(assigns(c) for c in spec[-1])
    if kind == "switch":
        return any(assigns(c) for c in spec[1])
    return bool(spec[5]) or assigns(spec[1])


class Program:
    """A program tree as a function of `x`, with its closed-over tensor and Variables."""

    def __init__(self, spec: Any, width: int = N) -> None:
        self.spec = spec
        self.width = width
        rng = np.random.default_rng(7)
        self.w = gl.tensor(rng.uniform(-0.8, 0.8, width))
        self.v0 = rng.uniform(-0.5, 0.5, width)
        self.v = gl.Variable(self.v0)
        self.acc = gl.Variable(np.zeros(width), trainable=False)

    def reset(self) -> None:
        """Puts the Variables back to their initial values (loop bodies assign to them)."""
        self.acc.assign(np.zeros(self.width))
        self.v.assign(self.v0)

    def __call__(self, x: gl.Tensor) -> gl.Tensor:
        y = self._eval(self.spec, x, self._scope(x))
        return gl.sum(gl.tanh(y)) + gl.sum(self.acc.read()) * 0.1

    def _scope(self, x: gl.Tensor) -> tuple[gl.Tensor, gl.Tensor]:
        """What code inside a construct closes over: the construct's input (a differentiated
        vector) and a scalar computed from it where the construct is called."""
        return x, gl.sum(x * self.w) * 0.3

    def _eval(self, spec: Any, x: gl.Tensor, scope: tuple[gl.Tensor, gl.Tensor]) -> gl.Tensor:
        kind = spec[0]
        if kind == "leaf":
            return self._leaf(spec[1], x, scope)
        if kind == "add":
            a, b = spec[1]
            return self._eval(a, x, scope) + self._eval(b, x, scope)
        if kind == "mul":
            a, b = spec[1]
            return gl.tanh(self._eval(a, x, scope)) * self._eval(b, x, scope)
        if kind == "cond":
            threshold, (a, b) = spec[1], spec[2]
            pred = gl.sum(x * self.w) > threshold
            inner = self._scope(x)
            return gl.cond(pred, lambda: self._eval(a, x, inner), lambda: self._eval(b, x, scope))
        if kind == "switch":
            branches, with_default = spec[1], spec[2]
            index = gl.cast(gl.sum(gl.abs(x)) * 2.0, gl.int32) - 1  # -1 runs the default
            fns = [lambda b=b: self._eval(b, x, scope) for b in branches]
            default = (lambda: x * 0.5) if with_default else None
            return gl.switch_case(index, fns, default=default)
        return self._while(spec, x)

    def _while(self, spec: Any, x: gl.Tensor) -> gl.Tensor:
        # Specs written before `checkpoints` was drawn (the named regressions) have none.
        _, body_spec, offset, bound, extra, assign, *drawn = spec
        checkpoints = drawn[0] if drawn else None
        # Data-dependent trip count: 0 to offset + 2 trips.
        n = gl.minimum(gl.cast(gl.abs(gl.sum(x * self.w)) * 3.0, gl.int32), 2) + offset - 1

        def cond(i, count, flag, h, h32, e, k):
            return i < n

        # The body closes over the loop's input and a scalar of it (differentiated values).
        scope = self._scope(x)

        def body(i, count, flag, h, h32, e, k):
            new_h = self._eval(body_spec, h, scope) * 0.5 + h * 0.3
            if assign:
                target = self.v if assign == "v" else self.acc
                target.assign_add(gl.stop_gradient(new_h) * 0.01)
            if extra == "passthrough":
                e2 = e
            elif extra == "overwritten":
                e2 = new_h * 0.5
            elif extra == "unread":
                e2 = h
            elif extra == "constant":
                e2 = gl.ones_like(e) * 0.5
            else:
                e2 = e * 1.0
            h32 = gl.cast(new_h, gl.float32) + h32 * gl.tensor(0.5, dtype=gl.float32)
            return i + 1, count + 2, gl.logical_not(flag), new_h, h32, e2, k * 2 + 1

        init = (
            gl.tensor(0, dtype=gl.int32),
            gl.tensor(0, dtype=gl.int64),
            gl.tensor(True),
            x,
            gl.cast(x, gl.float32),
            x * 0.25,
            gl.tensor(np.arange(self.width), dtype=gl.int32),  # an integer vector, mixed in
        )
        _i, count, flag, h, h32, e, k = gl.while_loop(
            cond,
            body,
            init,
            maximum_iterations=bound,
            checkpoints=None if assigns(spec) else checkpoints,
        )
        # The float32 copy counts through its sign only: piecewise constant, so that finite
        # differences in float64 agree with its zero gradient.
        out = h + gl.cast(h32 > 0.0, gl.float64) * 0.1
        out = out + gl.cast(count, gl.float64) * 0.01 + gl.cast(k, gl.float64) * 0.001
        out = out + gl.where(flag, x, -x) * 0.1
        if extra != "unused":
            out = out + e * 0.2
        return out

    def _leaf(self, name: str, x: gl.Tensor, scope: tuple[gl.Tensor, gl.Tensor]) -> gl.Tensor:
        vec, scalar = scope
        leaves: dict[str, Callable[[], gl.Tensor]] = {
            "x": lambda: x,
            "w": lambda: x * self.w,
            "v": lambda: x * self.v.read(),
            "sin": lambda: gl.sin(x),
            "tanh": lambda: gl.tanh(x + self.w),
            "square": lambda: (x - 0.2) ** 2,
            "cube": lambda: (x - 0.1) ** 3,
            "custom": lambda: scaled_square(x),
            "custom_jvp": lambda: skewed_sin(x),
            "recompute": lambda: recomputed(x),
            "stop": lambda: gl.stop_gradient(x) * x,
            "f32": lambda: gl.cast(gl.sin(gl.cast(x, gl.float32)), gl.float64) * 0.0 + x * 0.5,
            "sigmoid": lambda: gl.sigmoid(x),
            "outer": lambda: x * gl.tanh(vec) * 0.5 + x * scalar,
            "sin_sin": lambda: sin_sin(x),
            "recompute_outer": lambda: recompute_outer(x, vec),
            "nested_jvp": lambda: nested_jvp(x, scalar),
            "arctan": lambda: gl.arctan(x) * 1.5,
            "log1p": lambda: gl.log1p(x * x),
            "arctan2": lambda: gl.arctan2(x, 1.5 + gl.cos(x)),
            "hyperbolic": lambda: gl.hypot(x, 0.5) * gl.sinh(gl.tanh(x)) + gl.expm1(-(x * x)),
            "at": lambda: x.at[0].add(gl.sin(x[2])).at[1:].mul(x[:-1] * 0.5 + 1.0),
            "at_dynamic": lambda: x.at[self._row(x)].set(gl.tanh(x[self._row(x)]) * 2.0),
            "fori": lambda: gl.fori_loop(0, 2, lambda i, v: v * 0.8 + 0.1 * gl.sin(v), x),
            "scan": lambda: gl.scan(lambda c, xi: (c * 0.5 + xi, gl.sin(c + xi)), x[0] * 0.0, x)[1],
            "solve": lambda: gl.linalg.solve(
                gl.eye(self.width, dtype=x.dtype) * 2.0 + gl.outer(gl.tanh(x), self.w) * 0.3, x
            ),
            "cholesky": lambda: gl.matmul(
                gl.linalg.cholesky(
                    gl.eye(self.width, dtype=x.dtype) * 2.0 + gl.outer(gl.sin(x), gl.sin(x)) * 0.3
                ),
                x,
            ),
            "arrays": lambda: (
                gl.cumsum(x) * 0.3
                + gl.cumprod(gl.tanh(x))
                + gl.softmax(x) * x
                + gl.einsum("i,i,j->j", x, self.w, x) * 0.1
            ),
            "implicit": lambda: implicit_root(x),
            "linear_solve": lambda: diagonal_solve(x),
            "exp_log": lambda: gl.log(1.0 + gl.exp(-(x * x))) + gl.cos(x) * 0.5,
        }
        return leaves[name]()

    def _row(self, x: gl.Tensor) -> gl.Tensor:
        """A row chosen by the data: 0 .. width - 1."""
        return gl.minimum(gl.cast(gl.abs(gl.sum(x * self.w)) * 2.0, gl.int32), self.width - 1)


def build(spec: Any) -> Program:
    return Program(spec)
