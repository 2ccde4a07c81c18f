"""Parameters and results of the ``sccs_fit`` and ``sccs_eras`` job kinds (``docs/sccs.md``)."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from kernels.sccs import ANALYSES_KIND, ERAS_KIND, FIT_KIND
from kernels.spec import JobParams, ResultModel, ResultPart

DEFAULT_CV_SEED = 20130411
DEFAULT_BOOTSTRAP_SEED = 20130412


# The columns each table must have (as the runners read them: kernels/sccs/tables.py); checked at submission
# against the stored datasets' schemas, so a missing column is a 422 naming the field, not a failed job.
FIT_COLUMNS = {
    "outcomes_dataset_id": ("rowId", "stratumId", "time", "y"),
    "covariates_dataset_id": ("rowId", "covariateId"),  # covariateValue is optional (default 1)
    "names_dataset_id": ("covariateId", "covariateName"),
    # the person-level tables of the time-stability diagnostic (optional; as sccs_eras reads them)
    "cases_dataset_id": ("caseId", "observationStart", "observationEnd"),
    "events_dataset_id": ("caseId", "day"),
}
OUTCOME_COLUMN = "outcomeId"  # stacked tables of several outcomes (kernels/sccs/outcomes.py)
AGE_COLUMN = "ageAtObsStart"  # days of age at observationStart, as SelfControlledCaseSeries' cases table
ERAS_COLUMNS = {
    "cases_dataset_id": ("caseId", "observationStart", "observationEnd"),
    "events_dataset_id": ("caseId", "day"),
    "exposures_dataset_id": ("caseId", "drugId", "start", "end"),
}


def missing_columns(required: Mapping[str, tuple[str, ...]],
                    columns: Mapping[str, Collection[str]]) -> list[tuple[str, str]]:
    """(dataset field, message) for each stored dataset that lacks a column its table needs."""
    problems = []
    for field, have in columns.items():
        lacking = [name for name in required.get(field, ()) if name not in have]
        if lacking:
            problems.append((field, f"the dataset lacks column(s) {', '.join(map(repr, lacking))} "
                                    f"(needs {', '.join(required[field])}; has {', '.join(list(have)[:10])})"))
    return problems


class _Section(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


class PriorSpec(_Section):
    type: Literal["normal", "laplace", "none"] = Field(
        default="laplace", description="normal N(0, variance), laplace with that variance, or none (the MLE)"
    )
    variance: float = Field(
        default=1.0, gt=0.0, le=1e6, description="sigma^2 (Cyclops' parametrisation); the CV choice overrides it"
    )
    exclude: list[int] = Field(
        default_factory=list, max_length=100_000, description="covariateIds left out of the prior (unpenalised)"
    )


class CrossValidationSpec(_Section):
    folds: int = Field(default=10, ge=2, le=100, description="K-fold by case")
    grid: list[Annotated[float, Field(gt=0.0, le=1e6)]] | Literal["auto"] = Field(
        default="auto",
        min_length=1,
        max_length=100,
        description="variances to try, or auto: 10 log-spaced from 0.01 to 20 (Cyclops' default grid)",
    )
    seed: int = Field(default=DEFAULT_CV_SEED, ge=0, le=2**63 - 1, description="Philox key of the fold split")

    def variances(self) -> list[float]:
        from kernels.sccs.cv import DEFAULT_GRID

        return list(DEFAULT_GRID) if self.grid == "auto" else list(self.grid)


class BootstrapSpec(_Section):
    replicates: int = Field(default=200, ge=2, le=10_000, description="B case resamples")
    seed: int = Field(default=DEFAULT_BOOTSTRAP_SEED, ge=0, le=2**63 - 1, description="Philox key of the resamples")


class ProfileSpec(_Section):
    covariates: list[int] | None = Field(
        default=None, min_length=1, max_length=1000,
        description="covariateIds to profile (default: every covariate of the fit but the age, season and "
        "calendar-time spline components, covariateIds 100-399 as sccs_eras writes them; all of them when every "
        "covariateId lies in 100-399)",
    )
    level: float = Field(default=0.95, gt=0.5, lt=1.0, description="confidence level of the intervals")


class PositiveControl(_Section):
    covariate_id: int = Field(ge=-(2**63), le=2**63 - 1)
    true_relative_risk: float = Field(gt=0.0, le=1e6, description="the effect the control is known to have (not 1)")


class CalibrationSpec(_Section):
    """Empirical calibration (EmpiricalCalibration's fitNull / calibrateP / calibrateConfidenceInterval) of every
    profiled covariate, from the profile intervals of the controls (``kernels/sccs/calibration.py``)."""

    negative_controls: list[int] = Field(
        min_length=2, max_length=10_000, description="covariateIds known to have no effect on the outcome",
    )
    positive_controls: list[PositiveControl] = Field(
        default_factory=list, max_length=10_000,
        description="covariateIds of known effect: with them the systematic-error model's mean and sd depend on "
        "the true effect (fitSystematicErrorModel); without, the null's error is the same at every effect",
    )

    @model_validator(mode="after")
    def _controls_distinct(self) -> CalibrationSpec:
        positives = [control.covariate_id for control in self.positive_controls]
        for name, ids in (("negative_controls", self.negative_controls), ("positive_controls", positives)):
            if len(set(ids)) != len(ids):
                raise ValueError(f"calibration.{name} lists a covariateId twice")
        both = sorted(set(self.negative_controls) & set(positives))
        if both:
            raise ValueError(f"calibration: covariateId {both[0]} is both a negative and a positive control")
        if any(control.true_relative_risk == 1.0 for control in self.positive_controls):
            raise ValueError("calibration.positive_controls: a true_relative_risk of 1 is a negative control")
        return self


NullBounds = Annotated[list[Annotated[float, Field(gt=0.0, le=1e6)]], Field(min_length=2, max_length=2)]


class DiagnosticsSpec(_Section):
    """SelfControlledCaseSeries 6.x diagnostics (``kernels/sccs/diagnostics.py``, ``docs/sccs.md``)."""

    mdrr_alpha: float = Field(default=0.05, gt=0.0, lt=0.5, description="type I error of the MDRR's test")
    mdrr_power: float = Field(default=0.8, ge=0.1, lt=1.0, description="power at the minimum detectable RR")
    mdrr_two_sided: bool = Field(default=True, description="MDRR of a two-sided test (alpha halved)")
    mdrr_threshold: float = Field(default=10.0, gt=1.0, le=1e6, description="an MDRR above this does not pass")
    pre_exposure_covariates: list[int] = Field(
        default_factory=list, max_length=1000,
        description="covariateIds that are pre-exposure windows (event-exposure independence check)",
    )
    pre_exposure_null_bounds: NullBounds = Field(
        default_factory=lambda: [0.8, 1.25], description="relative-incidence bounds the window's 95% interval must meet"
    )
    end_of_observation_covariate: int | None = Field(
        default=None, ge=-(2**63), le=2**63 - 1,
        description="covariateId of a probe window ending each observation period (event-observation independence "
        "check), e.g. its last 30 days",
    )
    end_of_observation_null_bounds: NullBounds = Field(
        default_factory=lambda: [0.5, 2.0], description="relative-incidence bounds the probe's 95% interval must meet"
    )
    time_stability_max_ratio: float = Field(
        default=1.10, ge=1.0, le=10.0, description="largest mean observed/expected ratio per month that is stable"
    )
    time_stability_alpha: float = Field(default=0.05, gt=0.0, lt=1.0, description="level of the stability test")

    @model_validator(mode="after")
    def _bounds_in_order(self) -> DiagnosticsSpec:
        for name in ("pre_exposure_null_bounds", "end_of_observation_null_bounds"):
            low, high = getattr(self, name)
            if not low <= 1.0 <= high:
                raise ValueError(f"{name} must hold 1 between its lower and upper bound, got [{low}, {high}]")
        if len(set(self.pre_exposure_covariates)) != len(self.pre_exposure_covariates):
            raise ValueError("diagnostics.pre_exposure_covariates lists a covariateId twice")
        if self.end_of_observation_covariate in self.pre_exposure_covariates:
            raise ValueError("diagnostics: the end_of_observation_covariate is also a pre-exposure covariate")
        return self


class SccsParams(JobParams):
    outcomes_dataset_id: str = Field(
        min_length=1, max_length=100, description="table rowId, stratumId (case), time (days), y (events); "
        "optionally outcomeId (several outcomes' eras stacked, as sccs_eras writes them: choose one by outcome_id)"
    )
    outcome_id: int | None = Field(
        default=None, ge=-(2**63), le=2**63 - 1,
        description="the outcome to fit of stacked tables (outcomeId); needed when they hold several",
    )
    covariates_dataset_id: str = Field(
        min_length=1, max_length=100, description="table rowId, covariateId, covariateValue (optional, default 1)"
    )
    names_dataset_id: str | None = Field(
        default=None, min_length=1, max_length=100, description="optional table covariateId, covariateName"
    )
    prior: PriorSpec = Field(default_factory=PriorSpec)
    cross_validation: CrossValidationSpec | None = Field(default=None, description="choose the variance by CV")
    bootstrap: BootstrapSpec | None = Field(default=None, description="percentile intervals by case resampling")
    diagnostics: DiagnosticsSpec | None = Field(
        default_factory=DiagnosticsSpec, description="SCCS diagnostics (default on: the MDRR of every covariate; "
        "the window checks when their covariates are named; time stability when the person-level tables are "
        "given); null: none",
    )
    cases_dataset_id: str | None = Field(
        default=None, min_length=1, max_length=100,
        description="optional person-level table caseId, observationStart, observationEnd (days or dates) for "
        "the time-stability diagnostic, with events_dataset_id",
    )
    events_dataset_id: str | None = Field(
        default=None, min_length=1, max_length=100,
        description="optional table caseId, day (one row per event) for the time-stability diagnostic",
    )
    calibration: CalibrationSpec | None = Field(
        default=None, description="empirical calibration of the profiled covariates' p-values and intervals from "
        "negative (and positive) control covariates; needs profile, whose intervals give the standard errors",
    )
    profile: ProfileSpec | None = Field(
        default=None, description="profile-likelihood intervals (Cyclops's profile confint) of the posterior "
        "the fit maximises; on the host, one constrained CCD refit per evaluation (docs/sccs.md)",
    )
    tolerance: float = Field(default=5e-4, gt=0.0, le=1.0, description="convergence tolerance")
    max_iterations: int = Field(default=1000, ge=1, le=100_000, description="cycles over all coordinates")
    convergence: Literal["xbeta", "gradient"] = Field(
        default="xbeta",
        description="xbeta: relative change of X b per cycle (the paper's); gradient: max KKT residual",
    )
    precision: Literal["float64", "float32"] = Field(
        default="float64", description="dtype of the per-era state (reductions accumulate in float64)"
    )
    precondition: Literal["none", "splines"] = Field(
        default="none",
        description="splines: CV, the final fit and the bootstrap run in whitened coordinates of the dense "
        "unpenalised columns (age, season and calendar-time splines): the same likelihood and posterior, a few CCD "
        "cycles per fit instead of tens; every number is reported in the original coordinates (docs/sccs.md). "
        "none: the original coordinates throughout (as jobs stored before this option ran)",
    )

    @model_validator(mode="after")
    def _calibration_needs_profiled_controls(self) -> SccsParams:
        if self.calibration is None:
            return self
        if self.profile is None:
            raise ValueError("calibration needs profile: the controls' standard errors come from their profile "
                             "intervals")
        if self.profile.covariates is not None:
            controls = [*self.calibration.negative_controls,
                        *(control.covariate_id for control in self.calibration.positive_controls)]
            missing = [c for c in controls if c not in set(self.profile.covariates)]
            if missing:
                raise ValueError(f"calibration: control covariateId {missing[0]} is not in profile.covariates")
        return self

    @model_validator(mode="after")
    def _person_tables_together(self) -> SccsParams:
        if (self.cases_dataset_id is None) != (self.events_dataset_id is None):
            missing = "events_dataset_id" if self.events_dataset_id is None else "cases_dataset_id"
            raise ValueError(f"{missing} is needed too: the time-stability diagnostic reads both person-level tables")
        return self

    def dataset_column_problems(self, columns: Mapping[str, Collection[str]]) -> list[tuple[str, str]]:
        problems = missing_columns(FIT_COLUMNS, columns)
        if self.outcome_id is not None and OUTCOME_COLUMN not in columns.get("outcomes_dataset_id", (OUTCOME_COLUMN,)):
            problems.append(("outcomes_dataset_id", f"outcome_id needs an {OUTCOME_COLUMN} column in the outcomes "
                             "table (it holds one outcome)"))
        return problems


class Coefficient(ResultPart):
    covariate_id: int
    name: str | None
    estimate: float = Field(description="log relative incidence (MAP)")
    relative_incidence: float = Field(description="exp(estimate)")
    ci_lower: float | None = Field(
        default=None, description="log scale: 2.5% bootstrap percentile of the estimate (the log relative incidence)"
    )
    ci_upper: float | None = Field(default=None, description="log scale: 97.5% bootstrap percentile of the estimate")
    relative_incidence_ci_lower: float | None = Field(
        default=None, description="relative-incidence scale: exp(ci_lower), the 95% interval's lower end"
    )
    relative_incidence_ci_upper: float | None = Field(
        default=None, description="relative-incidence scale: exp(ci_upper)"
    )
    nonzero_share: float | None = Field(default=None, description="share of bootstrap replicates with b != 0 (L1)")
    profile_ci_lower: float | None = Field(
        default=None, description="log scale: lower end of the profile-likelihood interval (null: not profiled, "
        "or the profile does not fall to the threshold on that side: an open interval)",
    )
    profile_ci_upper: float | None = Field(default=None, description="log scale: upper end (as profile_ci_lower)")
    relative_incidence_profile_ci_lower: float | None = Field(
        default=None, description="relative-incidence scale: exp(profile_ci_lower)"
    )
    relative_incidence_profile_ci_upper: float | None = Field(
        default=None, description="relative-incidence scale: exp(profile_ci_upper)"
    )
    calibrated_p: float | None = Field(
        default=None, description="two-sided p-value calibrated by the negative controls' null (null: not "
        "calibrated, or the profile interval is open)",
    )
    calibrated_estimate: float | None = Field(
        default=None, description="log scale: the estimate with the systematic error removed",
    )
    calibrated_ci_lower: float | None = Field(
        default=None, description="log scale: calibrated interval at profile.level (EmpiricalCalibration)",
    )
    calibrated_ci_upper: float | None = Field(default=None, description="log scale: calibrated interval's upper end")
    relative_incidence_calibrated_ci_lower: float | None = Field(
        default=None, description="relative-incidence scale: exp(calibrated_ci_lower)"
    )
    relative_incidence_calibrated_ci_upper: float | None = Field(
        default=None, description="relative-incidence scale: exp(calibrated_ci_upper)"
    )


class CvPoint(ResultPart):
    variance: float
    predictive_log_likelihood: float = Field(description="mean over folds of the held-out log-likelihood")
    fold_predictive_log_likelihood: list[float]
    fold_iterations: list[int] = Field(description="CCD cycles of each fold's training fit")
    non_converged_folds: int = Field(description="training fits that stopped at max_iterations without converging")


class MdrrRow(ResultPart):
    covariate_id: int
    mdrr: float | None = Field(description="relative-incidence scale: minimum detectable relative risk (SRL1, "
                               "Musonda 2006); null: not reached by RR e^10, or nothing to compare")
    exposed_cases: int = Field(description="cases with the covariate in some era")
    events: float = Field(description="events of the exposed cases (n)")
    time_exposed: float = Field(description="days of the eras with the covariate")
    time_total: float = Field(description="observed days of the exposed cases (r = time_exposed / time_total)")
    passed: bool = Field(description="mdrr <= diagnostics.mdrr_threshold")


class WindowCheck(ResultPart):
    covariate_id: int
    ratio: float = Field(description="relative-incidence scale: exp(estimate) of the window")
    ci_lower: float | None = Field(description="relative-incidence scale: 95% profile-likelihood interval's lower "
                                   "end (null: open)")
    ci_upper: float | None = Field(description="relative-incidence scale: upper end (null: open)")
    null_bounds: list[float] = Field(description="relative-incidence scale: the bounds of the null")
    passed: bool = Field(description="the interval meets the null bounds (ci_lower <= upper bound and ci_upper >= "
                         "lower bound)")


class TimeStabilityCheck(ResultPart):
    ratio: float | None = Field(description="mean observed/expected ratio per month (x >= 1 of the mixture "
                                "likelihood); null with fewer than two months")
    p: float = Field(description="one-sided p-value of H0: ratio <= max_ratio")
    passed: bool = Field(description="p > time_stability_alpha")
    max_ratio: float
    months: int = Field(description="calendar months from the first observed to the last")
    events: int = Field(description="events inside the observation periods (the observed total)")


class SccsDiagnostics(ResultPart):
    mdrr: list[MdrrRow] = Field(description="per covariate, in the order of coefficients")
    pre_exposure: list[WindowCheck] = Field(description="event-exposure independence, per pre-exposure window")
    end_of_observation: WindowCheck | None = Field(description="event-observation independence (the probe window)")
    time_stability: TimeStabilityCheck | None = Field(description="outcome rate stable over calendar time")


class CalibrationSummary(ResultPart):
    null_mean: float = Field(description="log scale: mean of the systematic error (fitNull's mean)")
    null_sd: float = Field(description="log scale: its standard deviation (fitNull's sd)")
    negative_controls: int = Field(description="negative controls with a closed profile interval (the null's data)")
    positive_controls: int = Field(description="positive controls with a closed profile interval")
    error_model: list[float] = Field(
        description="the systematic-error model the intervals use: mean intercept, mean slope, log-sd intercept, "
        "log-sd slope (log sd -inf: no systematic error)",
    )
    level: float = Field(description="the level of the calibrated intervals (profile.level)")


class SccsResult(ResultModel):
    kind: Literal[FIT_KIND] = FIT_KIND  # type: ignore[valid-type]
    coefficients: list[Coefficient]
    log_likelihood: float = Field(description="conditional Poisson log-likelihood (without the multinomial constant)")
    log_posterior: float = Field(description="log_likelihood + log prior density (with its normalising constants)")
    variance: float | None = Field(description="prior variance of the final fit (CV choice if cross-validated)")
    cv_curve: list[CvPoint] | None
    iterations: int
    converged: bool
    gradient_norm: float = Field(description="max |KKT residual| of the log-posterior at the estimate")
    convergence_criterion: float
    prior_type: str
    precision: str
    n_cases: int
    n_eras: int
    n_covariates: int
    nonzero_coefficients: int
    dropped_cases: int = Field(description="cases without events (no likelihood contribution), dropped")
    cv_folds: int | None
    cv_seed: int | None
    bootstrap_replicates: int | None
    bootstrap_seed: int | None
    bootstrap_converged: int | None = Field(description="bootstrap refits that met the tolerance")
    diagnostics: SccsDiagnostics | None = Field(default=None, description="SCCS assumption checks (docs/sccs.md)")
    calibration: CalibrationSummary | None = Field(default=None, description="empirical calibration's null and model")


AnchorName = Literal["exposure_start", "exposure_end"]
# covariateIds SelfControlledCaseSeries gives the spline components (age 100.., season 200.., calendar time 300..).
RESERVED_COVARIATE_IDS = range(100, 400)


class EraWindowSpec(_Section):
    """One risk window of an exposure (SelfControlledCaseSeries' ``createEraCovariateSettings``):
    ``[start_anchor + start, end_anchor + end]``, inclusive days, anchored on the exposure era's start or end."""

    label: str | None = Field(default=None, min_length=1, max_length=100,
                              description="e.g. 'pre-exposure', 'risk', 'washout' (default: the offsets)")
    start: int = Field(default=0, ge=-36_500, le=36_500, description="days added to start_anchor")
    start_anchor: AnchorName = Field(default="exposure_start", description="SCCS' startAnchor ('era start')")
    end: int = Field(default=0, ge=-36_500, le=36_500, description="days added to end_anchor")
    end_anchor: AnchorName = Field(default="exposure_end", description="SCCS' endAnchor ('era end')")
    covariate_id: int | None = Field(
        default=None, ge=1, le=2**53, description="its covariateId (default: 1000, 1001, ... in the order given; "
        "100-399 are the splines')",
    )

    def offsets(self, exposure_days: int) -> tuple[int, int]:
        """First and last day relative to the exposure start, for an exposure era of ``exposure_days`` + 1 days."""
        first = self.start + (exposure_days if self.start_anchor == "exposure_end" else 0)
        last = self.end + (exposure_days if self.end_anchor == "exposure_end" else 0)
        return first, last

    def describe(self) -> str:
        return self.label or (f"days {self.start:+d} from exposure {self.start_anchor.split('_')[1]} to "
                              f"{self.end:+d} from exposure {self.end_anchor.split('_')[1]}")


def _overlap_length(first: EraWindowSpec, second: EraWindowSpec) -> int | None:
    """The shortest exposure era (days from start to end) at which the two windows share a day, or None.

    Each end is ``offset + (exposure_days if anchored at the end)``, so the two windows are non-empty and
    overlap exactly where four linear inequalities in the exposure length d >= 0 hold: an interval of d."""
    low, high = 0, 10**9
    for a, b in ((first, first), (second, second), (first, second), (second, first)):
        # a's start <= b's end: (b.end - a.start) + d (b_end_at_end - a_start_at_end) >= 0
        constant = b.end - a.start
        slope = (b.end_anchor == "exposure_end") - (a.start_anchor == "exposure_end")
        if slope == 0 and constant < 0:
            return None
        if slope > 0:
            low = max(low, -constant)
        elif slope < 0:
            high = min(high, constant)
    return low if low <= high else None


class EraExposureSpec(_Section):
    """An exposure: the exposure rows of any of ``drug_ids`` merged into eras (rows that overlap or touch form one
    era), each era putting the case in each of the windows."""

    label: str | None = Field(default=None, min_length=1, max_length=100, description="names its covariates")
    drug_ids: list[int] = Field(min_length=1, max_length=10_000, description="drugIds of the exposures table")
    windows: list[EraWindowSpec] = Field(
        default_factory=lambda: [EraWindowSpec()], min_length=1, max_length=20,
        description="its risk windows, each its own covariate; they must not overlap",
    )
    first_occurrence_only: bool = Field(default=False, description="only each case's first era of this exposure")

    @field_validator("windows")
    @classmethod
    def _windows_apart(cls, windows: list[EraWindowSpec]) -> list[EraWindowSpec]:
        for i, window in enumerate(windows):
            if window.end_anchor == window.start_anchor and window.end < window.start:
                raise ValueError(f"window {i} is always empty: end {window.end} precedes start {window.start} "
                                 f"on the same anchor ({window.start_anchor})")
            if window.start_anchor == "exposure_end" and window.end_anchor == "exposure_start" and (
                    window.end < window.start):
                raise ValueError(f"window {i} is always empty: it starts at exposure end {window.start:+d} and ends "
                                 f"at exposure start {window.end:+d}")
            for j in range(i):
                days = _overlap_length(windows[j], window)
                if days is not None:
                    raise ValueError(f"windows {j} and {i} of one exposure overlap (for exposure eras of "
                                     f"{days + 1} day(s) and others): give them disjoint offsets")
        return windows

    def describe(self) -> str:
        return self.label or "drug" + ("s " if len(self.drug_ids) > 1 else " ") + ", ".join(
            map(str, self.drug_ids[:5])) + (", ..." if len(self.drug_ids) > 5 else "")


class StudyPopulationSpec(_Section):
    """Restrictions of the observation periods (SelfControlledCaseSeries' ``createStudyPopulation``)."""

    min_age_years: float | None = Field(default=None, ge=0.0, le=150.0,
                                        description="keep days from this age (age >= years * 365.25 days)")
    max_age_years: float | None = Field(default=None, ge=0.0, le=150.0,
                                        description="keep days up to this age (age <= round((years + 1) * 365.25) - 1 "
                                        "days)")
    min_observation_days: int = Field(default=0, ge=0, le=36_500,
                                      description="remove cases observed fewer days (after the age restriction)")

    @model_validator(mode="after")
    def _ages_in_order(self) -> StudyPopulationSpec:
        if self.min_age_years is not None and self.max_age_years is not None and (
                self.max_age_years < self.min_age_years):
            raise ValueError(f"max_age_years {self.max_age_years} is below min_age_years {self.min_age_years}")
        return self


def _increasing(name: str, knots: list) -> None:
    if any(b <= a for a, b in itertools.pairwise(knots)):
        raise ValueError(f"{name} must be strictly increasing")


class AgeSplineSpec(_Section):
    """Age as a spline (SelfControlledCaseSeries' ``createAgeCovariateSettings``): a B-spline of ``degree`` (2:
    quadratic, as SCCS) in days of age, constant within each calendar month; covariateIds 100, 101, ..."""

    knots: Annotated[int, Field(ge=2, le=50)] | Annotated[list[Annotated[float, Field(ge=0, le=60_000)]], Field(
        min_length=2, max_length=50)] = Field(
        default=5, description="knot ages in days (the first and last are the boundary knots), or a count placed "
        "at quantiles 1%..99% of the ages at the events",
    )
    degree: int = Field(default=2, ge=1, le=3)

    @field_validator("knots")
    @classmethod
    def _knots_increasing(cls, knots: int | list[float]) -> int | list[float]:
        if isinstance(knots, list):
            _increasing("age knots", knots)
        return knots


class SeasonSplineSpec(_Section):
    """Season as a cyclic spline (``createSeasonalityCovariateSettings``; mgcv's ``cSplineDes``) over the months
    of the year; the first component is the reference (covariateIds 201, 202, ...)."""

    knots: Annotated[int, Field(ge=3, le=25)] | Annotated[list[Annotated[float, Field(ge=-12, le=25)]], Field(
        min_length=3, max_length=25)] = Field(
        default=5, description="knots in months (month m of the year sits at m = 1..12); the last must be the "
        "first + 12 (one cycle); or a count spread evenly from 0.5 to 12.5",
    )
    degree: int = Field(default=2, ge=1, le=3)

    @model_validator(mode="after")
    def _one_cycle(self) -> SeasonSplineSpec:
        if isinstance(self.knots, list):
            _increasing("season knots", self.knots)
            if self.knots[-1] - self.knots[0] != 12:
                raise ValueError(f"season knots must span one year: the last ({self.knots[-1]}) must be the first "
                                 f"({self.knots[0]}) + 12")
        count = self.knots if isinstance(self.knots, int) else len(self.knots)
        if count < self.degree + 2:
            raise ValueError(f"a cyclic spline of degree {self.degree} needs at least {self.degree + 2} knots")
        return self


_MONTH_PATTERN = r"^\d{4}-(0[1-9]|1[0-2])(-\d{2})?$"


class CalendarTimeSplineSpec(_Section):
    """Calendar time as a spline (``createCalendarTimeCovariateSettings``): a B-spline in calendar months,
    constant within each month; covariateIds 300, 301, ..."""

    knots: Annotated[int, Field(ge=2, le=50)] | Annotated[list[Annotated[str, Field(pattern=_MONTH_PATTERN)]], Field(
        min_length=2, max_length=50)] = Field(
        default=5, description="knot months as YYYY-MM (or dates YYYY-MM-DD, the day ignored), or a count placed "
        "where the observed person-months pass 0.5%..99.5% of their total",
    )
    degree: int = Field(default=2, ge=1, le=3)

    @field_validator("knots")
    @classmethod
    def _knots_increasing(cls, knots: int | list[str]) -> int | list[str]:
        if isinstance(knots, list):
            _increasing("calendar_time knots", [cls.month_number(k) for k in knots])
        return knots

    @staticmethod
    def month_number(text: str) -> int:
        """SelfControlledCaseSeries' month number: year * 12 + month - 1."""
        return int(text[:4]) * 12 + int(text[5:7]) - 1


class AnalysisPair(_Section):
    """One exposure-outcome pair of stacked tables (``outcomeId``); without ``outcome_id``: the exposure with
    every outcome (or the one outcome of tables without ``outcomeId``)."""

    covariate_id: int = Field(ge=-(2**63), le=2**63 - 1)
    outcome_id: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)

    def matches(self, covariate_id: int, outcome_id: int | None) -> bool:
        return self.covariate_id == covariate_id and (self.outcome_id is None or self.outcome_id == outcome_id)

    def key(self) -> tuple[int, int | None]:
        return self.covariate_id, self.outcome_id


class AnalysesPositiveControl(PositiveControl):
    outcome_id: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1,
                                   description="the outcome of the pair (stacked tables); null: every outcome")


