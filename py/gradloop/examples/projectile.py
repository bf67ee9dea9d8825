"""Fit a launch angle by gradient descent through a data-dependent `gl.while_loop`.

A projectile leaves a height of 1 m at 30 m/s; quadratic air drag slows it down. Its flight is
integrated with semi-implicit Euler steps inside `gl.while_loop` until it falls below the ground, so
the number of loop trips depends on the launch angle. The landing point is interpolated linearly
within the last step, which makes it a continuous function of the angle, whose derivative reverse
mode computes through the loop. Gradient descent on the squared miss distance then finds the angle
that lands the projectile on a target. Run it with `gradloop demo`, `python -m gradloop demo` or
`python examples/projectile.py`.
"""

from __future__ import annotations

import importlib.util
import math
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import gradloop as gl
from gradloop.examples import figures

GRAVITY = 9.81  # m/s^2
DRAG = 0.02  # quadratic drag coefficient divided by mass, 1/m: the deceleration is DRAG * |v| * v
SPEED = 30.0  # launch speed, m/s
HEIGHT = 1.0  # launch height, m
DT = 0.01  # integration time step, s
MAX_STEPS = 100_000  # a safety net only: every flight ends long before

DEFAULT_STEPS = 25
DEFAULT_TARGET = 35.0  # m; the drag-free range at 30 m/s would be ~92 m, drag cuts it to ~43 m
DEFAULT_THETA0 = 0.1  # rad, a flat first guess that lands at ~20 m
DEFAULT_LEARNING_RATE = 8e-5  # rad/m^2; d(landing)/d(angle) is ~40-70 m/rad over the path


def step(x: Any, y: Any, vx: Any, vy: Any, dt: float = DT) -> tuple[Any, Any, Any, Any]:
    """One semi-implicit Euler step of the flight: the position moves with the *new* velocity."""
    speed = gl.sqrt(vx * vx + vy * vy)
    vx_next = vx - DRAG * speed * vx * dt
    vy_next = vy - (GRAVITY + DRAG * speed * vy) * dt
    return x + vx_next * dt, y + vy_next * dt, vx_next, vy_next


def path(theta: float, dt: float = DT) -> np.ndarray:
    """The flight launched at `theta` as (x, y) rows, one per Euler step until it lands: the
    loop of `simulate` run eagerly, step by step (for pictures, not gradients)."""
    x, y = gl.tensor(0.0, dtype=gl.float64), gl.tensor(HEIGHT, dtype=gl.float64)
    vx, vy = SPEED * gl.cos(gl.tensor(theta, dtype=gl.float64)), SPEED * math.sin(theta)
    points = [(0.0, HEIGHT)]
    while points[-1][1] > 0.0 and len(points) <= MAX_STEPS:
        x, y, vx, vy = step(x, y, vx, vy, dt)
        points.append((float(x), float(y)))
    return np.array(points)


def plot(result: Fit, target: float, filename: str | os.PathLike[str]) -> None:
    """Draws the fit into `filename` (PNG, SVG or PDF, by its suffix): each step's flight,
    converging onto the target, and the loss per step. Needs matplotlib (`gradloop[plot]`)."""
    paths = [path(theta) for _, theta, _ in result.history]
    losses = [loss for loss, _, _ in result.history]
    figures.draw_fit(paths, path(result.theta), target, losses, filename)


def simulate(theta: gl.Tensor, dt: float = DT) -> tuple[gl.Tensor, gl.Tensor]:
    """Flies a projectile launched at angle `theta` (a float64 scalar tensor, radians).

    Returns (landing distance in m, a float64 scalar; number of Euler steps, an int32 scalar).
    """

    # Loop state: step count, position, velocity, and the position one step earlier (for the
    # interpolation at the end). A tuple of loop vars is spread into positional arguments.
    def above_ground(n, x, y, vx, vy, x_prev, y_prev):
        return y > 0.0

    def euler_step(n, x, y, vx, vy, x_prev, y_prev):
        x_next, y_next, vx_next, vy_next = step(x, y, vx, vy, dt)
        return n + 1, x_next, y_next, vx_next, vy_next, x, y

    x0, y0 = gl.zeros_like(theta), gl.zeros_like(theta) + HEIGHT
    vx0, vy0 = SPEED * gl.cos(theta), SPEED * gl.sin(theta)
    loop_vars = (gl.tensor(0, dtype=gl.int32), x0, y0, vx0, vy0, x0, y0)
    n, x, y, _, _, x_prev, y_prev = gl.while_loop(
        above_ground, euler_step, loop_vars, maximum_iterations=MAX_STEPS
    )
    # The ground (y = 0) was crossed between (x_prev, y_prev > 0) and (x, y <= 0): interpolate.
    # Where a change of angle moves a step across the ground the trip count jumps by one, yet
    # this landing point moves continuously (only its slope changes there, by O(dt)), so
    # gradient descent sees an almost smooth landscape.
    landing = x_prev + (x - x_prev) * y_prev / (y_prev - y)
    return landing, n


