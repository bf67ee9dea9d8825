"""Differential random-program tester: eager vs `@gl.function` on the frame executor and on the
reference interpreter vs `gl.jit` (llvm-cpu) vs `gl.jit(backend="xla")` (pure StableHLO on XLA).

Each program (`program_fuzz.py`) is run in the three modes on values, on its gradient with
respect to `x` and to a Variable read in it, on a second-order gradient and on the Variable its
loops assign; eager gradients of programs without custom gradients or stop_gradient are checked
against central finite differences in float64.

`make test` runs a fixed seed (`GRADLOOP_FUZZ_EXAMPLES` programs in every mode, ten times as many
in graph mode alone, which is cheap), so that it passes or fails the same way every time; a
compile that runs past `GRADLOOP_COMPILE_TIMEOUT_S` fails its program at once, never hangs.
That is a smoke test, as JAX's CI runs few generated cases: the search is `make fuzz`, thousands
of programs from a random seed (`GRADLOOP_FUZZ_SEED`, printed to reproduce), over every core.
Hypothesis prints the shrunk program; every failure found and fixed is a named regression test
in `test_mode_agreement.py`.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import gradloop as gl
from gradcheck import numerical_gradient
from program_fuzz import (
    N,
    Program,
    assigns_in_nested_loop,
    closes_over_in_checkpointed_loop,
    depth,
    is_pure,
    programs,
)
from runners import run_on

#: IREE compiles (or hundreds of programs): `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("GRADLOOP_FUZZ_EXAMPLES", "10"))
SEED = int(os.environ.get("GRADLOOP_FUZZ_SEED", "20261124"))
# About ten seconds per program in gl.jit (values, gradients and second derivatives in one
# module of up to a few thousand lines; IREE compiles some 500 lines a second), a fraction of a
# second in graph mode: about 80 s for the 10 programs `make test` runs, on a 2-core VM.
# `make fuzz` gives more (GRADLOOP_FUZZ_BUDGET_S): its shards share the cores with each other.
BUDGET_S = float(os.environ.get("GRADLOOP_FUZZ_BUDGET_S", 600 + 15 * EXAMPLES))


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory) -> None:
    old = os.environ.get("GRADLOOP_CACHE_DIR")
    os.environ["GRADLOOP_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        del os.environ["GRADLOOP_CACHE_DIR"]
    else:
        os.environ["GRADLOOP_CACHE_DIR"] = old


def aliased(program: Program, x: gl.Tensor, y: gl.Tensor) -> tuple[gl.Tensor, gl.Tensor]:
    """The gradient with respect to both positions of a function of two arguments; called with
    one tensor in both, each position still has its own gradient."""
    return gl.grad(lambda a, b: program(a) + gl.sum(gl.sin(b) * a), argnums=(0, 1))(x, y)


def outputs(program: Program, stage) -> list[np.ndarray]:
    """Value, d/dx, d/dv, a second-order gradient, the gradients of `aliased` at `(x, x)` and
    the Variables' final values of `program`, run through `stage`."""
    cot = gl.tensor(np.resize([0.3, -0.7, 0.5], program.width))

    def everything(x):
        with gl.GradientTape(persistent=True) as outer:
            outer.watch(x)
            with gl.GradientTape(persistent=True) as tape:
                tape.watch(x)
                y = program(x)
            gx, gv = tape.gradient(y, [x, program.v], unconnected_gradients="zero")
            h = gl.sum(gx * cot)
        hx = outer.gradient(h, x, unconnected_gradients="zero")
        ga, gb = aliased(program, x, x)
        # Read after the gradients: their construction must not rerun a body's assignments.
        return y, gx, gv, hx, ga, gb, program.acc.read(), program.v.read()

    program.reset()
    results = stage(everything)(gl.tensor(x_of(program.width)))
    program.reset()
    return [np.asarray(r) for r in results]


X = np.array([0.41, -0.23, 0.37])


def x_of(width: int) -> np.ndarray:
    """The input of a program of `width` elements: X, continued."""
    return np.resize(X, width) * np.linspace(1.0, 0.6, width)


def on_runner(name: str):
    """A stage: `gl.function(fn)` whose calls run on the graph runner `name`."""

    def stage(fn):
        staged = gl.function(fn)
        return lambda *args: run_on(name, staged, *args)

    return stage


