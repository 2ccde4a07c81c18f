"""The SCCS job kinds: ``sccs_fit`` (Bayesian self-controlled case series on the Cyclops interval tables: the
MAP fit, optional cross-validation of the prior variance and case-bootstrap intervals) and ``sccs_eras``
(person-level observation periods, events and exposures to those tables). Model and conventions:
``docs/sccs.md``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import pandas as pd
from scipy import stats

from kernels import cuda
from kernels.backend import get_namespace, is_numpy, to_host
from kernels.context import RunContext, local_context
from kernels.registry import JobKind, KindExample
from kernels.sccs import bootstrap as boot
from kernels.sccs import calibration as cal
from kernels.sccs import ccd, gpu, precondition, study, synthetic, transfer
from kernels.sccs import cv as crossval
from kernels.sccs import diagnostics as diag
from kernels.sccs.analyses import SingleFits, single_covariate_fits
from kernels.sccs.data import BuiltData, IntervalTables, SccsData, build_from_tables, eras_from_person_data
from kernels.sccs.model import Prior
from kernels.sccs.outcomes import outcome_of_rows, pair_columns, select_outcome
from kernels.sccs.profile import ProfileInterval, ProfileProgress, batched_profile_intervals
from kernels.sccs.spec import (
    AGE_COLUMN,
    OUTCOME_COLUMN,
    AnalysisRow,
    BootstrapSpec,
    CalibrationSummary,
    Coefficient,
    CrossValidationSpec,
    CvPoint,
    DiagnosticsSpec,
    EraCovariate,
    EraOutcome,
    MdrrRow,
    SccsAnalysesParams,
    SccsAnalysesResult,
    SccsDiagnostics,
    SccsErasParams,
    SccsErasResult,
    SccsParams,
    SccsResult,
    TimeStabilityCheck,
    WindowCheck,
)

# Share of the GPU's free memory a bootstrap batch may take.
_GPU_MEMORY_SHARE = 0.6
# Bootstrap refits per batch on NumPy (one after another there; the batch only sets the progress steps).
_NUMPY_BOOTSTRAP_CHUNK = 10


# -- the uploaded tables ---------------------------------------------------------------------------------

def _column(frame: pd.DataFrame, table: str, name: str, integer: bool) -> np.ndarray:
    if name not in frame.columns:
        raise ValueError(f"{table} table lacks column {name!r} (has {list(frame.columns)[:10]})")
    values = frame[name].to_numpy()
    if values.dtype == object or values.dtype.kind not in "iufb":
        raise ValueError(f"{table}.{name} must be numeric, got dtype {values.dtype}")
    # A real column's missing and non-finite values are refused where the tables are built, on their device
    # (``data.build_from_tables``): a host scan here took 0.25-0.34 s at the SCCS paper's largest size, in every
    # chunk of a fanned-out job (issue 19).
    if integer:
        floats = values.dtype.kind == "f"
        if floats and (not np.all(np.isfinite(values)) or np.any(values != np.round(values))):
            raise ValueError(f"{table}.{name} must hold integers")
        return values.astype(np.int64, copy=False)
    return values.astype(np.float64, copy=False)


def table_columns(outcomes: pd.DataFrame, covariates: pd.DataFrame) -> dict[str, np.ndarray]:
    """The Cyclops tables' columns as NumPy arrays (``covariateValue`` defaults to 1)."""
    cov_value = (
        _column(covariates, "covariates", "covariateValue", integer=False)
        if "covariateValue" in covariates.columns
        else np.ones(len(covariates))
    )
    return {
        "row_id": _column(outcomes, "outcomes", "rowId", integer=True),
        "stratum_id": _column(outcomes, "outcomes", "stratumId", integer=True),
        "time": _column(outcomes, "outcomes", "time", integer=False),
        "y": _column(outcomes, "outcomes", "y", integer=False),
        "cov_row_id": _column(covariates, "covariates", "rowId", integer=True),
        "cov_id": _column(covariates, "covariates", "covariateId", integer=True),
        "cov_value": cov_value,
    }


def load_tables(outcomes: pd.DataFrame, covariates: pd.DataFrame, xp: ModuleType = np) -> BuiltData:
    """Validate the uploaded Cyclops tables and build the analysis data with ``xp`` (on its device)."""
    return build_from_tables(**table_columns(outcomes, covariates), xp=xp)


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


@dataclass(frozen=True)
class _FitInputs:
    built: BuiltData
    names: list[str | None]
    prior: Prior

    @property
    def data(self) -> SccsData:
        return self.built.data


def _load_inputs(params: SccsParams, ctx: RunContext) -> _FitInputs:
    """The tables' columns read (host), copied to the job's device, sorted, indexed and checked there; the names
    and the prior."""
    built, names = _load_tables(ctx, params.outcome_id)
    return _FitInputs(built, names, _prior(params, built.data.covariate_ids))


def _load_tables(ctx: RunContext, outcome_id: int | None) -> tuple[BuiltData, list[str | None]]:
    """The interval tables (of ``outcome_id`` when they stack several outcomes) built on the job's device, and
    the covariates' names (None without a names table). Built once per job and worker process: a fanned-out
    job's finish reuses what its chunk built on the same worker (no fit changes them)."""
    return ctx.reuse(("sccs tables", outcome_id), lambda: _build_tables(ctx, outcome_id))


