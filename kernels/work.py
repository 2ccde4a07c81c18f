"""A job's size in one number per kind (issue 16): what an operator's CPU cap (``GPUEST_CPU_MAX_WORK``) is
compared with. Each measure counts the element operations of the kind's dominant loop (its run time grows in
proportion, other settings equal); the units differ between kinds, hence one cap per kind.

- crve_montecarlo: replications x (observations + clusters x bootstrap_reps), the bootstrap term only for
  test = wild_bootstrap (each replication draws G x B weights).
- crve_bootstrap: reps x rows (the dataset's stored rows, or synthetic.n_obs).
- dualcontrol_solve: grid points x quadrature nodes x evaluations per point (scan_points + golden_iterations
  for the optimal policy, 1 otherwise): the cost of one Bellman sweep.
- ks_solve: n_agents x periods: the panel simulated in each outer iteration.
- sccs_fit: covariate rows x fits, fits = 1 + bootstrap replicates + cross-validation folds x grid values.
- sccs_eras: the rows of its three person-level tables.
- sccs_analyses: outcome rows x analyses (the exposures listed, else the covariate rows, which bound them).

A kind without an entry in ``WORK`` is never capped: a new kind adds its measure here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# A cross-validation grid of "auto" searches this many variances (kernels/sccs/cv.py's DEFAULT_GRID).
AUTO_CV_GRID_POINTS = 10


@dataclass(frozen=True)
class Work:
    """A job's work, the formula that gave it (for the message) and the params field to shrink first."""

    units: float
    formula: str
    field: str


DatasetRows = Mapping[str, int]  # params field -> the stored rows of the dataset it names


def _crve_montecarlo(params: Any, _rows: DatasetRows) -> Work:
    observations = sum(params.design_sizes or ()) or params.n_clusters * params.cluster_size
    draws = params.n_clusters * params.bootstrap_reps if params.test == "wild_bootstrap" else 0
    return Work(float(params.replications) * (observations + draws),
                "replications x (observations + clusters x bootstrap_reps)", "params.replications")


def _crve_bootstrap(params: Any, rows: DatasetRows) -> Work:
    n_rows = rows.get("dataset_id") or (params.synthetic.n_obs if params.synthetic is not None else 0)
    return Work(float(params.reps) * n_rows, "reps x rows", "params.reps")


def _dualcontrol(params: Any, _rows: DatasetRows) -> Work:
    grid = params.grid
    points = grid.x.size * grid.mu.size * grid.sigma.size
    evaluations = params.minimizer.scan_points + params.minimizer.golden_iterations if params.policy == "optimal" else 1
    return Work(float(points) * params.quadrature_nodes * evaluations,
                "grid points x quadrature_nodes x evaluations per point (one Bellman sweep)", "params.grid")


def _ks(params: Any, _rows: DatasetRows) -> Work:
    return Work(float(params.n_agents) * params.periods, "n_agents x periods", "params.n_agents")


def _sccs_fit(params: Any, rows: DatasetRows) -> Work:
    fits = 1
    if params.bootstrap is not None:
        fits += params.bootstrap.replicates
    if params.cross_validation is not None:
        grid = params.cross_validation.grid
        fits += params.cross_validation.folds * (AUTO_CV_GRID_POINTS if grid == "auto" else len(grid))
    return Work(float(rows.get("covariates_dataset_id", 0)) * fits, "covariate rows x fits (1 + bootstrap "
                "replicates + folds x grid values)", "params.bootstrap" if params.bootstrap else "params")


def _sccs_analyses(params: Any, rows: DatasetRows) -> Work:
    # every analysis is a one-covariate fit over the outcome's eras; without a list, every covariate is analysed,
    # and the covariate rows bound their number
    analyses = len(params.exposures) if params.exposures is not None else rows.get("covariates_dataset_id", 0)
    return Work(float(rows.get("outcomes_dataset_id", 0)) * analyses, "outcome rows x analyses (exposures, else "
                "covariate rows)", "params.exposures")


def _sccs_eras(_params: Any, rows: DatasetRows) -> Work:
    return Work(float(sum(rows.values())), "rows of the person-level tables", "params")


WORK: dict[str, Callable[[Any, DatasetRows], Work]] = {
    "crve_montecarlo": _crve_montecarlo,
    "crve_bootstrap": _crve_bootstrap,
    "dualcontrol_solve": _dualcontrol,
    "ks_solve": _ks,
    "sccs_fit": _sccs_fit,
    "sccs_eras": _sccs_eras,
    "sccs_analyses": _sccs_analyses,
}


def job_work(kind: str, params: Any, dataset_rows: DatasetRows) -> Work | None:
    """The job's work, or None for a kind without a measure (never capped)."""
    measure = WORK.get(kind)
    return None if measure is None else measure(params, dataset_rows)


def cap_problem(kind: str, params: Any, dataset_rows: DatasetRows, caps: Mapping[str, float]) -> tuple[str, str] | None:
    """(field, message) when the job's work passes its kind's CPU cap; None within it or without a cap."""
    cap = caps.get(kind)
    if not cap or cap <= 0:
        return None
    work = job_work(kind, params, dataset_rows)
    if work is None or work.units <= cap:
        return None
    return work.field, (
        f"{kind} work {work.formula} = {work.units:.3g} exceeds this server's CPU cap of {cap:.3g} for {kind} "
        f"(jobs here run on CPU workers); make the job smaller ({work.field}), run it on a GPU worker, or ask the "
        f'operator to raise the cap: GPUEST_CPU_MAX_WORK=\'{{"{kind}": {work.units:.3g}}}\''
    )