class SccsAnalysesParams(JobParams):
    """Many single-exposure analyses of one or several outcomes' interval tables (one era build per outcome),
    fitted as one batch, with empirical calibration from the negative (and positive) controls among them
    (``kernels/sccs/analyses.py``; several outcomes: ``kernels/sccs/outcomes.py``)."""

    outcomes_dataset_id: str = Field(
        min_length=1, max_length=100, description="table rowId, stratumId (case), time (days), y (events), and "
        "optionally outcomeId: the eras of several outcomes stacked (as sccs_eras writes them), a stratum being "
        "(outcomeId, stratumId)",
    )
    covariates_dataset_id: str = Field(
        min_length=1, max_length=100, description="table rowId, covariateId, covariateValue (optional, default 1)"
    )
    names_dataset_id: str | None = Field(
        default=None, min_length=1, max_length=100, description="optional table covariateId, covariateName"
    )
    exposures: list[int] | None = Field(
        default=None, min_length=1, max_length=100_000,
        description="covariateIds to analyse, each alone, against every outcome (default: every covariate of the "
        "tables); with outcomeId, only the pairs the tables hold",
    )
    outcome_ids: list[int] | None = Field(
        default=None, min_length=1, max_length=10_000,
        description="outcomeIds to analyse (default: every outcome of the tables); needs outcomeId in the tables",
    )
    pairs: list[AnalysisPair] | None = Field(
        default=None, min_length=1, max_length=100_000,
        description="the exposure-outcome pairs to analyse, instead of exposures x outcome_ids",
    )
    negative_controls: list[int | AnalysisPair] = Field(
        default_factory=list, max_length=100_000,
        description="analysed pairs known to have no effect: a covariateId (with every outcome) or "
        "{covariate_id, outcome_id}; with at least 2 analyses among them, every analysis is calibrated",
    )
    positive_controls: list[AnalysesPositiveControl] = Field(
        default_factory=list, max_length=100_000,
        description="analysed pairs of known effect (fitSystematicErrorModel); needs negative controls",
    )
    level: float = Field(default=0.95, gt=0.5, lt=1.0, description="level of the likelihood-ratio intervals")

    def negative_pairs(self) -> list[AnalysisPair]:
        return [item if isinstance(item, AnalysisPair) else AnalysisPair(covariate_id=item)
                for item in self.negative_controls]

    @model_validator(mode="after")
    def _controls_are_analysed(self) -> SccsAnalysesParams:
        if self.pairs is not None and (self.exposures is not None or self.outcome_ids is not None):
            raise ValueError("pairs: give the pairs, or exposures and outcome_ids, not both")
        negatives = [pair.key() for pair in self.negative_pairs()]
        positives = [(control.covariate_id, control.outcome_id) for control in self.positive_controls]
        for name, keys in (("negative_controls", negatives), ("positive_controls", positives)):
            if len(set(keys)) != len(keys):
                raise ValueError(f"{name} lists a pair twice")
            if self.exposures is not None:
                missing = sorted({covariate for covariate, _ in keys} - set(self.exposures))
                if missing:
                    raise ValueError(f"{name}: covariateId {missing[0]} is not among the exposures")
        if self.exposures is not None and len(set(self.exposures)) != len(self.exposures):
            raise ValueError("exposures lists a covariateId twice")
        if self.outcome_ids is not None and len(set(self.outcome_ids)) != len(self.outcome_ids):
            raise ValueError("outcome_ids lists an outcomeId twice")
        if self.pairs is not None and len({pair.key() for pair in self.pairs}) != len(self.pairs):
            raise ValueError("pairs lists a pair twice")
        both = sorted(set(negatives) & set(positives), key=str)
        if both:
            raise ValueError(f"covariateId {both[0][0]} is both a negative and a positive control")
        if len(self.negative_controls) == 1:
            raise ValueError("negative_controls: the null needs at least 2 (or none: no calibration)")
        if positives and not self.negative_controls:
            raise ValueError("positive_controls need negative_controls (the null is fitted to those)")
        if any(control.true_relative_risk == 1.0 for control in self.positive_controls):
            raise ValueError("positive_controls: a true_relative_risk of 1 is a negative control")
        return self

    def dataset_column_problems(self, columns: Mapping[str, Collection[str]]) -> list[tuple[str, str]]:
        problems = missing_columns(FIT_COLUMNS, columns)
        wants_outcomes = self.outcome_ids is not None or any(
            item.outcome_id is not None for item in [*(self.pairs or []), *self.negative_pairs(),
                                                     *self.positive_controls])
        if wants_outcomes and OUTCOME_COLUMN not in columns.get("outcomes_dataset_id", (OUTCOME_COLUMN,)):
            problems.append(("outcomes_dataset_id", f"outcome_ids and outcome_id need an {OUTCOME_COLUMN} column in "
                             "the outcomes table (it holds one outcome)"))
        return problems


