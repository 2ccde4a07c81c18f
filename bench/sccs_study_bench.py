"""Issue 15's two speed goals for a study at the paper's smallest size WITH age and season splines (a script).

* (a) profile-likelihood intervals of 20 exposures: < 5 s on an H100;
* (b) the whole pipeline, 10-fold CV over 10 prior variances + the final fit + 200 bootstrap refits: < 10 s
  (15.4 s without splines when the issue was filed).

Data: person-level, as ``bench/sccs_study_eras.py`` builds it but with the paper's N and J: 115,000 cases observed
300-1,100 days from 2015 (K about 3.7M eras, as the paper's 3.8M), each with one event and about Poisson(1)
more, uniform over its observed days (every true relative incidence is 1), 1.15M exposures of 1,224 drugs
(uniform; drug d has covariateId 999 + d, clear of the splines' ids 100-399), each drug's risk window its
exposure days + 30 (the original one-window spec), age (5 knots at the events' age quantiles) and season
(5 knots) splines: ``kernels.sccs.study.study_eras`` on the host (NumPy, as the ``sccs_eras`` job), then the
interval tables built on the device (as ``sccs_fit`` does).

The model is a study's: a Laplace prior (CV-chosen variance) on the 1,204 other drugs; the 20 exposures of
interest (drugs 1-20) and the spline components unpenalised (SelfControlledCaseSeries does not regularise
the exposures of interest or the splines). The fits use the paper's criterion (relative change of X b below
5e-4); the profile refits to a KKT residual of 1e-8 (``kernels/sccs/profile.py``).

(b) runs ``sccs_fit`` itself (``run_kind`` on in-memory tables: the product's code path, fan-out aside) with
``precondition`` "none" and/or "splines" (``--precondition``; ``kernels/sccs/precondition.py``: the fits in
whitened coordinates of the spline block, every number reported in the original ones). Its seconds are the
job's fit stages (``precondition``, ``engine`` builds, ``cross_validation``, ``fit``, ``bootstrap``) from the
result's timings; the job's own table stages (``tables``, ``to_device``, ``build``) are printed beside them. On
the GPU each setting also prints what its batch engines spent (``engines``: per engine capacity, the batches, the
batch cycles (graph replays) and the seconds of set-up, cycles and finish, from ``BatchEngine.last_timings``).
(a) is ``batched_profile_intervals`` at the variance (b) chose (``--goal a`` alone: 0.1), at a final fit made
apart (``final_fit_seconds``), the new coordinates of the spline block, its engine build and the refit of the
maximum included. Neither goal's seconds include the era build or the table build: both are printed beside them
(``era_build_seconds``: host NumPy; ``table_build_seconds``: on the device), with the totals that do.

Before timing, the same code runs once on tiny data (kernel compiles, CuPy's own kernels, memory pools; a
worker does this at start). Prints ONE line ``RESULT {json}``.

Usage: ``PYTHONPATH=. python3 bench/sccs_study_bench.py [--backend gpu|numpy] [--cases 115000]
[--drugs 1224] [--profiled 20] [--folds 10] [--variances 10] [--replicates 200] [--goal a|b|both]
[--precondition none|splines|both] [--repeats 1]`` (``--precondition-pipeline``, the earlier flag, is
``--precondition both``; ``--repeats N``: the measurement N times in one process, the fastest kept);
on NumPy (a check of the script on small data): ``--backend numpy --cases 2000 --drugs 30 --profiled 4 --folds 3
--variances 3 --replicates 4``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd

from kernels.backend import device_label, is_numpy, synchronize
from kernels.context import local_context, run_kind
from kernels.progress import LocalProgress
from kernels.registry import get_kind
from kernels.sccs import ccd, cv, study
from kernels.sccs.data import IntervalTables, SccsData, build_from_tables
from kernels.sccs.model import Prior
from kernels.sccs.profile import batched_profile_intervals

DAY_2015 = 16_436
FIRST_DRUG_ID = 1000
SEED = 2013
# The sccs_fit stages goal (b) counts; the job's table stages (tables, to_device, build) are printed apart.
FIT_STAGES = ("precondition", "engine", "cross_validation", "fit", "bootstrap")
TABLE_STAGES = ("tables", "to_device", "build")


def person_inputs(n_cases: int, n_drugs: int, seed: int = SEED) -> study.PersonInputs:
    """Cases, events and exposures at day level (see the module docstring)."""
    g = np.random.default_rng(seed)
    n_exposures = 10 * n_cases
    obs_start = DAY_2015 + g.integers(0, 365, n_cases)
    obs_end = obs_start + g.integers(300, 1100, n_cases)
    event_case = np.concatenate([np.arange(n_cases), g.integers(0, n_cases, n_cases)])  # every case has one
    exposure_start = DAY_2015 + g.integers(-100, 1500, n_exposures)
    return study.PersonInputs(
        case_id=np.arange(n_cases),
        observation_start=obs_start,
        observation_end=obs_end,
        event_case=event_case,
        event_day=obs_start[event_case] + g.integers(0, obs_end[event_case] - obs_start[event_case] + 1),
        exposure_case=g.integers(0, n_cases, n_exposures),
        exposure_drug=FIRST_DRUG_ID - 1 + g.integers(1, n_drugs + 1, n_exposures),
        exposure_start=exposure_start,
        exposure_end=exposure_start + g.integers(0, 60, n_exposures),
        age_at_observation_start=g.integers(0, 25_000, n_cases),
    )


def study_tables(n_cases: int, n_drugs: int) -> tuple[IntervalTables, dict[str, float]]:
    """The study's interval tables (host NumPy, as the ``sccs_eras`` job writes them) and the seconds of each step."""
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    inputs = person_inputs(n_cases, n_drugs)
    seconds["person_data_seconds"] = time.perf_counter() - start
    design = study.Design(legacy=study.LegacyWindow(0, 30), age=study.Spline(5), season=study.Spline(5))
    start = time.perf_counter()
    tables = study.study_eras(inputs, design).tables
    seconds["era_build_seconds"] = time.perf_counter() - start
    return tables, seconds


