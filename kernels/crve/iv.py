"""Instrumental variables: 2SLS with CRV1 standard errors and the wild restricted efficient (WRE) bootstrap of
Davidson & MacKinnon (2010), as boottest, for one endogenous regressor, from cluster statistics.

Model y = X beta + u with X = [Z, y2] (Z exogenous, y2 endogenous), instruments W = [Z, X2]. With Q = W'W,
G_x = W'X, G_y = W'y: beta = (G_x'Q^-1 G_x)^-1 G_x'Q^-1 G_y (2SLS); cluster scores Pi'(W_g'y_g - W_g'X_g beta),
Pi = Q^-1 G_x; CRV1 = f A (sum_g s_g s_g') A with A = (G_x'Q^-1 G_x)^-1, f = G/(G-1) (N-1)/(N-k) as pyfixest.
Absorbed fixed effects (nested in the clusters for the bootstrap) are partialled out of y, X and W first.

WRE for H0: beta_y2 = r: the restricted structural residuals u1~ of y - r y2 on Z (OLS), the efficient
reduced form from the OLS of y2 on [W, u1~] (coefficients pi~ on W, residuals u2~ = y2 - W pi~), and draws
y2* = W pi~ + v_g u2~, y* = r y2* + Z gamma~ + v_g u1~ with one weight per cluster in both equations. Every
quantity of a draw's 2SLS fit is a sum over clusters of a_g + v_g b_g (W_g'y*_g, W_g'y2*_g), so a draw costs
O(G l k) with the rows reduced once: the fit, its scores and t* are computed for blocks of draws at once.

First-stage diagnostics: the cluster-robust Wald statistic of the excluded instruments in the first stage
divided by their number (pyfixest's ``_f_stat_1st_stage``) and Montiel Olea & Pflueger's (2013) effective F,
pi2'(X2~'X2~)pi2 / tr(V(pi2) X2~'X2~) with X2~ the excluded instruments partialled on Z (pyfixest uses the raw
instrument columns instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from scipy import stats

from kernels.backend import to_host
from kernels.crve.inference import analytic_p_values, p_values_from
from kernels.crve.ols import cluster_sums
from kernels.crve.weights import draw_weights, enumerated_weights, use_enumeration


@dataclass(frozen=True)
class IvData:
    """Arrays on xp (fixed effects already partialled out); codes int64 in [0, n_clusters)."""

    y: Any  # (N,)
    exogenous: Any  # (N, kz) Z
    endogenous: Any  # (N,) y2
    instruments: Any  # (N, l2) excluded instruments X2
    cluster: Any
    n_clusters: int
    n_absorbed: int = 0  # parameters the absorbed fixed effects add to the small-sample k


@dataclass
class IvOutcome:
    coefficients: np.ndarray  # [Z..., y2]
    covariance: np.ndarray
    estimate: float
    se: float
    t_stat: float
    p_values: dict[str, float]
    p_values_analytic: dict[str, float]
    conf_int: None  # WRE's DGP depends on r non-linearly: inversion needs a bootstrap per r (not built)
    conf_int_analytic: tuple[float, float]
    t_boot: np.ndarray
    reps_used: int
    enumerated: bool
    first_stage_f: float
    effective_f: float
    ssc_factor: float
    n_params_ssc: int


@dataclass
class _IvStats:
    """Per-cluster sums (host) that every quantity of the fit and of each draw comes from."""

    ww: np.ndarray  # (G, l, l) W_g'W_g
    wx: np.ndarray  # (G, l, k) W_g'X_g
    wy: np.ndarray  # (G, l) W_g'y_g
    zz: np.ndarray  # (kz, kz)
    zy: np.ndarray  # (kz,)
    zy2: np.ndarray  # (kz,)
    n_obs: int


def _cluster_stats(xp: ModuleType, data: IvData) -> _IvStats:
    w = xp.concatenate([data.exogenous, data.instruments], axis=1)
    x = xp.concatenate([data.exogenous, data.endogenous[:, None]], axis=1)
    l_count, k = w.shape[1], x.shape[1]
    products = xp.concatenate([(w[:, :, None] * w[:, None, :]).reshape(len(w), -1),
                               (w[:, :, None] * x[:, None, :]).reshape(len(w), -1),
                               w * data.y[:, None]], axis=1)  # fmt: skip
    sums = to_host(cluster_sums(xp, products, data.cluster, data.n_clusters))
    z = data.exogenous
    return _IvStats(
        ww=sums[:, : l_count * l_count].reshape(-1, l_count, l_count),
        wx=sums[:, l_count * l_count : l_count * l_count + l_count * k].reshape(-1, l_count, k),
        wy=sums[:, l_count * l_count + l_count * k :],
        zz=to_host(z.T @ z),
        zy=to_host(z.T @ data.y),
        zy2=to_host(z.T @ data.endogenous),
        n_obs=int(data.y.shape[0]),
    )


def _two_stage(xp: ModuleType, q_inverse: Any, gx: Any, gy: Any) -> tuple[Any, Any, Any]:
    """2SLS over a batch: gx (..., l, k), gy (..., l): beta (..., k), A (..., k, k), Pi (..., l, k)."""
    pi = q_inverse @ gx
    a = xp.linalg.inv(xp.swapaxes(gx, -1, -2) @ pi)
    beta = (a @ (xp.swapaxes(pi, -1, -2) @ gy[..., None]))[..., 0]
    return beta, a, pi


def iv_wre_bootstrap(
    xp: ModuleType,
    data: IvData,
    r: float,
    reps: int,
    weights_type: str,
    seed: int,
    sign_level: float = 0.05,
    ssc: bool = True,
    block_elements: int = 16_000_000,
) -> IvOutcome:
    """2SLS, CRV1 and the WRE bootstrap-t of H0: beta_y2 = r (see the module docstring)."""
    stats_ = _cluster_stats(xp, data)
    g_count, kz = data.n_clusters, data.exogenous.shape[1]
    l_count, k = stats_.wx.shape[1], stats_.wx.shape[2]
    if data.instruments.shape[1] < 1:
        raise ValueError("formula: the IV part needs at least one excluded instrument")
    q = stats_.ww.sum(axis=0)
    _check_full_rank(q, "formula: the instruments and exogenous regressors are collinear (W'W is singular)")
    q_inverse = np.linalg.inv(q)
    gx, gy = stats_.wx.sum(axis=0), stats_.wy.sum(axis=0)
    _check_full_rank(gx.T @ q_inverse @ gx, "formula: the IV model is not identified (X'P_W X is singular)")
    beta, a, pi = _two_stage(np, q_inverse, gx, gy)
    n_params = k + data.n_absorbed
    factor = g_count / (g_count - 1) * (stats_.n_obs - 1) / (stats_.n_obs - n_params) if ssc else 1.0
    scores = (stats_.wy - stats_.wx @ beta) @ pi  # (G, k)
    covariance = factor * a @ (scores.T @ scores) @ a
    j = k - 1  # the endogenous coefficient is the last
    estimate, se = float(beta[j]), float(np.sqrt(covariance[j, j]))
    t_stat = (estimate - r) / se
    a_dgp, b_dgp = _wre_dgp(xp, data, stats_, q, r, kz)
    enumerated = use_enumeration(weights_type, g_count, reps)
    total = 2**g_count if enumerated else reps
    numer, sumsq = np.empty(total), np.empty(total)
    on_device = [xp.asarray(array) for array in (stats_.wx, q_inverse, a_dgp, b_dgp)]
    done = 0
    while done < total:
        count = min(max(1, block_elements // (g_count * (l_count + 1) * (k + 2))), total - done)
        v = enumerated_weights(xp, g_count, done, count) if enumerated else draw_weights(
            xp, weights_type, seed, g_count, done, count)  # fmt: skip
        chunk_numer, chunk_sumsq = _draws(xp, v.T, *on_device, r, j)
        numer[done : done + count], sumsq[done : done + count] = to_host(chunk_numer), to_host(chunk_sumsq)
        done += count
    with np.errstate(divide="ignore", invalid="ignore"):
        t_boot = numer / np.sqrt(factor * sumsq)
    df = g_count - 1
    critical = float(stats.t.ppf(1 - sign_level / 2, df))
    first_f, effective_f = _first_stage(xp, data, stats_, ssc)
    return IvOutcome(
        coefficients=beta, covariance=covariance, estimate=estimate, se=se, t_stat=t_stat,
        p_values={name: float(value) for name, value in p_values_from(np, t_boot, t_stat).items()},
        p_values_analytic=analytic_p_values(t_stat, df), conf_int=None,
        conf_int_analytic=(estimate - critical * se, estimate + critical * se), t_boot=t_boot, reps_used=total,
        enumerated=enumerated, first_stage_f=first_f, effective_f=effective_f, ssc_factor=factor,
        n_params_ssc=n_params,
    )  # fmt: skip


def _check_full_rank(matrix: np.ndarray, message: str) -> None:
    scale = np.sqrt(np.clip(np.diag(matrix), 1e-300, None))
    if not np.linalg.cond(matrix / scale[:, None] / scale[None, :]) < 1e12:
        raise ValueError(message)


def _wre_dgp(
    xp: ModuleType, data: IvData, stats_: _IvStats, q: np.ndarray, r: float, kz: int
) -> tuple[np.ndarray, np.ndarray]:
    """The draws' cluster sums W_g'y*_g and W_g'y2*_g as a_g + v_g b_g: (G, l, 2) each, [:, :, 0] for y and
    [:, :, 1] for y2 (see the module docstring)."""
    gamma = np.linalg.solve(stats_.zz, stats_.zy - r * stats_.zy2)  # y - r y2 on Z
    w_y2 = stats_.wx[:, :, -1]  # W_g'y2_g
    w_z = stats_.wx[:, :, :kz]  # W_g'Z_g
    w_u1 = stats_.wy - r * w_y2 - w_z @ gamma  # W_g'u1~_g
    # The efficient reduced form, OLS of y2 on [W, u1~]: its normal equations need u1~'u1~ and u1~'y2 from the rows.
    u1 = data.y - r * data.endogenous - data.exogenous @ xp.asarray(gamma)
    u1_u1, u1_y2 = float(to_host(u1 @ u1)), float(to_host(u1 @ data.endogenous))
    l_count = q.shape[0]
    w_u1_total = w_u1.sum(axis=0)
    normal = np.zeros((l_count + 1, l_count + 1))
    normal[:l_count, :l_count] = q
    normal[:l_count, l_count] = normal[l_count, :l_count] = w_u1_total
    normal[l_count, l_count] = u1_u1
    rhs = np.concatenate([w_y2.sum(axis=0), [u1_y2]])
    pi_tilde = np.linalg.solve(normal, rhs)[:l_count]
    w_u2 = w_y2 - stats_.ww @ pi_tilde  # W_g'u2~_g
    a_y2 = stats_.ww @ pi_tilde  # W_g'W_g pi~
    a_y = r * a_y2 + w_z @ gamma
    b_y = w_u1 + r * w_u2
    return np.stack([a_y, a_y2], axis=-1), np.stack([b_y, w_u2], axis=-1)


def _draws(xp: ModuleType, v: Any, wx: Any, q_inverse: Any, a_dgp: Any, b_dgp: Any, r: float,
           j: int) -> tuple[Any, Any]:  # fmt: skip
    """Numerators beta*_j - r and the scores' sums of squares (before the factor) for draws v (B, G), on xp."""
    sums = a_dgp[None] + v[:, :, None, None] * b_dgp[None]  # (B, G, l, 2): W_g'y*_g, W_g'y2*_g
    kz = wx.shape[2] - 1
    exogenous = xp.broadcast_to(wx[None, :, :, :kz], (*sums.shape[:2], wx.shape[1], kz))
    wx_star = xp.concatenate([exogenous, sums[..., 1:2]], axis=-1)  # (B, G, l, k)
    wy_star = sums[..., 0]  # (B, G, l)
    beta, a, pi = _two_stage(xp, q_inverse, wx_star.sum(axis=1), wy_star.sum(axis=1))
    residual_w = wy_star - xp.einsum("bglk,bk->bgl", wx_star, beta)  # W_g'u*_g
    direction = xp.einsum("blk,bk->bl", pi, a[:, j, :])  # Pi A e_j
    scores = xp.einsum("bgl,bl->bg", residual_w, direction)
    return beta[:, j] - r, (scores * scores).sum(axis=1)