def xla(fn):
    """`gl.jit` on XLA: the program's pure StableHLO."""
    return gl.jit(fn, backend="xla")


def check(spec, compiled: bool = True, width: int = N, on_xla: bool = True) -> None:
    """`spec` of `width` elements in every mode against eager mode (`compiled`: `gl.jit` too,
    on IREE, and on XLA unless not `on_xla`)."""
    program = Program(spec, width)
    x0 = x_of(width)
    eager = outputs(program, lambda f: f)
    stages = {name: on_runner(name) for name in ("executor", "frames", "interpreter")}
    if compiled:
        stages["compiled"] = gl.jit
        if on_xla:
            stages["xla"] = xla
    for mode, stage in stages.items():
        try:
            got = outputs(program, stage)
        except gl.errors.CompileError as e:
            # pure StableHLO has no growable stacks: the contract's one refusal (DESIGN)
            if mode == "xla" and "body assigns a Variable" in str(e):
                continue
            raise
        names = ("value", "d/dx", "d/dv", "d2/dx2", "d/da", "d/db", "assigned", "v assigned")
        for what, e, g in zip(names, eager, got, strict=True):
            np.testing.assert_allclose(
                g, e, rtol=1e-6, atol=1e-9, err_msg=f"{mode} {what} differs from eager: {spec}"
            )
    # One tensor in both positions: the gradients of two distinct copies of it (each from the
    # Variables' initial values: loop bodies may assign them).
    program.reset()
    x = gl.tensor(x0)
    same = aliased(program, x, x)
    program.reset()
    distinct = aliased(program, gl.tensor(x0), gl.tensor(x0.copy()))
    program.reset()
    for what, s, d in zip(("d/da", "d/db"), same, distinct, strict=True):
        np.testing.assert_allclose(
            np.asarray(s), np.asarray(d), rtol=1e-12, err_msg=f"aliased {what}: {spec}"
        )
    if is_pure(spec):
        program.reset()

        def loss(x: np.ndarray) -> float:
            program.reset()  # loop bodies may assign to a Variable the output reads
            return float(program(gl.tensor(x)))

        fd = numerical_gradient(loss, [x0])[0]
        program.reset()
        np.testing.assert_allclose(eager[1], fd, rtol=1e-5, atol=1e-6, err_msg=f"d/dx: {spec}")


def all_modes(spec, width: int) -> None:
    check(spec, width=width)


@pytest.mark.long
@pytest.mark.timeout(BUDGET_S)
def test_modes_agree_on_random_programs() -> None:
    # a vector state of N elements is held as host scalars in compiled mode, one of 2N on the
    # device: both forms are drawn
    widths = st.sampled_from((N, 2 * N))
    specs = programs(heavy=os.environ.get("GRADLOOP_FUZZ_HEAVY") == "1")
    seed(SEED)(_settings(EXAMPLES)(given(spec=specs, width=widths)(all_modes)))()


@pytest.mark.long
@pytest.mark.timeout(BUDGET_S)
def test_graph_mode_agrees_on_many_random_programs() -> None:
    def graph_only(spec) -> None:
        check(spec, compiled=False)

    seed(SEED + 1)(_settings(10 * EXAMPLES)(given(spec=programs())(graph_only)))()


def test_the_generator_nests_three_deep_and_mixes_purity() -> None:
    # The strategy reaches what the tester is for: three-deep nesting, both kinds of program,
    # loops that assign a Variable inside another construct, and differentiated values closed
    # over by a checkpointed loop's body.
    found = {
        "deep": False,
        "pure": False,
        "impure": False,
        "nested assignment": False,
        "closure in a checkpointed loop": False,
    }

    @seed(1)
    @settings(max_examples=1000, deadline=None, database=None)
    @given(spec=programs())
    def look(spec) -> None:
        found["deep"] |= depth(spec) >= 3
        found["nested assignment"] |= assigns_in_nested_loop(spec)
        found["closure in a checkpointed loop"] |= closes_over_in_checkpointed_loop(spec)
        found["pure" if is_pure(spec) else "impure"] = True

    look()
    assert all(found.values()), found
