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

Conventions as the peers (wildboottest, fwildclusterboot, pyfixest): two-tailed p = share of draws with
|t*| > |t| over B (strict, the original draw not added); equal-tailed 2 min(P(t* > t), P(t* < t));
">" P(t* > t); "<" P(t* < t); the same small-sample factor in t and t*; full enumeration of the 2^H
Rademacher sign vectors when 2^H < B. Ties: "strict" is read in exact arithmetic: a draw whose t* equals t
up to rounding (relative TIE_RTOL) does not exceed it (see ``_exceed``). The peers compare the computed
numbers, so draws that tie exactly (the all-ones and, with Rademacher, all-minus-ones draws under WCR) count
or not by rounding noise there; with enumeration the p-values can then differ by up to 2 / 2^H. Without
exact ties the two agree.

Small-sample factor with an absorbed fixed effect of F levels (fixest's default ``ssc(fixef.K = "nested")``):
G/(G-1) (N-1)/(N-k) with k = the regressors plus F when the fixed effect crosses the variance clusters (as
OLS on explicit dummies counts them, e.g. statsmodels), the regressors alone when every level lies within
one variance cluster (nested: fixest does not count them). The nested case's SE is therefore the dummy
regression's SE times sqrt((N - k_x - F) / (N - k_x)), k_x the regressors.

Confidence interval: {r : p(r) > sign_level} by test inversion (``_PValueCurve``), for every p-value type
and level: [lower, upper] for two- and equal-tailed, [lower, inf) for ">", (-inf, upper] for "<" (at a
level above about 1/2 a one-sided set lies beyond the estimate).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
from scipy import optimize, stats

from kernels.crve.ols import cluster_sums, small_sample_factor
from kernels.crve.weights import draw_weights, enumerated_weights, use_enumeration

P_VALUE_TYPES = ("two-tailed", "equal-tailed", ">", "<")
T_QUANTILES = (0.005, 0.025, 0.05, 0.10, 0.25, 0.5, 0.75, 0.90, 0.95, 0.975, 0.995)
# Draws whose t* (|t*|) equals t (|t|) up to this relative rounding are ties, not exceedances (see _exceed).
TIE_RTOL = 1e-12


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


def pair_statistics(xp: ModuleType, x: Any, y: Any, codes: Any, n_groups: int) -> tuple[Any, Any]:
    """X_p'X_p (P, k, k) and X_p'y_p (P, k) for the groups of ``codes``: a segmented reduction over the rows.

    On CuPy: ``kernels.crve.gpu.pair_statistics_gpu`` (this function is its NumPy twin). On NumPy, groups of
    many rows take one BLAS product each over the rows sorted by group; many small groups take a bincount
    per entry of x x' and x y.
    """
    if xp is not np:
        from kernels.crve.gpu import pair_statistics_gpu

        return pair_statistics_gpu(xp, x, y, codes, n_groups)
    n_obs, k = x.shape
    if n_groups * 64 <= n_obs:
        if n_obs > 1 and not bool((codes[1:] >= codes[:-1]).all()):
            order = np.argsort(codes, kind="stable")
            x, y, codes = x[order], y[order], codes[order]
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=n_groups))])
        xtx = np.empty((n_groups, k, k))
        xty = np.empty((n_groups, k))
        for group in range(n_groups):
            rows = slice(bounds[group], bounds[group + 1])
            xtx[group] = x[rows].T @ x[rows]
            xty[group] = x[rows].T @ y[rows]
        return xtx, xty
    upper_i, upper_j = np.triu_indices(k)
    products = np.empty((n_obs, len(upper_i) + k), dtype=np.float64)
    for column, (i, j) in enumerate(zip(upper_i, upper_j, strict=True)):
        products[:, column] = x[:, i] * x[:, j]
    products[:, len(upper_i) :] = x * y[:, None]
    return assemble_statistics(np, cluster_sums(np, products, codes, n_groups), k)


