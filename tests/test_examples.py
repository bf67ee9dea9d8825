"""The flagship example (`gradloop demo`): its simulation, its gradients and its command line."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import pytest

import gradloop as gl
from gradloop.examples import projectile


def f64(x: float) -> gl.Tensor:
    return gl.tensor(x, dtype=gl.float64)


def reference_flight(theta: float, dt: float = projectile.DT) -> tuple[float, int]:
    """The same flight in plain Python floats: semi-implicit Euler with quadratic drag,
    v <- v + dt * (-DRAG |v| v - g e_y);  p <- p + dt * v;  while y > 0,
    then the landing point interpolated linearly between the last two positions."""
    x, y = 0.0, projectile.HEIGHT
    vx, vy = projectile.SPEED * math.cos(theta), projectile.SPEED * math.sin(theta)
    x_prev, y_prev, n = x, y, 0
    while y > 0:
        speed = math.hypot(vx, vy)
        vx, vy = (
            vx - projectile.DRAG * speed * vx * dt,
            vy - (projectile.GRAVITY + projectile.DRAG * speed * vy) * dt,
        )
        x_prev, y_prev, x, y, n = x, y, x + vx * dt, y + vy * dt, n + 1
    return x_prev + (x - x_prev) * y_prev / (y_prev - y), n


@pytest.mark.parametrize("theta", [-0.05, 0.1, 0.33, 0.8])
def test_simulation_matches_plain_python(theta):
    landing, n = projectile.simulate(f64(theta))
    expected, expected_n = reference_flight(theta)
    assert landing.dtype == gl.float64 and landing.shape == ()
    assert n.dtype == gl.int32 and int(n) == expected_n
    assert float(landing) == pytest.approx(expected, rel=1e-12)


def test_trip_count_depends_on_the_angle():
    trips = [int(projectile.simulate(f64(theta))[1]) for theta in (0.1, 0.4, 0.8)]
    assert trips[0] < trips[1] < trips[2]


def test_a_few_gradient_steps_decrease_the_loss():
    result = projectile.fit(steps=4, log=None)
    losses = [loss for loss, _, _ in result.history]
    assert all(later < earlier for earlier, later in itertools.pairwise(losses))
    assert losses[-1] < 1e-2 * losses[0]
    # the angles move towards the one that lands on the target
    thetas = [theta for _, theta, _ in result.history] + [result.theta]
    assert all(later > earlier for earlier, later in itertools.pairwise(thetas))


@pytest.mark.parametrize("theta", [0.1, 0.33, 0.8])
def test_loop_gradient_matches_central_differences(theta):
    reverse, central = projectile.check_gradient(theta, eps=1e-6)
    assert reverse == pytest.approx(central, rel=1e-6)


@pytest.mark.parametrize("theta", [0.1, 0.8])
def test_second_derivative_through_the_loop(theta):
    def landing(t):
        return projectile.simulate(t)[0]

    second = float(gl.grad(gl.grad(landing))(f64(theta)))
    eps = 1e-5
    first = gl.grad(landing)
    central = (float(first(f64(theta + eps))) - float(first(f64(theta - eps)))) / (2 * eps)
    assert second == pytest.approx(central, rel=1e-5)


@pytest.fixture
def private_cache(tmp_path, monkeypatch) -> None:
    """A cache of its own; fails (never skips) without IREE, which `make test` installs."""
    if not projectile.compiled_mode_available():
        pytest.fail("compiled mode needs IREE (iree-base-compiler, iree-base-runtime)")
    monkeypatch.setenv("GRADLOOP_CACHE_DIR", str(tmp_path / "cache"))


def test_compiled_mode_agrees_with_eager_and_graph_modes(private_cache, capsys):
    fit = projectile.Fit(theta=0.6, history=[(0.0, 0.1, 0), (0.0, 0.6, 0)])
    worst = projectile.compare_modes(fit, projectile.DEFAULT_TARGET)
    assert worst < 1e-12
    out = capsys.readouterr().out
    assert all(f"  {mode} " in out for mode in ("eager", "graph", "compiled"))


def test_exported_module_runs_under_iree_run_module(private_cache, tmp_path):
    if projectile.iree_run_module() is None:
        pytest.fail("iree-run-module is not installed (iree-base-runtime provides it)")
    done = projectile.export_and_run(0.33, projectile.DEFAULT_TARGET, tmp_path)
    assert done.vmfb.exists() and done.vmfb.with_suffix(".mlir").exists()
    assert done.matches  # bit for bit what the same module gives in process, and printed so
    assert done.printed_values == pytest.approx(done.values, rel=1e-5)
    assert done.values == pytest.approx(done.eager, rel=1e-12)
    landing, trips = reference_flight(0.33)
    assert done.values[1] == trips
    assert done.values[0] == pytest.approx((landing - projectile.DEFAULT_TARGET) ** 2, rel=1e-9)


def test_command_line_demo_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "gradloop", "demo", "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "fitted angle" in proc.stdout
    assert "gradient check" in proc.stdout
    if projectile.compiled_mode_available() and projectile.iree_run_module() is not None:
        assert "  compiled " in proc.stdout
        assert "bit for bit" in proc.stdout


def test_command_line_requires_a_subcommand(capsys):
    from gradloop import cli

    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    assert "demo" in capsys.readouterr().err


def test_the_flight_path_is_the_simulated_loop_step_by_step() -> None:
    for theta in (0.1, 0.6):
        xy = projectile.path(theta)
        landing, n = projectile.simulate(f64(theta))
        assert len(xy) == int(n) + 1  # the launch point, then one row per trip
        assert xy[-2, 1] > 0.0 >= xy[-1, 1]
        (x0, y0), (x1, y1) = xy[-2], xy[-1]
        assert math.isclose(x0 + (x1 - x0) * y0 / (y0 - y1), float(landing), rel_tol=1e-12)


def test_the_demo_draws_the_flights_and_losses(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra (make test installs it)")
    picture = tmp_path / "flight.png"
    done = subprocess.run(
        [sys.executable, "-m", "gradloop", "demo", "--steps", "3", "--plot", str(picture)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert f"flights and losses: {picture}" in done.stdout
    data = picture.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1100, 400)  # figsize (11, 4) at 100 dpi


def test_the_demo_without_matplotlib_says_what_to_install(tmp_path) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from gradloop import cli\n"
        f"sys.exit(cli.main(['demo', '--steps', '1', '--plot', r'{tmp_path / 'f.png'}']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "pip install 'gradloop[plot]'" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "Fitting" not in done.stdout
