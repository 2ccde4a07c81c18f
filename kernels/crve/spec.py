"""Parameters and results of the CRVE job kinds (``crve_montecarlo``, ``crve_bootstrap``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from kernels.crve.formula import column_problems, parse_formula
from kernels.spec import JobParams, ResultModel, ResultPart

DEFAULT_SEED = 20_190_101
WeightsType = Literal["rademacher", "webb", "mammen", "norm"]

# Bounds checked at submission (a 422 naming the field) instead of failing at run time for memory.
MAX_OBS_PER_REPLICATION = 10_000_000  # n_clusters * cluster_size: the NumPy path materialises a replication
MAX_BOOTSTRAP_CELLS = 50_000_000  # n_clusters * bootstrap_reps: the G x B arrays of one replication's draws
MAX_SYNTHETIC_ELEMENTS = 200_000_000  # n_obs * (n_regressors + 2) float64s of a synthetic dataset (1.6 GB)


class MonteCarloParams(JobParams):
    """Monte Carlo of cluster-robust inference in the Cameron-Gelbach-Miller (2008) design.

    Each replication draws G clusters of m observations, k - 1 regressors x = e_i + e_g and an intercept,
    y = x'1 + u_i + u_g (all N(0, 1)), fits OLS and tests H0: beta_j = 1 for slope ``test_coefficient``.
    Checked at submission: 1 <= test_coefficient < n_regressors; n_regressors < G m <= 10,000,000
    observations per replication; with the wild bootstrap, G B <= 50,000,000 (one replication's G x B draws).
    """

    n_clusters: int = Field(ge=2, le=100_000, description="G, clusters per replication")
    cluster_size: int = Field(
        ge=1,
        le=100_000,
        description=f"m, observations per cluster; G m at most {MAX_OBS_PER_REPLICATION:,} per replication",
    )
    n_regressors: int = Field(
        ge=2, le=32, description="k, regressors including the intercept; fewer than the G m observations"
    )
    replications: int = Field(ge=1, le=10_000_000, description="R, Monte Carlo replications")
    seed: int = Field(default=DEFAULT_SEED, ge=0, le=2**63 - 1, description="Philox key of every draw")
    test_coefficient: int = Field(
        default=1, ge=1, le=31, description="index of the tested slope (0 = intercept), below n_regressors"
    )
    test: Literal["crv1", "wild_bootstrap"] = Field(
        default="crv1",
        description="CRV1 t test, or a wild cluster restricted (WCR) bootstrap-t with its own B draws per replication",
    )
    critical_values: Literal["t", "normal"] = Field(
        default="t", description="CRV1 test: critical values of t(G-1) (default) or N(0,1)"
    )
    ssc: bool = Field(default=True, description="small-sample factor G/(G-1)(N-1)/(N-k) on the CRV1 variance")
    bootstrap_reps: int = Field(
        default=999,
        ge=9,
        le=99_999,
        validate_default=True,
        description=f"B per replication (wild_bootstrap); G B at most {MAX_BOOTSTRAP_CELLS:,}",
    )
    weights_type: WeightsType = Field(default="rademacher", description="bootstrap weights (wild_bootstrap)")

    # Field validators see the fields defined before theirs (info.data; absent when those failed), so each
    # error's location is the field checked, not the model.
    @field_validator("cluster_size")
    @classmethod
    def _observations_bounded(cls, cluster_size: int, info: ValidationInfo) -> int:
        n_clusters = info.data.get("n_clusters")
        if n_clusters is not None and n_clusters * cluster_size > MAX_OBS_PER_REPLICATION:
            raise ValueError(
                f"n_clusters * cluster_size = {n_clusters * cluster_size:,} observations per replication exceeds "
                f"the bound {MAX_OBS_PER_REPLICATION:,}"
            )
        return cluster_size

    @field_validator("n_regressors")
    @classmethod
    def _identified(cls, n_regressors: int, info: ValidationInfo) -> int:
        n_clusters, cluster_size = info.data.get("n_clusters"), info.data.get("cluster_size")
        if n_clusters is not None and cluster_size is not None and n_clusters * cluster_size <= n_regressors:
            raise ValueError(
                f"n_regressors={n_regressors} needs more than n_clusters * cluster_size = "
                f"{n_clusters * cluster_size} observations"
            )
        return n_regressors

    @field_validator("test_coefficient")
    @classmethod
    def _a_slope(cls, test_coefficient: int, info: ValidationInfo) -> int:
        n_regressors = info.data.get("n_regressors")
        if n_regressors is not None and test_coefficient >= n_regressors:
            raise ValueError(
                f"test_coefficient={test_coefficient} must be a slope index below n_regressors={n_regressors} "
                "(0 is the intercept)"
            )
        return test_coefficient

    @field_validator("bootstrap_reps")
    @classmethod
    def _draws_bounded(cls, bootstrap_reps: int, info: ValidationInfo) -> int:
        n_clusters = info.data.get("n_clusters")
        bootstrap = info.data.get("test") == "wild_bootstrap"
        if bootstrap and n_clusters is not None and n_clusters * bootstrap_reps > MAX_BOOTSTRAP_CELLS:
            raise ValueError(
                f"n_clusters * bootstrap_reps = {n_clusters * bootstrap_reps:,} exceeds the bound "
                f"{MAX_BOOTSTRAP_CELLS:,} on one replication's draws"
            )
        return bootstrap_reps


class MonteCarloResult(ResultModel):
    kind: Literal["crve_montecarlo"] = "crve_montecarlo"
    test: str
    replications: int
    n_clusters: int
    cluster_size: int
    n_regressors: int
    n_obs: int
    test_coefficient: int
    true_value: float
    seed: int
    rejection_rate: dict[str, float] = Field(description='keyed by level: "0.01", "0.05", "0.10"')
    rejection_rate_se: dict[str, float] = Field(description="Monte Carlo standard errors sqrt(p(1-p)/R)")
    critical_values: dict[str, float] | None = None
    mean_estimate: float
    sd_estimate: float | None = Field(description="empirical standard deviation of the estimate (null if R = 1)")
    mean_se: float = Field(description="mean CRV1 standard error")
    se_ratio: float | None = Field(description="mean_se / sd_estimate (1 = unbiased standard errors)")
    bootstrap_reps: int | None = None
    weights_type: str | None = None


class SyntheticDataset(JobParams):
    """A generated dataset (see kernels/crve/synthetic.py): columns y, x1..xK, cluster, and fe when n_fe > 0.

    y = 1 + 0 x1 + x2 + ... + xK (+ fe effect) + u_i + u_g with x_j = e_ij + e_gj: H0 beta_x1 = 0 is true.
    Checked at submission: n_clusters <= n_obs, n_fe <= n_obs (every cluster and level present), and
    n_obs * (n_regressors + 2) <= 200,000,000 float64s (1.6 GB).
    """

    n_obs: int = Field(ge=4, le=20_000_000, description="rows")
    n_clusters: int = Field(ge=2, le=1_000_000, description="clusters (near-equal sizes), at most n_obs")
    n_regressors: int = Field(
        default=2,
        ge=1,
        le=64,
        description=f"columns x1..xK; n_obs * (n_regressors + 2) at most {MAX_SYNTHETIC_ELEMENTS:,}",
    )
    n_fe: int = Field(
        default=0, ge=0, le=1_000_000, description="levels of the fixed effect column fe (0: none), at most n_obs"
    )
    seed: int = Field(default=DEFAULT_SEED, ge=0, le=2**63 - 1)

    @field_validator("n_clusters", "n_fe")
    @classmethod
    def _at_most_one_per_row(cls, count: int, info: ValidationInfo) -> int:
        n_obs = info.data.get("n_obs")
        if n_obs is not None and count > n_obs:
            raise ValueError(f"{info.field_name}={count} exceeds n_obs={n_obs} (every level needs a row)")
        return count

    @field_validator("n_regressors")
    @classmethod
    def _size_bounded(cls, n_regressors: int, info: ValidationInfo) -> int:
        n_obs = info.data.get("n_obs")
        if n_obs is not None and n_obs * (n_regressors + 2) > MAX_SYNTHETIC_ELEMENTS:
            raise ValueError(
                f"n_obs * (n_regressors + 2) = {n_obs * (n_regressors + 2):,} values exceeds the bound "
                f"{MAX_SYNTHETIC_ELEMENTS:,}"
            )
        return n_regressors


class BootstrapParams(JobParams):
    """Wild cluster bootstrap-t of H0: beta_param = r (Roodman et al. 2019 "fast and wild").

    The data: an uploaded dataset (``dataset_id``) or a ``synthetic`` one, exactly one of the two.
    ``formula``: Wilkinson as in pyfixest (formulaic): "y ~ x1 + x2", "- 1" drops the intercept,
    "y ~ x1 | fe" absorbs the one-way fixed effect fe (categorical terms such as C(region) then drop a
    reference level, as with an intercept).

    Bootstrap p-values, over the B draws (the original sample not added), as wildboottest, fwildclusterboot
    and pyfixest: two-tailed = share of draws with |t*| > |t|; equal-tailed = 2 min(share t* > t,
    share t* < t); ">" = share t* > t; "<" = share t* < t. Ties: the inequalities are strict in exact
    arithmetic, so a draw whose t* equals t up to rounding (relative 1e-12) is a tie and does not count.
    Exact ties occur under WCR (impose_null): the all-ones draw reproduces the sample, t* = t, and with
    Rademacher weights the all-minus-ones draw gives t* = -t. wildboottest compares the rounded numbers and
    so counts these draws or not by chance: with full enumeration (2^G draws) its p-value can differ from
    ours by up to 2 / 2^G. Without exact ties the two agree.

    ``conf_int``: the null values r whose bootstrap p-value exceeds sign_level, by test inversion with the
    same draws: [lower, upper] for two-tailed and equal-tailed (each tail at sign_level / 2), [lower, null]
    for ">" and [null, upper] for "<" (null: unbounded). A one-sided set at sign_level above about 1/2 lies
    beyond the estimate. A confidence set that is empty (too few distinct draws for the level) fails the job.

    ``ssc``: G/(G-1) (N-1)/(N-k) on t and t*; with an absorbed fixed effect of F levels k is the regressors
    k_x plus F when it crosses the variance clusters, plus 1 when it is nested in them (fixest's default
    fixef.K = "nested", K.fixef = "nonnested" since fixest 0.13, and pyfixest's: the nested levels are not
    counted but the constant they absorbed is): a crossing fixed effect gives the SE of OLS with explicit
    dummies (statsmodels' cluster-robust SE), a nested one that SE times sqrt((N - k_x - F) / (N - k_x - 1)).
    """

    dataset_id: str | None = Field(default=None, max_length=200, description="an uploaded dataset")
    synthetic: SyntheticDataset | None = Field(default=None, description="or a generated dataset")
    formula: str = Field(min_length=3, max_length=4000, examples=["y ~ x1 + x2"])
    cluster: str = Field(min_length=1, max_length=200, description="column of the variance clusters")
    bootcluster: str | None = Field(default=None, max_length=200, description="bootstrap cluster column")
    param: str = Field(min_length=1, max_length=400, description="the tested coefficient's name")
    r: float = Field(default=0.0, allow_inf_nan=False, description="null value: H0 beta_param = r")
    reps: int = Field(default=9_999, ge=1, le=999_999, description="B, bootstrap draws")
    weights_type: WeightsType = "rademacher"
    impose_null: bool = Field(default=True, description="true: WCR (null imposed), false: WCU")
    p_val_type: Literal["two-tailed", "equal-tailed", ">", "<"] = "two-tailed"
    conf_int: bool = Field(default=True, description="bootstrap confidence interval by test inversion")
    sign_level: float = Field(
        default=0.05, gt=0.0, lt=1.0, description="1 - confidence level of conf_int: r is in it when p(r) > sign_level"
    )
    ssc: bool = Field(
        default=True,
        description="small-sample factor G/(G-1)(N-1)/(N-k) on t and t*; k: regressors plus the absorbed fixed "
        "effect's levels, or plus 1 when it is nested in the clusters (fixest's fixef.K = 'nested')",
    )
    seed: int = Field(default=DEFAULT_SEED, ge=0, le=2**63 - 1, description="Philox key of the weights")

    @field_validator("formula")
    @classmethod
    def _parses(cls, formula: str) -> str:
        try:
            parse_formula(formula)  # no data needed: a typo is a 422 on params.formula at submission
        except ValueError as error:
            raise ValueError(str(error).removeprefix("formula: ")) from None
        return formula

    @model_validator(mode="after")
    def _one_data_source(self) -> BootstrapParams:
        if (self.dataset_id is None) == (self.synthetic is None):
            raise ValueError("give exactly one of dataset_id and synthetic")
        return self

    def dataset_column_problems(self, columns: Mapping[str, Collection[str]]) -> list[tuple[str, str]]:
        """(params field, message) for each column the job names that the uploaded dataset lacks; ``columns``:
        dataset field -> its column names (the API passes a stored dataset's schema at submission)."""
        if self.dataset_id is None or "dataset_id" not in columns:
            return []
        return column_problems(self.formula, self.cluster, self.bootcluster, columns["dataset_id"])


class CoefficientRow(ResultPart):
    """One row of the coefficient table."""

    name: str
    estimate: float
    se: float
    t_stat: float
    p_value: float = Field(description="analytic, t(G-1), two-tailed")
    conf_int: list[float] = Field(description="analytic, t(G-1)")


class BootstrapResult(ResultModel):
    kind: Literal["crve_bootstrap"] = "crve_bootstrap"
    param: str
    r: float
    estimate: float
    se: float = Field(description="CRV1")
    t_stat: float
    p_value: float = Field(description="bootstrap p-value of p_val_type")
    p_value_analytic: float = Field(description="t(G-1) p-value of p_val_type")
    p_values: dict[str, float] = Field(description="bootstrap p-values of every type")
    p_val_type: str
    conf_int: list[float | None] | None = Field(description="[lower, upper] by test inversion; null: unbounded")
    conf_int_analytic: list[float]
    sign_level: float
    reps: int
    reps_used: int
    enumerated: bool
    weights_type: str
    bootstrap_type: Literal["WCR", "WCU"]
    seed: int
    ssc: bool
    ssc_factor: float
    n_obs: int
    n_clusters: int
    n_boot_clusters: int
    n_params_ssc: int = Field(
        description="k in (N-1)/(N-k): the regressors, plus the fixed effect's levels when they cross the variance "
        "clusters, plus 1 (the constant) when they are nested in them (fixest's fixef.K = 'nested', pyfixest)"
    )
    fixed_effect: dict[str, Any] | None
    coefficients: list[CoefficientRow]
    bootstrap_t: dict[str, Any] = Field(description="quantiles, mean and sd of the bootstrap t statistics")
