"""Wild cluster bootstrap-t by the "fast and wild" algorithm (Roodman, MacKinnon, Nielsen & Webb 2019).

Model y = X beta (+ one-way fixed effects, partialled out exactly by demeaning), CRV1 variance clustered by
``cluster`` (G clusters), bootstrap weights drawn per ``bootcluster`` (H clusters; the variance clusters by
default), H0: beta_j = r.

Derivation (all for the tested coefficient j; A = (X'X)^-1, a = A e_j, ~ denotes the bootstrap DGP's
coefficients: the restricted estimate under WCR, beta-hat under WCU, and u~ its residuals). With weights v
(one per bootstrap cluster h) the bootstrap sample is y* = X beta~ + v_h(i) u~_i, so
    beta*_j - beta~_j = sum_h v_h a'S_h,                            S_h = X_h'u~_h,
and the bootstrap residuals' cluster scores, projected on a, are
    a'X_g'u*_g = sum_h v_h M_gh,   M_gh = a'S_gh - w_g'S_h - [P Q]_gh,
with S_gh = X_gh'u~_gh over the rows in variance cluster g and bootstrap cluster h, w_g = A X_g'X_g a,
and P Q the correction for fixed effects that cross the variance clusters (zero when they are nested):
P_gf = a' sum_{i in g, f} x_i, Q_fh = sum_{i in f, h} u~_i / n_f. Hence for a whole matrix V (H x B) of
draws at once: numerators c'V with c_h = a'S_h, and D = M V (G x B) whose column sums of squares are the
CRV1 variances. M is never formed: T1 (the a'S_gh, diagonal when the bootstrap and variance clusters
coincide) is sparse, W S' has rank k, P Q goes through the F fixed-effect levels. Each draw costs O(G k).

Everything needed comes from the pair statistics X_gh'X_gh and X_gh'y_gh (one pass over the N rows); every
quantity above is affine in the null value r (u~ is), which makes the confidence interval by test
inversion cheap: t*_b(r) = (n_b - d m_b) / sqrt(s (q_b - 2 d p_b + d^2 o_b)), d = r - r0, from five numbers
per draw.

p-values (full enumeration of the 2^H Rademacher sign vectors when 2^H < B), their tie rule and the
confidence interval by test inversion: :mod:`kernels.crve.inference`.

Small-sample factor with an absorbed fixed effect of F levels (fixest's default ``ssc(fixef.K = "nested")``,
renamed ``K.fixef = "nonnested"`` in fixest 0.13): G/(G-1) (N-1)/(N-k) with k = the regressors plus F when the
fixed effect crosses the variance clusters (as OLS on explicit dummies counts them, e.g. statsmodels), the
regressors plus 1 when every level lies within one variance cluster (nested: fixest drops the levels but keeps
one parameter for the constant they absorbed; pyfixest does the same). The nested case's SE is therefore the
dummy regression's SE times sqrt((N - k_x - F) / (N - k_x - 1)), k_x the regressors.

The stages (each a function below, timed as a stage): reduce the rows to pair statistics, estimate on the
host, apply the bootstrap operator to blocks of draws, infer. Facts and conventions: docs/crve.md.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
from scipy import stats

from kernels.backend import is_numpy, to_host
from kernels.crve.inference import P_VALUE_TYPES, PValueCurve, analytic_p_values, p_values_from
from kernels.crve.ols import cluster_sums, small_sample_factor
from kernels.crve.pairs import pair_statistics_host
from kernels.crve.weights import draw_weights, enumerated_weights, use_enumeration
from kernels.timing import StageTimer

Report = Callable[[float, str], None]

# Parameters a fixed effect nested in the variance clusters adds to the small-sample factor's k: fixest drops
# its levels but keeps one for the constant they absorbed (R/VCOV.R, "All FEs are removed, we add 1 for the
# intercept"; lrberge/fixest#116). docs/crve.md, "CRV1 and the small-sample factor".
NESTED_FE_PARAMS = 1


@dataclass(frozen=True)
class BootstrapOptions:
    param: int  # column index of the tested coefficient
    r: float = 0.0
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


@dataclass
class BootstrapData:
    """Arrays on the namespace ``xp``; codes are int64 in [0, count)."""

    x: Any  # (N, k) float64
    y: Any  # (N,) float64
    cluster: Any  # (N,)
    n_clusters: int
    bootcluster: Any | None = None  # (N,) or None: the variance clusters
    n_boot_clusters: int | None = None
    fe: Any | None = None  # (N,) one-way fixed effect, absorbed
    n_fe: int | None = None
    names: list[str] = field(default_factory=list)


@dataclass
class BootstrapOutcome:
    coefficients: np.ndarray
    standard_errors: np.ndarray
    covariance: np.ndarray
    estimate: float
    se: float
    t_stat: float
    p_values: dict[str, float]
    p_values_analytic: dict[str, float]
    conf_int: tuple[float | None, float | None] | None
    conf_int_analytic: tuple[float, float]
    t_boot: np.ndarray
    reps_used: int
    enumerated: bool
    n_obs: int
    n_clusters: int
    n_boot_clusters: int
    n_params_ssc: int
    ssc_factor: float
    fe_nested: bool | None


def wild_cluster_bootstrap(
    xp: ModuleType,
    data: BootstrapData,
    options: BootstrapOptions,
    report: Report | None = None,
    timer: StageTimer | None = None,
) -> BootstrapOutcome:
    """The wild cluster bootstrap-t of H0: beta_j = r; see the module docstring. ``timer`` times the stages
    (reduce, estimate, draw_weights, bootstrap, inference); ``report`` gets the share of draws done."""
    report = report or _no_report
    _check_options(data, options)
    with _stage(timer, "reduce"):
        rows = _reduce_rows(xp, data)
    with _stage(timer, "estimate"):
        fit = _estimate(rows, data, options)
        operator = _bootstrap_operator(xp, rows, fit, data, options)
    draws = _bootstrap_draws(xp, operator, data.n_clusters, rows.h_count, options, report, timer)
    with _stage(timer, "inference"):
        return _infer(fit, draws, rows, data, options)


def _no_report(fraction: float, stage: str) -> None:
    return None


def _stage(timer: StageTimer | None, name: str) -> AbstractContextManager[None]:
    return nullcontext() if timer is None else timer.stage(name)


def _check_options(data: BootstrapData, options: BootstrapOptions) -> None:
    k = data.x.shape[1]
    if options.p_val_type not in P_VALUE_TYPES:
        raise ValueError(f"p_val_type must be one of {P_VALUE_TYPES}, not {options.p_val_type!r}")
    if not 0 <= options.param < k:
        raise ValueError(f"param index {options.param} outside the {k} regressors")
    if data.n_clusters < 2:
        raise ValueError("cluster: the variance cluster column has a single cluster; at least 2 are needed")


@dataclass
class _ReducedRows:
    """All the later stages need from the N rows, on the host: the pair statistics and the fixed effect's."""

    xtx_p: np.ndarray  # (P, k, k)
    xty_p: np.ndarray  # (P, k)
    pair_g: np.ndarray  # (P,) each pair's variance cluster
    pair_h: np.ndarray  # (P,) each pair's bootstrap cluster
    h_count: int
    fe_nested: bool | None
    n_fe_params: int  # what the fixed effect adds to the small-sample factor's k: F, or 1 when nested
    fe_counts: np.ndarray | None  # (F,) rows per level
    fe_cells: _FeCells | None  # only for a fixed effect crossing the variance clusters


