"""CRVE plots: the wild bootstrap's distribution of t* (or Wald*) against the observed statistic, and the
Monte Carlo's rejection rates against the nominal levels. Read from the result JSON (``t_stat``,
``wald_stat``, ``p_value``, ``conf_int``...) and the ``bootstrap_t`` artifact only."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from kernels.crve import BOOTSTRAP_KIND, MONTECARLO_KIND
from plots.registry import JobData, PlotDataMissingError, PlotSpec

# Two-sided 95 % normal quantile: the Monte Carlo error bars are rate +- this many standard errors.
MC_Z = 1.959963984540054
OBSERVED_COLOUR, REGION_COLOUR, DRAW_COLOUR = "#c0392b", "#e67e22", "#5b7db1"


def _in_p_value_region(draws: np.ndarray, observed: float, p_val_type: str) -> np.ndarray:
    """The draws at least as extreme as the observed statistic, in the sense the reported p-value counts."""
    if p_val_type == "wald":
        return draws >= observed
    if p_val_type == ">":
        return draws >= observed
    if p_val_type == "<":
        return draws <= observed
    if p_val_type == "equal-tailed":  # the tail on the observed side (the p-value doubles its share)
        return draws >= observed if observed >= 0 else draws <= observed
    return np.abs(draws) >= abs(observed)  # two-tailed


def _statistic(result: dict[str, Any]) -> tuple[float, str]:
    test = result.get("test")
    value = result.get("t_stat") if test == "t" else result.get("wald_stat")
    if value is None:
        raise PlotDataMissingError("the result has no observed statistic to compare the draws with")
    return float(value), ("t" if test == "t" else "Wald")


def _draw_histogram(ax: Axes, draws: np.ndarray, observed: float, label: str, data: JobData) -> None:
    result = data.result
    p_val_type = str(result.get("p_val_type", "two-tailed"))
    finite = draws[np.isfinite(draws)]
    bins = np.histogram_bin_edges(np.concatenate([finite, [observed]]), bins=min(80, max(10, finite.size // 40)))
    region = _in_p_value_region(finite, observed, p_val_type)
    ax.hist(finite[~region], bins=bins, color=DRAW_COLOUR, alpha=0.85, label=f"bootstrap {label}* ({finite.size:,})")
    ax.hist(
        finite[region],
        bins=bins,
        color=REGION_COLOUR,
        alpha=0.9,
        label=f"p-value region ({p_val_type}): p = {float(result.get('p_value') or 0):.4f}",
    )
    ax.axvline(observed, color=OBSERVED_COLOUR, linewidth=2, label=f"observed {label} = {observed:.3f}")
    if p_val_type == "two-tailed":
        ax.axvline(-observed, color=OBSERVED_COLOUR, linewidth=1, linestyle="--")
    ax.set_xlabel(f"{label} statistic (standard errors)" if label == "t" else "Wald statistic (chi-square scale)")
    ax.set_ylabel("bootstrap draws (count)")
    ax.set_title(f"Wild bootstrap distribution of {label}*, {' and '.join(result.get('hypothesis') or [])}")
    ax.legend(loc="upper left", fontsize=8, frameon=False)


def _draw_intervals(ax: Axes, data: JobData) -> None:
    result = data.result
    estimate = result.get("estimate")
    rows = [
        (name, result.get(field))
        for name, field in (("bootstrap CI", "conf_int"), ("analytic CI", "conf_int_analytic"))
    ]
    rows = [(name, interval) for name, interval in rows if interval]
    level = 100 * (1 - float(result.get("sign_level") or 0.05))
    for position, (_, (low, high)) in enumerate(rows):
        ax.plot([low, high], [position, position], color=DRAW_COLOUR, linewidth=3, solid_capstyle="butt")
        ax.plot([low, high], [position, position], "|", color=DRAW_COLOUR, markersize=14)
    if estimate is not None:
        ax.plot([estimate] * len(rows), range(len(rows)), "o", color=OBSERVED_COLOUR, label=f"estimate {estimate:.4g}")
    ax.axvline(float(result.get("r") or 0.0), color="grey", linestyle=":", label="null value r")
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel(f"coefficient of {result.get('param', '')} (units of y per unit)")
    ax.set_title(f"{level:g} % confidence intervals")
    ax.legend(loc="upper center", fontsize=8, frameon=False)


def draw_bootstrap(figure: Figure, data: JobData) -> None:
    draws = np.asarray(data.artifact("bootstrap_t"), dtype=float).ravel()
    observed, label = _statistic(dict(data.result))
    has_interval = bool(data.result.get("conf_int") or data.result.get("conf_int_analytic"))
    if has_interval:
        figure.set_size_inches(11, 4.2)
        left, right = figure.subplots(1, 2, width_ratios=[2, 1])
        _draw_histogram(left, draws, observed, label, data)
        _draw_intervals(right, data)
    else:
        _draw_histogram(figure.subplots(), draws, observed, label, data)


def draw_rejection_rates(figure: Figure, data: JobData) -> None:
    result = data.result
    rates: dict[str, float] = dict(result.get("rejection_rate") or {})
    errors: dict[str, float] = dict(result.get("rejection_rate_se") or {})
    if not rates:
        raise PlotDataMissingError("the result has no rejection rates")
    levels = sorted(rates, key=float)
    nominal = np.array([float(level) for level in levels]) * 100
    observed = np.array([rates[level] for level in levels], dtype=float) * 100
    half_width = np.array([errors.get(level, 0.0) for level in levels], dtype=float) * 100 * MC_Z
    ax = figure.subplots()
    top = max(float(nominal.max()), float((observed + half_width).max())) * 1.15
    ax.plot([0, top], [0, top], color="grey", linestyle="--", label="nominal level (size-correct test)")
    ax.errorbar(
        nominal,
        observed,
        yerr=half_width,
        fmt="o",
        color=DRAW_COLOUR,
        capsize=5,
        label=f"rejection rate ± {MC_Z:.2f} MC s.e. ({result.get('replications', '?')} replications)",
    )
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("nominal level (%)")
    ax.set_ylabel("rejection rate (%)")
    test = str(result.get("test", "")).replace("_", " ")
    ax.set_title(
        f"Monte Carlo size of the {test} test: G = {result.get('n_clusters')} clusters of {result.get('cluster_size')}"
    )
    ax.legend(loc="upper left", fontsize=8, frameon=False)


def _single_statistic(data: JobData) -> bool:
    # A family of restrictions stores a B x S matrix of draws: no one observed statistic to set against it.
    return data.result.get("test") in ("t", "wald")


PLOTS = [
    PlotSpec(
        "bootstrap_t",
        "Bootstrap distribution with the observed statistic, p-value region and intervals",
        (BOOTSTRAP_KIND,),
        draw_bootstrap,
        artifacts=("bootstrap_t",),
        needs=_single_statistic,
    ),
    PlotSpec(
        "rejection_rates",
        "Rejection rates with Monte Carlo error bars against the nominal levels",
        (MONTECARLO_KIND,),
        draw_rejection_rates,
        needs=lambda data: bool(data.result.get("rejection_rate")),
    ),
]