class AnalysisRow(ResultPart):
    covariate_id: int
    outcome_id: int | None = Field(default=None, description="the pair's outcome (null: tables of one outcome "
                                   "without outcomeId)")
    name: str | None
    control: Literal["negative", "positive"] | None = Field(description="a control of the calibration, or not")
    true_relative_risk: float | None = Field(description="a positive control's known effect")
    estimate: float | None = Field(description="log scale: the conditional MLE of the exposure alone (null: "
                                   "infinite, e.g. no events while exposed)")
    relative_incidence: float | None = Field(description="exp(estimate); 0 or null (infinite) when estimate is")
    ci_lower: float | None = Field(description="log scale: likelihood-ratio interval at level (null: open)")
    ci_upper: float | None = Field(description="log scale: its upper end (null: open)")
    relative_incidence_ci_lower: float | None = Field(description="relative-incidence scale: exp(ci_lower)")
    relative_incidence_ci_upper: float | None = Field(description="relative-incidence scale: exp(ci_upper)")
    p: float = Field(description="two-sided likelihood-ratio test of relative incidence 1")
    log_likelihood_ratio: float = Field(description="log-likelihood at the estimate minus at 0")
    exposed_cases: int = Field(description="cases with the exposure in some era (with events)")
    events: float = Field(description="events of the exposed cases")
    mdrr: float | None = Field(description="relative-incidence scale: minimum detectable relative risk (SRL1, "
                               "alpha 0.05 two-sided, power 0.8); null: not reached")
    calibrated_p: float | None = Field(default=None, description="two-sided p calibrated by the null (null: not "
                                       "calibrated, or an open interval)")
    calibrated_estimate: float | None = Field(default=None, description="log scale: estimate less systematic error")
    calibrated_ci_lower: float | None = Field(default=None, description="log scale: calibrated interval at level")
    calibrated_ci_upper: float | None = Field(default=None, description="log scale: its upper end")
    relative_incidence_calibrated_ci_lower: float | None = Field(default=None, description="exp(calibrated_ci_lower)")
    relative_incidence_calibrated_ci_upper: float | None = Field(default=None, description="exp(calibrated_ci_upper)")