def _build_tables(ctx: RunContext, outcome_id: int | None) -> tuple[BuiltData, list[str | None]]:
    with ctx.stage("tables"):
        outcomes, covariates = select_outcome(ctx.dataset("outcomes_dataset_id"),
                                              ctx.dataset("covariates_dataset_id"), outcome_id)
        columns = table_columns(outcomes, covariates)
    if not is_numpy(ctx.xp):
        with ctx.stage("to_device"):
            columns = {name: transfer.to_device(ctx.xp, values) for name, values in columns.items()}
    with ctx.stage("build"):
        built = build_from_tables(**columns, xp=ctx.xp)
    return built, _names(ctx.optional_dataset("names_dataset_id"), built.data.covariate_ids)


# -- the fits --------------------------------------------------------------------------------------------

class FitPlan:
    """The job's fits in order (CV, final, bootstrap): their batch fitters and per-cycle progress (also what a
    fanned-out job's chunks fit with: ``kernels/sccs/chunks.py``)."""

    def __init__(self, params: SccsParams, ctx: RunContext, inputs: _FitInputs) -> None:
        self.ctx, self.data, self.prior = ctx, inputs.data, inputs.prior
        self.options = ccd.FitOptions.from_params(params)
        self.whiten_splines = params.precondition == "splines"
        cv_spec, boot_spec = params.cross_validation, params.bootstrap
        if cv_spec is not None and cv_spec.folds > self.data.n_cases:
            raise ValueError(f"cross_validation.folds={cv_spec.folds} exceeds the {self.data.n_cases} cases with "
                             "events")
        self.cv_fits = cv_spec.folds * len(cv_spec.variances()) if cv_spec else 0
        self.total_fits = self.cv_fits + 1 + (boot_spec.replicates if boot_spec else 0)

    @classmethod
    def load(cls, params: SccsParams, ctx: RunContext) -> FitPlan:
        """The plan of ``params`` on the tables of ``ctx`` (read, built on its device and checked)."""
        return cls(params, ctx, _load_inputs(params, ctx))

    def reporter(self, stage: str, before: int) -> ccd.CycleCallback:
        """Progress after every CCD cycle of every batch (the cancel point: progress may raise)."""

        def report(finished: int, cycle: int) -> None:
            done = before + finished
            self.ctx.progress(min(done / self.total_fits, 0.99),
                              f"{stage}: {done}/{self.total_fits} fits done, cycle {cycle}")

        return report

    @functools.cached_property
    def coordinates(self) -> precondition.FitCoordinates | None:
        """The whitened coordinates the fits run in (``precondition: splines`` and a dense unpenalised block in
        the data), made on first use (timed as "precondition"): a fanned-out job's finish that fits nothing
        makes none."""
        if not self.whiten_splines:
            return None
        with self.ctx.stage("precondition"):
            return precondition.fit_coordinates(self.data, self.prior)

    @property
    def fit_data(self) -> SccsData:
        """The data the fits run on (the whitened columns with ``precondition: splines``)."""
        return self.data if self.coordinates is None else self.coordinates.data

    def fitter(self, capacity: int) -> ccd.BatchFitter:
        """A batch fitter: NumPy fits one by one, or a GPU engine of ``capacity`` replicates (timed as "engine":
        buffers and the CUDA-graph capture, once per batch size). With ``precondition: splines`` it fits in the
        whitened coordinates and takes and gives coefficients in the original ones."""
        coordinates, data = self.coordinates, self.fit_data
        if is_numpy(self.ctx.xp):
            fitter = ccd.numpy_batch_fitter(data, self.prior, self.options)
        else:
            with self.ctx.stage("engine"):
                fitter = gpu.batch_fitter(data, self.prior, self.options, capacity)
        return fitter if coordinates is None else coordinates.fitter(fitter)

    def bootstrap_chunk(self, replicates: int) -> int:
        if is_numpy(self.ctx.xp):
            return _NUMPY_BOOTSTRAP_CHUNK
        data = self.fit_data  # first: whitened data (made now if not yet) takes device memory
        # Free device memory: the driver's, and the blocks CuPy's pool holds free (the table build leaves some).
        free_bytes = self.ctx.xp.cuda.Device().mem_info[0] + self.ctx.xp.get_default_memory_pool().free_bytes()
        return gpu.capacity_for(data, self.options.precision, replicates, int(free_bytes * _GPU_MEMORY_SHARE))


def _cross_validate(plan: FitPlan, spec: CrossValidationSpec,
                    computed: crossval.CvResult | None = None) -> crossval.CvResult:
    result = computed
    if result is None:
        fitter = plan.fitter(spec.folds)
        with plan.ctx.stage("cross_validation"):
            result = crossval.cross_validate(plan.data, fitter, spec.variances(), spec.folds, spec.seed,
                                             plan.reporter("cross-validation", 0))
    plan.ctx.save_artifact("cv_predictive_log_likelihood", {
        "variance": result.variances, "fold_log_likelihood": result.fold_loglik,
        "iterations": result.iterations, "converged": result.converged,
        "gradient_norm": result.gradient_norm, "coefficients": result.coefficients,
        "covariate_id": plan.data.covariate_ids,
    })
    return result


def final_fit(plan: FitPlan, variance: float) -> ccd.FitResult:
    """The MAP fit of every case at ``variance`` (from 0, alone in its batch)."""
    fitter = plan.fitter(1)
    with plan.ctx.stage("fit"):
        data = plan.data
        return fitter(np.asarray([variance]), np.ones((1, data.n_cases)), np.zeros((1, data.n_covariates)),
                      plan.reporter("fit", plan.cv_fits))[0]


