"""Krusell-Smith plots: the simulated aggregate capital path against the path the approximate law of motion
(ALM) forecasts (den Haan's test), the ALM regression's scatter by aggregate state, and the individual policy
k'(k) by (aggregate, employment) state. Read from the result JSON (``alm``, ``den_haan_error``, ``burn_in``,
``mean_capital``) and the ``den_haan_path`` / ``accuracy_path``, ``capital_path`` and ``policy`` artifacts."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from kernels.ks import SOLVE_KIND
from plots.registry import JobData, PlotDataMissingError, PlotSpec

STATE_NAMES = ("bad", "good")  # the aggregate state a: 0 bad, 1 good (the result's alm keys)
EMPLOYMENT_NAMES = ("unemployed", "employed")  # eps: 0 unemployed, 1 employed
STATE_COLOURS = ("#c0392b", "#1f4e79")
CAPITAL_UNITS = "capital (model units)"


def _den_haan_paths(data: JobData) -> tuple[np.ndarray, np.ndarray, str]:
    for name in ("den_haan_path", "accuracy_path"):
        if name in data.artifact_names:
            stored = data.artifact(name)
            simulated = stored["K"] if "K" in stored else stored["K_panel"]
            return np.asarray(simulated, dtype=float), np.asarray(stored["K_alm"], dtype=float), name
    raise PlotDataMissingError("this job saved no den Haan path (den_haan_periods 0?)")


def _den_haan_errors(data: JobData) -> dict[str, float]:
    """The test's max and mean error (%): the panel test's, else the JEDC comparison's."""
    if data.result.get("den_haan_error"):
        return dict(data.result["den_haan_error"])
    accuracy = data.result.get("accuracy") or {}
    return {key: accuracy[f"den_haan_{key}"] for key in ("max_pct", "mean_pct") if f"den_haan_{key}" in accuracy}


def draw_den_haan(figure: Figure, data: JobData) -> None:
    simulated, forecast, _ = _den_haan_paths(data)
    errors = _den_haan_errors(data)
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    periods = np.arange(simulated.size)
    top.plot(periods, simulated, color=STATE_COLOURS[1], linewidth=1.2, label="simulated K (panel)")
    top.plot(
        periods,
        forecast,
        color=STATE_COLOURS[0],
        linewidth=1.2,
        linestyle="--",
        label="K by the ALM alone (dynamic forecast)",
    )
    top.set_ylabel(f"aggregate {CAPITAL_UNITS}")
    summary = ", ".join(f"{key} {float(errors[key]):.3g} %" for key in ("max_pct", "mean_pct") if key in errors)
    top.set_title("den Haan accuracy test" + (f": {summary}" if summary else ""))
    top.legend(loc="best", fontsize=8, frameon=False)
    bottom.plot(periods, 100 * (forecast - simulated) / simulated, color="grey", linewidth=1)
    bottom.set_ylabel("error (%)")
    bottom.set_xlabel("period (quarters)")


def draw_alm_scatter(figure: Figure, data: JobData) -> None:
    stored = data.artifact("capital_path")
    capital, state = np.asarray(stored["K"], dtype=float), np.asarray(stored["a"], dtype=int)
    burn_in = int(data.result.get("burn_in") or 0)
    now, following, current_state = np.log(capital[burn_in:-1]), np.log(capital[burn_in + 1 :]), state[burn_in:-1]
    alm = data.result.get("alm") or {}
    ax = figure.subplots()
    for index, name in enumerate(STATE_NAMES):
        chosen = current_state == index
        ax.plot(
            now[chosen],
            following[chosen],
            ".",
            color=STATE_COLOURS[index],
            alpha=0.6,
            markersize=4,
            label=f"{name} state ({int(chosen.sum())} periods)",
        )
        line = alm.get(name)
        if line and chosen.any():
            grid = np.linspace(now[chosen].min(), now[chosen].max(), 50)
            ax.plot(
                grid,
                line["intercept"] + line["slope"] * grid,
                color=STATE_COLOURS[index],
                linewidth=1.5,
                label=f"ALM {name}: {line['intercept']:.4f} + {line['slope']:.4f} ln K (R² {line['r2']:.5f})",
            )
    ax.set_xlabel("ln K today (log model units)")
    ax.set_ylabel("ln K next period (log model units)")
    ax.set_title("Aggregate law of motion by state")
    ax.legend(loc="upper left", fontsize=8, frameon=False)


def draw_policy(figure: Figure, data: JobData) -> None:
    stored = data.artifact("policy")
    policy = np.asarray(stored["policy"], dtype=float)  # [a, eps, k, K]
    k_grid, aggregate_grid = np.asarray(stored["k_grid"], dtype=float), np.asarray(stored["K_grid"], dtype=float)
    mean_capital = float(data.result.get("mean_capital") or aggregate_grid[aggregate_grid.size // 2])
    column = int(np.argmin(np.abs(aggregate_grid - mean_capital)))
    ax = figure.subplots()
    ax.plot(k_grid, k_grid, color="grey", linestyle=":", linewidth=1, label="k' = k")
    for a, state_name in enumerate(STATE_NAMES):
        for eps, employment in enumerate(EMPLOYMENT_NAMES):
            ax.plot(
                k_grid,
                policy[a, eps, :, column],
                color=STATE_COLOURS[a],
                linestyle="-" if eps else "--",
                linewidth=1.3,
                label=f"{state_name}, {employment}",
            )
    ax.set_xlabel(f"individual {CAPITAL_UNITS} k")
    ax.set_ylabel(f"next-period {CAPITAL_UNITS} k'")
    ax.set_title(f"Policy k'(k) at aggregate K = {aggregate_grid[column]:.2f} (grid node nearest the mean)")
    ax.legend(loc="upper left", fontsize=8, frameon=False)


PLOTS = [
    PlotSpec(
        "den_haan",
        "Simulated K path against the ALM's forecast (den Haan test)",
        (SOLVE_KIND,),
        draw_den_haan,
        needs=lambda data: bool({"den_haan_path", "accuracy_path"} & data.artifact_names),
    ),
    PlotSpec(
        "alm_scatter",
        "ln K' against ln K by aggregate state, with the fitted ALM",
        (SOLVE_KIND,),
        draw_alm_scatter,
        artifacts=("capital_path",),
    ),
    PlotSpec(
        "policy",
        "Individual policy k'(k) by aggregate and employment state",
        (SOLVE_KIND,),
        draw_policy,
        artifacts=("policy",),
    ),
]