def study_data(xp: ModuleType, tables: IntervalTables) -> tuple[SccsData, float]:
    """The tables built on ``xp``'s device (as ``sccs_fit`` does), and the seconds it took."""
    start = time.perf_counter()
    built = build_from_tables(
        tables.row_id,
        tables.stratum_id,
        tables.time,
        tables.y,
        tables.cov_row_id,
        tables.cov_id,
        tables.cov_value,
        xp=xp,
    )
    synchronize(xp)
    return built.data, time.perf_counter() - start


def fit_frames(tables: IntervalTables) -> dict[str, pd.DataFrame]:
    """The tables as ``sccs_fit``'s datasets."""
    return {
        "outcomes_dataset_id": pd.DataFrame(
            {"rowId": tables.row_id, "stratumId": tables.stratum_id, "time": tables.time, "y": tables.y}
        ),
        "covariates_dataset_id": pd.DataFrame(
            {"rowId": tables.cov_row_id, "covariateId": tables.cov_id, "covariateValue": tables.cov_value}
        ),
    }


def flat_ids(covariate_ids: np.ndarray, profiled_ids: np.ndarray) -> np.ndarray:
    """The covariateIds the study leaves unpenalised: the exposures of interest and the spline components."""
    ids = np.asarray(covariate_ids)
    return ids[np.isin(ids, profiled_ids) | np.isin(ids, np.asarray(study.RESERVED_IDS))]


def study_prior(data: SccsData, profiled_ids: np.ndarray, variance: float) -> Prior:
    """Laplace on the other drugs; the exposures of interest and the spline components flat."""
    return Prior("laplace", variance, ~np.isin(data.covariate_ids, flat_ids(data.covariate_ids, profiled_ids)))