def _bootstrap(plan: FitPlan, spec: BootstrapSpec, variance: float, beta_hat: np.ndarray,
               computed: boot.BootstrapResult | None = None) -> boot.BootstrapResult:
    result = computed
    if result is None:
        chunk = plan.bootstrap_chunk(spec.replicates)
        fitter = plan.fitter(chunk)
        with plan.ctx.stage("bootstrap"):
            result = boot.bootstrap(plan.ctx.xp, plan.data.n_cases, fitter, variance, beta_hat, spec.replicates,
                                    spec.seed, chunk, plan.reporter("bootstrap", plan.cv_fits + 1))
    plan.ctx.save_artifact("bootstrap_estimates", {
        "covariate_id": plan.data.covariate_ids, "estimates": result.estimates,
        "iterations": result.iterations, "converged": result.converged,
        "gradient_norm": result.gradient_norm,
    })
    return result


# -- the result ------------------------------------------------------------------------------------------

def _relative_incidence(estimate: float) -> float:
    return math.exp(estimate) if estimate < 700 else math.inf


def _profile(params: SccsParams, inputs: _FitInputs, result: ccd.FitResult, variance: float,
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
                                          _profile_progress(ctx, 0.9, "profile likelihood"))
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


def _profile_progress(ctx: RunContext, fraction: float, stage: str) -> ProfileProgress:
    """The profile's progress after every CCD cycle of its refits (the cancel point: progress may raise)."""

    def report(finished: int, searches: int) -> None:
        ctx.progress(fraction, f"{stage}: {finished}/{searches} interval ends found")

    return report


def _profile_curves(inputs: _FitInputs, intervals: list[ProfileInterval]) -> pd.DataFrame:
    """The profiles where the searches evaluated them, as deviances 2 (p(b_hat) - p(b)) beside the interval's
    critical value (chi2_1 at the level): one row per point, for the dashboard's profile plot."""
    ids = inputs.data.covariate_ids
    rows = [(int(ids[interval.covariate]), b, 2.0 * (interval.maximum - value),
             2.0 * (interval.maximum - interval.threshold))
            for interval in intervals for b, value in interval.points]
    return pd.DataFrame(rows, columns=["covariateId", "logRelativeIncidence", "deviance", "criticalDeviance"])


