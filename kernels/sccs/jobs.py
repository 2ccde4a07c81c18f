"""The ``sccs_fit`` job kind: Bayesian self-controlled case series with optional CV and bootstrap."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from kernels.backend import device_label, get_namespace, is_gpu
from kernels.progress import Progress
from kernels.registry import JobKind
from kernels.sccs import bootstrap as boot
from kernels.sccs import ccd
from kernels.sccs import cv as crossval
from kernels.sccs.data import BuiltData, build_from_tables, eras_from_person_data
from kernels.sccs.model import Prior
from kernels.sccs.spec import (
    Coefficient,
    CvPoint,
    SccsErasParams,
    SccsErasResult,
    SccsParams,
    SccsResult,
)
from kernels.timing import StageTimer

# Share of the GPU's free memory a bootstrap batch may take.
_GPU_MEMORY_SHARE = 0.6


def _column(frame: pd.DataFrame, table: str, name: str, integer: bool) -> np.ndarray:
    if name not in frame.columns:
        raise ValueError(f"{table} table lacks column {name!r} (has {list(frame.columns)[:10]})")
    values = frame[name].to_numpy()
    if values.dtype == object or values.dtype.kind not in "iufb":
        raise ValueError(f"{table}.{name} must be numeric, got dtype {values.dtype}")
    if pd.isna(values).any():
        raise ValueError(f"{table}.{name} has missing values")
    if integer:
        if values.dtype.kind == "f":
            if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
                raise ValueError(f"{table}.{name} must hold integers")
            return values.astype(np.int64)
        return values.astype(np.int64)
    return values.astype(np.float64)


def load_tables(outcomes: pd.DataFrame, covariates: pd.DataFrame) -> BuiltData:
    """Validate the uploaded Cyclops tables and build the analysis data on the host."""
    cov_value = (
        _column(covariates, "covariates", "covariateValue", integer=False)
        if "covariateValue" in covariates.columns
        else np.ones(len(covariates))
    )
    return build_from_tables(
        row_id=_column(outcomes, "outcomes", "rowId", integer=True),
        stratum_id=_column(outcomes, "outcomes", "stratumId", integer=True),
        time=_column(outcomes, "outcomes", "time", integer=False),
        y=_column(outcomes, "outcomes", "y", integer=False),
        cov_row_id=_column(covariates, "covariates", "rowId", integer=True),
        cov_id=_column(covariates, "covariates", "covariateId", integer=True),
        cov_value=cov_value,
    )


def _names(frame: pd.DataFrame | None, covariate_ids: np.ndarray) -> list[str | None]:
    if frame is None:
        return [None] * covariate_ids.size
    ids = _column(frame, "names", "covariateId", integer=True)
    if "covariateName" not in frame.columns:
        raise ValueError("names table lacks column 'covariateName'")
    unique, counts = np.unique(ids, return_counts=True)
    if np.any(counts > 1):
        repeated = unique[counts > 1]
        raise ValueError(f"names table lists covariateId {int(repeated[0])} more than once "
                         f"(duplicated ids: {repeated[:10].tolist()})")
    lookup = dict(zip(ids.tolist(), frame["covariateName"].astype(str).tolist(), strict=True))
    return [lookup.get(int(c)) for c in covariate_ids.tolist()]


def _prior(params: SccsParams, covariate_ids: np.ndarray) -> Prior:
    excluded = np.asarray(params.prior.exclude, dtype=np.int64)
    unknown = np.setdiff1d(excluded, covariate_ids)
    if unknown.size:
        raise ValueError(f"prior.exclude names covariateIds absent from the covariates table: {unknown[:10].tolist()}")
    penalised = ~np.isin(covariate_ids, excluded)
    return Prior(params.prior.type, params.prior.variance, penalised)


def _relative_incidence(estimate: float) -> float:
    return math.exp(estimate) if estimate < 700 else math.inf


def run_fit(params: SccsParams, data: Mapping[str, Any], progress: Progress) -> dict[str, Any]:
    if params.cross_validation is not None and params.prior.type == "none":
        raise ValueError("cross_validation needs prior.type normal or laplace (there is no variance to choose)")
    xp = get_namespace()
    gpu = is_gpu(xp)
    timer = StageTimer(xp)
    progress(0.0, "loading tables")
    with timer.stage("build"):
        built = load_tables(data["outcomes_dataset_id"], data["covariates_dataset_id"])
        names = _names(data.get("names_dataset_id"), built.data.covariate_ids)
        prior = _prior(params, built.data.covariate_ids)
        sccs = built.data.to(xp) if gpu else built.data
    options = ccd.FitOptions(params.tolerance, params.max_iterations, params.convergence, params.precision)
    cv_spec, boot_spec = params.cross_validation, params.bootstrap
    variances = cv_spec.variances() if cv_spec is not None else []
    if cv_spec is not None and cv_spec.folds > sccs.n_cases:
        raise ValueError(f"cross_validation.folds={cv_spec.folds} exceeds the {sccs.n_cases} cases with events")
    cv_fits = cv_spec.folds * len(variances) if cv_spec else 0
    total_fits = cv_fits + 1 + (boot_spec.replicates if boot_spec else 0)

    def reporter(stage: str, before: int) -> ccd.CycleCallback:
        """Progress after every CCD cycle of every batch (the cancel point: progress may raise)."""

        def report(finished: int, cycle: int) -> None:
            done = before + finished
            progress(min(done / total_fits, 0.99), f"{stage}: {done}/{total_fits} fits done, cycle {cycle}")

        return report

    def fitter(capacity: int) -> ccd.BatchFitter:
        if gpu:
            from kernels.sccs import cuda

            return cuda.batch_fitter(sccs, prior, options, capacity)
        return ccd.numpy_batch_fitter(sccs, prior, options)

    cv_result = None
    variance = params.prior.variance
    if cv_spec is not None:
        with timer.stage("cross_validation"):
            cv_result = crossval.cross_validate(sccs, fitter(cv_spec.folds), variances, cv_spec.folds, cv_spec.seed,
                                                reporter("cross-validation", 0))
        variance = cv_result.chosen_variance
        progress.save_artifact("cv_predictive_log_likelihood", {
            "variance": cv_result.variances, "fold_log_likelihood": cv_result.fold_loglik,
            "iterations": cv_result.iterations, "converged": cv_result.converged,
            "gradient_norm": cv_result.gradient_norm, "coefficients": cv_result.coefficients,
            "covariate_id": sccs.covariate_ids,
        })
    final_prior = prior.with_variance(variance) if prior.kind != "none" else prior
    with timer.stage("fit"):
        result = fitter(1)(np.asarray([variance]), np.ones((1, sccs.n_cases)), np.zeros((1, sccs.n_covariates)),
                           reporter("fit", cv_fits))[0]

    boot_result = None
    if boot_spec is not None:
        chunk = 10
        if gpu:
            from kernels.sccs import cuda

            free_bytes = xp.cuda.Device().mem_info[0]
            chunk = cuda.capacity_for(sccs, params.precision, boot_spec.replicates,
                                      int(free_bytes * _GPU_MEMORY_SHARE))
        with timer.stage("bootstrap"):
            boot_result = boot.bootstrap(xp, sccs.n_cases, fitter(chunk), variance, result.beta,
                                         boot_spec.replicates, boot_spec.seed, chunk,
                                         reporter("bootstrap", cv_fits + 1))
        progress.save_artifact("bootstrap_estimates", {
            "covariate_id": sccs.covariate_ids, "estimates": boot_result.estimates,
            "iterations": boot_result.iterations, "converged": boot_result.converged,
            "gradient_norm": boot_result.gradient_norm,
        })
    progress.save_artifact("coefficients", pd.DataFrame({
        "covariateId": sccs.covariate_ids, "estimate": result.beta,
    }))

    coefficients = []
    for j, covariate_id in enumerate(sccs.covariate_ids.tolist()):
        estimate = float(result.beta[j])
        coefficients.append(Coefficient(
            covariate_id=int(covariate_id),
            name=names[j],
            estimate=estimate,
            relative_incidence=_relative_incidence(estimate),
            ci_lower=float(boot_result.ci_lower[j]) if boot_result else None,
            ci_upper=float(boot_result.ci_upper[j]) if boot_result else None,
            nonzero_share=float(boot_result.nonzero_share[j]) if boot_result and prior.kind == "laplace" else None,
        ))
    cv_curve = None
    if cv_result is not None:
        cv_curve = [
            CvPoint(variance=float(v), predictive_log_likelihood=float(cv_result.mean_loglik[i]),
                    fold_predictive_log_likelihood=cv_result.fold_loglik[:, i].tolist(),
                    fold_iterations=cv_result.iterations[:, i].tolist(),
                    non_converged_folds=int(np.sum(~cv_result.converged[:, i])))
            for i, v in enumerate(cv_result.variances.tolist())
        ]
    progress(1.0, "done")
    return SccsResult(
        coefficients=coefficients,
        log_likelihood=result.log_likelihood,
        log_posterior=result.log_posterior,
        variance=None if prior.kind == "none" else float(variance),
        cv_curve=cv_curve,
        iterations=result.iterations,
        converged=result.converged,
        gradient_norm=result.gradient_norm,
        convergence_criterion=result.criterion,
        prior_type=final_prior.kind,
        precision=params.precision,
        n_cases=sccs.n_cases,
        n_eras=sccs.n_eras,
        n_covariates=sccs.n_covariates,
        nonzero_coefficients=int(np.count_nonzero(result.beta)),
        dropped_cases=built.dropped_cases,
        cv_folds=cv_spec.folds if cv_spec else None,
        cv_seed=cv_spec.seed if cv_spec else None,
        bootstrap_replicates=boot_spec.replicates if boot_spec else None,
        bootstrap_seed=boot_spec.seed if boot_spec else None,
        bootstrap_converged=int(boot_result.converged.sum()) if boot_result else None,
        device=device_label(xp),
        timings=timer.as_dict(),
    ).model_dump(mode="json")


def _day_column(frame: pd.DataFrame, table: str, name: str) -> np.ndarray:
    """Integer days; dates (datetime64) become days since 1970-01-01."""
    if name in frame.columns and pd.api.types.is_datetime64_any_dtype(frame[name]):
        if frame[name].isna().any():
            raise ValueError(f"{table}.{name} has missing values")
        return frame[name].to_numpy().astype("datetime64[D]").astype(np.int64)
    return _column(frame, table, name, integer=True)


def run_eras(params: SccsErasParams, data: Mapping[str, Any], progress: Progress) -> dict[str, Any]:
    timer = StageTimer(np)
    progress(0.0, "building eras")
    cases, events, exposures = (data["cases_dataset_id"], data["events_dataset_id"], data["exposures_dataset_id"])
    with timer.stage("eras"):
        obs_start = _day_column(cases, "cases", "observationStart")
        obs_end = _day_column(cases, "cases", "observationEnd")
        case_id = _column(cases, "cases", "caseId", integer=True)
        event_case = _column(events, "events", "caseId", integer=True)
        event_day = _day_column(events, "events", "day")
        tables = eras_from_person_data(
            case_id, obs_start, obs_end, event_case, event_day,
            _column(exposures, "exposures", "caseId", integer=True),
            _column(exposures, "exposures", "drugId", integer=True),
            _day_column(exposures, "exposures", "start"), _day_column(exposures, "exposures", "end"),
            params.risk_window_start, params.risk_window_end, params.end_anchor, params.start_anchor,
        )
    position = pd.Series(np.arange(case_id.size), index=case_id)
    owner = position.loc[event_case].to_numpy() if event_case.size else np.zeros(0, dtype=np.int64)
    inside = int(np.sum((event_day >= obs_start[owner]) & (event_day <= obs_end[owner])))
    progress.save_artifact("outcomes", pd.DataFrame({
        "rowId": tables.row_id, "stratumId": tables.stratum_id, "time": tables.time, "y": tables.y.astype(np.int64),
    }))
    progress.save_artifact("covariates", pd.DataFrame({
        "rowId": tables.cov_row_id, "covariateId": tables.cov_id, "covariateValue": tables.cov_value,
    }))
    events_per_case = np.bincount(np.unique(tables.stratum_id, return_inverse=True)[1], weights=tables.y)
    progress(1.0, "done")
    return SccsErasResult(
        n_cases=int(case_id.size),
        n_cases_with_events=int(np.sum(events_per_case > 0)),
        n_eras=int(tables.row_id.size),
        n_covariate_rows=int(tables.cov_row_id.size),
        n_drugs=int(np.unique(tables.cov_id).size),
        events_in_observation=inside,
        events_outside_observation=int(event_case.size - inside),
        device="cpu",
        timings=timer.as_dict(),
    ).model_dump(mode="json")


KINDS = [
    JobKind(
        name="sccs_fit",
        params_model=SccsParams,
        run=run_fit,
        dataset_fields=("outcomes_dataset_id", "covariates_dataset_id", "names_dataset_id"),
        summary="Bayesian self-controlled case series (Cyclops tables): CCD MAP fit, CV of the prior variance, "
        "bootstrap intervals",
        example={
            "outcomes_dataset_id": "<outcomes dataset id>",
            "covariates_dataset_id": "<covariates dataset id>",
            "prior": {"type": "laplace", "variance": 0.1, "exclude": []},
            "cross_validation": {"folds": 10, "grid": "auto"},
            "bootstrap": {"replicates": 200},
        },
    ),
    JobKind(
        name="sccs_eras",
        params_model=SccsErasParams,
        run=run_eras,
        dataset_fields=("cases_dataset_id", "events_dataset_id", "exposures_dataset_id"),
        summary="Person-level observation periods, events and exposures → the SCCS interval tables "
        "(outcomes, covariates) as artifacts, ready for sccs_fit",
        example={
            "cases_dataset_id": "<cases dataset id>",
            "events_dataset_id": "<events dataset id>",
            "exposures_dataset_id": "<exposures dataset id>",
            "risk_window_start": 1,
            "start_anchor": "exposure_start",
            "risk_window_end": 30,
            "end_anchor": "exposure_start",
        },
    ),
]