@dataclass
class Fit:
    """The result of `fit`: the fitted angle and one row per gradient step."""

    theta: float
    history: list[tuple[float, float, int]] = field(default_factory=list)  # (loss, theta, trips)


def loss(theta: gl.Tensor, target: float) -> tuple[gl.Tensor, gl.Tensor]:
    """(landing(theta) - target)^2, the scalar to differentiate, and the loop trip count."""
    landing, trips = simulate(theta)
    miss = landing - target
    return miss * miss, trips


eager_loss_and_grad = gl.value_and_grad(loss, has_aux=True)
# Graph mode: traced once per signature by @gl.function into a graph whose While node is
# differentiated symbolically (a forward loop that stacks what the gradient needs, a reverse loop
# that pops it), then lowered to dataflow and run by the frame executor.
graph_loss_and_grad = gl.function(gl.value_and_grad(loss, has_aux=True))


def interpreted_loss_and_grad(theta: gl.Tensor, target: float) -> Any:
    """`graph_loss_and_grad` run on the reference interpreter instead of the frame executor."""
    runner = gl._core.graph_runner()
    gl._core.set_graph_runner("interpreter")
    try:
        return graph_loss_and_grad(theta, target)
    finally:
        gl._core.set_graph_runner(runner)


def fit(
    target: float = DEFAULT_TARGET,
    theta0: float = DEFAULT_THETA0,
    steps: int = DEFAULT_STEPS,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    log: Callable[[str], None] | None = print,
    loss_and_grad: Callable[..., Any] = eager_loss_and_grad,
) -> Fit:
    """Gradient descent on (landing(theta) - target)^2; `log` gets one line per step.

    `loss_and_grad` is `eager_loss_and_grad` or `graph_loss_and_grad`.
    """
    theta = gl.tensor(theta0, dtype=gl.float64)
    result = Fit(theta=theta0)
    if log:
        log(f"{'step':>4}  {'loss (m^2)':>12}  {'angle (deg)':>11}  {'loop trips':>10}")
    for step in range(steps):
        (value, trips), grad = loss_and_grad(theta, target)
        result.history.append((float(value), float(theta), int(trips)))
        if log:
            angle = math.degrees(float(theta))
            log(f"{step:>4}  {float(value):>12.6g}  {angle:>11.4f}  {int(trips):>10}")
        theta = theta - learning_rate * grad  # a new tensor: tensors are immutable
    result.theta = float(theta)
    return result


def check_gradient(theta: float, eps: float = 1e-6) -> tuple[float, float]:
    """d(landing)/d(theta) by reverse mode through the loop, and by a central finite difference."""
    reverse = gl.grad(lambda t: simulate(t)[0])(gl.tensor(theta, dtype=gl.float64))
    plus, _ = simulate(gl.tensor(theta + eps, dtype=gl.float64))
    minus, _ = simulate(gl.tensor(theta - eps, dtype=gl.float64))
    return float(reverse), (float(plus) - float(minus)) / (2 * eps)


