"""Parameters and results of the CRVE job kinds (``crve_montecarlo``, ``crve_bootstrap``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from kernels.spec import JobParams, ResultModel

DEFAULT_SEED = 20_190_101
WeightsType = Literal["rademacher", "webb", "mammen", "norm"]


class MonteCarloParams(JobParams):
    """Monte Carlo of cluster-robust inference in the Cameron-Gelbach-Miller (2008) design.

    Each replication draws G clusters of m observations, k - 1 regressors x = e_i + e_g and an intercept,
    y = x'1 + u_i + u_g (all N(0, 1)), fits OLS and tests H0: beta_j = 1 for slope ``test_coefficient``.
    """

    n_clusters: int = Field(ge=2, le=100_000, description="G, clusters per replication")
    cluster_size: int = Field(ge=1, le=100_000, description="m, observations per cluster")
    n_regressors: int = Field(ge=2, le=32, description="k, regressors including the intercept")
    replications: int = Field(ge=1, le=10_000_000, description="R, Monte Carlo replications")
    seed: int = Field(default=DEFAULT_SEED, ge=0, le=2**63 - 1, description="Philox key of every draw")
    test_coefficient: int = Field(default=1, ge=1, le=31, description="index of the tested slope (0 = intercept)")
    test: Literal["crv1", "wild_bootstrap"] = Field(
        default="crv1",
        description="CRV1 t test, or a wild cluster restricted (WCR) bootstrap-t with its own B draws per replication",
    )
    critical_values: Literal["t", "normal"] = Field(
        default="t", description="CRV1 test: critical values of t(G-1) (default) or N(0,1)"
    )
    ssc: bool = Field(default=True, description="small-sample factor G/(G-1)(N-1)/(N-k) on the CRV1 variance")
    bootstrap_reps: int = Field(default=999, ge=9, le=99_999, description="B per replication (wild_bootstrap)")
    weights_type: WeightsType = Field(default="rademacher", description="bootstrap weights (wild_bootstrap)")


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
    device: str
    timings: dict[str, float]


class SyntheticDataset(JobParams):
    """A generated dataset (see kernels/crve/synthetic.py): columns y, x1..xK, cluster, and fe when n_fe > 0.

    y = 1 + 0 x1 + x2 + ... + xK (+ fe effect) + u_i + u_g with x_j = e_ij + e_gj: H0 beta_x1 = 0 is true.
    """

    n_obs: int = Field(ge=4, le=20_000_000, description="rows")
    n_clusters: int = Field(ge=2, le=1_000_000, description="clusters (near-equal sizes)")
    n_regressors: int = Field(default=2, ge=1, le=64, description="columns x1..xK")
    n_fe: int = Field(default=0, ge=0, le=1_000_000, description="levels of the fixed effect column fe (0: none)")
    seed: int = Field(default=DEFAULT_SEED, ge=0, le=2**63 - 1)


class BootstrapParams(JobParams):
    """Wild cluster bootstrap-t of H0: beta_param = r (Roodman et al. 2019 "fast and wild").

    The data: an uploaded dataset (``dataset_id``) or a ``synthetic`` one, exactly one of the two.
    ``formula``: Wilkinson as in pyfixest (formulaic): "y ~ x1 + x2", "- 1" drops the intercept,
    "y ~ x1 | fe" absorbs the one-way fixed effect fe.
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
    sign_level: float = Field(default=0.05, gt=0.0, lt=1.0, description="1 - confidence level of conf_int")
    ssc: bool = Field(default=True, description="small-sample factor G/(G-1)(N-1)/(N-k) on t and t*")
    seed: int = Field(default=DEFAULT_SEED, ge=0, le=2**63 - 1, description="Philox key of the weights")

    @model_validator(mode="after")
    def _one_data_source(self) -> BootstrapParams:
        if (self.dataset_id is None) == (self.synthetic is None):
            raise ValueError("give exactly one of dataset_id and synthetic")
        return self


class CoefficientRow(ResultModel):
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
    n_params_ssc: int = Field(description="k in (N-1)/(N-k): regressors + fixed-effect levels not nested")
    fixed_effect: dict[str, Any] | None
    coefficients: list[CoefficientRow]
    bootstrap_t: dict[str, Any] = Field(description="quantiles, mean and sd of the bootstrap t statistics")
    device: str
    timings: dict[str, float]