def fit_params(
    tables: IntervalTables,
    profiled_ids: np.ndarray,
    folds: int,
    variances: list[float],
    replicates: int,
    precondition: str,
) -> dict[str, Any]:
    """The ``sccs_fit`` job of goal (b): the study's prior, CV over ``variances``, the bootstrap; no diagnostics."""
    return {
        "outcomes_dataset_id": "outcomes",
        "covariates_dataset_id": "covariates",
        "prior": {"type": "laplace", "variance": 0.1,
                  "exclude": flat_ids(np.unique(tables.cov_id), profiled_ids).tolist()},
        "cross_validation": {"folds": folds, "grid": variances, "seed": SEED},
        "bootstrap": {"replicates": replicates, "seed": SEED},
        "diagnostics": None,
        "precondition": precondition,
    }  # fmt: skip


def _fitter(xp: ModuleType, data: SccsData, prior: Prior, capacity: int) -> ccd.BatchFitter:
    if is_numpy(xp):
        return ccd.numpy_batch_fitter(data, prior, ccd.FitOptions())
    from kernels.sccs import gpu

    return gpu.batch_fitter(data, prior, ccd.FitOptions(), capacity)


def _timed(xp: ModuleType, work: Callable[[], Any]) -> tuple[float, Any]:
    synchronize(xp)
    start = time.perf_counter()
    result = work()
    synchronize(xp)
    return time.perf_counter() - start, result


@contextmanager
def engine_breakdown(xp: ModuleType) -> Iterator[dict[str, dict[str, float]]]:
    """What the GPU batch engines spend while the block runs, per engine capacity: batches, batch cycles (the
    most cycles of a batch's fits: the graph replays) and the seconds of each stage of ``BatchEngine.fit_batch``
    (``last_timings``: set-up, cycles, finish; device-synchronised by the engine itself). Instrumentation only:
    the engine computes as it would."""
    totals: dict[str, dict[str, float]] = {}
    if is_numpy(xp):
        yield totals
        return
    from kernels.sccs import gpu

    original = gpu.BatchEngine.fit_batch

    def fit_batch(engine: Any, variances: np.ndarray, *args: Any, **kwargs: Any) -> list[ccd.FitResult]:
        results = original(engine, variances, *args, **kwargs)
        entry = totals.setdefault(f"capacity_{engine.capacity}", {"batches": 0, "batch_cycles": 0})
        entry["batches"] += 1
        entry["batch_cycles"] += max((fit.iterations for fit in results), default=0)
        for stage, seconds in engine.last_timings.items():
            entry[f"{stage}_seconds"] = entry.get(f"{stage}_seconds", 0.0) + seconds
        return results

    gpu.BatchEngine.fit_batch = fit_batch
    try:
        yield totals
    finally:
        gpu.BatchEngine.fit_batch = original


def pipeline(xp: ModuleType, frames: dict[str, pd.DataFrame], params: dict[str, Any]) -> dict[str, Any]:
    """Goal (b): one ``sccs_fit`` job (CV + final fit + bootstrap), timed by its own stages."""
    progress = LocalProgress()
    with engine_breakdown(xp) as engines:
        wall, result = _timed(
            xp, lambda: run_kind(get_kind("sccs_fit"), params, local_context(xp=xp, datasets=frames, progress=progress))
        )
    timings = result["timings"]
    cv_fits, boot = progress.artifacts["cv_predictive_log_likelihood"], progress.artifacts["bootstrap_estimates"]
    return {
        "precondition": params["precondition"],
        "seconds": sum(timings.get(stage, 0.0) for stage in FIT_STAGES),
        "table_stage_seconds": sum(timings.get(stage, 0.0) for stage in TABLE_STAGES),
        "wall_seconds": wall,
        "stages": {name: value for name, value in timings.items() if name != "total"},
        "engines": engines,
        "chosen_variance": result["variance"],
        "cv_fits": int(cv_fits["iterations"].size),
        "cv_cycles": int(cv_fits["iterations"].sum()),
        "cv_non_converged": int(np.sum(~cv_fits["converged"])),
        "cv_max_gradient_norm": float(cv_fits["gradient_norm"].max()),
        "final_iterations": result["iterations"],
        "final_gradient_norm": result["gradient_norm"],
        "log_posterior": result["log_posterior"],
        "bootstrap_replicates": int(boot["iterations"].size),
        "bootstrap_converged": int(boot["converged"].sum()),
        "bootstrap_cycles": int(boot["iterations"].sum()),
        "bootstrap_max_gradient_norm": float(boot["gradient_norm"].max()),
        "coefficients": result["coefficients"],
    }