def _reduce_rows(xp: ModuleType, data: BootstrapData) -> _ReducedRows:
    """Absorb the fixed effect and reduce the rows to pair statistics: the one pass over the N rows on xp."""
    x, y = data.x, data.y
    fe_nested = None
    n_fe_params = 0
    fe_counts = None
    if data.fe is not None:
        x, fe_counts = demean(xp, x, data.fe, data.n_fe)
        y, _ = demean(xp, y, data.fe, data.n_fe)
        fe_nested = _is_nested(xp, data.fe, data.cluster, data.n_fe)
        n_fe_params = NESTED_FE_PARAMS if fe_nested else data.n_fe
    h_count, pair_codes, pair_count, pair_g, pair_h = _pairs(xp, data)
    if h_count < 2:
        raise ValueError("bootcluster: the bootstrap cluster column has a single cluster; at least 2 are needed")
    # The small dense algebra (k x k, P x k) runs on the host: on the GPU it is launch-latency bound. The N
    # rows (here) and the G x B draws (_bootstrap_draws) stay on xp.
    xtx_p, xty_p = pair_statistics_host(xp, x, y, pair_codes, pair_count)
    fe_cells = None
    if data.fe is not None and not fe_nested:
        fe_cells = _fe_cells(xp, x, y, data, h_count)
    return _ReducedRows(
        xtx_p=xtx_p,
        xty_p=xty_p,
        pair_g=to_host(pair_g),
        pair_h=to_host(pair_h),
        h_count=h_count,
        fe_nested=fe_nested,
        n_fe_params=n_fe_params,
        fe_counts=None if fe_counts is None else to_host(fe_counts),
        fe_cells=fe_cells,
    )


