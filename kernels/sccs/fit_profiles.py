"""Profile-likelihood intervals of an ``sccs_fit`` job's coefficients, and their curves as an artifact."""

from __future__ import annotations

import pandas as pd

from kernels.context import RunContext
from kernels.sccs import ccd, study
from kernels.sccs.fit_plan import FitInputs
from kernels.sccs.profile import ProfileInterval, ProfileProgress, batched_profile_intervals
from kernels.sccs.spec import SccsParams


def profile_intervals(params: SccsParams, inputs: FitInputs, result: ccd.FitResult, variance: float,
                      ctx: RunContext) -> dict[int, ProfileInterval]:
    """Profile intervals of the requested covariates (column index -> interval); unknown ids name the field."""
    spec = params.profile
    assert spec is not None
    ids = inputs.data.covariate_ids.tolist()
    wanted = default_profiled(ids, _control_ids(params)) if spec.covariates is None else spec.covariates
    unknown = sorted(set(wanted) - set(ids))
    if unknown:
        raise ValueError(f"profile.covariates: covariateId {unknown[0]} is not a covariate of the fit "
                         f"(unknown: {unknown[:10]})")
    columns = [ids.index(covariate) for covariate in wanted]
    prior = inputs.prior.with_variance(variance) if inputs.prior.kind != "none" else inputs.prior
    options = ccd.FitOptions.from_params(params, precision="float64")
    ctx.progress(0.9, f"profile likelihood of {len(columns)} covariates")
    intervals = batched_profile_intervals(inputs.data, prior, result, columns, spec.level, options,
                                          profile_progress(ctx, 0.9, "profile likelihood"))
    ctx.save_artifact("profile_curves", _profile_curves(inputs, intervals))
    return {interval.covariate: interval for interval in intervals}


def default_profiled(covariate_ids: list[int], controls: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """The covariates profiled when the job names none: every one but the time splines' components (the ids
    SelfControlledCaseSeries and ``sccs_eras`` reserve for age, season and calendar time,
    :data:`study.RESERVED_IDS`), whose intervals nobody reads; all of them when every id lies in that range (a
    fit of the user's own covariates). The calibration's controls are always profiled (their intervals are the
    null's data)."""
    exposures = [c for c in covariate_ids if c not in study.RESERVED_IDS or c in controls]
    return exposures or list(covariate_ids)


def _control_ids(params: SccsParams) -> set[int]:
    spec = params.calibration
    if spec is None:
        return set()
    return {*spec.negative_controls, *(control.covariate_id for control in spec.positive_controls)}


def profile_progress(ctx: RunContext, fraction: float, stage: str) -> ProfileProgress:
    """The profile's progress after every CCD cycle of its refits (the cancel point: progress may raise)."""

    def report(finished: int, searches: int) -> None:
        ctx.progress(fraction, f"{stage}: {finished}/{searches} interval ends found")

    return report


def _profile_curves(inputs: FitInputs, intervals: list[ProfileInterval]) -> pd.DataFrame:
    """The profiles where the searches evaluated them, as deviances 2 (p(b_hat) - p(b)) beside the interval's
    critical value (chi2_1 at the level): one row per point, for the dashboard's profile plot."""
    ids = inputs.data.covariate_ids
    rows = [(int(ids[interval.covariate]), b, 2.0 * (interval.maximum - value),
             2.0 * (interval.maximum - interval.threshold))
            for interval in intervals for b, value in interval.points]
    return pd.DataFrame(rows, columns=["covariateId", "logRelativeIncidence", "deviance", "criticalDeviance"])
