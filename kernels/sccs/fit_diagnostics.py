"""The SelfControlledCaseSeries diagnostics of an ``sccs_fit`` job: minimum detectable relative risks, the
pre-exposure and end-of-observation windows against their null bounds, and the time-stability check on the
person-level tables."""

from __future__ import annotations

import math

import numpy as np

from kernels.context import RunContext
from kernels.sccs import ccd
from kernels.sccs import diagnostics as diag
from kernels.sccs.dates import day_column
from kernels.sccs.fit_plan import FitInputs
from kernels.sccs.fit_profiles import profile_progress
from kernels.sccs.profile import batched_profile_intervals
from kernels.sccs.spec import (
    OUTCOME_COLUMN,
    DiagnosticsSpec,
    MdrrRow,
    SccsDiagnostics,
    SccsParams,
    TimeStabilityCheck,
    WindowCheck,
)
from kernels.sccs.tables import event_outcomes, numeric_column


def sccs_diagnostics(params: SccsParams, inputs: FitInputs, result: ccd.FitResult, variance: float,
                     ctx: RunContext) -> SccsDiagnostics:
    """The SelfControlledCaseSeries diagnostics the spec asks for (kernels/sccs/diagnostics.py)."""
    spec = params.diagnostics
    assert spec is not None
    data, ids = inputs.data, inputs.data.covariate_ids.tolist()
    statistics = diag.exposure_statistics(data)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(statistics.time_total > 0, statistics.time_exposed / statistics.time_total, 0.0)
    mdrr = diag.minimum_detectable_relative_risk(share, statistics.events, spec.mdrr_alpha, spec.mdrr_power,
                                                 spec.mdrr_two_sided)
    rows = [MdrrRow(covariate_id=int(ids[j]), mdrr=float(mdrr[j]) if math.isfinite(mdrr[j]) else None,
                    exposed_cases=int(statistics.exposed_cases[j]), events=float(statistics.events[j]),
                    time_exposed=float(statistics.time_exposed[j]), time_total=float(statistics.time_total[j]),
                    passed=bool(mdrr[j] <= spec.mdrr_threshold))
             for j in range(len(ids))]
    windows = _window_checks(spec, inputs, result, variance, params, ctx)
    pre_exposure = [windows[covariate] for covariate in spec.pre_exposure_covariates]
    end_check = windows.get(spec.end_of_observation_covariate) if spec.end_of_observation_covariate is not None \
        else None
    stability = _time_stability(spec, ctx, params.outcome_id) if ctx.has_dataset("cases_dataset_id") else None
    return SccsDiagnostics(mdrr=rows, pre_exposure=pre_exposure, end_of_observation=end_check,
                           time_stability=stability)


def _window_checks(spec: DiagnosticsSpec, inputs: FitInputs, result: ccd.FitResult, variance: float,
                   params: SccsParams, ctx: RunContext) -> dict[int, WindowCheck]:
    """The pre-exposure and end-of-observation windows against their null bounds, each by its 95% profile-
    likelihood interval (SelfControlledCaseSeries' logLb95 / logUb95 are Cyclops's profile intervals)."""
    bounds = {covariate: spec.pre_exposure_null_bounds for covariate in spec.pre_exposure_covariates}
    field = {covariate: "diagnostics.pre_exposure_covariates" for covariate in spec.pre_exposure_covariates}
    if spec.end_of_observation_covariate is not None:
        bounds[spec.end_of_observation_covariate] = spec.end_of_observation_null_bounds
        field[spec.end_of_observation_covariate] = "diagnostics.end_of_observation_covariate"
    if not bounds:
        return {}
    ids = inputs.data.covariate_ids.tolist()
    for covariate in bounds:
        if covariate not in ids:
            raise ValueError(f"{field[covariate]}: covariateId {covariate} is not a covariate of the fit")
    prior = inputs.prior.with_variance(variance) if inputs.prior.kind != "none" else inputs.prior
    options = ccd.FitOptions.from_params(params, precision="float64")
    ctx.progress(0.95, f"diagnostics: profile intervals of {len(bounds)} windows")
    with ctx.stage("diagnostics"):
        intervals = batched_profile_intervals(inputs.data, prior, result, [ids.index(c) for c in bounds], 0.95,
                                              options, profile_progress(ctx, 0.95, "diagnostics"))
    checks = {}
    for covariate, interval in zip(bounds, intervals, strict=True):
        check = diag.interval_check(interval.estimate, interval.lower, interval.upper, tuple(bounds[covariate]))
        checks[covariate] = WindowCheck(covariate_id=covariate, ratio=check.ratio, ci_lower=check.lower,
                                        ci_upper=check.upper, null_bounds=list(bounds[covariate]),
                                        passed=check.passed)
    return checks


def _single_outcome(event_outcome: np.ndarray, outcome_id: int | None) -> int:
    """The outcome of a fit among the events' outcomeIds (``outcome_id``, or the only one there is)."""
    present = np.unique(event_outcome)
    if outcome_id is None:
        if present.size > 1:
            raise ValueError(f"outcome_id: the events table holds {present.size} outcomes ({OUTCOME_COLUMN}); "
                             "choose the one to fit")
        return int(present[0])
    if outcome_id not in set(present.tolist()):
        raise ValueError(f"outcome_id: {outcome_id} is not an {OUTCOME_COLUMN} of the events table")
    return outcome_id


def _time_stability(spec: DiagnosticsSpec, ctx: RunContext, outcome_id: int | None) -> TimeStabilityCheck:
    """checkTimeStabilityAssumption on the person-level tables (days or dates; events outside their case's
    observation period, or of no listed case, are not counted)."""
    cases, events = ctx.dataset("cases_dataset_id"), ctx.dataset("events_dataset_id")
    with ctx.stage("diagnostics"):
        case_id = numeric_column(cases, "cases", "caseId", integer=True)
        start = day_column(cases, "cases", "observationStart")
        end = day_column(cases, "cases", "observationEnd")
        inverted = np.flatnonzero(end < start)
        if inverted.size:
            raise ValueError(f"cases.observationEnd precedes observationStart at row {int(inverted[0]) + 1}")
        if np.unique(case_id).size != case_id.size:
            raise ValueError("cases.caseId must be unique (one observation period per case)")
        event_case = numeric_column(events, "events", "caseId", integer=True)
        event_day = day_column(events, "events", "day")
        event_outcome = event_outcomes(events)
        if event_outcome is not None:  # several outcomes' events: this fit's outcome, and the cases that have it
            kept = event_outcome == _single_outcome(event_outcome, outcome_id)
            event_case, event_day = event_case[kept], event_day[kept]
            cases_kept = np.isin(case_id, event_case)
            case_id, start, end = case_id[cases_kept], start[cases_kept], end[cases_kept]
        order = np.argsort(case_id, kind="stable")
        slot = np.minimum(np.searchsorted(case_id[order], event_case), case_id.size - 1)
        owner = order[slot]
        inside = (case_id[owner] == event_case) & (event_day >= start[owner]) & (event_day <= end[owner])
        counts = np.bincount(owner[inside], minlength=case_id.size).astype(np.float64)
        monthly = diag.monthly_counts(start, end, counts, event_day[inside])
        test = diag.time_stability(monthly.observed, monthly.expected, spec.time_stability_max_ratio,
                                   spec.time_stability_alpha)
    return TimeStabilityCheck(ratio=None if math.isnan(test.ratio) else test.ratio, p=test.p, passed=test.passed,
                              max_ratio=spec.time_stability_max_ratio, months=test.months, events=int(inside.sum()))