def main(
    steps: int = DEFAULT_STEPS,
    target: float = DEFAULT_TARGET,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    compiled: bool = True,
    export_dir: str | os.PathLike[str] | None = None,
    plot_to: str | os.PathLike[str] | None = None,
) -> Fit:
    """Runs the demo and prints its progress; returns the fit. With `compiled` (and IREE
    installed) the loss and gradient also run under `gl.jit`, and are exported to a `.vmfb`
    (into `export_dir`, else a temporary directory) that `iree-run-module` runs. With
    `plot_to`, the fit's flights and losses are drawn into that file (`plot`)."""
    if plot_to is not None:
        figures.pyplot()  # before the work: a missing matplotlib is said at once
    print(
        f"Fitting the launch angle of a projectile (speed {SPEED} m/s, drag {DRAG} 1/m,\n"
        f"launch height {HEIGHT} m, time step {DT} s) so that it lands at {target} m.\n"
        "Each loss evaluation runs an eager gl.while_loop until the projectile hits the ground;\n"
        "gl.value_and_grad differentiates through it in reverse mode.\n"
    )
    result = fit(target=target, steps=steps, learning_rate=learning_rate)
    landing, n = simulate(gl.tensor(result.theta, dtype=gl.float64))
    reverse, central = check_gradient(result.theta)
    rel = abs(reverse - central) / max(abs(central), 1e-300)
    print(
        f"\nfitted angle: {math.degrees(result.theta):.4f} deg ({result.theta:.6f} rad)\n"
        f"landing distance: {float(landing):.6f} m after {int(n)} steps "
        f"(target {target} m, miss {float(landing) - target:+.2e} m)\n"
        f"gradient check, d landing / d angle at the fitted angle:\n"
        f"  {reverse:.9f} m/rad by reverse mode through the while_loop\n"
        f"  {central:.9f} m/rad by central difference (relative difference {rel:.1e})"
    )
    compare_modes(result, target, compiled=compiled)
    if compiled:
        report_export(result.theta, target, export_dir)
    if plot_to is not None:
        plot(result, target, plot_to)
        print(f"\nthe fit's flights and losses: {plot_to}")
    return result


def compare_modes(result: Fit, target: float, compiled: bool = True) -> float:
    """Re-runs the fit's angles in graph mode and, when IREE is installed and `compiled`, under
    `gl.jit`; prints and returns the largest relative difference of loss and gradient from
    eager mode, and the median time per loss+gradient evaluation of each mode."""
    thetas = [gl.tensor(theta, dtype=gl.float64) for _, theta, _ in result.history]
    modes: dict[str, Callable[..., Any]] = {
        "eager": eager_loss_and_grad,
        "graph": graph_loss_and_grad,
        "reference": interpreted_loss_and_grad,
    }
    if compiled and compiled_mode_available():
        modes["compiled"] = compiled_loss_and_grad()
    results, medians = {}, {}
    for name, fn in modes.items():
        fn(thetas[0], target)  # graph mode traces, compiled mode also compiles, on a first call
        results[name], medians[name] = timed(fn, thetas, target)
    worst = {name: largest_relative_difference(results["eager"], results[name]) for name in modes}
    print(
        f"\nthe fit's {len(thetas)} angles again in every mode (median time per loss+gradient; "
        "largest relative difference of loss and gradient from eager mode):"
    )
    for name in modes:
        diff = "" if name == "eager" else f"   {worst[name]:.1e}"
        print(f"  {name:<9} {MODES[name]:<66} {medians[name] * 1e3:8.2f} ms{diff}")
    if "compiled" not in modes and compiled:
        print("  (compiled mode skipped: install iree-base-compiler and iree-base-runtime)")
    return max(worst.values())


MODES = {
    "eager": "(ops run at once, gradient tape)",
    "graph": "(@gl.function: traced once, symbolic While gradient, frame executor)",
    "reference": "(the same graph on the reference interpreter)",
    "compiled": "(gl.jit: the same graph as MLIR, compiled by IREE for llvm-cpu)",
}


def timed(fn: Callable[..., Any], thetas: list[gl.Tensor], target: float) -> tuple[list, float]:
    """`fn(theta, target)` for each angle, and the median seconds per call."""
    outputs, seconds = [], []
    for theta in thetas:
        start = time.perf_counter()
        outputs.append(fn(theta, target))
        seconds.append(time.perf_counter() - start)
    return outputs, statistics.median(seconds)


def largest_relative_difference(reference: list, other: list) -> float:
    """The largest |a - b| / |a| over the losses and gradients of two runs of the angles."""
    worst = 0.0
    for ((rv, _), rg), ((ov, _), og) in zip(reference, other, strict=True):
        for a, b in ((rv, ov), (rg, og)):
            worst = max(worst, abs(float(a) - float(b)) / max(abs(float(a)), 1e-300))
    return worst


