"""Wild (cluster) bootstrap tests of linear restrictions by the "fast and wild" algorithm (Roodman, MacKinnon,
Nielsen & Webb 2019), generalised to absorbed fixed effects of any structure, multiway variance clusters,
regression weights and joint restrictions.

Model y = X beta + D alpha + u, D the dummies of the absorbed fixed effects (partialled out: X~ = M_D X, see
:mod:`kernels.crve.fixef`), regression weights w (all arrays below are the weighted ones, sqrt(w) times the
demeaned values), variance clusters in one or more dimensions d (multiway: Cameron, Gelbach & Miller 2011,
V = sum_d s_d V_d over the intersections with signs s_d), bootstrap weights drawn per bootstrap cluster h
(``bootcluster``; by default the variance clusters, or with several dimensions the one with the fewest
clusters, as MacKinnon, Nielsen & Webb 2021 recommend; every observation without clusters: the
heteroskedastic wild bootstrap with HC1), H0: R beta = r with q rows.

Derivation (A = (X~'X~)^-1, the directions a_l = A R_l', ~ the bootstrap DGP's coefficients: the restricted
estimate under WCR, beta-hat under WCU, u~ their residuals). The bootstrap sample is y* = X beta~ + D alpha~ +
v_h(i) u~_i; re-estimated with the fixed effects absorbed (X~'M_D = X~'),
    R_l(beta* - beta~) = sum_h v_h a_l'S_h,                        S_h = X~_h'u~_h,
and the bootstrap residuals' scores of variance cluster g of dimension d, projected on a_l, are
    a_l'X~_g'u*_g = sum_h v_h M_gh,   M_gh = a_l'S_gh - w_g'S_h - K_gh,
with S_gh = X~_gh'u~_gh over the rows in g and h, w_g = A X~_g'X~_g a_l and K the projection of the perturbed
residuals on the fixed effects, K_gh = P_g'(D'WD)^- Q_h with P_g = D'(1_g a_l'X~') and Q_h = D'(1_h u~): it
vanishes for a fixed effect nested in the dimension's clusters (its levels' sums of X~ are zero) and is applied
through the Schur complement of :class:`kernels.crve.fixef.Gram` otherwise. So for a matrix V (H x B) of draws:
numerators C'V (q x B) and, per dimension, D_d = M_d V (q G_d x B), whose products give each draw's variance
f sum_d s_d D_d D_d'. M is never formed: T1 (the a'S_gh) is sparse (diagonal when the clusters coincide), W S'
has rank k and K is factored through the fixed-effect levels. Each draw costs O(q G k).

Everything comes from the statistics X~_c'X~_c and X~_c'y~_c of the cells c (the combinations of every
variance dimension's cluster and the bootstrap cluster that occur; one pass over the N rows) and, with crossing
fixed effects, their sums per (level, cluster). Every quantity is affine in r (u~ is), so for one restriction
the confidence interval by test inversion needs five numbers per draw:
t*_b(r) = (n_b - d m_b) / sqrt(f (q_b - 2 d p_b + d^2 o_b)), d = r - r0.

Joint restrictions (q > 1): the bootstrap Wald statistic W* = (R beta* - R beta~)'(R V* R')^-1 (R beta* - R beta~)
against W = (R beta - r)'(R V R')^-1 (R beta - r); p = share of draws with W* > W.

Small-sample factor (pyfixest's and fixest's defaults, docs/crve.md): f = G/(G-1) (N-1)/(N-k) with G the
fewest clusters of any dimension (``G_df = "min"``) and k the regressors plus the fixed effects' levels, less
one per fixed effect after the first, less the levels of each fixed effect nested in a cluster dimension plus
one for each such; HC1: f = N/(N-k). With multiway clusters the reported covariance is made positive
semi-definite by zeroing negative eigenvalues (fixest, reghdfe); the test statistics use the variance as
computed, like their bootstrap counterparts, and a draw whose variance is not positive has no t* (NaN) and
is left out of the p-value (its share is reported).

p-values (full enumeration of the 2^H Rademacher sign vectors when 2^H < B), the tie rule and the confidence
interval by test inversion: :mod:`kernels.crve.inference`. Facts and conventions: docs/crve.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import special

from kernels.backend import is_numpy, to_host
from kernels.crve.fixef import (
    FixedEffect,
    Gram,
    demean,
    dense,
    drop_singletons,
    grouped_table,
    is_nested,
    recode,
    sparse_matrix,
)
from kernels.crve.hypothesis import Restrictions
from kernels.crve.inference import P_VALUE_TYPES, PValueCurve, analytic_p_values, p_values_from, t_quantile
from kernels.crve.ols import cluster_sums
from kernels.crve.pairs import pair_statistics, pair_statistics_host
from kernels.crve.weights import draw_weights, enumerated_weights, use_enumeration
from kernels.spec import settings_from
from kernels.timing import StageTimer

if TYPE_CHECKING:
    from pydantic import BaseModel

Report = Callable[[float, str], None]
# On CuPy, cells above this count keep their statistics and the bootstrap operator's algebra on the device
# (many clusters, the intersections of multiway clusters, the heteroskedastic bootstrap's cell per row); up to
# it the small algebra runs on the host, where it is cheaper than the launch latency of many tiny GPU
# operations.
HOST_CELLS = 10_000
BOOTSTRAP_TYPES = ("11", "13", "31", "33")
QUADRATIC_MAX_H = 4_096  # the H x H quadratic forms (_add_quadratic_forms): at most 128 MB each
QUADRATIC_MAX_CELLS = 50_000_000  # the dense M_d (G_d x H) they are formed from


@dataclass(frozen=True)
class BootstrapOptions:
    param: int | None = None  # column index of the tested coefficient (H0: beta_param = r) ...
    r: float = 0.0
    restrictions: Restrictions | None = None  # ... or R beta = r (one row: a t test; several: a Wald test)
    reps: int = 999
    weights_type: str = "rademacher"
    impose_null: bool = True
    p_val_type: str = "two-tailed"
    conf_int: bool = True
    sign_level: float = 0.05
    ssc: bool = True
    seed: int = 0
    draw_chunk: int | None = None  # draws per chunk; None: sized so a chunk's G x B block stays bounded
    block_elements: int = 4_000_000  # bound on the G x chunk arrays when draw_chunk is None
    draw_base: int = 0  # Philox address of draw 0's first weight (a Monte Carlo replication's block)
    fixef_method: str = "auto"  # "auto", "map" or "direct" (kernels.crve.fixef)
    fixef_tol: float = 1e-8
    fixef_maxiter: int = 10_000
    drop_singletons: bool = True
    crv3: bool = False  # also the CRV3 (jackknife) covariance (BootstrapOutcome.covariance_crv3)
    # MacKinnon, Nielsen & Webb (2023) variants as wildboottest and fwildclusterboot name them: the first digit
    # the bootstrap DGP's residuals (1: of the (restricted) fit; 3: of the fit leaving the bootstrap cluster
    # out, the jackknife), the second the variance of t and t* (1: CRV1; 3: CRV3).
    bootstrap_type: str = "11"

    @classmethod
    def from_params(cls, params: BaseModel, **settings: Any) -> BootstrapOptions:
        """The options of a job's validated params, copied by name (:func:`kernels.spec.settings_from`);
        ``settings`` the rest (the restrictions, the draws' block bound, what the run derives from the params).
        ``param`` and ``r`` are not copied: a job names its coefficient and null value in text, which its
        restrictions carry."""
        return settings_from(cls, params, exclude=("param", "r"), **settings)


@dataclass
class BootstrapData:
    """Arrays on the namespace ``xp``; codes are int64 in [0, count)."""

    x: Any  # (N, k) float64
    y: Any  # (N,) float64
    cluster: Any | None  # (N,) the variance clusters; None: heteroskedasticity-robust (no clusters)
    n_clusters: int | None = None
    bootcluster: Any | None = None  # (N,) or None: chosen from the variance clusters
    n_boot_clusters: int | None = None
    fe: Any | None = None  # (N,) a fixed effect, absorbed
    n_fe: int | None = None
    names: list[str] = field(default_factory=list)
    more_clusters: list[tuple[Any, int]] = field(default_factory=list)  # further variance cluster dimensions
    more_fe: list[tuple[Any, int]] = field(default_factory=list)  # further fixed effects
    weights: Any | None = None  # (N,) regression weights >= 0 (rows of weight 0 are dropped)
    cluster_names: list[str] = field(default_factory=list)
    fe_names: list[str] = field(default_factory=list)


@dataclass
class BootstrapOutcome:
    coefficients: np.ndarray
    standard_errors: np.ndarray
    covariance: np.ndarray
    restriction_estimate: np.ndarray  # R beta (q,)
    estimate: float  # R beta (q = 1), or nan
    se: float  # sqrt(R V R') (q = 1), or nan
    t_stat: float  # (R beta - r) / se (q = 1), or nan
    wald_stat: float | None  # q > 1
    p_values: dict[str, float]  # q = 1: the four types; q > 1: {"wald": p}
    p_values_analytic: dict[str, float]
    conf_int: tuple[float | None, float | None] | None
    conf_int_analytic: tuple[float, float] | None
    t_boot: np.ndarray  # t* (q = 1) or W* (q > 1)
    reps_used: int
    reps_undefined: int  # draws whose variance is not positive (multiway): left out of the p-values
    enumerated: bool
    n_obs: int
    n_clusters: int  # the fewest clusters of any dimension (N without clusters)
    cluster_counts: list[int]
    n_boot_clusters: int
    bootcluster_name: str | None
    n_params_ssc: int
    ssc_factor: float
    df_t: int
    fe_nested: bool | None  # the first fixed effect nested in the (first) variance clusters
    fe_nested_all: list[bool]
    fe_levels: list[int]
    n_singletons: int
    demeaning: dict[str, Any] | None
    eigen_fixed: bool
    covariance_crv3: np.ndarray | None = None


def wild_cluster_bootstrap(
    xp: ModuleType,
    data: BootstrapData,
    options: BootstrapOptions,
    report: Report | None = None,
    timer: StageTimer | None = None,
) -> BootstrapOutcome:
    """The wild (cluster) bootstrap test of H0: R beta = r; see the module docstring. ``timer`` times the
    stages (demean: dropping rows, absorbing fixed effects, weighting; reduce, estimate, draw_weights, bootstrap,
    inference); ``report`` gets the share of draws done."""
    setup = bootstrap_setup(xp, data, options, timer)
    draws = bootstrap_draws(xp, setup, options, None, report or _no_report, timer)
    with _stage(timer, "inference"):
        return bootstrap_inference(setup.inference, draws, options)


# The run in its three parts, for a run whose draws are computed in ranges by separate workers and put together
# (a fan-out: kernels/crve/bootstrap_chunks.py): the set-up, the draws of a range (in the whole run's chunks of
# draws, so each draw comes from the very call that computes it in one run), and the inference from all draws.


@dataclass
class InferenceInputs:
    """What the inference takes from the set-up, all on the host: the fit, the test and facts of the rows."""

    fit: _Fit
    test: _Test
    facts: _RowFacts

    def parts(self) -> dict[str, dict[str, Any]]:
        """The fields of the fit, the test and the facts by name (numbers, strings, lists, host arrays)."""
        named = {"fit": self.fit, "test": self.test, "facts": self.facts}
        return {name: {item.name: getattr(part, item.name) for item in fields(part)} for name, part in named.items()}

    @classmethod
    def from_parts(cls, parts: dict[str, dict[str, Any]]) -> InferenceInputs:
        return cls(_Fit(**parts["fit"]), _Test(**parts["test"]), _RowFacts(**parts["facts"]))


@dataclass
class BootstrapSetup:
    """A test ready for its draws: the operator (on xp), the factor on every draw's variance, the inference's
    inputs."""

    operator: _Operator
    factor: float
    inference: InferenceInputs


def bootstrap_setup(
    xp: ModuleType, data: BootstrapData, options: BootstrapOptions, timer: StageTimer | None = None
) -> BootstrapSetup:
    """The stages before the draws: rows prepared and reduced, the model estimated, the test's operator."""
    rows, cells, fit = _fit_model(xp, data, options, timer)
    with _stage(timer, "estimate"):
        test = _hypothesis(fit, rows, data, options)
        operator = _bootstrap_operator(xp, cells, rows, fit, test, options)
    return BootstrapSetup(operator, _draw_factor(fit, options), InferenceInputs(fit, test, _row_facts(cells, rows)))


def draw_schedule(setup: BootstrapSetup, options: BootstrapOptions) -> DrawSchedule:
    """The draws of the run of ``setup`` and the chunks it computes them in."""
    return _draw_schedule(setup.operator, setup.inference.facts.h_count, options)


def bootstrap_draws(
    xp: ModuleType,
    setup: BootstrapSetup,
    options: BootstrapOptions,
    draws: range | None,
    report: Report,
    timer: StageTimer | None,
) -> DrawSums:
    """The per-draw sums of ``draws`` (None: all of the run's) computed in the run's chunks: ``draws`` starts
    at a chunk's first draw and ends at a chunk's end or at the last draw (:class:`DrawSchedule`)."""
    facts = setup.inference.facts
    return _bootstrap_draws(xp, setup.operator, facts.h_count, setup.inference.test.count, setup.factor, options,
                            report, timer, draws)  # fmt: skip


def bootstrap_inference(inputs: InferenceInputs, draws: DrawSums, options: BootstrapOptions) -> BootstrapOutcome:
    """The outcome from the set-up's inputs and every draw's sums, in draw order."""
    return _infer(inputs.fit, inputs.test, draws, inputs.facts, options)


def wild_bootstrap_family(
    xp: ModuleType,
    data: BootstrapData,
    options: BootstrapOptions,
    family: list[Restrictions],
    report: Report | None = None,
    timer: StageTimer | None = None,
) -> list[BootstrapOutcome]:
    """A family of single restrictions tested on one fit with the same draws (the weights are a function of
    (seed, draw, cluster), so every member sees the same v): the inputs of the multiple-testing adjustments
    (:func:`kernels.crve.inference.romano_wolf_p_values`). The rows are reduced and the model estimated once."""
    report = report or _no_report
    if not family:
        raise ValueError("family: no restrictions")
    options = replace(options, restrictions=family[0])
    rows, cells, fit = _fit_model(xp, data, options, timer)
    outcomes = []
    for index, member in enumerate(family):
        if member.count != 1:
            raise ValueError("family: each member is a single restriction")
        member_options = replace(options, restrictions=member)

        def member_report(fraction: float, stage: str, index: int = index) -> None:
            report((index + fraction) / len(family), f"hypothesis {index + 1}/{len(family)}: {stage}")

        with _stage(timer, "estimate"):
            test = _hypothesis(fit, rows, data, member_options)
            operator = _bootstrap_operator(xp, cells, rows, fit, test, member_options)
        draws = _bootstrap_draws(xp, operator, cells.h_count, 1, _draw_factor(fit, member_options), member_options,
                                 member_report, timer)  # fmt: skip
        with _stage(timer, "inference"):
            outcomes.append(_infer(fit, test, draws, _row_facts(cells, rows), member_options))
    return outcomes


def _draw_factor(fit: _Fit, options: BootstrapOptions) -> float:
    """The factor on every draw's variance sum: CRV1's small-sample factor, or 1 for CRV3 (its (G-1)/G is
    inside the operator)."""
    return 1.0 if options.bootstrap_type[1] == "3" else fit.factor


def _fit_model(
    xp: ModuleType, data: BootstrapData, options: BootstrapOptions, timer: StageTimer | None
) -> tuple[_Rows, _Cells, _Fit]:
    """The stages every test shares: the rows prepared, reduced to cells, the model estimated."""
    with _stage(timer, "demean"):
        rows = _prepare_rows(xp, data, options)
    with _stage(timer, "reduce"):
        cells = _reduce_cells(xp, rows)
    with _stage(timer, "estimate"):
        fit = _estimate(cells, rows, data, options)
    return rows, cells, fit


def _no_report(fraction: float, stage: str) -> None:
    return None


def _stage(timer: StageTimer | None, name: str) -> AbstractContextManager[None]:
    return nullcontext() if timer is None else timer.stage(name)


# ----------------------------------------------------------------------------------------------- the rows


@dataclass
class _Dimension:
    """A variance cluster dimension (or an intersection of several, with its sign)."""

    codes: Any  # (N,) on xp
    count: int
    sign: float


@dataclass
class _Rows:
    """The N rows after dropping, demeaning and weighting, on xp."""

    x: Any  # sqrt(w) M_D x
    y: Any
    sqrt_w: Any | None
    dimensions: list[_Dimension]
    cluster_counts: list[int]
    boot: Any  # (N,) bootstrap cluster codes
    h_count: int
    bootcluster_name: str | None
    fixed_effects: list[FixedEffect]
    fe_nested: list[bool]  # per fixed effect: nested in some variance dimension (the small-sample count)
    fe_crossing: list[list[bool]]  # per dimension, per fixed effect: crosses the dimension's clusters
    gram: Gram | None  # when some fixed effect crosses some dimension
    n_singletons: int
    demeaning: dict[str, Any] | None
    heteroskedastic: bool


def _cluster_list(data: BootstrapData) -> list[tuple[Any, int]]:
    if data.cluster is None:
        if data.more_clusters:
            raise ValueError("cluster: further cluster dimensions need a first one")
        return []
    return [(data.cluster, data.n_clusters), *data.more_clusters]


def _fixed_effect_list(data: BootstrapData) -> list[FixedEffect]:
    pairs = ([] if data.fe is None else [(data.fe, data.n_fe)]) + list(data.more_fe)
    names = data.fe_names or [f"fe{index + 1}" for index in range(len(pairs))]
    return [FixedEffect(name, codes, count) for name, (codes, count) in zip(names, pairs, strict=True)]


def _prepare_rows(xp: ModuleType, data: BootstrapData, options: BootstrapOptions) -> _Rows:
    """Drop rows of weight zero and singletons, demean, weight; the variance dimensions and bootstrap clusters."""
    n_obs, k = data.x.shape
    _check_options(data, options, k)
    clusters = _cluster_list(data)
    fixed_effects = _fixed_effect_list(data)
    boot = None if data.bootcluster is None else (data.bootcluster, data.n_boot_clusters)
    keep, n_zero_weight = None, 0
    if data.weights is not None:
        keep = data.weights > 0
        n_zero_weight = int((data.weights <= 0).sum())
    if options.drop_singletons and fixed_effects:
        keep = drop_singletons(xp, fixed_effects, xp.ones(n_obs, dtype=bool) if keep is None else keep)
    n_kept = n_obs if keep is None else int(keep.sum())  # without weights or fixed effects every row stays
    n_singletons = n_obs - n_kept - n_zero_weight
    x, y, weights = data.x, data.y, data.weights
    if n_kept < n_obs:
        x, y = x[keep], y[keep]
        weights = None if weights is None else weights[keep]
        clusters = [recode(xp, codes[keep]) for codes, _ in clusters]
        boot = None if boot is None else recode(xp, boot[0][keep])
        fixed_effects = [FixedEffect(e.name, *recode(xp, e.codes[keep])) for e in fixed_effects]
    demeaning = None
    gram = None
    dimension_codes = _dimension_codes(xp, clusters)
    fe_crossing = [
        [not is_nested(xp, e.codes, e.count, codes) for e in fixed_effects] for codes, _, _ in dimension_codes
    ]
    heteroskedastic = not clusters
    if heteroskedastic:
        fe_crossing = [[True] * len(fixed_effects)]
    if fixed_effects:  # x and y demeaned together: one pass of the projections over both
        if any(any(row) for row in fe_crossing) or options.fixef_method == "direct":
            gram = Gram(xp, fixed_effects, weights)
        values = xp.concatenate([x, y[:, None]], axis=1)
        result = demean(
            xp, values, fixed_effects, weights, options.fixef_method, options.fixef_tol, options.fixef_maxiter, gram
        )
        if not result.converged:
            raise ValueError(
                f"fixef_maxiter: demeaning by alternating projections did not converge to fixef_tol="
                f"{options.fixef_tol:g} in {options.fixef_maxiter} iterations; raise fixef_maxiter or fixef_tol"
            )
        x, y = result.values[:, :k], result.values[:, k]
        demeaning = {"method": result.method, "iterations": result.iterations, "tol": options.fixef_tol}
    sqrt_w = None if weights is None else xp.sqrt(weights)
    if sqrt_w is not None:
        x, y = x * sqrt_w[:, None], y * sqrt_w
    if heteroskedastic:
        rows_codes = xp.arange(n_kept, dtype=xp.int64)
        dimensions = [_Dimension(rows_codes, n_kept, 1.0)]
        boot_codes, h_count, boot_name = rows_codes, n_kept, None
    else:
        dimensions = [_Dimension(codes, count, sign) for codes, count, sign in dimension_codes]
        boot_codes, h_count, boot_name = _bootstrap_clusters(clusters, boot, data)
    fe_nested = [not all(row[index] for row in fe_crossing) for index in range(len(fixed_effects))]
    if heteroskedastic:
        fe_nested = [False] * len(fixed_effects)
    return _Rows(
        x=xp.ascontiguousarray(x, dtype=xp.float64),  # no copy when the rows are used as given
        y=xp.ascontiguousarray(y, dtype=xp.float64),
        sqrt_w=sqrt_w,
        dimensions=dimensions,
        cluster_counts=[count for _, count in clusters] if clusters else [n_kept],
        boot=boot_codes,
        h_count=h_count,
        bootcluster_name=boot_name,
        fixed_effects=fixed_effects,
        fe_nested=fe_nested,
        fe_crossing=fe_crossing,
        gram=gram,
        n_singletons=n_singletons,
        demeaning=demeaning,
        heteroskedastic=heteroskedastic,
    )


def _check_options(data: BootstrapData, options: BootstrapOptions, k: int) -> None:
    """Options against the data. What a job's params refuse at submission (kernels/crve/spec.py) is asserted."""
    assert options.p_val_type in P_VALUE_TYPES, f"p_val_type must be one of {P_VALUE_TYPES}"
    assert options.bootstrap_type in BOOTSTRAP_TYPES, f"bootstrap_type must be one of {BOOTSTRAP_TYPES}"
    if options.bootstrap_type != "11":
        assert data.cluster is not None, "bootstrap_type: the jackknife variants need clusters"
        assert options.restrictions is None or options.restrictions.count == 1, (
            "bootstrap_type: the jackknife variants test one restriction"
        )
    if options.restrictions is None and (options.param is None or not 0 <= options.param < k):
        raise ValueError(f"param index {options.param} outside the {k} regressors")
    if options.restrictions is not None and options.restrictions.matrix.shape[1] != k:
        raise ValueError(f"the restrictions have {options.restrictions.matrix.shape[1]} columns for {k} regressors")
    for _, count in _cluster_list(data):
        if count < 2:
            raise ValueError("cluster: a variance cluster column has a single cluster; at least 2 are needed")


def _dimension_codes(xp: ModuleType, clusters: list[tuple[Any, int]]) -> list[tuple[Any, int, float]]:
    """Every non-empty subset of the cluster dimensions as one clustering (their intersection), with the sign
    (-1)^(size + 1) of the inclusion-exclusion formula (Cameron, Gelbach & Miller 2011)."""
    out = []
    for size in range(1, len(clusters) + 1):
        for subset in itertools.combinations(range(len(clusters)), size):
            codes, count = clusters[subset[0]]
            for index in subset[1:]:
                other, other_count = clusters[index]
                codes, count = recode(xp, codes * other_count + other)
            out.append((codes, count, 1.0 if size % 2 else -1.0))
    return out


def _bootstrap_clusters(
    clusters: list[tuple[Any, int]], boot: tuple[Any, int] | None, data: BootstrapData
) -> tuple[Any, int, str | None]:
    if boot is not None:
        return boot[0], boot[1], "bootcluster"
    counts = [count for _, count in clusters]
    index = int(np.argmin(counts))  # with several dimensions the one with the fewest clusters (MNW 2021)
    name = data.cluster_names[index] if index < len(data.cluster_names) else None
    return clusters[index][0], clusters[index][1], name


# ---------------------------------------------------------------------------------------------- the cells


@dataclass
class _Cells:
    """The cells' statistics and memberships on the namespace ``ns`` (NumPy, or xp for many cells)."""

    ns: ModuleType
    xtx: Any  # (P, k, k)
    xty: Any  # (P, k)
    dim_codes: list[Any]  # per dimension: each cell's cluster (P,)
    boot: Any  # (P,) each cell's bootstrap cluster
    h_count: int
    codes: Any  # (N,) each row's cell, on xp
    identity: bool = False  # one cell per cluster: the cells are the (single dimension's) bootstrap clusters

    def sums(self, values: Any, codes: Any, count: int) -> Any:
        """``values`` (P, ...) of the cells summed by ``codes`` (the cells' clusters of a dimension, or their
        bootstrap clusters): the values themselves when each cell is its own cluster."""
        return values if self.identity else cluster_sums(self.ns, values, codes, count)


def _cells_are_clusters(rows: _Rows) -> bool:
    """One variance dimension whose clusters are the bootstrap clusters (or a cell per row without clusters):
    each cluster is one cell, so the reduction needs no cell codes and the sums by cluster are the cells'."""
    return rows.heteroskedastic or (len(rows.dimensions) == 1 and rows.boot is rows.dimensions[0].codes)


def _reduce_cells(xp: ModuleType, rows: _Rows) -> _Cells:
    """One pass over the rows: each cell's X~'X~ and X~'y~."""
    identity = _cells_are_clusters(rows)
    if identity:
        codes, count = rows.boot, rows.h_count
    else:
        first = rows.dimensions[: len(rows.cluster_counts)]
        keys = [(dimension.codes, dimension.count) for dimension in first]
        if not any(rows.boot is dimension.codes for dimension in first):  # a dimension bootstrapped adds nothing
            keys.append((rows.boot, rows.h_count))
        codes, count = keys[0]
        for other, other_count in keys[1:]:
            codes, count = recode(xp, codes * other_count + other)
    on_host = is_numpy(xp) or count <= HOST_CELLS
    ns = np if on_host else xp
    if on_host:
        xtx, xty = pair_statistics_host(xp, rows.x, rows.y, codes, count)
    elif rows.heteroskedastic:
        xtx, xty = rows.x[:, :, None] * rows.x[:, None, :], rows.x * rows.y[:, None]
    else:
        xtx, xty = pair_statistics(xp, rows.x, rows.y, codes, count)
    if identity:
        cell_codes = ns.arange(count, dtype=ns.int64)
        return _Cells(ns, xtx, xty, [cell_codes], cell_codes, rows.h_count, codes, identity=True)
    move = to_host if on_host else (lambda array: array)
    dim_codes = [move(_cell_labels(xp, codes, count, dimension.codes)) for dimension in rows.dimensions]
    return _Cells(ns, xtx, xty, dim_codes, move(_cell_labels(xp, codes, count, rows.boot)), rows.h_count, codes)


def _cell_labels(xp: ModuleType, codes: Any, count: int, labels: Any) -> Any:
    """Each cell's label (count,) from the rows' labels, which agree within a cell: a plain scatter, every row
    of a cell writing the same value."""
    out = xp.empty(count, dtype=xp.int64)
    out[codes] = labels
    return out


# ------------------------------------------------------------------------------------------- the estimate


@dataclass
class _Fit:
    beta: np.ndarray
    a_full: np.ndarray  # (X'X)^-1, host
    covariance_raw: np.ndarray
    covariance: np.ndarray  # positive semi-definite (eigenvalues clipped) with several dimensions
    eigen_fixed: bool
    factor: float
    n_params_ssc: int
    df_t: int
    n_obs: int
    covariance_crv3: np.ndarray | None = None


def _small_sample(rows: _Rows, n_obs: int, k: int, ssc: bool) -> tuple[float, int, int]:
    """(factor, k in (N-1)/(N-k), degrees of freedom of the t tests); see the module docstring."""
    levels = [effect.count for effect in rows.fixed_effects]
    n_fe_params = sum(levels) - max(len(levels) - 1, 0)
    nested = [count for count, flag in zip(levels, rows.fe_nested, strict=True) if flag]
    n_params = k + n_fe_params - sum(nested) + len(nested)
    if rows.heteroskedastic:
        return (n_obs / (n_obs - n_params) if ssc else 1.0), n_params, n_obs - n_params
    g_min = min(rows.cluster_counts)
    factor = g_min / (g_min - 1) * (n_obs - 1) / (n_obs - n_params) if ssc else 1.0
    return factor, n_params, g_min - 1


def _estimate(cells: _Cells, rows: _Rows, data: BootstrapData, options: BootstrapOptions) -> _Fit:
    ns = cells.ns
    n_obs, k = rows.x.shape
    factor, n_params, df_t = _small_sample(rows, n_obs, k, options.ssc)
    if n_obs < 2 * n_params:
        raise ValueError(
            f"{n_obs} observations for {n_params} parameters: at least 2 observations per parameter needed"
        )
    xtx = to_host(cells.xtx.sum(axis=0))
    xty = to_host(cells.xty.sum(axis=0))
    check_identified(xtx, data.names)
    a_full = np.linalg.inv(xtx)
    a_full = 0.5 * (a_full + a_full.T)
    beta = a_full @ xty
    beta_ns = ns.asarray(beta)
    meat = np.zeros((k, k))
    for dimension, codes in zip(rows.dimensions, cells.dim_codes, strict=True):
        scores = cells.sums(cells.xty - _matvec(cells.xtx, beta_ns), codes, dimension.count)
        meat += dimension.sign * to_host(scores.T @ scores)
    covariance_raw = factor * (a_full @ meat @ a_full)
    covariance_raw = 0.5 * (covariance_raw + covariance_raw.T)
    covariance, eigen_fixed = covariance_raw, False
    if len(rows.dimensions) > 1:
        values, vectors = np.linalg.eigh(covariance_raw)
        if values[0] < 0:
            covariance, eigen_fixed = (vectors * np.maximum(values, 0.0)) @ vectors.T, True
    wants_crv3 = options.crv3 or options.bootstrap_type[1] == "3"
    crv3 = _crv3(cells, rows, xtx, xty, beta, data.names, options.ssc) if wants_crv3 else None
    return _Fit(beta, a_full, covariance_raw, covariance, eigen_fixed, factor, n_params, df_t, n_obs, crv3)


def _crv3(
    cells: _Cells, rows: _Rows, xtx: np.ndarray, xty: np.ndarray, beta: np.ndarray, names: list[str], ssc: bool
) -> np.ndarray:
    """CRV3, the cluster jackknife (MacKinnon, Nielsen & Webb 2023): per dimension d, with the estimates
    beta_(g) leaving out cluster g, V_d = (G_d - 1)/G_d sum_g (beta_(g) - beta)(beta_(g) - beta)' ((G_d - 1)/G_d
    only with ``ssc``; pyfixest multiplies by its CRV1 factor instead), summed with the multiway signs. The
    leave-one-out estimates come from the cluster statistics: beta_(g) = (X'X - X_g'X_g)^-1 (X'y - X_g'y_g),
    which is the refit only when no fixed effect crosses the clusters (their demeaning would change)."""
    if rows.heteroskedastic:
        raise ValueError("vcov_type: CRV3 needs clusters (cluster is null: HC1)")
    if any(any(row) for row in rows.fe_crossing):
        raise ValueError(
            "vcov_type: CRV3 with a fixed effect that crosses the clusters needs a refit per cluster, not built; "
            "absorb only fixed effects nested in the clusters or add the crossing one as C(column)"
        )
    k = xtx.shape[0]
    total = np.zeros((k, k))
    for dimension, codes in zip(rows.dimensions, cells.dim_codes, strict=True):
        xtx_g = to_host(cells.sums(cells.xtx, codes, dimension.count))
        xty_g = to_host(cells.sums(cells.xty, codes, dimension.count))
        left_out = xtx[None] - xtx_g
        scale = np.sqrt(np.einsum("gii->gi", left_out).clip(min=1e-300))
        condition = np.linalg.cond(left_out / scale[:, :, None] / scale[:, None, :])
        if not np.all(condition < 1e12):
            group = int(np.argmax(~(condition < 1e12)))
            raise ValueError(
                f"vcov_type: CRV3 leaves out cluster {group} (code) of {dimension.count}, and without it X'X is "
                f"singular (the regressors {names} are not identified without that cluster)"
            )
        jack = np.linalg.solve(left_out, (xty[None] - xty_g)[:, :, None])[:, :, 0] - beta
        factor = (dimension.count - 1) / dimension.count if ssc else 1.0
        total += dimension.sign * factor * (jack.T @ jack)
    return 0.5 * (total + total.T)


@dataclass
class _Test:
    matrix: np.ndarray  # R (q, k)
    rhs: np.ndarray  # r (q,)
    directions: np.ndarray  # A R' (k, q)
    beta_boot: np.ndarray  # the bootstrap DGP's coefficients at r
    beta_boot1: np.ndarray  # d beta~ / d r (q = 1, WCR), zeros otherwise
    estimate: np.ndarray  # R beta (q,)
    variance: np.ndarray  # R V R' (q, q), V as computed (not eigen-fixed)
    t_stat: float
    wald_stat: float | None

    @property
    def count(self) -> int:
        return int(self.matrix.shape[0])


def _hypothesis(fit: _Fit, rows: _Rows, data: BootstrapData, options: BootstrapOptions) -> _Test:
    k = fit.beta.size
    if options.restrictions is not None:
        matrix, rhs = options.restrictions.matrix, options.restrictions.rhs
    else:
        matrix, rhs = np.eye(k)[[options.param]], np.array([options.r])
    directions = fit.a_full @ matrix.T
    middle = matrix @ directions  # R A R'
    estimate = matrix @ fit.beta
    if options.impose_null:
        correction = np.linalg.solve(middle, estimate - rhs)
        beta_boot = fit.beta - directions @ correction
        beta_boot1 = directions[:, 0] / middle[0, 0] if matrix.shape[0] == 1 else np.zeros(k)
    else:
        beta_boot, beta_boot1 = fit.beta, np.zeros(k)
    covariance = fit.covariance_crv3 if options.bootstrap_type[1] == "3" else fit.covariance_raw
    variance = matrix @ covariance @ matrix.T
    if matrix.shape[0] == 1:
        if not variance[0, 0] > 0:
            raise ValueError(
                "cluster: the multiway variance of the tested combination is not positive on these data (the signed "
                "sum of the dimensions' variances); test with fewer cluster dimensions"
            )
        t_stat, wald = float((estimate[0] - rhs[0]) / np.sqrt(variance[0, 0])), None
    else:
        gap = estimate - rhs
        t_stat, wald = float("nan"), float(gap @ np.linalg.solve(variance, gap))
    return _Test(matrix, rhs, directions, beta_boot, beta_boot1, estimate, variance, t_stat, wald)


# ------------------------------------------------------------------------------------------ the operator


class _Operator:
    """Applies the numerators C' and each dimension's M (and their derivatives in r) to draws V (H x B) on xp."""

    def __init__(self, xp: ModuleType, q: int) -> None:
        self.xp, self.q = xp, q
        self.c: Any = None
        self.c1: Any = None
        self.s_h: Any = None
        self.s_h1: Any = None
        self.blocks: list[_DimensionBlock] = []
        self.quadratic: tuple[Any, Any, Any] | None = None  # (Q00, Q01, Q11) when chosen (quadratic_forms)

    def widest(self, h_count: int) -> int:
        """Rows of the largest array a chunk of draws makes (H, q G of a dimension, or F1 of Q1 V)."""
        sizes = [h_count] + [block.w.shape[0] for block in self.blocks]
        sizes += [block.fe.q1.shape[0] for block in self.blocks if block.fe is not None and block.fe.l1 is not None]
        return max(sizes)

    def numerators(self, v: Any, derivative: bool) -> Any:
        """(q, B)"""
        return _contract(self.xp, self.c1 if derivative else self.c, v)

    def scores(self, block: _DimensionBlock, v: Any, derivative: bool) -> Any:
        """D = M V (q G_d, B) for one dimension."""
        s_h = self.s_h1 if derivative else self.s_h
        t1 = block.t1_1 if derivative else block.t1
        if block.diagonal:  # each of the q blocks scales the rows of v: (q, G, 1) broadcast against (G, B)
            d = t1[:, None] * v if self.q == 1 else (t1.reshape(self.q, -1, 1) * v).reshape(-1, v.shape[1])
        else:
            d = t1 @ v
        d = d - block.w @ _contract(self.xp, s_h, v)
        if block.fe is not None:
            d = d - block.fe.apply(v, derivative)
        return d


@dataclass
class _FeCorrection:
    """K V = L1 (Q1 V) + R2 (Y2 V) (module docstring), each factor at r0 and its derivative in r."""

    l1: Any | None  # (q G, F1) sparse, None when the first fixed effect is nested in the dimension
    q1: Any
    q1_1: Any
    r2: Any | None  # (q G, F_r) dense
    y2: Any | None  # (F_r, H) dense
    y2_1: Any | None

    def dense(self, derivative: bool) -> Any:
        """K (q G, H) as a dense matrix."""
        out = 0
        if self.l1 is not None:
            out = dense_matrix(self.l1 @ (self.q1_1 if derivative else self.q1))
        if self.r2 is not None:
            out = out + self.r2 @ (self.y2_1 if derivative else self.y2)
        return out

    def apply(self, v: Any, derivative: bool) -> Any:
        out = 0
        if self.l1 is not None:
            out = self.l1 @ ((self.q1_1 if derivative else self.q1) @ v)
        if self.r2 is not None:
            out = out + self.r2 @ ((self.y2_1 if derivative else self.y2) @ v)
        return out


@dataclass
class _DimensionBlock:
    sign: float
    diagonal: bool  # the dimension's clusters are the bootstrap clusters: T1 is q diagonal G x G blocks (t1)
    t1: Any
    t1_1: Any
    w: Any  # (q G, k)
    fe: _FeCorrection | None


def _bootstrap_operator(
    xp: ModuleType, cells: _Cells, rows: _Rows, fit: _Fit, test: _Test, options: BootstrapOptions
) -> _Operator:
    ns, q, h_count = cells.ns, test.count, cells.h_count
    move = xp.asarray
    directions = ns.asarray(test.directions)
    if options.bootstrap_type[0] == "3":  # each cell's residuals from the fit without its bootstrap cluster
        if any(not is_nested(xp, effect.codes, effect.count, rows.boot) for effect in rows.fixed_effects):
            raise ValueError(
                "bootstrap_type: jackknife residuals with a fixed effect that crosses the bootstrap clusters need a "
                "refit per cluster, not built; absorb only nested fixed effects or add the crossing one as C(column)"
            )
        beta_h, beta_h1 = _jackknife_dgp(ns, cells, fit, test, options)
        s_c = cells.xty - ns.einsum("cij,cj->ci", cells.xtx, beta_h[cells.boot])
        s_c1 = ns.einsum("cij,cj->ci", cells.xtx, beta_h1[cells.boot])
    else:
        beta_boot, beta_boot1 = ns.asarray(test.beta_boot), ns.asarray(test.beta_boot1)
        s_c = cells.xty - _matvec(cells.xtx, beta_boot)  # (P, k) at r0
        s_c1 = _matvec(cells.xtx, beta_boot1)  # its derivative: S(r) = S(r0) - (r - r0) S1
    s_h, s_h1 = cells.sums(s_c, cells.boot, h_count), cells.sums(s_c1, cells.boot, h_count)
    operator = _Operator(xp, q)
    # The operator's dense pieces built on the host go to the device together at the end (_pack_to_device).
    pack_later = is_numpy(ns) and not is_numpy(xp)
    dense_move = (lambda array: array) if pack_later else move
    operator.c, operator.c1 = dense_move(s_h @ directions), dense_move(s_h1 @ directions)
    operator.s_h, operator.s_h1 = dense_move(s_h), dense_move(s_h1)
    a_full = ns.asarray(fit.a_full)
    derivative = options.conf_int and options.impose_null and q == 1
    fe_terms = _FeTerms(xp, rows, test, derivative) if rows.gram is not None else None
    rows_total = sum(dimension.count for dimension in rows.dimensions)
    quadratic = (
        q == 1
        and h_count <= QUADRATIC_MAX_H
        and h_count * h_count < rows_total * (fit.beta.size + 2)
        and rows_total * h_count <= QUADRATIC_MAX_CELLS
    )
    forms = [xp.zeros((h_count, h_count)) for _ in range(3 if derivative else 1)] if quadratic else None
    for index, (dimension, codes) in enumerate(zip(rows.dimensions, cells.dim_codes, strict=True)):
        g_count = dimension.count
        xtx_g = cells.sums(cells.xtx, codes, g_count)
        if options.bootstrap_type[1] == "3":
            w, t1_values, t1_values1 = _crv3_operator(ns, cells, codes, xtx_g, fit, test, s_c, s_c1, options, g_count)
        else:
            # w_{l,g} = A X_g'X_g a_l, stacked over l: row l G + g.
            w = ns.concatenate([_matvec(xtx_g, directions[:, row]) @ a_full for row in range(q)], axis=0)
            t1_values, t1_values1 = s_c @ directions, s_c1 @ directions  # (P, q)
        fe = None
        if fe_terms is not None and any(rows.fe_crossing[index]):
            fe = fe_terms.correction(dimension, rows.fe_crossing[index])
        if forms is not None:
            _add_quadratic_forms(ns, xp, forms, dimension, codes, cells.boot, h_count, w, (t1_values, t1_values1),
                                 (s_h, s_h1), fe)  # fmt: skip
            continue
        diagonal = cells.identity or bool(g_count == h_count and to_host((codes == cells.boot).all()))
        if diagonal:  # rows l G + g of D: t1 (q G,) against the draws of cluster g
            t1 = dense_move(cells.sums(t1_values, codes, g_count).T.reshape(-1))
            t1_1 = dense_move(cells.sums(t1_values1, codes, g_count).T.reshape(-1))
        else:
            row_index = move(ns.concatenate([codes + row * g_count for row in range(q)]))
            col_index = move(ns.concatenate([cells.boot] * q))
            shape = (q * g_count, h_count)
            t1 = sparse_matrix(xp, row_index, col_index, move(t1_values.T.reshape(-1)), shape)
            t1_1 = sparse_matrix(xp, row_index, col_index, move(t1_values1.T.reshape(-1)), shape)
        operator.blocks.append(_DimensionBlock(dimension.sign, diagonal, t1, t1_1, dense_move(w), fe))
    if forms is not None:
        operator.quadratic = (forms[0], forms[1], forms[2]) if derivative else (forms[0], None, None)
    if pack_later:
        _pack_to_device(xp, operator)
    return operator


def _pack_to_device(xp: ModuleType, operator: _Operator) -> None:
    """Move the operator's host-built dense pieces (numerators, S_h, the diagonal T1 and W of each dimension) to
    xp in one copy: views of one device buffer. A copy each would pay a transfer's latency per piece."""
    owners = [(operator, name) for name in ("c", "c1", "s_h", "s_h1")]
    for block in operator.blocks:
        owners += [(block, "w")] + ([(block, "t1"), (block, "t1_1")] if block.diagonal else [])
    arrays = [np.ascontiguousarray(getattr(owner, name), dtype=np.float64) for owner, name in owners]
    buffer = xp.asarray(np.concatenate([array.reshape(-1) for array in arrays]))
    start = 0
    for (owner, name), array in zip(owners, arrays, strict=True):
        setattr(owner, name, buffer[start : start + array.size].reshape(array.shape))
        start += array.size


def _jackknife_dgp(ns: ModuleType, cells: _Cells, fit: _Fit, test: _Test, options: BootstrapOptions) -> tuple[Any, Any]:
    """The bootstrap DGP's coefficients leaving each bootstrap cluster h out (MNW 2023's jackknife residuals,
    the first digit 3): beta^(h) by least squares without h, restricted to R beta = r under WCR
    (beta~^(h) = beta^(h) - A_h R'(R A_h R')^-1 (R beta^(h) - r), A_h = (X'X - X_h'X_h)^-1), and its derivative
    in r, A_h R' / (R A_h R'). (H, k) each. Refused where leaving a cluster out leaves X'X singular."""
    xtx_h = to_host(cells.sums(cells.xtx, cells.boot, cells.h_count))
    xty_h = to_host(cells.sums(cells.xty, cells.boot, cells.h_count))
    left_out = to_host(cells.xtx.sum(axis=0))[None] - xtx_h
    scale = np.sqrt(np.einsum("hii->hi", left_out).clip(min=1e-300))
    if not np.all(np.linalg.cond(left_out / scale[:, :, None] / scale[:, None, :]) < 1e12):
        raise ValueError("bootstrap_type: leaving a bootstrap cluster out leaves X'X singular (jackknife residuals)")
    xty = to_host(cells.xty.sum(axis=0))
    inverse = np.linalg.inv(left_out)
    beta = np.einsum("hij,hj->hi", inverse, xty[None] - xty_h)
    if not options.impose_null:
        return ns.asarray(beta), ns.zeros_like(ns.asarray(beta))
    row, rhs = test.matrix[0], test.rhs[0]
    direction = inverse @ row  # (H, k): A_h R'
    middle = direction @ row  # (H,)
    restricted = beta - direction * ((beta @ row - rhs) / middle)[:, None]
    return ns.asarray(restricted), ns.asarray(direction / middle[:, None])


def _crv3_operator(
    ns: ModuleType,
    cells: _Cells,
    codes: Any,
    xtx_g: Any,
    fit: _Fit,
    test: _Test,
    s_c: Any,
    s_c1: Any,
    options: BootstrapOptions,
    g_count: int,
) -> tuple[Any, Any, Any]:
    """A dimension's operator for CRV3 in t* (the second digit 3): R beta*_(g) - R beta* = c_g'(S(v) - S_g(v)) -
    a'S(v) with c_g = (X'X - X_g'X_g)^-1 R', so D = T1 V - W S'V with T1 the cells' c_g'S_gh and w_g = c_g - a
    (the negative of the jackknife deviations: the same squares), scaled by sqrt((G-1)/G) (the CRV3 factor; the
    draws' common factor is then 1)."""
    row = test.matrix[0]
    left_out = to_host(cells.xtx.sum(axis=0))[None] - to_host(xtx_g)
    c = np.linalg.solve(left_out, np.broadcast_to(row, (g_count, row.size))[:, :, None])[:, :, 0]
    scale = np.sqrt((g_count - 1) / g_count) if options.ssc else 1.0
    c_cells = ns.asarray(c)[codes]
    w = ns.asarray(scale * (c - test.directions[:, 0][None, :]))
    t1 = scale * (s_c * c_cells).sum(axis=1)[:, None]
    t1_1 = scale * (s_c1 * c_cells).sum(axis=1)[:, None]
    return w, t1, t1_1


def _add_quadratic_forms(
    ns: ModuleType,
    xp: ModuleType,
    forms: list[Any],
    dimension: _Dimension,
    codes: Any,
    boot: Any,
    h_count: int,
    w: Any,
    t1_values: tuple[Any, Any],
    s_h: tuple[Any, Any],
    fe: _FeCorrection | None,
) -> None:
    """With one restriction and few bootstrap clusters each draw's variance sum is a quadratic form in v:
    sum_d s_d |M_d v|^2 = v'Q v with Q = sum_d s_d M_d'M_d (H x H), O(H^2) per draw instead of O(sum_d G_d k).
    Chosen when H^2 is the smaller (multiway clustering bootstrapped by a coarse dimension: the intersections
    have many clusters). Adds this dimension's M_d'M_d (and the derivatives' forms) to ``forms`` (on xp: M_d is
    built where the cells are, its G_d x H x H products run on the device)."""
    g_count = dimension.count

    def dense_operator(derivative: int) -> Any:
        flat = ns.bincount(codes * h_count + boot, weights=t1_values[derivative][:, 0], minlength=g_count * h_count)
        m = xp.asarray(flat.reshape(g_count, h_count) - w @ s_h[derivative].T)
        if fe is not None:
            m = m - fe.dense(bool(derivative))
        return m

    m0 = dense_operator(0)
    forms[0] += dimension.sign * (m0.T @ m0)
    if len(forms) > 1:
        m1 = dense_operator(1)
        cross = m0.T @ m1
        forms[1] += dimension.sign * 0.5 * (cross + cross.T)
        forms[2] += dimension.sign * (m1.T @ m1)


class _FeTerms:
    """The pieces of the fixed-effect correction shared by the dimensions: Q and the Schur solve (on xp)."""

    def __init__(self, xp: ModuleType, rows: _Rows, test: _Test, derivative: bool) -> None:
        """``derivative``: also the pieces of d/dr (the confidence interval under WCR)."""
        self.xp, self.rows, self.test, self.derivative = xp, rows, test, derivative
        gram = rows.gram
        self.gram = gram
        self.weight = xp.ones(rows.x.shape[0]) if rows.sqrt_w is None else rows.sqrt_w
        self.residual = self.weight * (rows.y - rows.x @ xp.asarray(test.beta_boot))
        self.residual1 = self.weight * (rows.x @ xp.asarray(test.beta_boot1))
        self.q1 = self.q1_1 = None  # built when a dimension needs them (the first fixed effect crosses it)
        self.y2 = self.y2_1 = None
        if gram.rest_levels:
            self.y2 = self._schur_solution(self.residual)
            self.y2_1 = self._schur_solution(self.residual1) if derivative else None

    def _first_table(self, residual: Any) -> Any:
        """Q_first (F1, H): sums of sqrt(w) u~ by first-effect level and bootstrap cluster."""
        gram, rows = self.gram, self.rows
        return grouped_table(self.xp, gram.first.codes, rows.boot, residual, (gram.first.count, rows.h_count))

    def _schur_solution(self, residual: Any) -> Any:
        """Y2 = S^+ (Q_rest - B' N1^-1 Q_first) (F_r, H): the other fixed effects' block of (D'WD)^- Q."""
        xp, gram, rows = self.xp, self.gram, self.rows
        shape = (gram.rest_levels, rows.h_count)
        rest = grouped_table(xp, xp.concatenate(gram.rest_codes), xp.concatenate([rows.boot] * len(gram.rest_codes)),
                             xp.concatenate([residual] * len(gram.rest_codes)), shape)  # fmt: skip
        first = self._first_table(residual / gram.n_first[gram.first.codes])
        return gram.s_pinv @ (dense(xp, rest) - dense(xp, gram.cross.T @ first))

    def correction(self, dimension: _Dimension, crossing: list[bool]) -> _FeCorrection:
        """L1 and R2 for one dimension: P (the sums of sqrt(w) a_l'x~ per level and cluster) of the crossing
        fixed effects only (a nested one's P is zero)."""
        xp, gram, rows, q = self.xp, self.gram, self.rows, self.test.count
        g_count = dimension.count
        z = self.weight[:, None] * (rows.x @ xp.asarray(self.test.directions))  # (N, q)
        row_index = xp.concatenate([dimension.codes + row * g_count for row in range(q)])
        l1 = None
        if crossing[gram.first_index]:
            if self.q1 is None:
                self.q1 = self._first_table(self.residual)
                self.q1_1 = self._first_table(self.residual1) if self.derivative else None
            # L1 = P1' N1^-1, (q G, F1): rows l G + g.
            values = (z / gram.n_first[gram.first.codes][:, None]).T.reshape(-1)
            l1 = grouped_table(xp, row_index, xp.concatenate([gram.first.codes] * q), values,
                               (q * g_count, gram.first.count))  # fmt: skip
        r2 = None
        if gram.rest_levels:
            # R2 = P2' - L1 B, (q G, F_r); P2 only over the crossing fixed effects among the others.
            r2 = xp.zeros((q * g_count, gram.rest_levels))
            for position, codes in zip(gram.rest_indices, gram.rest_codes, strict=True):
                if crossing[position]:
                    r2 += dense(xp, grouped_table(xp, row_index, xp.concatenate([codes] * q), z.T.reshape(-1),
                                                  (q * g_count, gram.rest_levels)))  # fmt: skip
            if l1 is not None:
                r2 = r2 - dense(xp, l1 @ gram.cross)
        return _FeCorrection(l1, self.q1, self.q1_1, r2, self.y2, self.y2_1)


# ------------------------------------------------------------------------------------------------ the draws


DRAW_SUM_FIELDS = ("numer", "sumsq", "numer1", "cross", "sumsq1", "wald")  # DrawSums's arrays, in order


@dataclass
class DrawSums:
    """Per draw (host): for one restriction the numerator and the variance sum, and with a confidence interval
    (WCR) their derivatives in r, t*_b(r) = (numer - d numer1) / sqrt(f (sumsq - 2 d cross + d^2 sumsq1));
    for several restrictions W*."""

    enumerated: bool
    numer: np.ndarray
    sumsq: np.ndarray
    numer1: np.ndarray | None
    cross: np.ndarray | None
    sumsq1: np.ndarray | None
    wald: np.ndarray | None

    @classmethod
    def empty(cls, reps: int, enumerated: bool, derivative: bool, joint: bool) -> DrawSums:
        def maybe(flag: bool) -> np.ndarray | None:
            return np.empty(reps) if flag else None

        return cls(enumerated, np.empty(reps), np.empty(reps), maybe(derivative), maybe(derivative),
                   maybe(derivative), maybe(joint))  # fmt: skip

    @property
    def reps(self) -> int:
        return self.numer.size

    @classmethod
    def concatenate(cls, parts: list[DrawSums]) -> DrawSums:
        """The sums of consecutive ranges of draws as one, in order."""

        def joined(name: str) -> np.ndarray | None:
            arrays = [getattr(part, name) for part in parts]
            return None if arrays[0] is None else np.concatenate(arrays)

        enumerated = {part.enumerated for part in parts}
        if len(enumerated) != 1:
            raise ValueError("the ranges of draws disagree on whether the draws are enumerated")
        return cls(enumerated.pop(), *(joined(name) for name in DRAW_SUM_FIELDS))

    def fill(self, operator: _Operator, v: Any, done: int, count: int, factor: float) -> None:
        """Apply the operator to the draws ``done .. done + count - 1`` (the columns of v)."""
        xp, block = operator.xp, slice(done, done + count)
        numer = operator.numerators(v, derivative=False)
        quadratic = operator.quadratic is not None
        scores = [] if quadratic else [operator.scores(dim, v, derivative=False) for dim in operator.blocks]
        if self.wald is not None:
            self.wald[block] = to_host(_wald(xp, operator, numer, scores, factor))
            self.numer[block] = np.nan
            self.sumsq[block] = np.nan
            return
        self.numer[block] = to_host(numer[0])
        if operator.quadratic is not None:
            q00, q01, q11 = operator.quadratic
            self.sumsq[block] = to_host((v * (q00 @ v)).sum(axis=0))
            if self.numer1 is not None:
                self.numer1[block] = to_host(operator.numerators(v, derivative=True)[0])
                self.cross[block] = to_host((v * (q01 @ v)).sum(axis=0))
                self.sumsq1[block] = to_host((v * (q11 @ v)).sum(axis=0))
            return
        self.sumsq[block] = to_host(_signed_sum(operator, scores, scores))
        if self.numer1 is not None:
            scores1 = [operator.scores(dim, v, derivative=True) for dim in operator.blocks]
            self.numer1[block] = to_host(operator.numerators(v, derivative=True)[0])
            self.cross[block] = to_host(_signed_sum(operator, scores, scores1))
            self.sumsq1[block] = to_host(_signed_sum(operator, scores1, scores1))


def _signed_sum(operator: _Operator, left: list[Any], right: list[Any]) -> Any:
    """sum_d s_d sum_g left_d right_d (one restriction): (B,)."""
    total = 0
    for dim, a, b in zip(operator.blocks, left, right, strict=True):
        total = total + dim.sign * _column_sums(operator.xp, a * b)
    return total


def _column_sums(xp: ModuleType, values: Any) -> Any:
    """values.sum(axis=0) for (rows, B). With millions of rows and few columns (the heteroskedastic bootstrap's
    chunks) CuPy reduces each column in one block; summing tiles of rows first gives it thousands."""
    rows = values.shape[0]
    if is_numpy(xp) or rows <= _CONTRACT_BY_SUM_ROWS:
        return values.sum(axis=0)
    per_split = -(-rows // _CONTRACT_SPLITS)
    padded = per_split * _CONTRACT_SPLITS
    if padded != rows:
        values = xp.concatenate([values, xp.zeros((padded - rows, values.shape[1]), dtype=values.dtype)])
    return values.reshape(_CONTRACT_SPLITS, per_split, values.shape[1]).sum(axis=1).sum(axis=0)


def _wald(xp: ModuleType, operator: _Operator, numer: Any, scores: list[Any], factor: float) -> Any:
    """W*_b = n_b' (f sum_d s_d D_d D_d')^-1 n_b for each draw: (B,)."""
    q = operator.q
    variance = 0
    for dim, d in zip(operator.blocks, scores, strict=True):
        stacked = d.reshape(q, -1, d.shape[-1])  # (q, G, B)
        variance = variance + dim.sign * xp.einsum("lgb,mgb->blm", stacked, stacked)
    variance = factor * variance
    numer_b = numer.T[:, :, None]  # (B, q, 1)
    solved = xp.linalg.solve(variance, numer_b)
    wald = (numer_b * solved).sum(axis=(1, 2))
    positive = xp.linalg.eigvalsh(variance)[:, 0] > 0
    return xp.where(positive, wald, xp.nan)


@dataclass(frozen=True)
class DrawSchedule:
    """The draws of a run (B, or 2^H when enumerated) and the chunks it computes them in, one operator call
    each: draws [i chunk, (i + 1) chunk), the last one shorter when chunk does not divide the draws."""

    enumerated: bool
    reps: int
    chunk: int

    @property
    def n_chunks(self) -> int:
        return -(-self.reps // self.chunk)

    def draws_of(self, chunks: range) -> range:
        """The draws of the chunks ``chunks`` (contiguous)."""
        return range(min(chunks.start * self.chunk, self.reps), min(chunks.stop * self.chunk, self.reps))

    def check(self, draws: range) -> None:
        """Refuse a range of draws that does not begin and end where the run's chunks do."""

        def at_chunk_bound(draw: int) -> bool:
            return draw % self.chunk == 0 or draw == self.reps

        aligned = at_chunk_bound(draws.start) and at_chunk_bound(draws.stop)
        if not (draws.step == 1 and 0 <= draws.start <= draws.stop <= self.reps and aligned):
            raise ValueError(
                f"draws {draws.start}..{draws.stop - 1}: not whole chunks of {self.chunk} of the run's "
                f"{self.reps} draws"
            )


def draw_chunk_size(block_elements: int, widest_rows: int) -> int:
    """Draws per chunk: the most whose widest array (``widest_rows`` x draws) stays within ``block_elements``."""
    return max(1, block_elements // widest_rows)


def _draw_schedule(operator: _Operator, h_count: int, options: BootstrapOptions) -> DrawSchedule:
    enumerated = use_enumeration(options.weights_type, h_count, options.reps)
    reps = 2**h_count if enumerated else options.reps
    chunk = options.draw_chunk or draw_chunk_size(options.block_elements, operator.widest(h_count))
    return DrawSchedule(enumerated, reps, chunk)


def _bootstrap_draws(
    xp: ModuleType,
    operator: _Operator,
    h_count: int,
    q: int,
    factor: float,
    options: BootstrapOptions,
    report: Report,
    timer: StageTimer | None,
    draws: range | None = None,
) -> DrawSums:
    """The draws ``draws`` (None: all B, or 2^H when enumerated) in the run's chunks of bounded rows x chunk
    arrays (:class:`DrawSchedule`), reporting after each chunk."""
    schedule = _draw_schedule(operator, h_count, options)
    draws = range(schedule.reps) if draws is None else draws
    schedule.check(draws)
    joint = q > 1
    sums = DrawSums.empty(len(draws), schedule.enumerated, options.conf_int and options.impose_null and not joint,
                          joint)  # fmt: skip
    done = draws.start
    report(0.0, f"bootstrap draws 0/{len(draws)}")
    while done < draws.stop:
        count = min(schedule.chunk, draws.stop - done)
        with _stage(timer, "draw_weights"):
            if schedule.enumerated:
                v = enumerated_weights(xp, h_count, done, count)
            else:
                v = draw_weights(xp, options.weights_type, options.seed, h_count, done, count, options.draw_base)
        with _stage(timer, "bootstrap"):
            sums.fill(operator, v, done - draws.start, count, factor)
        done += count
        report((done - draws.start) / len(draws), f"bootstrap draws {done - draws.start}/{len(draws)}")
    return sums


# -------------------------------------------------------------------------------------------- the inference


@dataclass
class _RowFacts:
    """What the outcome reports of the rows and cells, and the one fact of them the inference uses."""

    h_count: int
    cluster_counts: list[int]
    bootcluster_name: str | None
    fe_nested: list[bool]
    fe_levels: list[int]
    n_singletons: int
    demeaning: dict[str, Any] | None
    n_dimensions: int  # variance dimensions with the intersections: several make a variance a signed sum


def _row_facts(cells: _Cells, rows: _Rows) -> _RowFacts:
    return _RowFacts(
        h_count=cells.h_count,
        cluster_counts=rows.cluster_counts,
        bootcluster_name=rows.bootcluster_name,
        fe_nested=rows.fe_nested,
        fe_levels=[effect.count for effect in rows.fixed_effects],
        n_singletons=rows.n_singletons,
        demeaning=rows.demeaning,
        n_dimensions=len(rows.dimensions),
    )


def _infer(fit: _Fit, test: _Test, draws: DrawSums, facts: _RowFacts, options: BootstrapOptions) -> BootstrapOutcome:
    factor = _draw_factor(fit, options)
    common = {
        "coefficients": fit.beta,
        "standard_errors": np.sqrt(np.diag(fit.covariance)),
        "covariance": fit.covariance,
        "restriction_estimate": test.estimate,
        "reps_used": draws.reps,
        "enumerated": draws.enumerated,
        "n_obs": fit.n_obs,
        "n_clusters": min(facts.cluster_counts),
        "cluster_counts": facts.cluster_counts,
        "n_boot_clusters": facts.h_count,
        "bootcluster_name": facts.bootcluster_name,
        "n_params_ssc": fit.n_params_ssc,
        "ssc_factor": factor,
        "df_t": fit.df_t,
        "fe_nested": facts.fe_nested[0] if facts.fe_nested else None,
        "fe_nested_all": facts.fe_nested,
        "fe_levels": facts.fe_levels,
        "n_singletons": facts.n_singletons,
        "demeaning": facts.demeaning,
        "eigen_fixed": fit.eigen_fixed,
        "covariance_crv3": fit.covariance_crv3,
    }
    if test.count > 1:
        wald_boot = draws.wald
        defined = np.isfinite(wald_boot)
        exceed = (wald_boot[defined] > test.wald_stat * (1 + 1e-12)).sum()
        q = test.count
        return BootstrapOutcome(
            estimate=float("nan"),
            se=float("nan"),
            t_stat=float("nan"),
            wald_stat=test.wald_stat,
            p_values={"wald": float(exceed / max(defined.sum(), 1))},
            p_values_analytic={"wald": float(special.fdtrc(q, fit.df_t, test.wald_stat / q))},
            conf_int=None,
            conf_int_analytic=None,
            t_boot=wald_boot,
            reps_undefined=int((~defined).sum()),
            **common,
        )
    se = float(np.sqrt(test.variance[0, 0]))
    estimate, r = float(test.estimate[0]), float(test.rhs[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        t_boot = draws.numer / np.sqrt(factor * draws.sumsq)  # a negative variance (multiway): NaN
    p_values = {name: float(value) for name, value in p_values_from(np, t_boot, test.t_stat).items()}
    critical = t_quantile(1 - options.sign_level / 2, fit.df_t)
    ci = None
    if options.conf_int:
        curve = PValueCurve(
            estimate, se, r, factor, draws.numer, draws.sumsq, draws.numer1, draws.cross, draws.sumsq1,
            options.p_val_type, signed_variance=facts.n_dimensions > 1,
        )  # fmt: skip
        ci = curve.confidence_interval(options.sign_level, critical)
    return BootstrapOutcome(
        estimate=estimate,
        se=se,
        t_stat=test.t_stat,
        wald_stat=None,
        p_values=p_values,
        p_values_analytic=analytic_p_values(test.t_stat, fit.df_t),
        conf_int=ci,
        conf_int_analytic=(estimate - critical * se, estimate + critical * se),
        t_boot=t_boot,
        reps_undefined=int(np.isnan(t_boot).sum()),
        **common,
    )


# ------------------------------------------------------------------------------------------------- helpers


def check_identified(xtx: np.ndarray, names: list[str]) -> None:
    """Refuse a singular X'X with the names of the collinear columns."""
    diag = np.diag(xtx)
    for index, value in enumerate(diag):
        if not value > 0:
            raise ValueError(f"regressor {_name(names, index)!r} is identically zero (after absorbing fixed effects)")
    scale = 1.0 / np.sqrt(diag)
    correlation = xtx * scale[:, None] * scale[None, :]
    eigenvalues, eigenvectors = np.linalg.eigh(correlation)
    if eigenvalues[0] < 1e-10 * eigenvalues[-1]:
        involved = [_name(names, i) for i in np.flatnonzero(np.abs(eigenvectors[:, 0]) > 0.1)]
        raise ValueError(f"X'X is singular: the regressors {involved} are collinear")


def _name(names: list[str], index: int) -> str:
    return names[index] if index < len(names) else f"x{index}"


# Above this many bootstrap clusters a'V (a: H x m, m small) is split by hand: cuBLAS gives a GEMM with a tiny
# output and an inner dimension in the millions (the heteroskedastic bootstrap: H = N) too few blocks.
_CONTRACT_BY_SUM_ROWS = 65_536


_CONTRACT_SPLITS = 1_024


def _contract(xp: ModuleType, a: Any, v: Any) -> Any:
    """a'v for a (H, m) and v (H, B): (m, B). For very large H the inner dimension is split by hand into
    _CONTRACT_SPLITS batches of one batched GEMM whose partial products are then summed (split-K)."""
    rows = a.shape[0]
    if is_numpy(xp) or rows <= _CONTRACT_BY_SUM_ROWS:
        return a.T @ v
    per_split = -(-rows // _CONTRACT_SPLITS)
    padded = per_split * _CONTRACT_SPLITS
    if padded != rows:
        a = xp.concatenate([a, xp.zeros((padded - rows, a.shape[1]), dtype=a.dtype)])
        v = xp.concatenate([v, xp.zeros((padded - rows, v.shape[1]), dtype=v.dtype)])
    a_split = a.reshape(_CONTRACT_SPLITS, per_split, a.shape[1])
    v_split = v.reshape(_CONTRACT_SPLITS, per_split, v.shape[1])
    return xp.matmul(xp.swapaxes(a_split, 1, 2), v_split).sum(axis=0)


def dense_matrix(matrix: Any) -> Any:
    return matrix.toarray() if hasattr(matrix, "toarray") else matrix


def _matvec(matrices: Any, vector: Any) -> Any:
    """(..., k, k) @ (k,) as one matrix-vector product (NumPy's stacked matmul of tiny matrices is slow)."""
    k = matrices.shape[-1]
    return (matrices.reshape(-1, k) @ vector).reshape(matrices.shape[:-1])