def _diagnostics(params: SccsParams, inputs: _FitInputs, result: ccd.FitResult, variance: float,
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


def _window_checks(spec: DiagnosticsSpec, inputs: _FitInputs, result: ccd.FitResult, variance: float,
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
                                              options, _profile_progress(ctx, 0.95, "diagnostics"))
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
        case_id = _column(cases, "cases", "caseId", integer=True)
        start = _day_column(cases, "cases", "observationStart")
        end = _day_column(cases, "cases", "observationEnd")
        inverted = np.flatnonzero(end < start)
        if inverted.size:
            raise ValueError(f"cases.observationEnd precedes observationStart at row {int(inverted[0]) + 1}")
        if np.unique(case_id).size != case_id.size:
            raise ValueError("cases.caseId must be unique (one observation period per case)")
        event_case = _column(events, "events", "caseId", integer=True)
        event_day = _day_column(events, "events", "day")
        event_outcome = _event_outcome(events)
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
    result = _calibration(x, s, np.isin(profiled, spec.negative_controls),
                          np.array([positives.get(c, math.nan) for c in profiled]), level)
    coefficients = list(fitted.coefficients)
    for covariate, update in zip(profiled, _calibrated_fields(result), strict=True):
        coefficients[column_of[covariate]] = coefficients[column_of[covariate]].model_copy(update=update)
    return fitted.model_copy(update={"coefficients": coefficients, "calibration": _calibration_summary(result, level)})


def _calibration(log_rr: np.ndarray, se: np.ndarray, negative: np.ndarray, positive_true: np.ndarray,
                 level: float) -> cal.Calibration:
    try:
        return cal.calibrate(log_rr, se, negative, positive_true, level)
    except ValueError as error:
        raise ValueError(f"calibration.negative_controls: {error} (estimates with open intervals are left "
                         "out)") from None


def _calibrated_fields(result: cal.Calibration) -> list[dict[str, float | None]]:
    """The calibrated p, estimate and interval of each estimate, as the result's fields."""
    return [{
        "calibrated_p": _finite_or_none(p_value),
        "calibrated_estimate": _finite_or_none(interval.log_rr),
        "calibrated_ci_lower": _finite_or_none(interval.lower),
        "calibrated_ci_upper": _finite_or_none(interval.upper),
        "relative_incidence_calibrated_ci_lower": _maybe_exp(_finite_or_none(interval.lower)),
        "relative_incidence_calibrated_ci_upper": _maybe_exp(_finite_or_none(interval.upper)),
    } for p_value, interval in zip(result.p.tolist(), result.intervals, strict=True)]


def _calibration_summary(result: cal.Calibration, level: float) -> CalibrationSummary:
    model = result.model
    return CalibrationSummary(
        null_mean=result.null.mean, null_sd=result.null.sd, negative_controls=result.null.n_controls,
        positive_controls=result.positive_controls,
        error_model=[model.mean_intercept, model.mean_slope, model.sd_intercept, model.sd_slope], level=level,
    )


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _maybe_exp(value: float | None) -> float | None:
    return None if value is None else _relative_incidence(value)


def _coefficients(inputs: _FitInputs, beta: np.ndarray, boot_result: boot.BootstrapResult | None,
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
            relative_incidence=_relative_incidence(estimate),
            ci_lower=float(boot_result.ci_lower[j]) if boot_result else None,
            ci_upper=float(boot_result.ci_upper[j]) if boot_result else None,
            relative_incidence_ci_lower=_relative_incidence(float(boot_result.ci_lower[j])) if boot_result else None,
            relative_incidence_ci_upper=_relative_incidence(float(boot_result.ci_upper[j])) if boot_result else None,
            nonzero_share=float(boot_result.nonzero_share[j]) if boot_result and laplace else None,
            profile_ci_lower=profiled.lower if profiled else None,
            profile_ci_upper=profiled.upper if profiled else None,
            relative_incidence_profile_ci_lower=_maybe_exp(profiled.lower) if profiled else None,
            relative_incidence_profile_ci_upper=_maybe_exp(profiled.upper) if profiled else None,
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
    params: SccsParams, inputs: _FitInputs, variance: float, result: ccd.FitResult,
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
    inputs = _load_inputs(params, ctx)
    plan = FitPlan(params, ctx, inputs)
    computed = computed or ComputedFits()
    cv_result = None
    variance = params.prior.variance
    if params.cross_validation is not None:
        cv_result = _cross_validate(plan, params.cross_validation, computed.cross_validation)
        variance = cv_result.chosen_variance
    result = computed.final_fit or final_fit(plan, variance)
    boot_result = None
    if params.bootstrap is not None:
        boot_result = _bootstrap(plan, params.bootstrap, variance, result.beta, computed.bootstrap)
    profiles = None
    if params.profile is not None:
        with ctx.stage("profile"):
            profiles = _profile(params, inputs, result, variance, ctx)
    diagnostics = _diagnostics(params, inputs, result, variance, ctx) if params.diagnostics is not None else None
    ctx.save_artifact("coefficients", pd.DataFrame({"covariateId": inputs.data.covariate_ids, "estimate": result.beta}))
    fitted = _fit_result(params, inputs, variance, result, cv_result, boot_result, profiles, diagnostics)
    return _calibrated(params, fitted, profiles) if params.calibration is not None else fitted


# -- many single-exposure analyses -----------------------------------------------------------------------

@dataclass(frozen=True)
class _AnalysesData:
    """The tables built for the analyses: per column of ``built.data`` its covariateId, its outcomeId (None
    for tables of one outcome) and its name."""

    built: BuiltData
    covariate: np.ndarray
    outcome: np.ndarray | None
    names: list[str | None]


def load_analyses(params: SccsAnalysesParams, ctx: RunContext) -> tuple[_AnalysesData, np.ndarray]:
    """The analyses' tables, built on the job's device once per job and worker process (a fanned-out job's finish
    reuses what its chunk built on the same worker: ``kernels/sccs/analyses_chunks.py``), and the columns to
    analyse in the result's order."""
    tables = ctx.reuse(("sccs analyses tables",), lambda: _load_analyses_data(ctx))
    return tables, _analysis_columns(params, tables)


def _load_analyses_data(ctx: RunContext) -> _AnalysesData:
    """Tables of one outcome as ``sccs_fit`` reads them; stacked tables (``outcomeId``) with one column per
    exposure-outcome pair (``kernels/sccs/outcomes.py``)."""
    with ctx.stage("tables"):
        outcomes_frame, covariates_frame = ctx.dataset("outcomes_dataset_id"), ctx.dataset("covariates_dataset_id")
        owner = outcome_of_rows(outcomes_frame)
        columns = table_columns(outcomes_frame, covariates_frame)
        pairs = None if owner is None else pair_columns(columns, owner)
        if pairs is not None:
            columns = pairs.columns
    if not is_numpy(ctx.xp):
        with ctx.stage("to_device"):
            columns = {name: transfer.to_device(ctx.xp, values) for name, values in columns.items()}
    with ctx.stage("build"):
        built = build_from_tables(**columns, xp=ctx.xp)
    column_ids = np.asarray(to_host(built.data.covariate_ids), dtype=np.int64)
    covariate = column_ids if pairs is None else pairs.covariate[column_ids]
    outcome = None if pairs is None else pairs.outcome[column_ids]
    return _AnalysesData(built, covariate, outcome, _names(ctx.optional_dataset("names_dataset_id"), covariate))


def _analysis_columns(params: SccsAnalysesParams, tables: _AnalysesData) -> np.ndarray:
    """The columns to analyse, in the result's order: the pairs as given, or by outcome and then exposure."""
    covariate, outcome = tables.covariate.tolist(), tables.outcome
    outcomes = [None] if outcome is None else sorted(set(outcome.tolist()))
    if outcome is None and params.outcome_ids is not None:
        raise ValueError("outcome_ids: the outcomes table has no outcomeId column (it holds one outcome)")
    column_of = {(c, None if outcome is None else int(outcome[j])): j for j, c in enumerate(covariate)}
    if params.pairs is not None:
        chosen = []
        for i, pair in enumerate(params.pairs):
            if outcome is None and pair.outcome_id is not None:
                raise ValueError(f"pairs.{i}.outcome_id: the outcomes table has no outcomeId column")
            candidates = outcomes if pair.outcome_id is None else [pair.outcome_id]
            found = [column_of[(pair.covariate_id, o)] for o in candidates if (pair.covariate_id, o) in column_of]
            if not found:
                where = "" if pair.outcome_id is None else f" with outcome {pair.outcome_id}"
                raise ValueError(f"pairs.{i}: covariateId {pair.covariate_id} has no era{where} in the tables")
            chosen.extend(found)
        return np.asarray(chosen, dtype=np.int64)
    if params.outcome_ids is not None:
        unknown = sorted(set(params.outcome_ids) - set(outcomes))
        if unknown:
            raise ValueError(f"outcome_ids: {unknown[0]} is not an outcomeId of the outcomes table")
        outcomes = sorted(params.outcome_ids)
    wanted = list(dict.fromkeys(covariate)) if params.exposures is None else params.exposures
    unknown = sorted(set(wanted) - set(covariate))
    if unknown:
        raise ValueError(f"exposures: covariateId {unknown[0]} is not a covariate of the tables "
                         f"(unknown: {unknown[:10]})")
    return np.asarray([column_of[(c, o)] for o in outcomes for c in wanted if (c, o) in column_of], dtype=np.int64)


def run_analyses(params: SccsAnalysesParams, ctx: RunContext, computed: SingleFits | None = None) -> SccsAnalysesResult:
    """The ``sccs_analyses`` job: every exposure alone on each outcome's tables, one batch on the job's device
    (kernels/sccs/analyses.py), then the MDRRs and, with controls, empirical calibration over all the pairs.
    ``computed``: the analyses' fits in the result's order, computed by a fanned-out job's chunks."""
    ctx.progress(0.0, "loading tables")
    tables, columns = load_analyses(params, ctx)
    data = tables.built.data
    pair_covariate = tables.covariate[columns]
    pair_outcome = [None] * columns.size if tables.outcome is None else tables.outcome[columns].tolist()
    if computed is None:
        ctx.progress(0.2, f"fitting {columns.size} analyses")
        with ctx.stage("analyses"):
            fits = single_covariate_fits(data, columns, params.level)
    elif computed.estimate.size != columns.size:
        raise ValueError(f"the chunks fitted {computed.estimate.size} analyses and this job has {columns.size}")
    else:
        fits = computed
    with ctx.stage("diagnostics"):
        statistics = diag.exposure_statistics(data)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(statistics.time_total > 0, statistics.time_exposed / statistics.time_total, 0.0)
        mdrr = diag.minimum_detectable_relative_risk(share[columns], statistics.events[columns])
    z = float(stats.norm.ppf((1.0 + params.level) / 2.0))
    se = (fits.upper - fits.lower) / (2.0 * z)  # NaN for an open interval: not calibrated, not in the null
    negative = np.array([any(pair.matches(int(c), o) for pair in params.negative_pairs())
                         for c, o in zip(pair_covariate.tolist(), pair_outcome, strict=True)], dtype=bool)
    positive_true = np.array([_positive_effect(params, int(c), o)
                              for c, o in zip(pair_covariate.tolist(), pair_outcome, strict=True)])
    rows = [_analysis_row(a, int(column), fits, statistics, mdrr[a], tables, bool(negative[a]), positive_true[a])
            for a, column in enumerate(columns.tolist())]
    summary = None
    if params.negative_controls:
        if int(negative.sum()) < 2:
            raise ValueError(f"negative_controls: {int(negative.sum())} analysed pair(s) match them; the null needs "
                             "at least 2")
        with ctx.stage("calibration"):
            result = _calibration(np.where(np.isfinite(fits.estimate), fits.estimate, np.nan), se, negative,
                                  np.log(positive_true), params.level)
        rows = [row.model_copy(update=update) for row, update in zip(rows, _calibrated_fields(result), strict=True)]
        summary = _calibration_summary(result, params.level)
    ctx.save_artifact("analyses", pd.DataFrame([row.model_dump() for row in rows]))
    n_outcomes = None if tables.outcome is None else int(np.unique(tables.outcome).size)
    return SccsAnalysesResult(analyses=rows, calibration=summary, level=params.level, n_cases=data.n_cases,
                              n_eras=data.n_eras, n_outcomes=n_outcomes, dropped_cases=tables.built.dropped_cases)


def _positive_effect(params: SccsAnalysesParams, covariate_id: int, outcome_id: int | None) -> float:
    """The known relative risk of a positive-control pair, NaN for any other pair."""
    for control in params.positive_controls:
        if control.covariate_id == covariate_id and control.outcome_id in (None, outcome_id):
            return control.true_relative_risk
    return math.nan


def _analysis_row(a: int, column: int, fits: SingleFits, statistics: diag.ExposureStatistics, mdrr: float,
                  tables: _AnalysesData, negative: bool, true_relative_risk: float) -> AnalysisRow:
    estimate = float(fits.estimate[a])
    lower, upper = _finite_or_none(float(fits.lower[a])), _finite_or_none(float(fits.upper[a]))
    positive = not math.isnan(true_relative_risk)
    return AnalysisRow(
        covariate_id=int(tables.covariate[column]),
        outcome_id=None if tables.outcome is None else int(tables.outcome[column]),
        name=tables.names[column], control="negative" if negative else ("positive" if positive else None),
        true_relative_risk=true_relative_risk if positive else None,
        estimate=_finite_or_none(estimate),
        relative_incidence=0.0 if estimate == -math.inf else _finite_or_none(_relative_incidence(estimate)),
        ci_lower=lower, ci_upper=upper,
        relative_incidence_ci_lower=_maybe_exp(lower), relative_incidence_ci_upper=_maybe_exp(upper),
        p=float(fits.p_value[a]), log_likelihood_ratio=float(fits.log_likelihood_ratio[a]),
        exposed_cases=int(statistics.exposed_cases[column]), events=float(statistics.events[column]),
        mdrr=_finite_or_none(float(mdrr)),
    )


# -- person-level data to eras ---------------------------------------------------------------------------

def _day_column(frame: pd.DataFrame, table: str, name: str) -> np.ndarray:
    """Integer days, or dates as days since 1970-01-01: datetime columns (Parquet timestamps), date objects
    (Parquet date32) and ISO 8601 text (CSV, e.g. 2020-01-31), whose unreadable or missing entries are named
    by their row (counting data rows from 1)."""
    if name not in frame.columns:
        return _column(frame, table, name, integer=True)  # its message names the missing column
    values = frame[name]
    if pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        return _column(frame, table, name, integer=True)
    if not pd.api.types.is_datetime64_any_dtype(values):
        values = _parse_dates(values, table, name)
    elif values.isna().any():
        raise ValueError(f"{table}.{name} has a missing date at row {int(np.flatnonzero(values.isna())[0]) + 1}")
    if isinstance(values.dtype, pd.DatetimeTZDtype):
        values = values.dt.tz_convert("UTC").dt.tz_localize(None)
    return values.to_numpy().astype("datetime64[D]").astype(np.int64)


def _parse_dates(values: pd.Series, table: str, name: str) -> pd.Series:
    """Dates in text or date objects; anything else is refused naming the first row that is not a date."""
    missing = values.isna().to_numpy()
    if missing.any():
        raise ValueError(f"{table}.{name} has a missing value at row {int(np.flatnonzero(missing)[0]) + 1}")
    parsed = pd.to_datetime(values.astype(str), format="ISO8601", errors="coerce")
    bad = parsed.isna().to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        shown = str(values.iloc[row])[:40]
        raise ValueError(f"{table}.{name} must hold day numbers or dates (YYYY-MM-DD); row {row + 1} holds {shown!r}")
    return parsed


def _events_inside(case_id: np.ndarray, obs_start: np.ndarray, obs_end: np.ndarray, event_case: np.ndarray,
                   event_day: np.ndarray) -> int:
    """How many events fall inside their case's observation period."""
    position = pd.Series(np.arange(case_id.size), index=case_id)
    owner = position.loc[event_case].to_numpy() if event_case.size else np.zeros(0, dtype=np.int64)
    return int(np.sum((event_day >= obs_start[owner]) & (event_day <= obs_end[owner])))


def _study_design(params: SccsErasParams) -> study.Design:
    """The kernel's description of an ``sccs_eras`` spec that uses exposures, restrictions or time splines."""
    exposures = None
    if params.exposures is not None:
        exposures = tuple(
            study.Exposure(
                drug_ids=tuple(exposure.drug_ids),
                windows=tuple(study.Window(w.start, w.start_anchor, w.end, w.end_anchor, covariate_id,
                                           f"{exposure.describe()}: {w.describe()}")
                              for w, covariate_id in zip(exposure.windows, ids, strict=True)),
                first_occurrence_only=exposure.first_occurrence_only,
            )
            for exposure, ids in zip(params.exposures, params.window_covariate_ids(), strict=True)
        )
    population = params.study_population
    return study.Design(
        exposures=exposures,
        legacy=study.LegacyWindow(params.risk_window_start, params.risk_window_end, params.start_anchor,
                                  params.end_anchor),
        population=study.Population() if population is None else study.Population(
            population.min_age_years, population.max_age_years, population.min_observation_days),
        age=None if params.age is None else study.Spline(
            params.age.knots if isinstance(params.age.knots, int) else tuple(params.age.knots), params.age.degree),
        season=None if params.season is None else study.Spline(
            params.season.knots if isinstance(params.season.knots, int) else tuple(params.season.knots),
            params.season.degree),
        calendar_time=None if params.calendar_time is None else study.Spline(
            params.calendar_time.knots if isinstance(params.calendar_time.knots, int) else tuple(
                float(params.calendar_time.month_number(k)) for k in params.calendar_time.knots),
            params.calendar_time.degree),
    )


def _uses_study_design(params: SccsErasParams) -> bool:
    return any(getattr(params, name) is not None for name in ("exposures", "study_population", "age", "season",
                                                              "calendar_time"))


def _age_column(cases: pd.DataFrame) -> np.ndarray:
    """``ageAtObsStart`` in whole days, not negative (a bad row is named, data rows counted from 1)."""
    age = _column(cases, "cases", AGE_COLUMN, integer=True)
    negative = np.flatnonzero(age < 0)
    if negative.size:
        raise ValueError(f"cases.{AGE_COLUMN} must be >= 0 (days of age): row {int(negative[0]) + 1} holds "
                         f"{int(age[negative[0]])}")
    return age


def _save_tables(ctx: RunContext, tables: IntervalTables, outcome: np.ndarray | None = None) -> None:
    outcomes = {"rowId": tables.row_id, "stratumId": tables.stratum_id, "time": tables.time,
                "y": tables.y.astype(np.int64)}
    if outcome is not None:
        outcomes[OUTCOME_COLUMN] = outcome
    ctx.save_artifact("outcomes", pd.DataFrame(outcomes))
    ctx.save_artifact("covariates", pd.DataFrame({
        "rowId": tables.cov_row_id, "covariateId": tables.cov_id, "covariateValue": tables.cov_value,
    }))


def _cases_with_events(tables: IntervalTables) -> int:
    if tables.row_id.size == 0:
        return 0
    events_per_case = np.bincount(np.unique(tables.stratum_id, return_inverse=True)[1], weights=tables.y)
    return int(np.sum(events_per_case > 0))


def _eras_of(params: SccsErasParams, inputs: study.PersonInputs) -> tuple[IntervalTables, study.StudyEras | None]:
    """The tables of one outcome's events: the original one-window spec's exactly as before, or the study
    design's (with what it reports)."""
    if not _uses_study_design(params):
        tables = eras_from_person_data(
            inputs.case_id, inputs.observation_start, inputs.observation_end, inputs.event_case,
            inputs.event_day, inputs.exposure_case, inputs.exposure_drug, inputs.exposure_start,
            inputs.exposure_end, params.risk_window_start, params.risk_window_end, params.end_anchor,
            params.start_anchor,
        )
        return tables, None
    built = study.study_eras(inputs, _study_design(params))
    return built.tables, built


def _of_outcome(inputs: study.PersonInputs, events: np.ndarray) -> study.PersonInputs:
    """The person-level inputs of one outcome: its events, and only the cases that have one (the others have
    no likelihood contribution: SelfControlledCaseSeries' cases of an outcome are the people with its event)."""
    cases = np.isin(inputs.case_id, inputs.event_case[events])
    exposures = np.isin(inputs.exposure_case, inputs.case_id[cases])
    age = inputs.age_at_observation_start
    return study.PersonInputs(
        inputs.case_id[cases], inputs.observation_start[cases], inputs.observation_end[cases],
        inputs.event_case[events], inputs.event_day[events], inputs.exposure_case[exposures],
        inputs.exposure_drug[exposures], inputs.exposure_start[exposures], inputs.exposure_end[exposures],
        None if age is None else age[cases],
    )


def _stacked(parts: list[IntervalTables]) -> IntervalTables:
    """Tables of several outcomes one after the other, rowIds renumbered to stay unique."""
    offsets = np.cumsum([0] + [part.row_id.size for part in parts])
    return IntervalTables(*(
        np.concatenate([getattr(part, name) + (offset if name in ("row_id", "cov_row_id") else 0)
                        for part, offset in zip(parts, offsets[:-1].tolist(), strict=True)])
        for name in ("row_id", "stratum_id", "time", "y", "cov_row_id", "cov_id", "cov_value")
    ))


def _eras_by_outcome(params: SccsErasParams, inputs: study.PersonInputs, event_outcome: np.ndarray, ctx: RunContext,
                     ) -> tuple[IntervalTables, np.ndarray, list[EraOutcome], study.StudyEras | None]:
    """Each outcome's tables (one era build per outcome), stacked, with each row's outcomeId."""
    parts, summaries, first_built = [], [], None
    outcome_ids = np.unique(event_outcome)
    for number, outcome_id in enumerate(outcome_ids.tolist()):
        ctx.progress(number / outcome_ids.size, f"eras of outcome {outcome_id} ({number + 1}/{outcome_ids.size})")
        events = event_outcome == outcome_id
        tables, built = _eras_of(params, _of_outcome(inputs, events))
        first_built = first_built or built
        inside = built.events_inside if built is not None else _events_inside(
            inputs.case_id, inputs.observation_start, inputs.observation_end, inputs.event_case[events],
            inputs.event_day[events])
        parts.append(tables)
        summaries.append(EraOutcome(
            outcome_id=outcome_id, n_cases_with_events=_cases_with_events(tables), n_eras=int(tables.row_id.size),
            events_in_observation=inside, events_outside_observation=int(events.sum() - inside),
            cases_removed=None if built is None else built.cases_removed,
            knots=None if built is None else (built.knots or None),
        ))
    stacked = _stacked(parts)
    outcome = np.repeat(outcome_ids, [part.row_id.size for part in parts])
    return stacked, outcome, summaries, first_built


def _event_outcome(events: pd.DataFrame) -> np.ndarray | None:
    if OUTCOME_COLUMN not in events.columns:
        return None
    outcome = _column(events, "events", OUTCOME_COLUMN, integer=True)
    if outcome.size == 0:
        raise ValueError(f"events table has no rows (its {OUTCOME_COLUMN} column names no outcome)")
    return outcome


def run_eras(params: SccsErasParams, ctx: RunContext) -> SccsErasResult:
    """The ``sccs_eras`` job: the Cyclops tables of person-level data, saved as artifacts, and their counts;
    with ``outcomeId`` in the events, one era build per outcome, stacked."""
    ctx.progress(0.0, "building eras")
    cases, events, exposures = (ctx.dataset("cases_dataset_id"), ctx.dataset("events_dataset_id"),
                                ctx.dataset("exposures_dataset_id"))
    with ctx.stage("eras"):
        obs_start = _day_column(cases, "cases", "observationStart")
        obs_end = _day_column(cases, "cases", "observationEnd")
        case_id = _column(cases, "cases", "caseId", integer=True)
        event_case = _column(events, "events", "caseId", integer=True)
        event_day = _day_column(events, "events", "day")
        event_outcome = _event_outcome(events)
        inputs = study.PersonInputs(
            case_id, obs_start, obs_end, event_case, event_day,
            _column(exposures, "exposures", "caseId", integer=True),
            _column(exposures, "exposures", "drugId", integer=True),
            _day_column(exposures, "exposures", "start"), _day_column(exposures, "exposures", "end"),
            _age_column(cases) if params.needs_age() else None,
        )
        outcome, summaries = None, None
        if event_outcome is None:
            tables, built = _eras_of(params, inputs)
        else:
            tables, outcome, summaries, built = _eras_by_outcome(params, inputs, event_outcome, ctx)
    _save_tables(ctx, tables, outcome)
    counts = {"n_cases": int(case_id.size), "n_cases_with_events": _cases_with_events(tables) if summaries is None
              else sum(part.n_cases_with_events for part in summaries),
              "n_eras": int(tables.row_id.size), "n_covariate_rows": int(tables.cov_row_id.size), "outcomes": summaries}
    if summaries is not None:
        inside = sum(part.events_in_observation for part in summaries)
    elif built is None:
        inside = _events_inside(case_id, obs_start, obs_end, event_case, event_day)
    else:
        inside = built.events_inside
    counts |= {"events_in_observation": inside, "events_outside_observation": int(event_case.size - inside)}
    if built is None:
        return SccsErasResult(n_drugs=int(np.unique(tables.cov_id).size), **counts)
    ctx.save_artifact("names", pd.DataFrame({"covariateId": [c.covariate_id for c in built.covariates],
                                             "covariateName": [c.name for c in built.covariates]}))
    window_ids = [c.covariate_id for c in built.covariates if c.source in ("exposure_window", "drug")]
    removed = built.cases_removed if summaries is None else sum(part.cases_removed or 0 for part in summaries)
    return SccsErasResult(
        n_drugs=int(np.isin(np.unique(tables.cov_id), window_ids).sum()),
        covariates=[EraCovariate(covariate_id=c.covariate_id, name=c.name, source=c.source)
                    for c in built.covariates],
        cases_removed=removed, knots=(built.knots or None) if summaries is None else None, **counts,
    )


# -- examples and the GPU warm-up ------------------------------------------------------------------------

def cyclops_frames(n_cases: int, n_drugs: int, seed: int, names: bool = False) -> dict[str, pd.DataFrame]:
    """Synthetic Cyclops tables (:mod:`kernels.sccs.synthetic`) as the ``sccs_fit`` datasets."""
    tables = synthetic.to_tables(synthetic.generate(np, n_cases=n_cases, n_drugs=n_drugs, seed=seed).data)
    frames = {
        "outcomes_dataset_id": pd.DataFrame(
            {"rowId": tables.row_id, "stratumId": tables.stratum_id, "time": tables.time, "y": tables.y}
        ),
        "covariates_dataset_id": pd.DataFrame(
            {"rowId": tables.cov_row_id, "covariateId": tables.cov_id, "covariateValue": tables.cov_value}
        ),
    }
    if names:
        ids = np.arange(1, n_drugs + 1)
        frames["names_dataset_id"] = pd.DataFrame({"covariateId": ids, "covariateName": [f"drug {i}" for i in ids]})
    return frames


def _example_fit_tables() -> dict[str, pd.DataFrame]:
    return cyclops_frames(n_cases=3_000, n_drugs=40, seed=5, names=True)


def _example_person_tables() -> dict[str, pd.DataFrame]:
    """400 cases observed for 1-2 years, 1-4 events each, 1,200 exposures of 25 drugs (seeded, deterministic)."""
    generator = np.random.default_rng(2013)
    n_cases, n_exposures = 400, 1_200
    case_id = np.arange(1, n_cases + 1)
    observation_end = generator.integers(365, 731, n_cases)
    events_per_case = generator.integers(1, 5, n_cases)
    event_case = np.repeat(case_id, events_per_case)
    exposure_start = generator.integers(0, 700, n_exposures)
    return {
        "cases_dataset_id": pd.DataFrame({"caseId": case_id, "observationStart": np.zeros(n_cases, dtype=np.int64),
                                          "observationEnd": observation_end}),
        "events_dataset_id": pd.DataFrame({"caseId": event_case,
                                           "day": generator.integers(0, 731, event_case.size)}),
        "exposures_dataset_id": pd.DataFrame({"caseId": generator.integers(1, n_cases + 1, n_exposures),
                                              "drugId": generator.integers(1, 26, n_exposures),
                                              "start": exposure_start,
                                              "end": exposure_start + generator.integers(0, 60, n_exposures)}),
    }


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


def _example_analyses_params() -> dict:
    """The sccs_analyses example: the fit example's tables, every drug alone, drugs 11-30 as negative controls."""
    return {"outcomes_dataset_id": "<outcomes dataset id>", "covariates_dataset_id": "<covariates dataset id>",
            "names_dataset_id": "<names dataset id>", "negative_controls": list(range(11, 31)), "level": 0.95}


KINDS = [
    JobKind(
        name="sccs_fit",
        params_model=SccsParams,
        result_model=SccsResult,
        run=run_fit,
        dataset_fields=("outcomes_dataset_id", "covariates_dataset_id", "names_dataset_id", "cases_dataset_id",
                        "events_dataset_id"),
        summary="Bayesian self-controlled case series (Cyclops tables): CCD MAP fit, CV of the prior variance, "
        "bootstrap and profile-likelihood intervals, SCCS diagnostics, empirical calibration from control covariates",
        example=KindExample(
            {
                "outcomes_dataset_id": "<outcomes dataset id>",
                "covariates_dataset_id": "<covariates dataset id>",
                "names_dataset_id": "<names dataset id>",
                "prior": {"type": "laplace", "variance": 0.5, "exclude": []},
                "cross_validation": {"folds": 5, "grid": [0.01, 0.1, 1.0], "seed": 1},
                "bootstrap": {"replicates": 20, "seed": 2},
            },
            datasets=_example_fit_tables,
        ),
    ),
    JobKind(
        name="sccs_analyses",
        params_model=SccsAnalysesParams,
        result_model=SccsAnalysesResult,
        run=run_analyses,
        dataset_fields=("outcomes_dataset_id", "covariates_dataset_id", "names_dataset_id"),
        summary="Many SCCS analyses of one or several outcomes' tables (each exposure-outcome pair alone, one batch "
        "on the GPU): conditional MLE, likelihood-ratio intervals and p-values, MDRR, empirical calibration from "
        "controls",
        example=KindExample(_example_analyses_params(), datasets=_example_fit_tables),
    ),
    JobKind(
        name="sccs_eras",
        params_model=SccsErasParams,
        result_model=SccsErasResult,
        run=run_eras,
        dataset_fields=("cases_dataset_id", "events_dataset_id", "exposures_dataset_id"),
        summary="Person-level observation periods, events and exposures → the SCCS interval tables "
        "(outcomes, covariates, names) as artifacts, ready for sccs_fit: several exposures with their own risk "
        "windows, age and observation-time restrictions, age, season and calendar-time splines",
        example=KindExample(
            {
                "cases_dataset_id": "<cases dataset id>",
                "events_dataset_id": "<events dataset id>",
                "exposures_dataset_id": "<exposures dataset id>",
                "risk_window_start": 1,
                "start_anchor": "exposure_start",
                "risk_window_end": 30,
                "end_anchor": "exposure_start",
            },
            datasets=_example_person_tables,
        ),
        host_only=True,
    ),
]