def _differences(left: dict[str, Any], right: dict[str, Any]) -> dict[str, float]:
    """The largest differences between two runs' reported coefficients and bootstrap interval ends."""

    def values(run: dict[str, Any], field: str) -> np.ndarray:
        return np.array([c[field] for c in run["coefficients"]], dtype=float)

    return {f"max_abs_{field}_difference": float(np.max(np.abs(values(left, field) - values(right, field))))
            for field in ("estimate", "ci_lower", "ci_upper")}  # fmt: skip


def profile(xp: ModuleType, data: SccsData, prior: Prior, final: ccd.FitResult, columns: list[int]) -> dict[str, Any]:
    """The batched profile intervals of ``columns`` at the final fit, and what its searches spent."""
    ticks = [0]

    def count(finished: int, searches: int) -> None:
        ticks[0] += 1

    seconds, intervals = _timed(
        xp, lambda: batched_profile_intervals(data, prior, final, columns, options=ccd.FitOptions(), progress=count)
    )
    widths = [i.upper - i.lower for i in intervals if i.lower is not None and i.upper is not None]
    return {
        "seconds": seconds,
        "exposures": len(columns),
        "searches": 2 * len(columns),
        "refits": int(sum(i.evaluations for i in intervals)),
        "max_refits_per_interval": int(max((i.evaluations for i in intervals), default=0)),
        "cycle_callbacks": ticks[0],  # GPU: one per cycle of each batch; NumPy: one per cycle of each refit
        "open_ends": int(sum((i.lower is None) + (i.upper is None) for i in intervals)),
        "median_width": float(np.median(widths)) if widths else None,
    }


