"""What the examples draw with (the `plot` extra: matplotlib): pyplot, and the figure of a fit
by gradient steps that the projectile and the bouncing ball share."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import errors


def pyplot() -> Any:
    """matplotlib's pyplot, drawing into files; an error that says what to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        raise errors.InvalidArgumentError(
            "drawing needs matplotlib: pip install 'gradloop[plot]'"
        ) from None
    return plt


def draw_fit(
    paths: Sequence[np.ndarray],
    fitted: np.ndarray,
    target: float,
    losses: Sequence[float],
    filename: str | os.PathLike[str],
    *,
    what: str = "flight",
    target_label: str = "target",
) -> None:
    """Each gradient step's path ((x, y) rows), the fitted one and the target on the ground,
    beside the loss per step (log scale), into `filename` (PNG, SVG or PDF, by its suffix)."""
    plt = pyplot()
    figure, (flights, loss_axes) = plt.subplots(1, 2, figsize=(11, 4), width_ratios=(2, 1))
    colours = plt.get_cmap("viridis")
    for k, xy in enumerate(paths):
        colour = colours(k / max(len(paths) - 1, 1))
        flights.plot(xy[:, 0], xy[:, 1], color=colour, linewidth=1)
    flights.plot(fitted[:, 0], fitted[:, 1], color="crimson", linewidth=2, label="fitted")
    flights.plot([target], [0.0], marker="v", color="crimson", markersize=10, label=target_label)
    flights.set(xlabel="x (m)", ylabel="height (m)", title=f"each step's {what}")
    flights.set_ylim(bottom=0.0)
    flights.legend()
    loss_axes.semilogy([max(v, 1e-30) for v in losses], marker="o", markersize=3)
    loss_axes.set(xlabel="gradient step", ylabel="loss (m²)", title="squared miss")
    figure.tight_layout()
    figure.savefig(filename)
    plt.close(figure)