def _pairs(xp: ModuleType, data: BootstrapData) -> tuple[int, Any, int, Any, Any]:
    """H, each row's pair code, the number of pairs P, and each pair's variance and bootstrap cluster."""
    g_count = data.n_clusters
    if data.bootcluster is None:
        pair_g = pair_h = xp.arange(g_count)
        return g_count, data.cluster, g_count, pair_g, pair_h
    h_count = data.n_boot_clusters
    key = data.cluster * h_count + data.bootcluster
    unique_keys, pair_codes = xp.unique(key, return_inverse=True)
    pair_codes = pair_codes.reshape(-1)
    pair_count = int(unique_keys.shape[0])
    return h_count, pair_codes, pair_count, unique_keys // h_count, unique_keys % h_count


@dataclass
class _Fit:
    """OLS and CRV1 on the host, and the bootstrap DGP's coefficients at the null r0 (see the docstring)."""

    beta: np.ndarray
    a_full: np.ndarray  # (X'X)^-1
    xtx_g: np.ndarray  # (G, k, k) X_g'X_g
    covariance: np.ndarray
    se_all: np.ndarray
    factor: float  # the small-sample factor
    n_params_ssc: int
    estimate: float
    se: float
    t_stat: float


def _estimate(rows: _ReducedRows, data: BootstrapData, options: BootstrapOptions) -> _Fit:
    n_obs, k = data.x.shape
    j, g_count = options.param, data.n_clusters
    n_params_ssc = k + rows.n_fe_params
    if n_obs < 2 * n_params_ssc:
        raise ValueError(
            f"{n_obs} observations for {n_params_ssc} parameters: at least 2 observations per parameter needed"
        )
    xtx = rows.xtx_p.sum(axis=0)
    xty = rows.xty_p.sum(axis=0)
    check_identified(xtx, data.names)
    a_full = np.linalg.inv(xtx)
    a_full = 0.5 * (a_full + a_full.T)
    beta = a_full @ xty
    diagonal = data.bootcluster is None  # pairs are the variance clusters and the bootstrap clusters
    xtx_g = rows.xtx_p if diagonal else cluster_sums(np, rows.xtx_p, rows.pair_g, g_count)
    xty_g = rows.xty_p if diagonal else cluster_sums(np, rows.xty_p, rows.pair_g, g_count)
    scores_g = xty_g - _matvec(xtx_g, beta)
    factor = small_sample_factor(n_obs, g_count, n_params_ssc, options.ssc)
    covariance = factor * (a_full @ (scores_g.T @ scores_g) @ a_full)
    se_all = np.sqrt(np.diag(covariance))
    estimate, se = float(beta[j]), float(se_all[j])
    return _Fit(
        beta=beta,
        a_full=a_full,
        xtx_g=xtx_g,
        covariance=covariance,
        se_all=se_all,
        factor=factor,
        n_params_ssc=n_params_ssc,
        estimate=estimate,
        se=se,
        t_stat=(estimate - options.r) / se,
    )


