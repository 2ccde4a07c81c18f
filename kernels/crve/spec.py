"""Parameters and results of the CRVE job kinds (``crve_montecarlo``, ``crve_bootstrap``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from kernels.crve import BOOTSTRAP_KIND, MONTECARLO_KIND
from kernels.crve.formula import FormulaText, ParsedFormula, column_problems, parse_formula, parse_of
from kernels.crve.hypothesis import submission_problems
from kernels.spec import JobParams, ResultModel, ResultPart, memoized_parse

DEFAULT_SEED = 20_190_101
WeightsType = Literal["rademacher", "webb", "mammen", "norm"]

# Bounds checked at submission (a 422 naming the field) instead of failing at run time for memory.
MAX_OBS_PER_REPLICATION = 10_000_000  # n_clusters * cluster_size: the NumPy path materialises a replication
MAX_BOOTSTRAP_CELLS = 50_000_000  # n_clusters * bootstrap_reps: the G x B arrays of one replication's draws
MAX_SYNTHETIC_ELEMENTS = 200_000_000  # n_obs * (n_regressors + 2) float64s of a synthetic dataset (1.6 GB)
MAX_CLUSTER_DIMENSIONS = 3
MAX_RESTRICTIONS = 32
MAX_FAMILY = 200


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
    cluster_sizes: list[int] | None = Field(
        default=None,
        description="unbalanced design: each cluster's size (n_clusters of them; cluster_size is then ignored)",
    )
    cluster_size_dispersion: float = Field(
        default=0.0,
        ge=0.0,
        le=3.0,
        description="unbalanced design: sizes drawn once from m exp(s z - s^2/2), z ~ N(0, 1) (lognormal, mean "
        "about cluster_size, CV sqrt(exp(s^2) - 1)); 0: balanced",
    )

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


    @model_validator(mode="after")
    def _unbalanced_design(self) -> MonteCarloParams:
        if self.cluster_sizes is not None:
            if self.cluster_size_dispersion > 0:
                raise ValueError("give cluster_sizes or cluster_size_dispersion, not both")
            if len(self.cluster_sizes) != self.n_clusters:
                raise ValueError(f"cluster_sizes has {len(self.cluster_sizes)} sizes for n_clusters={self.n_clusters}")
            if min(self.cluster_sizes) < 1 or max(self.cluster_sizes) > 100_000:
                raise ValueError("cluster_sizes: every size is 1 to 100,000")
        total = sum(self.design_sizes or ()) or self.n_clusters * self.cluster_size
        if total > MAX_OBS_PER_REPLICATION:
            raise ValueError(
                f"the clusters hold {total:,} observations per replication, above {MAX_OBS_PER_REPLICATION:,}"
            )
        if total <= self.n_regressors:
            raise ValueError(f"n_regressors={self.n_regressors} needs more than the {total} observations")
        return self

    @property
    def design_sizes(self) -> tuple[int, ...] | None:
        """The clusters' sizes of an unbalanced design (None: balanced)."""
        if self.cluster_sizes is not None:
            return tuple(self.cluster_sizes)
        if self.cluster_size_dispersion > 0:
            from kernels.crve.montecarlo import lognormal_sizes

            return lognormal_sizes(self.n_clusters, self.cluster_size, self.cluster_size_dispersion, self.seed)
        return None


class MonteCarloResult(ResultModel):
    kind: Literal[MONTECARLO_KIND] = MONTECARLO_KIND  # type: ignore[valid-type]
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
    cluster_sizes: dict[str, float] | None = Field(
        default=None, description="unbalanced designs: min, max, mean and coefficient of variation of the sizes"
    )


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


def _check_restrictions(texts: list[str], info: ValidationInfo) -> None:
    """Restrictions against the formula's terms (no data needed; the formula field is validated first and
    carries its parse); once per distinct formula and restrictions under a validation context's memo."""
    formula = info.data.get("formula")
    if formula is None:
        return

    def check() -> None:
        problems = submission_problems(texts, parse_of(formula).terms)
        if problems:
            raise ValueError("; ".join(problems))

    # Their cost grows with the formula's terms; members of a group sharing formula and restrictions share it.
    memoized_parse(info, ("crve restrictions", str(formula), tuple(texts)), check)