class SccsAnalysesResult(ResultModel):
    kind: Literal[ANALYSES_KIND] = ANALYSES_KIND  # type: ignore[valid-type]
    analyses: list[AnalysisRow] = Field(description="one per exposure-outcome pair: in the order of pairs, or by "
                                        "outcome and then in the order of exposures (or of covariates)")
    calibration: CalibrationSummary | None = Field(description="the null and error model (null: no controls)")
    level: float
    n_cases: int = Field(description="strata with events: (outcome, case) with outcomeId")
    n_eras: int
    n_outcomes: int | None = Field(default=None, description="outcomes of the stacked tables (null: no outcomeId)")
    dropped_cases: int = Field(description="cases without events (no likelihood contribution), dropped")


class SccsErasParams(JobParams):
    """Raw person-level data → the Cyclops interval tables (as SelfControlledCaseSeries builds them)."""

    cases_dataset_id: str = Field(
        min_length=1, max_length=100, description="table caseId, observationStart, observationEnd (days or dates)"
    )
    events_dataset_id: str = Field(min_length=1, max_length=100, description="table caseId, day (one row per event), "
                                   "optionally outcomeId: the eras of each outcome, stacked")
    exposures_dataset_id: str = Field(
        min_length=1, max_length=100, description="table caseId, drugId, start, end (inclusive days or dates)"
    )
    risk_window_start: int = Field(default=0, ge=-36_500, le=36_500, description="days added to the start anchor")
    start_anchor: Literal["exposure_start", "exposure_end"] = Field(
        default="exposure_start", description="what risk_window_start counts from (SCCS' startAnchor)"
    )
    risk_window_end: int = Field(default=0, ge=-36_500, le=36_500, description="days added to the end anchor")
    end_anchor: Literal["exposure_end", "exposure_start"] = Field(
        default="exposure_end", description="what risk_window_end counts from (SCCS' endAnchor)"
    )
    exposures: list[EraExposureSpec] | None = Field(
        default=None, min_length=1, max_length=1_000,
        description="exposures, each with its own risk windows (each window its own covariate); null: the one "
        "window risk_window_start..risk_window_end over every drug (covariateId = drugId)",
    )
    study_population: StudyPopulationSpec | None = Field(default=None, description="age and observation-time "
                                                         "restrictions (ages need cases.ageAtObsStart)")
    age: AgeSplineSpec | None = Field(default=None, description="age spline (needs cases.ageAtObsStart, in days)")
    season: SeasonSplineSpec | None = Field(default=None, description="cyclic season spline")
    calendar_time: CalendarTimeSplineSpec | None = Field(default=None, description="calendar-time spline")

    @field_validator("exposures")
    @classmethod
    def _one_way_to_give_windows(cls, exposures: list[EraExposureSpec] | None,
                                 info: ValidationInfo) -> list[EraExposureSpec] | None:
        if exposures is None:
            return exposures
        for name in ("risk_window_start", "start_anchor", "risk_window_end", "end_anchor"):
            if name in info.data and info.data[name] != cls.model_fields[name].default:
                raise ValueError(f"{name} applies only without exposures; give the window in exposures[].windows")
        given: dict[int, str] = {}
        for i, exposure in enumerate(exposures):
            for j, window in enumerate(exposure.windows):
                where = f"exposures.{i}.windows.{j}.covariate_id"
                if window.covariate_id is None:
                    continue
                if window.covariate_id in RESERVED_COVARIATE_IDS:
                    raise ValueError(f"{where}: {window.covariate_id} is in 100-399, the spline components' ids")
                if window.covariate_id in given:
                    raise ValueError(f"{where}: {window.covariate_id} is also {given[window.covariate_id]}")
                given[window.covariate_id] = where
        return exposures

    def window_covariate_ids(self) -> list[list[int]]:
        """The covariateId of every window of every exposure: the given ones, the others 1000, 1001, ... (skipping
        given ids), in the order of the exposures and their windows."""
        assert self.exposures is not None
        taken = {w.covariate_id for e in self.exposures for w in e.windows if w.covariate_id is not None}
        next_id, ids = 1000, []
        for exposure in self.exposures:
            row = []
            for window in exposure.windows:
                if window.covariate_id is None:
                    while next_id in taken:
                        next_id += 1
                    taken.add(next_id)
                    row.append(next_id)
                else:
                    row.append(window.covariate_id)
            ids.append(row)
        return ids

    def needs_age(self) -> bool:
        population = self.study_population
        return self.age is not None or (population is not None and (
            population.min_age_years is not None or population.max_age_years is not None))

    def dataset_column_problems(self, columns: Mapping[str, Collection[str]]) -> list[tuple[str, str]]:
        required = dict(ERAS_COLUMNS)
        if self.needs_age():
            required["cases_dataset_id"] = (*ERAS_COLUMNS["cases_dataset_id"], AGE_COLUMN)
        return missing_columns(required, columns)