def assemble_statistics(xp: ModuleType, sums: Any, k: int) -> tuple[Any, Any]:
    """(P, k, k) and (P, k) from the rows (P, k(k+1)/2 + k) of sums: upper triangle of x x' row by row, then x y."""
    upper_i, upper_j = np.triu_indices(k)
    xtx = xp.empty((sums.shape[0], k, k), dtype=xp.float64)
    xtx[:, upper_i, upper_j] = sums[:, : len(upper_i)]
    xtx[:, upper_j, upper_i] = sums[:, : len(upper_i)]
    return xtx, sums[:, len(upper_i) :]


def pair_statistics_host(xp: ModuleType, x: Any, y: Any, codes: Any, n_groups: int) -> tuple[Any, Any]:
    """``pair_statistics`` delivered as NumPy arrays (one small device-to-host copy of the sums on CuPy)."""
    if xp is np:
        return pair_statistics(np, x, y, codes, n_groups)
    from kernels.crve.gpu import pair_sums_gpu

    return assemble_statistics(np, pair_sums_gpu(xp, x, y, codes, n_groups).get(), x.shape[1])


def demean(xp: ModuleType, values: Any, codes: Any, n_groups: int) -> tuple[Any, Any]:
    """Subtract group means (one-way fixed effects partialled out exactly); also returns the group counts."""
    counts = xp.bincount(codes, minlength=n_groups).astype(xp.float64)
    sums = cluster_sums(xp, values, codes, n_groups)
    means = sums / counts.reshape((-1,) + (1,) * (values.ndim - 1))
    return values - means[codes], counts


def _sparse(xp: ModuleType, rows: Any, cols: Any, values: Any, shape: tuple[int, int]) -> Any:
    if xp is np:
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


def _exceed(xp: ModuleType, boot: Any, stat: Any) -> Any:
    """boot > stat, strictly, read in exact arithmetic: a draw within rounding of the statistic is a tie.

    Ties count as *not* exceeding: boot exceeds stat only when boot > stat + TIE_RTOL max(|stat|, |boot|, 1).
    Under WCR the all-ones draw reproduces the sample exactly (t* = t in exact arithmetic, at every null
    value) and, with Rademacher weights, the all-minus-ones draw gives t* = -t; computed, they differ from
    +-t by rounding only, which must not decide whether they count. The floor 1 makes t = 0 (the null at
    the estimate) no exception: there a draw with t* = 0 in exact arithmetic computes to rounding noise.
    """
    scale = xp.maximum(xp.maximum(xp.abs(stat), xp.abs(boot)), 1.0)
    return boot > stat + TIE_RTOL * scale


def p_values_from(xp: ModuleType, t_boot: Any, t_stat: Any) -> dict[str, Any]:
    """All four bootstrap p-value types; ``t_stat`` may be an array broadcast against ``t_boot``'s last axis."""
    above = _exceed(xp, t_boot, t_stat).mean(axis=-1)
    below = _exceed(xp, -t_boot, -t_stat).mean(axis=-1)
    two = _exceed(xp, xp.abs(t_boot), xp.abs(t_stat)).mean(axis=-1)
    return {"two-tailed": two, "equal-tailed": 2 * xp.minimum(above, below), ">": above, "<": below}


def analytic_p_values(t_stat: float, df: int) -> dict[str, float]:
    """p-values of the t statistic against t(df) (df = G - 1, as Stata and fixest)."""
    two = float(2 * stats.t.sf(abs(t_stat), df))
    return {
        "two-tailed": two,
        "equal-tailed": two,
        ">": float(stats.t.sf(t_stat, df)),
        "<": float(stats.t.cdf(t_stat, df)),
    }


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