def _bootstrap_operator(
    xp: ModuleType, rows: _ReducedRows, fit: _Fit, data: BootstrapData, options: BootstrapOptions
) -> _Operator:
    """c, T1, W, S_h and the fixed-effect terms at r0 and their derivatives in r, moved to xp once."""
    j, r0, g_count, h_count = options.param, options.r, data.n_clusters, rows.h_count
    beta, a_full = fit.beta, fit.a_full
    a = a_full[:, j]
    if options.impose_null:
        beta_boot = beta - a * (beta[j] - r0) / a_full[j, j]  # restricted least squares: beta_j = r0
        beta_boot1 = a / a_full[j, j]  # d beta~ / d r
    else:
        beta_boot, beta_boot1 = beta, np.zeros_like(beta)
    # Pair scores at r0, S_p(r) = S_p(r0) - (r - r0) S_p1: u~(r) = y - X beta~(r) is affine in r.
    diagonal = data.bootcluster is None
    s_p = rows.xty_p - _matvec(rows.xtx_p, beta_boot)
    s_p1 = _matvec(rows.xtx_p, beta_boot1)
    s_h = s_p if diagonal else cluster_sums(np, s_p, rows.pair_h, h_count)
    s_h1 = s_p1 if diagonal else cluster_sums(np, s_p1, rows.pair_h, h_count)
    w = _matvec(fit.xtx_g, a) @ a_full  # w_g = A X_g'X_g a, A symmetric
    if diagonal:
        t1_pairs, t1_diag = None, (s_p @ a, s_p1 @ a)
    else:
        t1_pairs, t1_diag = (rows.pair_g, rows.pair_h, s_p @ a, s_p1 @ a), None
    fe_terms = None
    if rows.fe_cells is not None:
        fe_terms = _fe_operator(rows.fe_cells, a, beta_boot, beta_boot1, rows.fe_counts, g_count, data.n_fe, h_count)
    return _Operator(xp, s_h @ a, s_h1 @ a, t1_pairs, t1_diag, w, s_h, s_h1, fe_terms, (g_count, h_count))


@dataclass
class _DrawSums:
    """Five numbers per draw (host): t*_b(r) = (numer - d numer1) / sqrt(s (sumsq - 2 d cross + d^2 sumsq1)),
    d = r - r0; the last three only when the confidence interval needs the derivative in r (WCR)."""

    enumerated: bool
    numer: np.ndarray
    sumsq: np.ndarray
    numer1: np.ndarray | None
    cross: np.ndarray | None
    sumsq1: np.ndarray | None

    @classmethod
    def empty(cls, reps: int, enumerated: bool, derivative: bool) -> _DrawSums:
        def maybe() -> np.ndarray | None:
            return np.empty(reps) if derivative else None

        return cls(enumerated, np.empty(reps), np.empty(reps), maybe(), maybe(), maybe())

    @property
    def reps(self) -> int:
        return self.numer.size

    def fill(self, operator: _Operator, v: Any, done: int, count: int) -> None:
        """Apply the operator to the draws ``done .. done + count - 1`` (the columns of v)."""
        block = slice(done, done + count)
        n_b, d_b = operator.apply(v, derivative=False)
        self.numer[block] = to_host(n_b)
        self.sumsq[block] = to_host((d_b * d_b).sum(axis=0))
        if self.numer1 is not None:
            n1_b, d1_b = operator.apply(v, derivative=True)
            self.numer1[block] = to_host(n1_b)
            self.cross[block] = to_host((d_b * d1_b).sum(axis=0))
            self.sumsq1[block] = to_host((d1_b * d1_b).sum(axis=0))