class EraCovariate(ResultPart):
    covariate_id: int
    name: str
    source: Literal["exposure_window", "drug", "age", "season", "calendar_time"]


class EraOutcome(ResultPart):
    outcome_id: int
    n_cases_with_events: int = Field(description="cases with an event of this outcome in observation (strata)")
    n_eras: int
    events_in_observation: int
    events_outside_observation: int
    cases_removed: int | None = Field(default=None, description="of the cases with this outcome, removed by "
                                      "study_population")
    knots: dict[str, list[float]] | None = Field(default=None, description="this outcome's knots (age knots "
                                                 "follow its events' ages)")


class SccsErasResult(ResultModel):
    kind: Literal[ERAS_KIND] = ERAS_KIND  # type: ignore[valid-type]
    outcomes: list[EraOutcome] | None = Field(
        default=None, description="per outcome, when the events table has outcomeId: the tables then stack every "
        "outcome's eras (the outcomes artifact has outcomeId; a stratum is (outcomeId, stratumId))",
    )
    n_cases: int
    n_cases_with_events: int = Field(description="cases that sccs_fit will keep")
    n_eras: int = Field(description="rows of the outcomes table (one per case and distinct drug set)")
    n_covariate_rows: int
    n_drugs: int
    events_in_observation: int
    events_outside_observation: int = Field(description="events before or after their case's observation period")
    covariates: list[EraCovariate] | None = Field(
        default=None, description="the covariates of the tables (also the artifact names); null for the plain "
        "one-window spec",
    )
    cases_removed: int | None = Field(default=None, description="cases removed by study_population")
    knots: dict[str, list[float]] | None = Field(
        default=None, description="knots used: age in days, season in months of the year, calendar_time in months "
        "(year * 12 + month - 1)",
    )