def wild_cluster_bootstrap(
    xp: ModuleType,
    data: BootstrapData,
    options: BootstrapOptions,
    report: Callable[[float, str], None] | None = None,
    timer: Any | None = None,
) -> BootstrapOutcome:
    """The wild cluster bootstrap-t of H0: beta_j = r; see the module docstring."""
    stage = timer.stage if timer is not None else _no_stage
    report = report or (lambda fraction, text: None)
    x, y = data.x, data.y
    n_obs, k = x.shape
    j = options.param
    g_count = data.n_clusters
    if options.p_val_type not in P_VALUE_TYPES:
        raise ValueError(f"p_val_type must be one of {P_VALUE_TYPES}, not {options.p_val_type!r}")
    if not 0 <= j < k:
        raise ValueError(f"param index {j} outside the {k} regressors")
    if g_count < 2:
        raise ValueError("cluster: the variance cluster column has a single cluster; at least 2 are needed")

    with stage("reduce"):
        fe_nested = None
        n_fe_params = 0
        fe_counts = None
        if data.fe is not None:
            x, fe_counts = demean(xp, x, data.fe, data.n_fe)
            y, _ = demean(xp, y, data.fe, data.n_fe)
            fe_nested = _is_nested(xp, data.fe, data.cluster, data.n_fe)
            n_fe_params = 0 if fe_nested else data.n_fe
        if data.bootcluster is None:
            h_count = g_count
            pair_codes, pair_count = data.cluster, g_count
            pair_g = pair_h = xp.arange(g_count)
        else:
            h_count = data.n_boot_clusters
            key = data.cluster * h_count + data.bootcluster
            unique_keys, pair_codes = xp.unique(key, return_inverse=True)
            pair_codes = pair_codes.reshape(-1)
            pair_count = int(unique_keys.shape[0])
            pair_g, pair_h = unique_keys // h_count, unique_keys % h_count
        if h_count < 2:
            raise ValueError("bootcluster: the bootstrap cluster column has a single cluster; at least 2 are needed")
        # The small dense algebra (k x k, P x k) runs on the host: on the GPU it is launch-latency bound. The N
        # rows (above) and the G x B draws (below) stay on xp.
        xtx_p, xty_p = pair_statistics_host(xp, x, y, pair_codes, pair_count)
        fe_cells = None
        if data.fe is not None and not fe_nested:
            fe_cells = _fe_cells(xp, x, y, data, h_count)
        pair_g, pair_h, fe_counts = _host(pair_g), _host(pair_h), _host(fe_counts)

    with stage("estimate"):
        n_params_ssc = k + n_fe_params
        if n_obs < 2 * n_params_ssc:
            raise ValueError(
                f"{n_obs} observations for {n_params_ssc} parameters: at least 2 observations per parameter needed"
            )
        xtx = xtx_p.sum(axis=0)
        xty = xty_p.sum(axis=0)
        check_identified(xtx, data.names)
        a_full = np.linalg.inv(xtx)
        a_full = 0.5 * (a_full + a_full.T)
        beta = a_full @ xty
        diagonal = data.bootcluster is None  # pairs are the variance clusters and the bootstrap clusters
        xtx_g = xtx_p if diagonal else cluster_sums(np, xtx_p, pair_g, g_count)
        xty_g = xty_p if diagonal else cluster_sums(np, xty_p, pair_g, g_count)
        scores_g = xty_g - _matvec(xtx_g, beta)
        factor = small_sample_factor(n_obs, g_count, n_params_ssc, options.ssc)
        covariance = factor * (a_full @ (scores_g.T @ scores_g) @ a_full)
        se_all = np.sqrt(np.diag(covariance))
        a = a_full[:, j]
        estimate, se = float(beta[j]), float(se_all[j])
        r0 = options.r
        t_stat = (estimate - r0) / se
        if options.impose_null:
            beta_boot = beta - a * (beta[j] - r0) / a_full[j, j]  # restricted least squares: beta_j = r0
            beta_boot1 = a / a_full[j, j]  # d beta~ / d r
        else:
            beta_boot, beta_boot1 = beta, np.zeros_like(beta)
        # Pair scores at r0, S_p(r) = S_p(r0) - (r - r0) S_p1: u~(r) = y - X beta~(r) is affine in r.
        s_p = xty_p - _matvec(xtx_p, beta_boot)
        s_p1 = _matvec(xtx_p, beta_boot1)
        s_h = s_p if diagonal else cluster_sums(np, s_p, pair_h, h_count)
        s_h1 = s_p1 if diagonal else cluster_sums(np, s_p1, pair_h, h_count)
        w = _matvec(xtx_g, a) @ a_full  # w_g = A X_g'X_g a, A symmetric
        if diagonal:
            t1_pairs, t1_diag = None, (s_p @ a, s_p1 @ a)
        else:
            t1_pairs, t1_diag = (pair_g, pair_h, s_p @ a, s_p1 @ a), None
        fe_terms = None
        if fe_cells is not None:
            fe_terms = _fe_operator(fe_cells, a, beta_boot, beta_boot1, fe_counts, g_count, data.n_fe, h_count)
        operator = _Operator(xp, s_h @ a, s_h1 @ a, t1_pairs, t1_diag, w, s_h, s_h1, fe_terms, (g_count, h_count))

    enumerated = use_enumeration(options.weights_type, h_count, options.reps)
    reps = 2**h_count if enumerated else options.reps
    chunk = options.draw_chunk or max(1, options.block_elements // max(g_count, h_count))
    need_derivative = options.conf_int and options.impose_null
    numer = np.empty(reps)
    sumsq = np.empty(reps)
    numer1 = np.empty(reps) if need_derivative else None
    cross = np.empty(reps) if need_derivative else None
    sumsq1 = np.empty(reps) if need_derivative else None
    done = 0
    report(0.0, f"bootstrap draws 0/{reps}")
    while done < reps:
        count = min(chunk, reps - done)
        with stage("draw_weights"):
            if enumerated:
                v = enumerated_weights(xp, h_count, done, count)
            else:
                v = draw_weights(xp, options.weights_type, options.seed, h_count, done, count, options.draw_base)
        with stage("bootstrap"):
            n_b, d_b = operator.apply(v, derivative=False)
            numer[done : done + count] = _host(n_b)
            sumsq[done : done + count] = _host((d_b * d_b).sum(axis=0))
            if need_derivative:
                n1_b, d1_b = operator.apply(v, derivative=True)
                numer1[done : done + count] = _host(n1_b)
                cross[done : done + count] = _host((d_b * d1_b).sum(axis=0))
                sumsq1[done : done + count] = _host((d1_b * d1_b).sum(axis=0))
        done += count
        report(done / reps, f"bootstrap draws {done}/{reps}")

    with stage("inference"):
        with np.errstate(divide="ignore", invalid="ignore"):
            t_boot = numer / np.sqrt(factor * sumsq)
        p_values = {name: float(value) for name, value in p_values_from(np, t_boot, t_stat).items()}
        df = g_count - 1
        p_analytic = analytic_p_values(t_stat, df)
        critical = float(stats.t.ppf(1 - options.sign_level / 2, df))
        ci_analytic = (estimate - critical * se, estimate + critical * se)
        ci = None
        if options.conf_int:
            curve = _PValueCurve(estimate, se, r0, factor, numer, sumsq, numer1, cross, sumsq1, options.p_val_type)
            ci = curve.confidence_interval(options.sign_level, critical)

    return BootstrapOutcome(
        coefficients=_host(beta),
        standard_errors=_host(se_all),
        covariance=_host(covariance),
        estimate=estimate,
        se=se,
        t_stat=t_stat,
        p_values=p_values,
        p_values_analytic=p_analytic,
        conf_int=ci,
        conf_int_analytic=ci_analytic,
        t_boot=t_boot,
        reps_used=reps,
        enumerated=enumerated,
        n_obs=n_obs,
        n_clusters=g_count,
        n_boot_clusters=h_count,
        n_params_ssc=n_params_ssc,
        ssc_factor=factor,
        fe_nested=fe_nested,
    )


class EmptyConfidenceSet(ValueError):
    """No null value has a bootstrap p-value above the level: the confidence set is empty."""


# The two ends of the confidence set {r : p(r) > level} per p-value type: (tail, share of the level) of the
# lower and of the upper bound, None where that end is unbounded. "two": |t*| > |t|; "above": t* > t (p_>
# rises with r); "below": t* < t (p_< falls with r). Equal-tailed: 2 min(p_>, p_<) > level exactly when
# p_> > level / 2 and p_< > level / 2 (halving is exact in binary floating point), so its lower end is
# where p_> crosses level / 2 and its upper end where p_< does.
_CI_TAILS: dict[str, tuple[tuple[str, float] | None, tuple[str, float] | None]] = {
    "two-tailed": (("two", 1.0), ("two", 1.0)),
    "equal-tailed": (("above", 0.5), ("below", 0.5)),
    ">": (("above", 1.0), None),
    "<": (None, ("below", 1.0)),
}


class _PValueCurve:
    """The bootstrap p-value as a function of the null value r, from five numbers per draw.

    The confidence set is {r : p(r) > level} (the null values the test does not reject), inverted tail by
    tail (``_CI_TAILS``). p(r) is a step function of r: it changes only where one draw's comparison with
    the statistic flips, t*_b(r) = t(r) (or |t*_b(r)| = |t(r)|), and each bound is such a crossing, solved
    to machine precision.
    """

    def __init__(
        self,
        estimate: float,
        se: float,
        r0: float,
        factor: float,
        numer: np.ndarray,
        sumsq: np.ndarray,
        numer1: np.ndarray | None,
        cross: np.ndarray | None,
        sumsq1: np.ndarray | None,
        p_val_type: str,
    ) -> None:
        self.estimate, self.se, self.r0, self.factor = estimate, se, r0, factor
        self.numer, self.sumsq = numer, sumsq
        self.numer1, self.cross, self.sumsq1 = numer1, cross, sumsq1
        self.p_val_type = p_val_type

    def t_boot(self, r: float) -> np.ndarray:
        if self.numer1 is None:  # WCU: the bootstrap distribution does not depend on r
            numer, sumsq = self.numer, self.sumsq
        else:
            d = r - self.r0
            numer = self.numer - d * self.numer1
            sumsq = np.maximum(self.sumsq - 2 * d * self.cross + d * d * self.sumsq1, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return numer / np.sqrt(self.factor * sumsq)

    def _draw_t(self, r: float, b: int) -> float:
        if self.numer1 is None:
            numer, sumsq = self.numer[b], self.sumsq[b]
        else:
            d = r - self.r0
            numer = self.numer[b] - d * self.numer1[b]
            sumsq = max(self.sumsq[b] - 2 * d * self.cross[b] + d * d * self.sumsq1[b], 0.0)
        return numer / math.sqrt(self.factor * sumsq) if sumsq > 0 else math.copysign(math.inf, numer)

    def _tail(self, tail: str, r: float) -> tuple[float, np.ndarray]:
        """The tail's p-value at r and the per-draw comparisons it counts."""
        t_boot, t_stat = self.t_boot(r), (self.estimate - r) / self.se
        if tail == "two":
            flags = _exceed(np, np.abs(t_boot), abs(t_stat))
        elif tail == "above":
            flags = _exceed(np, t_boot, t_stat)
        else:
            flags = _exceed(np, -t_boot, -t_stat)
        return float(flags.mean()), flags

    def _crossing(self, tail: str, b: int, inside: float, outside: float) -> float | None:
        """Where draw b's comparison with the statistic flips between ``inside`` and ``outside`` (a root)."""

        def gap(r: float) -> float:
            t_stat, t_b = (self.estimate - r) / self.se, self._draw_t(r, b)
            return abs(t_stat) - abs(t_b) if tail == "two" else t_stat - t_b

        low, high = gap(inside), gap(outside)
        if not (math.isfinite(low) and math.isfinite(high)) or low * high > 0:
            return None
        return float(optimize.brentq(gap, inside, outside, xtol=1e-15 * max(abs(inside), abs(outside), 1.0)))

    def _bound(self, tail: str, level: float, direction: float, step: float) -> float | None:
        """The end of {r : p_tail(r) > level} on the ``direction`` side (-1 lower, +1 upper); None: unbounded.

        From the estimate, doubling steps bracket the crossing: outwards while p_tail > level there (the
        usual case), inwards while p_tail <= level there (a one-sided tail at a level above its p-value at
        the estimate, about 1/2: the confidence set then lies beyond the estimate). Bisection narrows the
        bracket until a single draw's comparison flips inside it; that draw's crossing is the bound.
        """
        p_start, flags_start = self._tail(tail, self.estimate)
        accepted_at_start = p_start > level
        if not accepted_at_start and tail == "two":
            # |t| = 0 at the estimate: p_two is the share of draws with t* != 0, its largest value.
            raise EmptyConfidenceSet(
                f"conf_int: the bootstrap p-value is {p_start:.6g} <= sign_level={level:g} even at the estimate, "
                "so no null value is accepted (too few distinct bootstrap draws for this level); lower "
                "sign_level or set conf_int to false"
            )
        march = direction if accepted_at_start else -direction
        last, flags_last = self.estimate, flags_start
        found = None
        for doubling in range(64):
            candidate = self.estimate + march * step * 2.0**doubling
            p_candidate, flags_candidate = self._tail(tail, candidate)
            if (p_candidate > level) != accepted_at_start:
                found = candidate, flags_candidate
                break
            last, flags_last = candidate, flags_candidate
        if found is None:
            if accepted_at_start:
                return None  # accepted however far out: unbounded on this side
            raise EmptyConfidenceSet(
                f"conf_int: no null value has a bootstrap p-value ({tail} tail) above {level:g}; lower sign_level "
                "or set conf_int to false"
            )
        if accepted_at_start:
            (inside, flags_inside), (outside, flags_outside) = (last, flags_last), found
        else:
            (inside, flags_inside), (outside, flags_outside) = found, (last, flags_last)
        for _ in range(200):
            flipped = np.flatnonzero(flags_inside != flags_outside)
            if flipped.size == 1:
                root = self._crossing(tail, int(flipped[0]), inside, outside)
                if root is not None:
                    return root
            middle = 0.5 * (inside + outside)
            if middle in (inside, outside):
                break
            p_middle, flags_middle = self._tail(tail, middle)
            if p_middle <= level:
                outside, flags_outside = middle, flags_middle
            else:
                inside, flags_inside = middle, flags_middle
        return 0.5 * (inside + outside)

    def confidence_interval(self, level: float, critical: float) -> tuple[float | None, float | None]:
        """[lower, upper] of {r : p(r) > level}; None: unbounded on that side."""
        step = max(critical, 1.0) * self.se
        ends = []
        for spec, direction in zip(_CI_TAILS[self.p_val_type], (-1.0, 1.0), strict=True):
            ends.append(None if spec is None else self._bound(spec[0], spec[1] * level, direction, step))
        lower, upper = ends
        if lower is not None and upper is not None and lower > upper:
            raise EmptyConfidenceSet(
                f"conf_int: the equal-tailed confidence set at sign_level={level:g} is empty (lower end {lower:.6g} "
                f"above upper end {upper:.6g}); lower sign_level or set conf_int to false"
            )
        return lower, upper


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
    gf_keys, fh_keys, fh_sums = _host(gf_keys), _host(fh_keys), _host(fh_sums)
    return _FeCells(
        gf_rows=gf_keys // n_fe,
        gf_cols=gf_keys % n_fe,
        gf_x=_host(cluster_sums(xp, x, gf_codes, int(gf_keys.shape[0]))),
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


def _host(array: Any) -> Any:
    get = getattr(array, "get", None)
    return get() if callable(get) else array


class _NoStage:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _no_stage(name: str) -> _NoStage:
    return _NoStage()


def t_summary(t_boot: np.ndarray) -> dict[str, Any]:
    """Quantiles, mean and standard deviation of the finite bootstrap t statistics (null where undefined)."""
    finite = t_boot[np.isfinite(t_boot)]
    if finite.size == 0:
        return {"quantiles": {}, "mean": None, "sd": None, "non_finite": int(t_boot.size)}
    values = np.quantile(finite, T_QUANTILES)
    return {
        "quantiles": {f"{q:g}": float(v) for q, v in zip(T_QUANTILES, values, strict=True)},
        "mean": float(finite.mean()),
        "sd": float(finite.std(ddof=1)) if finite.size > 1 else None,
        "non_finite": int(t_boot.size - finite.size),
    }
