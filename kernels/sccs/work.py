"""The SCCS kinds' work measures (``JobKind.work``, capped by ``GPUEST_CPU_MAX_WORK``).

- sccs_fit: covariate rows x fits x max_iterations (each fit's CCD cycles, at their cap, pass over every
  covariate row), fits = 1 + bootstrap replicates + cross-validation folds x grid values.
- sccs_eras: the rows of its three person-level tables.
- sccs_analyses: outcome rows x analyses (the exposures listed, else the covariate rows, which bound them).

Memory, every kind: the rows of its tables times the bytes a row and its per-row temporaries take.
"""

from __future__ import annotations

from kernels.registry import DatasetRows, Work
from kernels.sccs.spec import SccsAnalysesParams, SccsErasParams, SccsParams

# A cross-validation grid of "auto" searches this many variances (kernels/sccs/cv.py's DEFAULT_GRID).
AUTO_CV_GRID_POINTS = 10
# Bytes per table row: its columns, the eras made from it and the fit's per-row arrays.
BYTES_PER_ROW = 512


def _table_bytes(rows: DatasetRows) -> tuple[float, str]:
    return float(sum(rows.values())) * BYTES_PER_ROW, f"rows of the tables x {BYTES_PER_ROW} bytes"


def fit_work(params: SccsParams, rows: DatasetRows) -> Work:
    fits = 1
    if params.bootstrap is not None:
        fits += params.bootstrap.replicates
    if params.cross_validation is not None:
        grid = params.cross_validation.grid
        fits += params.cross_validation.folds * (AUTO_CV_GRID_POINTS if grid == "auto" else len(grid))
    return Work(float(rows.get("covariates_dataset_id", 0)) * fits * params.max_iterations, "covariate rows x fits "
                "(1 + bootstrap replicates + folds x grid values) x max_iterations",
                "params.bootstrap" if params.bootstrap else "params.max_iterations",
                *_table_bytes(rows), "params.covariates_dataset_id")


def analyses_work(params: SccsAnalysesParams, rows: DatasetRows) -> Work:
    # every analysis is a one-covariate fit over the outcome's eras; without a list, every covariate is analysed,
    # and the covariate rows bound their number
    analyses = len(params.exposures) if params.exposures is not None else rows.get("covariates_dataset_id", 0)
    return Work(float(rows.get("outcomes_dataset_id", 0)) * analyses, "outcome rows x analyses (exposures, else "
                "covariate rows)", "params.exposures", *_table_bytes(rows), "params.outcomes_dataset_id")


def eras_work(_params: SccsErasParams, rows: DatasetRows) -> Work:
    return Work(float(sum(rows.values())), "rows of the person-level tables", "params", *_table_bytes(rows), "params")
