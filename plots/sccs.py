"""SCCS plots: a forest plot of relative incidences with their intervals, the cross-validation curve of the
predictive log-likelihood over the prior variance, the bootstrap distributions of the relative incidences and
the profile likelihoods behind the profile intervals. Read from the result JSON (``coefficients``, ``cv_curve``,
``variance``) and the ``bootstrap_estimates`` and ``profile_curves`` artifacts only."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from kernels.sccs import FIT_KIND
from plots.registry import JobData, PlotDataMissingError, PlotSpec

POINT_COLOUR, INTERVAL_COLOUR, CHOSEN_COLOUR = "#1f4e79", "#5b7db1", "#c0392b"
MAX_BOOTSTRAP_COVARIATES = 30  # the most boxes one plot holds readably
MAX_PROFILE_PANELS, PROFILE_COLUMNS = 12, 3  # small multiples: the first profiled covariates, three a row


def _interval(row: dict[str, Any]) -> tuple[float, float] | None:
    """The row's relative-incidence interval: the bootstrap one, else the profile-likelihood one."""
    for low, high in (
        ("relative_incidence_ci_lower", "relative_incidence_ci_upper"),
        ("relative_incidence_profile_ci_lower", "relative_incidence_profile_ci_upper"),
    ):
        if row.get(low) is not None and row.get(high) is not None:
            return float(row[low]), float(row[high])
    return None


def _label(row: dict[str, Any]) -> str:
    return str(row.get("name") or f"covariate {row.get('covariate_id')}")


def draw_forest(figure: Figure, data: JobData) -> None:
    rows = list(data.result.get("coefficients") or [])
    if not rows:
        raise PlotDataMissingError("the result has no coefficients")
    figure.set_size_inches(7.5, max(3.0, 0.9 + 0.24 * len(rows)))
    ax = figure.subplots()
    positions = np.arange(len(rows))[::-1]  # the first covariate on top
    for position, row in zip(positions, rows, strict=True):
        interval = _interval(row)
        if interval is not None:
            ax.plot(interval, [position, position], color=INTERVAL_COLOUR, linewidth=2)
    estimates = [float(row["relative_incidence"]) for row in rows]
    ax.plot(estimates, positions, "s", color=POINT_COLOUR, markersize=5, label="relative incidence (MAP)")
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1, label="no effect (RI = 1)")
    ax.set_xscale("log")
    ax.set_yticks(positions, [_label(row) for row in rows], fontsize=8)
    ax.set_ylim(-0.8, len(rows) - 0.2)
    ax.set_xlabel("relative incidence (ratio, log scale) with 95 % interval")
    ax.set_title("Relative incidence by covariate")
    ax.legend(loc="lower right", fontsize=8, frameon=False)


