"""The ``sccs_fit`` job: the fits of its plan (``kernels/sccs/fit_plan.py``), then the optional profile
intervals, diagnostics and empirical calibration, gathered into its result; and the GPU warm-up that runs tiny
``sccs_fit`` jobs at worker start."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from kernels import cuda
from kernels.backend import get_namespace
from kernels.context import RunContext, local_context
from kernels.sccs import bootstrap as boot
from kernels.sccs import ccd, transfer
from kernels.sccs import cv as crossval
from kernels.sccs.examples import cyclops_frames
from kernels.sccs.fit_diagnostics import sccs_diagnostics
from kernels.sccs.fit_plan import FitInputs, FitPlan, final_fit, fit_bootstrap, fit_cross_validation, load_inputs
from kernels.sccs.fit_profiles import profile_intervals
from kernels.sccs.profile import ProfileInterval
from kernels.sccs.result_fields import (
    calibrate_estimates,
    calibrated_fields,
    calibration_summary,
    relative_incidence,
    relative_incidence_or_none,
)
from kernels.sccs.spec import Coefficient, CvPoint, SccsDiagnostics, SccsParams, SccsResult


def _profiled_se(interval: ProfileInterval, z: float) -> float:
    """The standard error a profile interval implies, (upper - lower) / (2 z) as EmpiricalCalibration's hint;
    infinite for an open interval (such an estimate is left out of the null and not calibrated)."""
    if interval.lower is None or interval.upper is None:
        return math.inf
    return (interval.upper - interval.lower) / (2.0 * z)


def _calibrated(params: SccsParams, fitted: SccsResult, profiles: dict[int, ProfileInterval] | None) -> SccsResult:
    """Empirical calibration (kernels/sccs/calibration.py) of every profiled coefficient from the controls'
    profile estimates and the standard errors their intervals imply."""
    spec, level = params.calibration, params.profile.level if params.profile else 0.95
    assert spec is not None and profiles is not None
    z = float(stats.norm.ppf((1.0 + level) / 2.0))
    column_of = {c.covariate_id: j for j, c in enumerate(fitted.coefficients)}
    positives = {control.covariate_id: math.log(control.true_relative_risk) for control in spec.positive_controls}
    for field, ids in (("negative_controls", spec.negative_controls), ("positive_controls", list(positives))):
        unknown = [covariate for covariate in ids if covariate not in column_of]
        if unknown:
            raise ValueError(f"calibration.{field}: covariateId {unknown[0]} is not a covariate of the fit")
    profiled = sorted(covariate for covariate, j in column_of.items() if j in profiles)
    x = np.array([profiles[column_of[c]].estimate for c in profiled])
    s = np.array([_profiled_se(profiles[column_of[c]], z) for c in profiled])
    result = calibrate_estimates(x, s, np.isin(profiled, spec.negative_controls),
                                 np.array([positives.get(c, math.nan) for c in profiled]), level)
    coefficients = list(fitted.coefficients)
    for covariate, update in zip(profiled, calibrated_fields(result), strict=True):
        coefficients[column_of[covariate]] = coefficients[column_of[covariate]].model_copy(update=update)
    return fitted.model_copy(update={"coefficients": coefficients, "calibration": calibration_summary(result, level)})


def _coefficients(inputs: FitInputs, beta: np.ndarray, boot_result: boot.BootstrapResult | None,
                  profiles: dict[int, ProfileInterval] | None = None) -> list[Coefficient]:
    laplace = inputs.prior.kind == "laplace"
    profiles = profiles or {}
    coefficients = []
    for j, covariate_id in enumerate(inputs.data.covariate_ids.tolist()):
        estimate = float(beta[j])
        profiled = profiles.get(j)
        coefficients.append(Coefficient(
            covariate_id=int(covariate_id),
            name=inputs.names[j],
            estimate=estimate,
            relative_incidence=relative_incidence(estimate),
            ci_lower=float(boot_result.ci_lower[j]) if boot_result else None,
            ci_upper=float(boot_result.ci_upper[j]) if boot_result else None,
            relative_incidence_ci_lower=relative_incidence(float(boot_result.ci_lower[j])) if boot_result else None,
            relative_incidence_ci_upper=relative_incidence(float(boot_result.ci_upper[j])) if boot_result else None,
            nonzero_share=float(boot_result.nonzero_share[j]) if boot_result and laplace else None,
            profile_ci_lower=profiled.lower if profiled else None,
            profile_ci_upper=profiled.upper if profiled else None,
            relative_incidence_profile_ci_lower=relative_incidence_or_none(profiled.lower) if profiled else None,
            relative_incidence_profile_ci_upper=relative_incidence_or_none(profiled.upper) if profiled else None,
        ))
    return coefficients


def _cv_curve(cv_result: crossval.CvResult) -> list[CvPoint]:
    return [
        CvPoint(variance=float(v), predictive_log_likelihood=float(cv_result.mean_loglik[i]),
                fold_predictive_log_likelihood=cv_result.fold_loglik[:, i].tolist(),
                fold_iterations=cv_result.iterations[:, i].tolist(),
                non_converged_folds=int(np.sum(~cv_result.converged[:, i])))
        for i, v in enumerate(cv_result.variances.tolist())
    ]


def _fit_result(
    params: SccsParams, inputs: FitInputs, variance: float, result: ccd.FitResult,
    cv_result: crossval.CvResult | None, boot_result: boot.BootstrapResult | None,
    profiles: dict[int, ProfileInterval] | None = None, diagnostics: SccsDiagnostics | None = None,
) -> SccsResult:
    data, prior = inputs.data, inputs.prior
    cv_spec, boot_spec = params.cross_validation, params.bootstrap
    return SccsResult(
        coefficients=_coefficients(inputs, result.beta, boot_result, profiles),
        log_likelihood=result.log_likelihood,
        log_posterior=result.log_posterior,
        variance=None if prior.kind == "none" else float(variance),
        cv_curve=_cv_curve(cv_result) if cv_result is not None else None,
        iterations=result.iterations,
        converged=result.converged,
        gradient_norm=result.gradient_norm,
        convergence_criterion=result.criterion,
        prior_type=prior.kind,
        precision=params.precision,
        n_cases=data.n_cases,
        n_eras=data.n_eras,
        n_covariates=data.n_covariates,
        nonzero_coefficients=int(np.count_nonzero(result.beta)),
        dropped_cases=inputs.built.dropped_cases,
        cv_folds=cv_spec.folds if cv_spec else None,
        cv_seed=cv_spec.seed if cv_spec else None,
        bootstrap_replicates=boot_spec.replicates if boot_spec else None,
        bootstrap_seed=boot_spec.seed if boot_spec else None,
        bootstrap_converged=int(boot_result.converged.sum()) if boot_result else None,
        diagnostics=diagnostics,
    )


@dataclass(frozen=True)
class ComputedFits:
    """Fits of an ``sccs_fit`` run computed before it, by a fanned-out job's chunks and lead
    (``kernels/sccs/chunks.py``): the run takes them as they are instead of fitting them again."""

    cross_validation: crossval.CvResult | None = None
    final_fit: ccd.FitResult | None = None
    bootstrap: boot.BootstrapResult | None = None


def run_fit(params: SccsParams, ctx: RunContext, computed: ComputedFits | None = None) -> SccsResult:
    """The ``sccs_fit`` job: CV of the prior variance (optional), the MAP fit, the case bootstrap (optional)."""
    if params.cross_validation is not None and params.prior.type == "none":
        raise ValueError("cross_validation needs prior.type normal or laplace (there is no variance to choose)")
    ctx.progress(0.0, "loading tables")
    inputs = load_inputs(params, ctx)
    plan = FitPlan(params, ctx, inputs)
    computed = computed or ComputedFits()
    cv_result = None
    variance = params.prior.variance
    if params.cross_validation is not None:
        cv_result = fit_cross_validation(plan, params.cross_validation, computed.cross_validation)
        variance = cv_result.chosen_variance
    result = computed.final_fit or final_fit(plan, variance)
    boot_result = None
    if params.bootstrap is not None:
        boot_result = fit_bootstrap(plan, params.bootstrap, variance, result.beta, computed.bootstrap)
    profiles = None
    if params.profile is not None:
        with ctx.stage("profile"):
            profiles = profile_intervals(params, inputs, result, variance, ctx)
    diagnostics = sccs_diagnostics(params, inputs, result, variance, ctx) if params.diagnostics is not None else None
    ctx.save_artifact("coefficients", pd.DataFrame({"covariateId": inputs.data.covariate_ids, "estimate": result.beta}))
    fitted = _fit_result(params, inputs, variance, result, cv_result, boot_result, profiles, diagnostics)
    return _calibrated(params, fitted, profiles) if params.calibration is not None else fitted


# Tiny sccs_fit jobs that together take every path of a job on the GPU: the table build, engines of one and
# of several replicates, CV, the final fit and the bootstrap in float64 with the paper's criterion, and a
# float32 fit with the gradient criterion.
_WARM_UP_JOBS: tuple[dict, ...] = (
    {"prior": {"type": "laplace", "variance": 0.5}, "cross_validation": {"folds": 2, "grid": [0.1, 1.0]},
     "bootstrap": {"replicates": 2}},
    {"prior": {"type": "normal", "variance": 0.5}, "precision": "float32", "convergence": "gradient",
     "max_iterations": 5},
)


@cuda.on_warm_up
def warm_up_fit() -> None:
    """Pay, at worker start, the one-off device costs a first ``sccs_fit`` job would otherwise pay: the
    compile (or disk-cache load) of CuPy's own kernels that the table build, the engine build and the fit use
    (sorts, bincount, cumsum, sparse conversions...), the cuSPARSE handle, the first CUDA-graph capture and
    the pinned staging buffers of the tables' copy to the device (the ``ccd.cu`` variants are compiled by
    :func:`kernels.cuda.warm_up` itself). Runs tiny jobs on the GPU."""
    xp = get_namespace("gpu")
    transfer.reserve(xp)  # the staging ring, kept for the process: first, so a failing tiny job cannot skip it
    transfer.to_device(xp, np.zeros(1 << 16), min_bytes=0)  # its threads, streams and copy path, once
    frames = cyclops_frames(n_cases=200, n_drugs=6, seed=1)
    for job in _WARM_UP_JOBS:
        params = SccsParams.model_validate({"outcomes_dataset_id": "o", "covariates_dataset_id": "c", **job})
        run_fit(params, local_context(xp=xp, datasets=frames))