def compiled_mode_available() -> bool:
    """Whether IREE's compiler and runtime (what `gl.jit` uses) are installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("iree.compiler", "iree.runtime"))


def compiled_loss_and_grad() -> Callable[..., Any]:
    """The loss and its gradient compiled with IREE for the CPU (`gl.jit`): the traced graph of
    `graph_loss_and_grad`, emitted as MLIR (StableHLO inside scf.while) once per signature."""
    return gl.jit(gl.value_and_grad(loss, has_aux=True), target="llvm-cpu")


@dataclass
class Exported:
    """What `export_and_run` did: the artifact, the command, and both sets of results."""

    vmfb: pathlib.Path
    command: list[str]
    printed: str  # iree-run-module's output
    values: list[float]  # its results, read back exactly (.npy): loss, trips, gradient
    in_process: list[float]  # the same .vmfb run in this process by IREE's Python runtime
    eager: list[float]  # the same function run eagerly

    @property
    def printed_values(self) -> list[float]:
        """The results as iree-run-module printed them (`f64=0.0699663`: 6 significant digits)."""
        return [float(v) for v in re.findall(r"^[fi]\d+=(\S+)$", self.printed, re.MULTILINE)]

    @property
    def matches(self) -> bool:
        """Whether iree-run-module gave exactly what the same module gives in this process (and
        printed it, to its precision)."""
        printed = self.printed_values
        close = len(printed) == len(self.values) and all(
            math.isclose(p, v, rel_tol=1e-5) for p, v in zip(printed, self.values, strict=True)
        )
        return close and self.values == self.in_process

    @property
    def eager_difference(self) -> float:
        """The largest relative difference of the exported module's results from eager mode."""
        pairs = zip(self.eager, self.values, strict=True)
        return max(abs(e - v) / max(abs(e), 1e-300) for e, v in pairs)


def iree_run_module() -> str | None:
    """The `iree-run-module` binary of this Python environment (`iree-base-runtime` ships it)."""
    beside = pathlib.Path(sys.executable).parent / "iree-run-module"
    return str(beside) if beside.exists() else shutil.which("iree-run-module")


def export_and_run(theta: float, target: float, directory: pathlib.Path) -> Exported:
    """Exports loss+gradient at `target` as a self-contained `.vmfb` (`gl.export`) and runs it
    for `theta` with plain `iree-run-module` in a subprocess: no Python, no gradloop."""
    fn = gl.value_and_grad(loss, has_aux=True)
    t = gl.tensor(theta, dtype=gl.float64)
    vmfb = gl.export(fn, t, target, path=directory / "projectile.vmfb")
    function = re.search(
        r"func\.func (?:public )?@([\w.$]+)", vmfb.with_suffix(".mlir").read_text()
    )
    binary = iree_run_module()
    if function is None or binary is None:
        raise gl.errors.CompileError("the exported module has no function, or no iree-run-module")
    command = [binary, f"--module={vmfb}", f"--function={function[1]}", f"--input=f64={theta!r}"]
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    outputs = [directory / f"result{i}.npy" for i in range(3)]
    exact = command + [f"--output=@{o}" for o in outputs]
    subprocess.run(exact, capture_output=True, text=True, check=True)
    values = [float(np.load(o)) for o in outputs]
    (value, trips), grad = fn(t, target)
    eager = [float(value), float(trips), float(grad)]
    return Exported(vmfb, command, printed, values, run_in_process(vmfb, function[1], t), eager)


def run_in_process(vmfb: pathlib.Path, function: str, theta: gl.Tensor) -> list[float]:
    """The results of `function` of the `.vmfb` run by IREE's Python runtime in this process."""
    from iree import runtime

    module = runtime.load_vm_flatbuffer(vmfb.read_bytes(), driver="local-task")
    results = module[function](np.asarray(theta))
    return [float(np.asarray(r.to_host() if hasattr(r, "to_host") else r)) for r in results]


def report_export(theta: float, target: float, export_dir: str | os.PathLike[str] | None) -> bool:
    """Runs `export_and_run` (in `export_dir`, or a temporary directory) and prints it."""
    if not compiled_mode_available() or iree_run_module() is None:
        print("\nexport skipped: install iree-base-compiler and iree-base-runtime")
        return False
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(export_dir) if export_dir is not None else pathlib.Path(tmp)
        done = export_and_run(theta, target, directory)
        where = done.vmfb if export_dir is not None else f"{done.vmfb.name} (a temporary file)"
        printed = " ".join(line.strip() for line in done.printed.splitlines()[1:])
        print(
            f"\nexported loss+gradient with gl.export to {where} and ran it with iree-run-module:\n"
            f"  $ {' '.join([pathlib.Path(done.command[0]).name, *done.command[1:]])}\n"
            f"  printed: {printed}\n"
            f"  loss {done.values[0]!r}, trips {done.values[1]:.0f}, gradient {done.values[2]!r}\n"
            + (
                "  bit for bit what the same module gives in this process"
                if done.matches
                else f"  DIFFERENT from the same module run in this process: {done.in_process}"
            )
            + f"; relative difference from eager mode {done.eager_difference:.1e}"
        )
        return done.matches


if __name__ == "__main__":
    main()
