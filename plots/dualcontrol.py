"""Dual control plots: slices over x of the value (expected discounted loss), the control and the value of
experimentation at a (mu, Sigma) grid node (nearest the values chosen, else the first report state), optimal
against myopic. Read from the result JSON (``states``, ``policy``) and the ``value``, ``policy``, ``grid``,
``myopic_value`` and ``myopic_policy`` artifacts (arrays over the (x, mu, Sigma) grid)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from kernels.dualcontrol import SOLVE_KIND
from plots.registry import JobData, PlotOption, PlotOptionError, PlotSpec

OPTIMAL_COLOUR, MYOPIC_COLOUR, VOE_COLOUR = "#1f4e79", "#e67e22", "#2e7d32"


def _nearest_node(name: str, nodes: np.ndarray, value: float) -> int:
    """The grid node nearest a chosen value, which must lie within the grid (no extrapolated slices)."""
    low, high = float(nodes.min()), float(nodes.max())
    if not low <= value <= high:
        raise PlotOptionError(name, f"{name} = {value:g} is outside this job's grid [{low:g}, {high:g}]")
    return int(np.argmin(np.abs(nodes - value)))


def _slice_node(data: JobData, mu_nodes: np.ndarray, sigma_nodes: np.ndarray, mu: float | None,
                sigma: float | None) -> tuple[int, int, str]:
    """Indices of the (mu, Sigma) node to slice at, and where it came from: nearest the chosen values, else
    nearest the first report state, else the middle of the grid."""
    states = data.result.get("states") or []
    origin = "the chosen (mu, Sigma)"
    if mu is None or sigma is None:
        if states:
            _, first_mu, first_sigma = states[0]["state"]
            origin = "the first report state" if mu is None and sigma is None else origin
        else:
            first_mu, first_sigma = mu_nodes[mu_nodes.size // 2], sigma_nodes[sigma_nodes.size // 2]
            origin = "the middle of the grid" if mu is None and sigma is None else origin
        mu = float(first_mu) if mu is None else mu
        sigma = float(first_sigma) if sigma is None else sigma
    return _nearest_node("mu", mu_nodes, mu), _nearest_node("sigma", sigma_nodes, sigma), origin


def draw_slices(figure: Figure, data: JobData, mu: float | None = None, sigma: float | None = None) -> None:
    grid = data.artifact("grid")
    x, mu_nodes, sigma_nodes = (np.asarray(grid[axis], dtype=float) for axis in ("x", "mu", "sigma"))
    i, j, origin = _slice_node(data, mu_nodes, sigma_nodes, mu, sigma)
    value = np.asarray(data.artifact("value"), dtype=float)[:, i, j]
    control = np.asarray(data.artifact("policy"), dtype=float)[:, i, j]
    policy_name = str(data.result.get("policy", "optimal"))
    has_myopic = "myopic_value" in data.artifact_names
    figure.set_size_inches(12, 4.0)
    value_ax, control_ax, voe_ax = figure.subplots(1, 3)
    value_ax.plot(x, value, color=OPTIMAL_COLOUR, label=policy_name)
    control_ax.plot(x, control, color=OPTIMAL_COLOUR, label=policy_name)
    if has_myopic:
        myopic_value = np.asarray(data.artifact("myopic_value"), dtype=float)[:, i, j]
        value_ax.plot(x, myopic_value, color=MYOPIC_COLOUR, linestyle="--", label="myopic")
        voe_ax.plot(x, myopic_value - value, color=VOE_COLOUR, label="myopic − optimal")
        voe_ax.axhline(0.0, color="grey", linewidth=0.8)
        voe_ax.legend(loc="best", fontsize=8, frameon=False)
    else:
        voe_ax.text(
            0.5,
            0.5,
            "no myopic companion\n(optimal policy jobs only)",
            ha="center",
            va="center",
            transform=voe_ax.transAxes,
            color="grey",
        )
    if "myopic_policy" in data.artifact_names:
        myopic_control = np.asarray(data.artifact("myopic_policy"), dtype=float)[:, i, j]
        control_ax.plot(x, myopic_control, color=MYOPIC_COLOUR, linestyle="--", label="myopic")
    value_ax.set_ylabel("value V (expected discounted loss)")
    control_ax.set_ylabel("control u (units of u)")
    voe_ax.set_ylabel("value of experimentation (loss units)")
    for ax, title in ((value_ax, "Value"), (control_ax, "Policy"), (voe_ax, "Value of experimentation")):
        ax.set_xlabel("state x (units of x)")
        ax.set_title(title)
    value_ax.legend(loc="best", fontsize=8, frameon=False)
    control_ax.legend(loc="best", fontsize=8, frameon=False)
    figure.suptitle(
        f"Slices over x at mu = {mu_nodes[i]:.3g}, Sigma = {sigma_nodes[j]:.3g} (grid node nearest {origin})",
        fontsize=10,
    )


PLOTS = [
    PlotSpec(
        "slices",
        "Value, policy and value of experimentation over x at one (mu, Sigma)",
        (SOLVE_KIND,),
        draw_slices,
        artifacts=("value", "policy", "grid"),
        options=(
            PlotOption("mu", "the slice's mu (the grid node nearest it; default: the first report state's)"),
            PlotOption("sigma", "the slice's Sigma (the grid node nearest it; default: the first report state's)"),
        ),
    ),
]
