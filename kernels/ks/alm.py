"""Aggregate law of motion: OLS of ln K_{t+1} on ln K_t by aggregate state, and Den Haan's accuracy test."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StateRegression:
    intercept: float
    slope: float
    r2: float
    se: float  # standard error of the regression: sqrt(SSR / (n - 2)), the KS "sigma"
    n_obs: int


def _ols(x: np.ndarray, y: np.ndarray) -> StateRegression:
    n = x.size
    if n < 3:
        raise ValueError(f"only {n} observations of an aggregate state after burn_in: raise periods")
    x_mean, y_mean = x.mean(), y.mean()
    dx, dy = x - x_mean, y - y_mean
    sxx = float(dx @ dx)
    if sxx <= 0.0:
        raise ValueError("aggregate capital does not vary after burn_in: the ALM regression is not identified")
    slope = float(dx @ dy) / sxx
    intercept = float(y_mean - slope * x_mean)
    resid = dy - slope * dx
    ssr = float(resid @ resid)
    sst = float(dy @ dy)
    r2 = 1.0 - ssr / sst if sst > 0.0 else 1.0
    return StateRegression(intercept, slope, r2, float(np.sqrt(ssr / (n - 2))), n)


def regress_alm(capital_path: np.ndarray, a_path: np.ndarray, burn_in: int) -> tuple[StateRegression, StateRegression]:
    """(bad, good) regressions of ln K_{t+1} on ln K_t over t = burn_in .. T-2 with a_t in that state."""
    log_k = np.log(np.asarray(capital_path, dtype=np.float64))
    states = np.asarray(a_path[: log_k.size - 1])
    x, y = log_k[:-1], log_k[1:]
    keep = np.arange(x.size) >= burn_in
    return tuple(_ols(x[keep & (states == s)], y[keep & (states == s)]) for s in (0, 1))  # type: ignore[return-value]


def coefficients(bad: StateRegression, good: StateRegression) -> np.ndarray:
    return np.array([bad.intercept, bad.slope, good.intercept, good.slope])


def alm_path(alm: np.ndarray, a_path: np.ndarray, first: float, periods: int) -> np.ndarray:
    """K implied by the ALM alone (dynamic forecast): K_0 = first, ln K_{t+1} = b0_{a_t} + b1_{a_t} ln K_t."""
    coef = np.asarray(alm, dtype=np.float64).reshape(2, 2)
    log_k = np.empty(periods)
    log_k[0] = np.log(first)
    for t in range(periods - 1):
        a = int(a_path[t])
        log_k[t + 1] = coef[a, 0] + coef[a, 1] * log_k[t]
    return np.exp(log_k)


def den_haan_errors(panel_path: np.ndarray, a_path: np.ndarray, alm: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Den Haan (2010) statistics: max and mean of 100 |ln K^ALM_t - ln K_t| over the path, and K^ALM."""
    implied = alm_path(alm, a_path, float(panel_path[0]), panel_path.size)
    gap = 100.0 * np.abs(np.log(implied) - np.log(panel_path))
    return float(gap.max()), float(gap.mean()), implied