def _first_stage(xp: ModuleType, data: IvData, stats_: _IvStats, ssc: bool) -> tuple[float, float]:
    """The first stage's cluster-robust F of the excluded instruments and the effective F (docstring)."""
    z, x2, y2 = data.exogenous, data.instruments, data.endogenous
    w = xp.concatenate([z, x2], axis=1)
    q = to_host(w.T @ w)
    coef = np.linalg.solve(q, to_host(w.T @ y2))
    residual = y2 - w @ xp.asarray(coef)
    scores = to_host(cluster_sums(xp, w * residual[:, None], data.cluster, data.n_clusters))
    g_count, n_obs, l_count = data.n_clusters, stats_.n_obs, w.shape[1]
    n_params = l_count + data.n_absorbed
    factor = g_count / (g_count - 1) * (n_obs - 1) / (n_obs - n_params) if ssc else 1.0
    q_inverse = np.linalg.inv(q)
    covariance = factor * q_inverse @ (scores.T @ scores) @ q_inverse
    kz = z.shape[1]
    pi2, v2 = coef[kz:], covariance[kz:, kz:]
    first_f = float(pi2 @ np.linalg.solve(v2, pi2) / pi2.size)
    # Effective F: the excluded instruments partialled on Z.
    zz = to_host(z.T @ z)
    x2_tilde = x2 - z @ xp.asarray(np.linalg.solve(zz, to_host(z.T @ x2)))
    q_tilde = to_host(x2_tilde.T @ x2_tilde)
    effective_f = float(pi2 @ q_tilde @ pi2 / np.trace(v2 @ q_tilde))
    return first_f, effective_f


