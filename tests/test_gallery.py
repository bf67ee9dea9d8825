"""The gallery (`examples/`, shown on the site's gallery page): each script runs here in its short
configuration, draws its figure, and its numbers are checked (derivatives against finite
differences or closed forms, fits that converge, loops that make the trips they should)."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
from types import ModuleType

import numpy as np
import pytest

import gradloop as gl

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GALLERY = ROOT / "docs" / "gallery.md"
PNG = b"\x89PNG\r\n\x1a\n"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"gallery_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_quick(module: ModuleType, tmp_path: pathlib.Path):
    """`main(["--quick", "--plot", ...])`: its result, after checking the figure was drawn."""
    pytest.importorskip("matplotlib", reason="the plot extra (make test installs it)")
    figure = tmp_path / "figure.png"
    result = module.main(["--quick", "--plot", str(figure)])
    assert figure.read_bytes().startswith(PNG)
    return result


def test_the_bouncing_ball_fit_converges_and_its_event_gradient_is_exact(tmp_path) -> None:
    ball = example("bouncing_ball")
    result = run_quick(ball, tmp_path)
    losses = [loss for loss, _, _ in result.history]
    assert losses[-1] < 1e-4 * losses[0], losses
    # the throws make different numbers of steps: the loop's trip count follows the throw
    assert len({trips for _, _, trips in result.history}) > 1
    exact, numeric = ball.restitution_derivative(result.speed)
    np.testing.assert_allclose(exact, numeric, rtol=1e-6)
    # the contact point moves continuously where a bounce crosses from one step to the next
    speeds = result.speed + np.linspace(-0.02, 0.02, 9)
    e = gl.tensor(ball.RESTITUTION, dtype=gl.float64)
    contacts = [float(ball.third_bounce(gl.tensor(s, dtype=gl.float64), e)[0]) for s in speeds]
    assert np.max(np.abs(np.diff(contacts, 2))) < 1e-4


def test_newton_and_bfgs_derivatives_are_the_implicit_function_theorem_s(tmp_path) -> None:
    solvers = example("newton_bfgs")
    result = run_quick(solvers, tmp_path)
    for m, e in ((1.0, 0.6), (0.2, 0.9), (3.0, 0.1)):
        got, closed_form = solvers.kepler_derivatives(m, e)
        np.testing.assert_allclose(got, closed_form, rtol=1e-12)
    data = solvers.make_data()
    for log_lam in (-1.0, 0.5):
        exact, closed_form = solvers.hypergradient_check(data, log_lam)
        np.testing.assert_allclose(exact, closed_form, rtol=1e-7)
    losses = [loss for loss, _ in result.history]
    assert losses[-1] < losses[0]


def test_the_rnn_makes_each_sequence_s_trips_and_its_gradient_is_exact(tmp_path) -> None:
    rnn = example("rnn_stop")
    result = run_quick(rnn, tmp_path)
    assert all(np.isfinite(loss) for loss, _ in result.history)
    exact, numeric = rnn.per_example_gradient_check(result.params)
    np.testing.assert_allclose(exact, numeric, rtol=1e-6)
    # each lane of the batch stops at its own marker
    xs, _ = rnn.make_batch(np.random.default_rng(3), 8)
    params = {k: gl.tensor(v) for k, v in result.params.items()}
    _, trips = gl.vmap(rnn.read, in_axes=(None, 0))(params, gl.tensor(xs))
    np.testing.assert_array_equal(np.asarray(trips), np.argmax(xs == rnn.MARKER, axis=1))


def test_checkpointed_gradients_equal_the_stacks_gradient(tmp_path) -> None:
    sim = example("checkpointed_sim")
    runs = run_quick(sim, tmp_path)
    assert [r.checkpoints for r in runs] == list(sim.CHECKPOINTS)
    stacks = next(r.gradient for r in runs if r.checkpoints is None)
    for run in runs:
        np.testing.assert_allclose(run.gradient, stacks, rtol=1e-9, atol=1e-14)
    assert np.max(np.abs(stacks)) > 0.0


def test_the_gallery_page_shows_every_example_and_its_figure() -> None:
    page = GALLERY.read_text()
    scripts = sorted(p.stem for p in EXAMPLES.glob("*.py"))
    for name in scripts:
        assert f"examples/{name}.py" in page, f"{name} is not on the gallery page"
    for figure in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page):
        path = GALLERY.parent / figure
        assert path.read_bytes().startswith(PNG), figure