def run(
    xp: ModuleType,
    n_cases: int,
    n_drugs: int,
    n_profiled: int,
    folds: int,
    n_variances: int,
    replicates: int,
    goal: str = "both",
    preconditions: tuple[str, ...] = ("none", "splines"),
) -> dict[str, Any]:
    """Goal (a), (b) or both on one data set; (b) once per ``preconditions`` setting. (a) profiles at a final fit at
    the variance (b)'s last setting chose (0.1 when (a) runs alone), that fit timed apart (``final_fit_seconds``)."""
    tables, data_seconds = study_tables(n_cases, n_drugs)
    data, data_seconds["table_build_seconds"] = study_data(xp, tables)
    before = data_seconds["era_build_seconds"] + data_seconds["table_build_seconds"]
    profiled_ids = np.arange(FIRST_DRUG_ID, FIRST_DRUG_ID + n_profiled)
    columns = [int(np.flatnonzero(data.covariate_ids == c)[0]) for c in profiled_ids]
    prior = study_prior(data, profiled_ids, 0.1)
    variances = list(cv.DEFAULT_GRID[:: max(1, len(cv.DEFAULT_GRID) // n_variances)][:n_variances])
    result: dict[str, Any] = {
        "device": device_label(xp),
        "N": data.n_cases,
        "J": data.n_covariates,
        "K": data.n_eras,
        "nnz": data.nnz,
        "spline_columns": int(np.isin(data.covariate_ids, np.asarray(study.RESERVED_IDS)).sum()),
        **data_seconds,
        "goals_exclude": "era build (host) and table build (device)",
    }
    variance = prior.variance
    if goal in ("b", "both"):
        frames = fit_frames(tables)
        runs = {}
        for setting in preconditions:
            runs[setting] = pipeline(xp, frames, fit_params(tables, profiled_ids, folds, variances, replicates,
                                                            setting))  # fmt: skip
            result[f"goal_b_{setting}_seconds"] = runs[setting]["seconds"]
            result[f"goal_b_{setting}_with_era_and_table_build_seconds"] = runs[setting]["seconds"] + before
        if {"none", "splines"} <= set(runs):
            result["splines_against_none"] = _differences(runs["splines"], runs["none"])
        variance = runs[preconditions[-1]]["chosen_variance"]
        for run_result in runs.values():
            run_result.pop("coefficients")
        result["pipeline"] = runs
    if goal in ("a", "both"):
        result["final_fit_seconds"], final = _timed(
            xp,
            lambda: _fitter(xp, data, prior.with_variance(variance), 1)(
                np.asarray([variance]), np.ones((1, data.n_cases)), np.zeros((1, data.n_covariates)), None
            )[0],
        )
        profiled = profile(xp, data, prior.with_variance(variance), final, columns)
        result.update(
            goal_a_profile_seconds=profiled["seconds"],
            goal_a_with_era_and_table_build_seconds=profiled["seconds"] + before,
            profile=profiled,
        )
    return result


def _namespace(backend: str) -> ModuleType:
    if backend == "numpy":
        return np
    import cupy

    return cupy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["gpu", "numpy"], default="gpu")
    parser.add_argument("--cases", type=int, default=115_000)
    parser.add_argument("--drugs", type=int, default=1224)
    parser.add_argument("--profiled", type=int, default=20)
    parser.add_argument("--folds", type=int, default=10)
    parser.add_argument("--variances", type=int, default=10)
    parser.add_argument("--replicates", type=int, default=200)
    parser.add_argument(
        "--goal",
        choices=["a", "b", "both"],
        default="both",
        help="a: the profile of the exposures; b: the CV + fit + bootstrap pipeline (sccs_fit)",
    )
    parser.add_argument(
        "--precondition",
        choices=["none", "splines", "both"],
        default="both",
        help="sccs_fit's precondition setting(s) for goal b (both: none, then splines)",
    )
    parser.add_argument("--precondition-pipeline", action="store_true", help="the earlier flag: --precondition both")
    parser.add_argument("--repeats", type=int, default=1, help="measure this many times, keep the fastest")
    args = parser.parse_args()
    setting = "both" if args.precondition_pipeline else args.precondition
    preconditions = ("none", "splines") if setting == "both" else (setting,)
    xp = _namespace(args.backend)
    warm_start = time.perf_counter()
    run(xp, 600, 12, 2, 2, 2, 2, args.goal, preconditions)  # compiles and pools (a worker's warm-up)
    warm_up = time.perf_counter() - warm_start
    # --repeats: the whole measurement again in this process, the fastest kept (the goal's seconds), every
    # repeat's printed: the first large run on a fresh machine also compiles what the tiny warm-up did not reach
    # (CuPy's library kernels for large arrays), seconds a worker pays once and then has in its kernel cache.
    repeats = [
        run(xp, args.cases, args.drugs, args.profiled, args.folds, args.variances, args.replicates, args.goal,
            preconditions)
        for _ in range(args.repeats)
    ]
    goal_key = "goal_a_profile_seconds" if args.goal == "a" else f"goal_b_{preconditions[-1]}_seconds"
    result = min(repeats, key=lambda r: r[goal_key])
    result["repeat_goal_seconds"] = [r[goal_key] for r in repeats]
    if args.goal == "both":
        result["repeat_goal_a_seconds"] = [r["goal_a_profile_seconds"] for r in repeats]
    result["warm_up_seconds"] = warm_up
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