def anderson_rubin(
    xp: ModuleType, data: IvData, r: float, reps: int, weights_type: str, seed: int, ssc: bool = True
) -> dict[str, float]:
    """The Anderson-Rubin test of beta_y2 = r, robust to weak instruments, by the wild cluster bootstrap (as
    boottest's AR option): the OLS of y - r y2 on [Z, X2] and the joint test that the excluded instruments'
    coefficients are zero (a bootstrap Wald test, WCR; one instrument: the bootstrap-t, the same p-value as its
    square). The fixed effects, if any, are already partialled out of the arrays; the analytic p-value's small-
    sample k does not count them (the bootstrap p-value does not depend on that factor)."""
    from kernels.crve.bootstrap import BootstrapData, BootstrapOptions, wild_cluster_bootstrap
    from kernels.crve.hypothesis import Restrictions

    x = xp.concatenate([data.exogenous, data.instruments], axis=1)
    kz, l2 = data.exogenous.shape[1], data.instruments.shape[1]
    matrix = np.zeros((l2, kz + l2))
    matrix[:, kz:] = np.eye(l2)
    restrictions = Restrictions(tuple(f"instrument {j + 1} = 0" for j in range(l2)), matrix, np.zeros(l2))
    options = BootstrapOptions(restrictions=restrictions, reps=reps, weights_type=weights_type, seed=seed,
                               conf_int=False, ssc=ssc, drop_singletons=False)  # fmt: skip
    outcome = wild_cluster_bootstrap(
        xp, BootstrapData(x, data.y - r * data.endogenous, data.cluster, data.n_clusters), options
    )
    if l2 == 1:
        return {"statistic": outcome.t_stat**2, "p_value": outcome.p_values["two-tailed"],
                "p_value_analytic": outcome.p_values_analytic["two-tailed"]}  # fmt: skip
    return {"statistic": float(outcome.wald_stat), "p_value": outcome.p_values["wald"],
            "p_value_analytic": outcome.p_values_analytic["wald"]}  # fmt: skip