def draw_cv_curve(figure: Figure, data: JobData) -> None:
    points = sorted(data.result.get("cv_curve") or [], key=lambda point: point["variance"])
    if not points:
        raise PlotDataMissingError("the result has no CV curve")
    ax = figure.subplots()
    variance = np.array([point["variance"] for point in points], dtype=float)
    folds = np.array([point["fold_predictive_log_likelihood"] for point in points], dtype=float)
    for fold in range(folds.shape[1]):
        ax.plot(
            variance,
            folds[:, fold],
            color=INTERVAL_COLOUR,
            alpha=0.35,
            linewidth=1,
            label="each fold" if fold == 0 else None,
        )
    ax.plot(
        variance,
        [point["predictive_log_likelihood"] for point in points],
        "o-",
        color=POINT_COLOUR,
        label="mean over folds",
    )
    chosen = data.result.get("variance")
    if chosen is not None:
        ax.axvline(float(chosen), color=CHOSEN_COLOUR, linestyle="--", label=f"chosen variance {float(chosen):.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("prior variance (coefficient units squared, log scale)")
    ax.set_ylabel("held-out predictive log-likelihood (nats)")
    ax.set_title(f"Cross-validation of the prior variance ({folds.shape[1]} folds)")
    ax.legend(loc="best", fontsize=8, frameon=False)


def draw_bootstrap(figure: Figure, data: JobData) -> None:
    stored = data.artifact("bootstrap_estimates")
    estimates = np.asarray(stored["estimates"], dtype=float)
    ids = [int(value) for value in np.asarray(stored["covariate_id"])]
    names = {int(row["covariate_id"]): _label(row) for row in data.result.get("coefficients") or []}
    # The covariates whose draws move most first, so the plot shows what the bootstrap is about.
    order = np.argsort(-np.nanstd(estimates, axis=0), kind="stable")[:MAX_BOOTSTRAP_COVARIATES]
    order = np.sort(order)
    figure.set_size_inches(7.5, max(3.0, 0.9 + 0.24 * order.size))
    ax = figure.subplots()
    relative = np.exp(estimates[:, order])
    ax.boxplot(
        [column[np.isfinite(column)] for column in relative.T],
        orientation="horizontal",
        widths=0.6,
        tick_labels=[names.get(ids[index], f"covariate {ids[index]}") for index in order],
    )
    ax.invert_yaxis()
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel("bootstrap relative incidence (ratio, log scale)")
    ax.set_title(f"Bootstrap distributions ({estimates.shape[0]} replicates)")


def draw_profiles(figure: Figure, data: JobData) -> None:
    curves = data.artifact("profile_curves")
    covariate = np.asarray(curves["covariateId"], dtype=np.int64)
    b = np.asarray(curves["logRelativeIncidence"], dtype=float)
    deviance = np.asarray(curves["deviance"], dtype=float)
    critical = float(np.asarray(curves["criticalDeviance"], dtype=float)[0])
    ids = list(dict.fromkeys(covariate.tolist()))[:MAX_PROFILE_PANELS]  # in the order the job profiled them
    rows = {int(row["covariate_id"]): row for row in data.result.get("coefficients") or []}
    columns = min(PROFILE_COLUMNS, len(ids))
    n_rows = -(-len(ids) // columns)
    figure.set_size_inches(3.4 * columns, 0.6 + 2.6 * n_rows)
    axes = np.atleast_1d(figure.subplots(n_rows, columns, squeeze=False)).ravel()
    for ax, covariate_id in zip(axes, ids, strict=False):
        mine = covariate == covariate_id
        # on the log scale of the coefficient, where a profile is near a parabola and its ends read directly
        ax.plot(b[mine], deviance[mine], "o-", color=POINT_COLOUR, markersize=3, linewidth=1)
        ax.axhline(critical, color=CHOSEN_COLOUR, linestyle="--", linewidth=1)
        row = rows.get(covariate_id, {})
        for end in ("profile_ci_lower", "profile_ci_upper"):
            if row.get(end) is not None:
                ax.axvline(float(row[end]), color=INTERVAL_COLOUR, linewidth=1)
        ax.set_title(_label(row) if row else f"covariate {covariate_id}", fontsize=9)
        ax.set_xlabel("log relative incidence b", fontsize=8)
        ax.set_ylabel("deviance 2 (p(b̂) − p(b))", fontsize=8)
    for ax in axes[len(ids):]:
        ax.set_visible(False)
    figure.suptitle(f"Profile log posteriors: the interval is where the deviance is below {critical:.2f} (dashed)",
                    fontsize=10)


PLOTS = [
    PlotSpec(
        "forest",
        "Forest plot of relative incidences with intervals",
        (FIT_KIND,),
        draw_forest,
        needs=lambda data: bool(data.result.get("coefficients")),
    ),
    PlotSpec(
        "cv_curve",
        "Predictive log-likelihood over the prior variance (cross-validation)",
        (FIT_KIND,),
        draw_cv_curve,
        needs=lambda data: bool(data.result.get("cv_curve")),
    ),
    PlotSpec(
        "bootstrap",
        "Bootstrap distributions of the relative incidences",
        (FIT_KIND,),
        draw_bootstrap,
        artifacts=("bootstrap_estimates",),
    ),
    PlotSpec(
        "profile",
        "Profile likelihoods behind the profile intervals",
        (FIT_KIND,),
        draw_profiles,
        artifacts=("profile_curves",),
    ),
]