def _check_iv_spec(params: BootstrapParams, endogenous: str) -> None:
    """What the WRE bootstrap of an IV formula supports (one-way clusters, a test of the endogenous coefficient)."""
    if params.param != endogenous:
        raise ValueError(f"an IV formula tests its endogenous coefficient: give param={endogenous!r} (and r)")
    unsupported = {
        "cluster": len(params.cluster_columns) != 1,
        "bootcluster": params.bootcluster is not None and params.bootcluster not in params.cluster_columns,
        "weights": params.weights is not None,
        "impose_null": not params.impose_null,
        "bootstrap_type": params.bootstrap_type != "11",
        "vcov_type": params.vcov_type != "CRV1",
    }
    named = [field for field, flag in unsupported.items() if flag]
    if named:
        raise ValueError(
            f"an IV formula (the WRE bootstrap) takes one cluster column, no weights, impose_null true, bootstrap_type "
            f"11 and CRV1; not supported here: {named}"
        )


class BootstrapParams(JobParams):
    """Wild (cluster) bootstrap test of linear restrictions R beta = r ("fast and wild", Roodman et al. 2019).

    The data: an uploaded dataset (``dataset_id``) or a ``synthetic`` one, exactly one of the two.
    ``formula``: Wilkinson as in pyfixest (formulaic): "y ~ x1 + x2", "- 1" drops the intercept,
    "y ~ x1 | firm + year" absorbs fixed effects (up to 4; "firm^year" is the interaction of two columns as one
    fixed effect; categorical terms such as C(region) then drop a reference level, as with an intercept).
    Fixed effects are partialled out by ``fixef_method``: "direct" (exact: the largest fixed effect eliminated,
    the others' Schur complement solved densely), "map" (alternating projections to ``fixef_tol``, as fixest and
    pyfixest), "auto" (direct when the fixed effects other than the largest have at most 4,000 levels together).
    Singletons (a level with one observation) are dropped as fixest and pyfixest do (``fixef_rm``).

    ``cluster``: a column (CRV1), a list of two or three (multiway CRV1, Cameron-Gelbach-Miller 2011, made
    positive semi-definite as fixest does), or null for the heteroskedastic wild bootstrap (HC1, a weight per
    observation). ``bootcluster``: the bootstrap clusters; default the variance clusters, or with several the
    dimension with the fewest clusters (MacKinnon-Nielsen-Webb 2021). ``weights``: a column of regression
    weights (WLS in the estimate, the variance and the bootstrap; rows of weight 0 are dropped).

    The hypothesis: ``param`` and ``r`` (H0: beta_param = r), or ``hypothesis``: one restriction as text
    ("x1 - x2 = 0", "x1 + 2*x2 = 1") tested by the bootstrap-t, or a list of them tested jointly by the
    bootstrap Wald statistic (p = share of draws with W* > W; analytic: F(q, G-1)), or ``family``: several
    single restrictions each tested by the bootstrap-t on the same draws, their two-tailed p-values adjusted
    for multiple testing (``family_method``: Romano-Wolf stepdown on |t|, or Westfall-Young stepdown minP on
    the t(df) p-values, as pyfixest's rwolf and wyoung); the result's p_value is then the smallest adjusted
    one (the family-wise test that every restriction holds).

    Bootstrap p-values, over the B draws (the original sample not added), as wildboottest, fwildclusterboot
    and pyfixest: two-tailed = share of draws with |t*| > |t|; equal-tailed = 2 min(share t* > t,
    share t* < t); ">" = share t* > t; "<" = share t* < t. Ties: the inequalities are strict in exact
    arithmetic, so a draw whose t* equals t up to rounding (relative 1e-12) is a tie and does not count.
    Exact ties occur under WCR (impose_null): the all-ones draw reproduces the sample, t* = t, and with
    Rademacher weights the all-minus-ones draw gives t* = -t. With multiway clusters a draw whose variance is
    negative has no t* and is left out (``reps_undefined``).

    ``conf_int`` (one restriction): the null values r whose bootstrap p-value exceeds sign_level, by test
    inversion with the same draws: [lower, upper] for two-tailed and equal-tailed, [lower, null] for ">" and
    [null, upper] for "<" (null: unbounded). An empty confidence set fails the job.

    ``ssc``: G/(G-1) (N-1)/(N-k) on t and t* (HC1: N/(N-k)); G the fewest clusters of any dimension; k the
    regressors plus the fixed effects' levels less one per fixed effect after the first, less the levels of
    each fixed effect nested in a cluster dimension plus one for each (pyfixest's and fixest's defaults).
    """

    dataset_id: str | None = Field(default=None, max_length=200, description="an uploaded dataset")
    synthetic: SyntheticDataset | None = Field(default=None, description="or a generated dataset")
    formula: str = Field(min_length=3, max_length=4000, examples=["y ~ x1 + x2", "y ~ x1 + x2 | firm + year"])
    cluster: str | list[str] | None = Field(
        description="variance cluster column; a list of 2-3 for multiway clustering; null: heteroskedastic (HC1)",
        examples=["firm", ["firm", "year"]],
    )
    bootcluster: str | None = Field(default=None, max_length=200, description="bootstrap cluster column")
    param: str | None = Field(
        default=None, min_length=1, max_length=400, description="the tested coefficient (H0: beta_param = r)"
    )
    r: float = Field(default=0.0, allow_inf_nan=False, description="null value: H0 beta_param = r")
    hypothesis: str | list[str] | None = Field(
        default=None,
        description="instead of param and r: a linear restriction as text, or a list tested jointly (Wald)",
        examples=["x1 - x2 = 0", ["x1 = 0", "x2 = 0"]],
    )
    family: list[str] | None = Field(
        default=None,
        description="instead: a family of single restrictions, each tested on the same draws, with p-values "
        "adjusted for multiple testing by family_method",
        examples=[["x1 = 0", "x2 = 0", "x3 = 0"]],
    )
    family_method: Literal["romano-wolf", "westfall-young"] = Field(
        default="romano-wolf", description="stepdown adjustment of the family's p-values (pyfixest's rwolf / wyoung)"
    )
    weights: str | None = Field(default=None, max_length=200, description="column of regression weights (WLS)")
    vcov_type: Literal["CRV1", "CRV3"] = Field(
        default="CRV1",
        description="the coefficient table's variance: CRV1, or CRV3 (cluster jackknife, (G-1)/G as MacKinnon, "
        "Nielsen & Webb 2023; fixed effects nested in the clusters only); the bootstrap-t stays CRV1-based (WCR11)",
    )
    reps: int = Field(default=9_999, ge=1, le=999_999, description="B, bootstrap draws")
    weights_type: WeightsType = "rademacher"
    impose_null: bool = Field(default=True, description="true: WCR (null imposed), false: WCU")
    bootstrap_type: Literal["11", "13", "31", "33"] = Field(
        default="11",
        description="MacKinnon-Nielsen-Webb (2023) variants, named as wildboottest and fwildclusterboot: first digit "
        "the DGP's residuals (3: jackknife, leaving the bootstrap cluster out), second the variance of t and t* "
        "(3: CRV3); with 3s only fixed effects nested in the clusters, one restriction",
    )
    p_val_type: Literal["two-tailed", "equal-tailed", ">", "<"] = "two-tailed"
    conf_int: bool = Field(
        default=True, description="bootstrap confidence interval by test inversion (one restriction)"
    )
    sign_level: float = Field(
        default=0.05, gt=0.0, lt=1.0, description="1 - confidence level of conf_int: r is in it when p(r) > sign_level"
    )
    ssc: bool = Field(
        default=True,
        description="small-sample factor G/(G-1)(N-1)/(N-k) on t and t* (HC1: N/(N-k)); G the fewest clusters; k "
        "as pyfixest's default (fixed effects nested in the clusters count one parameter)",
    )
    fixef_method: Literal["auto", "direct", "map"] = Field(
        default="auto", description="how fixed effects are partialled out (see the kind's description)"
    )
    fixef_tol: float = Field(
        default=1e-8, gt=0.0, le=1e-2, description="map: stop when no value moves by more than this share of its "
        "column's largest absolute value"
    )  # fmt: skip
    fixef_maxiter: int = Field(default=10_000, ge=1, le=1_000_000, description="map: most sweeps")
    fixef_rm: Literal["singleton", "none"] = Field(
        default="singleton", description="drop singletons (levels with one observation), repeatedly, as fixest"
    )
    seed: int = Field(default=DEFAULT_SEED, ge=0, le=2**63 - 1, description="Philox key of the weights")

    @field_validator("formula")
    @classmethod
    def _parses(cls, formula: str, info: ValidationInfo) -> str:
        """The one parse of the formula (no data needed: a typo is a 422 on params.formula at submission),
        carried by the text for the validators after this one and for the run (:attr:`parsed_formula`); under
        a validation context's memo, one parse per distinct formula (:func:`kernels.spec.memoized_parse`)."""
        try:
            parsed = memoized_parse(info, ("crve formula", str(formula)), lambda: parse_formula(formula))
        except ValueError as error:
            raise ValueError(str(error).removeprefix("formula: ")) from None
        return FormulaText.of(parsed)

    @field_validator("cluster")
    @classmethod
    def _cluster_columns(cls, cluster: str | list[str] | None) -> str | list[str] | None:
        names = [cluster] if isinstance(cluster, str) else (cluster or [])
        if isinstance(cluster, list) and not 1 <= len(cluster) <= MAX_CLUSTER_DIMENSIONS:
            raise ValueError(f"give 1 to {MAX_CLUSTER_DIMENSIONS} cluster columns, not {len(cluster)}")
        if any(not name or len(name) > 200 for name in names):
            raise ValueError("a cluster column name has 1 to 200 characters")
        if len(set(names)) < len(names):
            raise ValueError(f"a cluster column is named twice in {names}")
        return cluster

    @field_validator("param")
    @classmethod
    def _a_coefficient(cls, param: str | None, info: ValidationInfo) -> str | None:
        if param is not None:
            _check_restrictions([f"{param} = 0"], info)
        return param

    @field_validator("hypothesis")
    @classmethod
    def _restriction_texts(cls, hypothesis: str | list[str] | None, info: ValidationInfo) -> str | list[str] | None:
        texts = [hypothesis] if isinstance(hypothesis, str) else (hypothesis or [])
        if isinstance(hypothesis, list) and not 1 <= len(hypothesis) <= MAX_RESTRICTIONS:
            raise ValueError(f"give 1 to {MAX_RESTRICTIONS} restrictions, not {len(hypothesis)}")
        if any(not text.strip() or len(text) > 2000 for text in texts):
            raise ValueError("a restriction has 1 to 2,000 characters")
        _check_restrictions(texts, info)
        return hypothesis

    @field_validator("family")
    @classmethod
    def _family_members(cls, family: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if family is None:
            return None
        if not 2 <= len(family) <= MAX_FAMILY:
            raise ValueError(f"a family has 2 to {MAX_FAMILY} restrictions, not {len(family)}")
        if any(not text.strip() or len(text) > 2000 for text in family):
            raise ValueError("a restriction has 1 to 2,000 characters")
        for text in family:
            _check_restrictions([text], info)
        return family

    @model_validator(mode="after")
    def _consistent(self) -> BootstrapParams:
        if (self.dataset_id is None) == (self.synthetic is None):
            raise ValueError("give exactly one of dataset_id and synthetic")
        if sum(value is not None for value in (self.param, self.hypothesis, self.family)) != 1:
            raise ValueError("give exactly one of param (with r), hypothesis and family")
        if self.cluster is None and self.bootcluster is not None:
            raise ValueError("bootcluster needs cluster: the heteroskedastic bootstrap draws a weight per observation")
        if self.cluster is None and self.vcov_type == "CRV3":
            raise ValueError("vcov_type CRV3 needs cluster (null is the heteroskedastic HC1)")
        iv = self.parsed_formula.iv
        if iv is not None:
            _check_iv_spec(self, iv.endogenous)
        if self.bootstrap_type != "11" and (self.cluster is None or self.family is not None
                                            or (isinstance(self.hypothesis, list) and len(self.hypothesis) > 1)):
            raise ValueError("bootstrap_type other than 11 needs clusters and one restriction (no family, no joint "
                             "test)")  # fmt: skip
        return self

    @property
    def parsed_formula(self) -> ParsedFormula:
        """The formula's parse, made once when these params were validated."""
        return parse_of(self.formula)

    @property
    def cluster_columns(self) -> list[str]:
        return [self.cluster] if isinstance(self.cluster, str) else list(self.cluster or [])

    @property
    def restriction_texts(self) -> list[str]:
        """The hypothesis as restrictions: param and r as "param = r"."""
        if self.param is not None:
            return [f"{self.param} = {self.r!r}"]
        if self.family is not None:
            return list(self.family)
        return [self.hypothesis] if isinstance(self.hypothesis, str) else list(self.hypothesis or [])

    def dataset_column_problems(self, columns: Mapping[str, Collection[str]]) -> list[tuple[str, str]]:
        """(params field, message) for each column the job names that the uploaded dataset lacks; ``columns``:
        dataset field -> its column names (the API passes a stored dataset's schema at submission)."""
        if self.dataset_id is None or "dataset_id" not in columns:
            return []
        named = {"cluster": self.cluster_columns}
        for field in ("bootcluster", "weights"):
            if getattr(self, field) is not None:
                named[field] = [getattr(self, field)]
        return column_problems(self.parsed_formula, named, columns["dataset_id"])


class CoefficientRow(ResultPart):
    """One row of the coefficient table."""

    name: str
    estimate: float
    se: float = Field(description="CRV1 (HC1 without clusters)")
    t_stat: float
    p_value: float = Field(description="analytic, t(df_t), two-tailed")
    conf_int: list[float] = Field(description="analytic, t(df_t)")


class RestrictionRow(ResultPart):
    """One restriction of the hypothesis: R_l beta = r_l."""

    text: str
    coefficients: dict[str, float] = Field(description="the row of R by coefficient (zeros left out)")
    rhs: float = Field(description="r_l")
    estimate: float = Field(description="R_l beta")


class FamilyRow(ResultPart):
    """One member of a family of restrictions."""

    text: str
    estimate: float
    se: float
    t_stat: float
    p_value: float = Field(description="its own bootstrap p-value, two-tailed")
    p_value_analytic: float = Field(description="t(df_t), two-tailed")
    p_value_adjusted: float = Field(description="adjusted for the family (family_method)")


class ClusterDimension(ResultPart):
    name: str
    count: int


class FixedEffectInfo(ResultPart):
    name: str
    levels: int = Field(description="levels after dropping singletons")
    nested_in_cluster: bool = Field(description="every level within one cluster of some variance dimension")


class BootstrapResult(ResultModel):
    kind: Literal[BOOTSTRAP_KIND] = BOOTSTRAP_KIND  # type: ignore[valid-type]
    param: str | None = Field(description="the tested coefficient (null when the hypothesis was given as text)")
    r: float | None
    hypothesis: list[str] = Field(description="the restrictions tested (param and r as 'param = r')")
    restrictions: list[RestrictionRow]
    test: Literal["t", "wald", "family"] = Field(
        description="bootstrap-t (one restriction), bootstrap Wald (several jointly) or a family of t tests"
    )
    estimate: float | None = Field(description="R beta (one restriction)")
    se: float | None = Field(description="sqrt(R V R'), V: CRV1 (HC1 without clusters)")
    t_stat: float | None = Field(description="(R beta - r) / se (one restriction)")
    wald_stat: float | None = Field(description="(R beta - r)'(R V R')^-1 (R beta - r) (several restrictions)")
    p_value: float = Field(
        description="bootstrap p-value: of p_val_type (t test), share of W* > W (Wald), smallest adjusted (family)"
    )
    p_value_analytic: float = Field(
        description="t(df_t) p-value of p_val_type, F(q, df_t) of wald_stat / q, or Bonferroni over the family"
    )
    p_values: dict[str, float] = Field(description="bootstrap p-values of every type (t test) or {'wald': p}")
    p_val_type: str
    conf_int: list[float | None] | None = Field(description="[lower, upper] by test inversion; null: unbounded")
    conf_int_analytic: list[float] | None
    sign_level: float
    reps: int
    reps_used: int
    reps_undefined: int = Field(description="draws without a statistic (negative multiway variance), left out")
    enumerated: bool
    weights_type: str
    bootstrap_type: Literal["WCR", "WCU"]
    bootstrap_variant: str = Field(description="MNW 2023 variant: residuals digit, variance digit (11, 13, 31, 33)")
    vcov_type: Literal["CRV1", "CRV3", "HC1"] = Field(description="the coefficient table's variance")
    seed: int
    ssc: bool
    ssc_factor: float
    df_t: int = Field(description="degrees of freedom of the analytic tests: G - 1 (fewest clusters), or N - k")
    n_obs: int = Field(description="observations used (after dropping singletons and zero weights)")
    n_singletons: int
    n_clusters: int = Field(description="the fewest clusters of any dimension (N without clusters)")
    clusters: list[ClusterDimension]
    n_boot_clusters: int
    bootcluster: str | None = Field(description="the bootstrap cluster column (null: one weight per observation)")
    weights: str | None = Field(description="the regression weights column")
    eigen_fixed: bool = Field(description="the multiway covariance had negative eigenvalues, set to zero")
    n_params_ssc: int = Field(
        description="k in (N-1)/(N-k): the regressors plus the fixed effects' levels less one per fixed effect after "
        "the first, less the levels of each fixed effect nested in the clusters plus one for each (pyfixest, fixest)"
    )
    fixed_effect: dict[str, Any] | None = Field(description="the first fixed effect (as fixed_effects[0])")
    fixed_effects: list[FixedEffectInfo]
    iv: dict[str, Any] | None = Field(
        default=None,
        description="IV: endogenous, instruments, first_stage_f (cluster-robust), effective_f (MOP 2013), "
        "anderson_rubin (statistic, bootstrap p_value, p_value_analytic of the weak-instrument-robust test of r)",
    )
    demeaning: dict[str, Any] | None = Field(description="method, sweeps and tolerance of the fixed-effect demeaning")
    coefficients: list[CoefficientRow]
    family: list[FamilyRow] | None = Field(description="per restriction of a family: its test and adjusted p-value")
    family_method: str | None
    bootstrap_t: dict[str, Any] = Field(
        description="quantiles, mean and sd of the bootstrap t (Wald; for a family the largest |t*| of each draw)"
    )
