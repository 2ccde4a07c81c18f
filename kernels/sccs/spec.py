"""Parameters and results of the ``sccs_fit`` and ``sccs_eras`` job kinds (names as in issue 4; ``docs/sccs.md``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernels.spec import JobParams, ResultModel, ResultPart

DEFAULT_CV_SEED = 20130411
DEFAULT_BOOTSTRAP_SEED = 20130412


# The columns each table must have (as the runners read them: kernels/sccs/jobs.py); checked at submission
# against the stored datasets' schemas, so a missing column is a 422 naming the field, not a failed job.
FIT_COLUMNS = {
    "outcomes_dataset_id": ("rowId", "stratumId", "time", "y"),
    "covariates_dataset_id": ("rowId", "covariateId"),  # covariateValue is optional (default 1)
    "names_dataset_id": ("covariateId", "covariateName"),
}
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
        description="covariateIds to profile (default: every covariate of the fit)",
    )
    level: float = Field(default=0.95, gt=0.5, lt=1.0, description="confidence level of the intervals")


class SccsParams(JobParams):
    outcomes_dataset_id: str = Field(
        min_length=1, max_length=100, description="table rowId, stratumId (case), time (days), y (events)"
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

    def dataset_column_problems(self, columns: Mapping[str, Collection[str]]) -> list[tuple[str, str]]:
        return missing_columns(FIT_COLUMNS, columns)


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


class CvPoint(ResultPart):
    variance: float
    predictive_log_likelihood: float = Field(description="mean over folds of the held-out log-likelihood")
    fold_predictive_log_likelihood: list[float]
    fold_iterations: list[int] = Field(description="CCD cycles of each fold's training fit")
    non_converged_folds: int = Field(description="training fits that stopped at max_iterations without converging")


class SccsResult(ResultModel):
    kind: Literal["sccs_fit"] = "sccs_fit"
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


class SccsErasParams(JobParams):
    """Raw person-level data → the Cyclops interval tables (as SelfControlledCaseSeries builds them)."""

    cases_dataset_id: str = Field(
        min_length=1, max_length=100, description="table caseId, observationStart, observationEnd (days or dates)"
    )
    events_dataset_id: str = Field(min_length=1, max_length=100, description="table caseId, day (one row per event)")
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

    def dataset_column_problems(self, columns: Mapping[str, Collection[str]]) -> list[tuple[str, str]]:
        return missing_columns(ERAS_COLUMNS, columns)


class SccsErasResult(ResultModel):
    kind: Literal["sccs_eras"] = "sccs_eras"
    n_cases: int
    n_cases_with_events: int = Field(description="cases that sccs_fit will keep")
    n_eras: int = Field(description="rows of the outcomes table (one per case and distinct drug set)")
    n_covariate_rows: int
    n_drugs: int
    events_in_observation: int
    events_outside_observation: int = Field(description="events before or after their case's observation period")