def _bootstrap_draws(
    xp: ModuleType,
    operator: _Operator,
    g_count: int,
    h_count: int,
    options: BootstrapOptions,
    report: Report,
    timer: StageTimer | None,
) -> _DrawSums:
    """All B draws (2^H when enumerated) in chunks of bounded G x chunk arrays, reporting after each chunk."""
    enumerated = use_enumeration(options.weights_type, h_count, options.reps)
    reps = 2**h_count if enumerated else options.reps
    chunk = options.draw_chunk or max(1, options.block_elements // max(g_count, h_count))
    sums = _DrawSums.empty(reps, enumerated, derivative=options.conf_int and options.impose_null)
    done = 0
    report(0.0, f"bootstrap draws 0/{reps}")
    while done < reps:
        count = min(chunk, reps - done)
        with _stage(timer, "draw_weights"):
            if enumerated:
                v = enumerated_weights(xp, h_count, done, count)
            else:
                v = draw_weights(xp, options.weights_type, options.seed, h_count, done, count, options.draw_base)
        with _stage(timer, "bootstrap"):
            sums.fill(operator, v, done, count)
        done += count
        report(done / reps, f"bootstrap draws {done}/{reps}")
    return sums


def _infer(
    fit: _Fit, draws: _DrawSums, rows: _ReducedRows, data: BootstrapData, options: BootstrapOptions
) -> BootstrapOutcome:
    """t*, the bootstrap and analytic p-values and confidence intervals."""
    estimate, se, t_stat, factor = fit.estimate, fit.se, fit.t_stat, fit.factor
    with np.errstate(divide="ignore", invalid="ignore"):
        t_boot = draws.numer / np.sqrt(factor * draws.sumsq)
    p_values = {name: float(value) for name, value in p_values_from(np, t_boot, t_stat).items()}
    df = data.n_clusters - 1
    critical = float(stats.t.ppf(1 - options.sign_level / 2, df))
    ci = None
    if options.conf_int:
        curve = PValueCurve(
            estimate, se, options.r, factor, draws.numer, draws.sumsq, draws.numer1, draws.cross, draws.sumsq1,
            options.p_val_type,
        )  # fmt: skip
        ci = curve.confidence_interval(options.sign_level, critical)
    return BootstrapOutcome(
        coefficients=fit.beta,
        standard_errors=fit.se_all,
        covariance=fit.covariance,
        estimate=estimate,
        se=se,
        t_stat=t_stat,
        p_values=p_values,
        p_values_analytic=analytic_p_values(t_stat, df),
        conf_int=ci,
        conf_int_analytic=(estimate - critical * se, estimate + critical * se),
        t_boot=t_boot,
        reps_used=draws.reps,
        enumerated=draws.enumerated,
        n_obs=data.x.shape[0],
        n_clusters=data.n_clusters,
        n_boot_clusters=rows.h_count,
        n_params_ssc=fit.n_params_ssc,
        ssc_factor=factor,
        fe_nested=rows.fe_nested,
    )


def demean(xp: ModuleType, values: Any, codes: Any, n_groups: int) -> tuple[Any, Any]:
    """Subtract group means (one-way fixed effects partialled out exactly); also returns the group counts."""
    counts = xp.bincount(codes, minlength=n_groups).astype(xp.float64)
    sums = cluster_sums(xp, values, codes, n_groups)
    means = sums / counts.reshape((-1,) + (1,) * (values.ndim - 1))
    return values - means[codes], counts


def _sparse(xp: ModuleType, rows: Any, cols: Any, values: Any, shape: tuple[int, int]) -> Any:
    if is_numpy(xp):
        from scipy import sparse

        return sparse.csr_matrix((values, (rows, cols)), shape=shape)
    from cupyx.scipy import sparse

    return sparse.coo_matrix((values, (rows, cols)), shape=shape).tocsr()


class _Operator:
    """Applies c' and M (and their derivatives in r) to a block of draws V (H x B) on the namespace xp.

    Built from host arrays (the small algebra); they are moved to xp once here.
    """

    def __init__(
        self,
        xp: ModuleType,
        c: np.ndarray,
        c1: np.ndarray,
        t1_pairs: tuple[Any, Any, Any, Any] | None,
        t1_diag: tuple[Any, Any] | None,
        w: np.ndarray,
        s_h: np.ndarray,
        s_h1: np.ndarray,
        fe_terms: tuple[SparseTriple, SparseTriple, SparseTriple] | None,
        shape: tuple[int, int],
    ) -> None:
        move = xp.asarray
        self.xp, self.c, self.c1, self.w, self.s_h, self.s_h1 = xp, move(c), move(c1), move(w), move(s_h), move(s_h1)
        self.t1_diag = None if t1_diag is None else (move(t1_diag[0]), move(t1_diag[1]))
        self.t1 = self.t1_1 = None
        if t1_pairs is not None:
            rows, cols, values, values1 = (move(part) for part in t1_pairs)
            self.t1 = _sparse(xp, rows, cols, values, shape)
            self.t1_1 = _sparse(xp, rows, cols, values1, shape)
        self.fe_terms = None
        if fe_terms is not None:
            self.fe_terms = tuple(
                _sparse(xp, move(rows), move(cols), move(values), sparse_shape)
                for rows, cols, values, sparse_shape in fe_terms
            )

    def apply(self, v: Any, derivative: bool) -> tuple[Any, Any]:
        """The numerators (B,) and D = M V (G, B) at r0, or their derivatives in r when ``derivative``."""
        c = self.c1 if derivative else self.c
        s_h = self.s_h1 if derivative else self.s_h
        numerator = c @ v
        if self.t1_diag is not None:
            diag = self.t1_diag[1] if derivative else self.t1_diag[0]
            d = diag[:, None] * v
        else:
            d = (self.t1_1 if derivative else self.t1) @ v
        d = d - self.w @ (s_h.T @ v)
        if self.fe_terms is not None:
            p, q, q1 = self.fe_terms
            d = d - p @ ((q1 if derivative else q) @ v)
        return numerator, d


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


def _is_nested(xp: ModuleType, inner: Any, outer: Any, n_inner: int) -> bool:
    """Whether every level of ``inner`` (codes 0..n_inner-1, all present) lies within one level of ``outer``."""
    n_outer = int(outer.max()) + 1
    return int(xp.unique(inner * n_outer + outer).shape[0]) == n_inner


@dataclass
class _FeCells:
    gf_rows: Any
    gf_cols: Any
    gf_x: Any  # (cells, k) sums of x~ over rows in variance cluster g and fixed effect f
    fh_rows: Any
    fh_cols: Any
    fh_x: Any  # (cells, k) sums of x~ over rows in fixed effect f and bootstrap cluster h
    fh_y: Any  # (cells,) sums of y~


def _fe_cells(xp: ModuleType, x: Any, y: Any, data: BootstrapData, h_count: int) -> _FeCells:
    n_fe = data.n_fe
    boot = data.cluster if data.bootcluster is None else data.bootcluster
    gf_keys, gf_codes = xp.unique(data.cluster * n_fe + data.fe, return_inverse=True)
    fh_keys, fh_codes = xp.unique(data.fe * h_count + boot, return_inverse=True)
    gf_codes, fh_codes = gf_codes.reshape(-1), fh_codes.reshape(-1)
    fh_sums = cluster_sums(xp, xp.concatenate([x, y[:, None]], axis=1), fh_codes, int(fh_keys.shape[0]))
    gf_keys, fh_keys, fh_sums = to_host(gf_keys), to_host(fh_keys), to_host(fh_sums)
    return _FeCells(
        gf_rows=gf_keys // n_fe,
        gf_cols=gf_keys % n_fe,
        gf_x=to_host(cluster_sums(xp, x, gf_codes, int(gf_keys.shape[0]))),
        fh_rows=fh_keys // h_count,
        fh_cols=fh_keys % h_count,
        fh_x=fh_sums[:, :-1],
        fh_y=fh_sums[:, -1],
    )


SparseTriple = tuple[Any, Any, Any, tuple[int, int]]


def _fe_operator(
    cells: _FeCells,
    a: np.ndarray,
    beta_boot: np.ndarray,
    beta_boot1: np.ndarray,
    fe_counts: np.ndarray,
    g_count: int,
    n_fe: int,
    h_count: int,
) -> tuple[SparseTriple, SparseTriple, SparseTriple]:
    """P (G x F) and Q, dQ/dr (F x H) of the fixed-effect correction as (rows, cols, values, shape) (host)."""
    p = (cells.gf_rows, cells.gf_cols, cells.gf_x @ a, (g_count, n_fe))
    scale = 1.0 / fe_counts[cells.fh_rows]
    q_values = (cells.fh_y - cells.fh_x @ beta_boot) * scale
    q1_values = (cells.fh_x @ beta_boot1) * scale  # u~(r) = u~(r0) - (r - r0) x~'beta1
    q = (cells.fh_rows, cells.fh_cols, q_values, (n_fe, h_count))
    q1 = (cells.fh_rows, cells.fh_cols, q1_values, (n_fe, h_count))
    return p, q, q1


def _matvec(matrices: Any, vector: Any) -> Any:
    """(..., k, k) @ (k,) as one matrix-vector product (NumPy's stacked matmul of tiny matrices is slow)."""
    k = matrices.shape[-1]
    return (matrices.reshape(-1, k) @ vector).reshape(matrices.shape[:-1])
