"""Empirical calibration of p-values and confidence intervals from negative (and positive) controls: the
systematic-error model of Schuemie et al. (Statistics in Medicine 2014; PNAS 2018), as the R package
EmpiricalCalibration defines it (``fitNull``, ``calibrateP``, ``fitSystematicErrorModel``,
``convertNullToErrorModel``, ``calibrateConfidenceInterval``; ``docs/sccs.md``).

- **The null** (``fitNull``): a negative control's estimate is its true log relative risk 0 plus a systematic
  error ~ N(mu, sigma^2) plus its random error ~ N(0, se_i^2), so log_rr_i ~ N(mu, sigma^2 + se_i^2);
  (mu, sigma >= 0) by maximum likelihood. Estimates or standard errors that are not finite are left out.
- **Calibrated p** (``calibrateP``): the probability under the null of an estimate as extreme:
  p_upper = Phi((mu - x) / sqrt(sigma^2 + se^2)), p_lower = Phi((x - mu) / ...), two-sided 2 min(p_upper,
  p_lower).
- **Systematic-error model** (``fitSystematicErrorModel``): with controls of known true effect theta (negative:
  0; positive: e.g. log 2, log 4), log_rr ~ N(a + b theta, exp(c + d theta)^2 + se^2), (a, b, c, d) by maximum
  likelihood; from the null alone (``convertNullToErrorModel``): (mu, 1, log sigma, 0).
- **Calibrated interval** (``calibrateConfidenceInterval``): the thetas at which the estimate sits at the
  z quantiles of its error distribution: a + b theta = x -+ z_(1+level)/2 sqrt(exp(c + d theta)^2 + se^2) for
  the lower and upper ends, and a + b theta = x for the calibrated estimate; each end the root nearest the
  estimate, by Brent's method; the calibrated standard error is (upper - lower) / (2 z).

Host arithmetic (NumPy, SciPy): a few hundred controls at most.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

MAX_THETA_DISTANCE = 100.0  # how far from the calibrated estimate an interval's end is searched (log scale)
FIRST_STEP = 1.0 / 64


@dataclass(frozen=True)
class NullDistribution:
    mean: float  # mu, log scale
    sd: float  # sigma >= 0
    n_controls: int  # the finite estimates it was fitted to


@dataclass(frozen=True)
class ErrorModel:
    """log_rr ~ N(mean_intercept + mean_slope theta, exp(sd_intercept + sd_slope theta)^2 + se^2)."""

    mean_intercept: float
    mean_slope: float
    sd_intercept: float  # log scale; -inf for a null with sigma = 0
    sd_slope: float

    def mean(self, theta: float) -> float:
        return self.mean_intercept + self.mean_slope * theta

    def sd(self, theta: float) -> float:
        return math.exp(self.sd_intercept + self.sd_slope * theta) if math.isfinite(self.sd_intercept) else 0.0


def _finite(*columns: np.ndarray) -> np.ndarray:
    keep = np.ones(np.asarray(columns[0]).shape, dtype=bool)
    for column in columns:
        keep &= np.isfinite(np.asarray(column, dtype=np.float64))
    return keep


def null_log_likelihood(mean: float, sd: float, log_rr: np.ndarray, se: np.ndarray) -> float:
    """sum_i log N(log_rr_i; mean, sd^2 + se_i^2)."""
    return float(np.sum(stats.norm.logpdf(log_rr, loc=mean, scale=np.sqrt(sd * sd + se * se))))


def _profile_mean(sd: float, log_rr: np.ndarray, se: np.ndarray) -> float:
    """The mean maximising the likelihood at a given sd: the precision-weighted average."""
    weight = 1.0 / (sd * sd + se * se)
    return float(np.sum(weight * log_rr) / np.sum(weight))


def fit_null(log_rr: np.ndarray, se: np.ndarray) -> NullDistribution:
    """The maximum-likelihood null from negative controls' log estimates and standard errors.

    The likelihood is profiled over sd (the mean at each sd is the precision-weighted average), scanned on a
    log grid that includes sd = 0, and refined by bounded Brent's method around the best grid point, so a
    boundary maximum at sd = 0 is found as such (R's Nelder-Mead from its start may stop short of it)."""
    log_rr, se = np.asarray(log_rr, np.float64), np.asarray(se, np.float64)
    keep = _finite(log_rr, se) & (se > 0)
    log_rr, se = log_rr[keep], se[keep]
    if log_rr.size < 2:
        raise ValueError(f"the null needs at least 2 negative controls with finite estimates and standard errors, "
                         f"got {log_rr.size}")
    spread = float(np.ptp(log_rr) + np.max(se))

    def profile(sd: float) -> float:
        return null_log_likelihood(_profile_mean(sd, log_rr, se), sd, log_rr, se)

    grid = np.concatenate([[0.0], spread * np.logspace(-6, 1, 141)])
    values = np.array([profile(sd) for sd in grid])
    best = int(np.argmax(values))
    if best == 0:
        mean = _profile_mean(0.0, log_rr, se)
        # d log L / d sd^2 at sd = 0: where it is not positive, the maximum is on the boundary itself
        if float(np.sum((log_rr - mean) ** 2 / se ** 4 - 1.0 / se ** 2)) <= 0.0:
            return NullDistribution(mean, 0.0, int(log_rr.size))
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
    # The maximum as the root of the profile's derivative, not by comparing likelihood values: a flat maximum
    # located from values is known only to about sqrt(machine epsilon) in sd, and then estimates that differ in
    # their last digits (a GPU and a NumPy fit) give nulls, and calibrated p-values, apart by 1e-8.
    slope_low, slope_high = _profile_slope(max(low, 1e-300), log_rr, se), _profile_slope(high, log_rr, se)
    if slope_low > 0.0 > slope_high:
        sd = float(optimize.brentq(_profile_slope, max(low, 1e-300), high, args=(log_rr, se), xtol=1e-300,
                                   rtol=4 * np.finfo(float).eps))
    else:
        found = optimize.minimize_scalar(lambda sd: -profile(sd), bounds=(low, high), method="bounded",
                                         options={"xatol": 1e-12 * max(spread, 1.0)})
        sd = float(found.x) if -found.fun >= values[best] else float(grid[best])
    return NullDistribution(_profile_mean(sd, log_rr, se), sd, int(log_rr.size))


def _profile_slope(sd: float, log_rr: np.ndarray, se: np.ndarray) -> float:
    """d log L / d sd of the profile, divided by sd (> 0 below the maximum, < 0 above it). The mean maximises
    the likelihood at every sd, so only the explicit dependence on sd counts (the envelope theorem):
    sum over controls of (x - mean)^2 / v^2 - 1 / v with v = sd^2 + se^2."""
    variance = sd * sd + se * se
    residual = log_rr - _profile_mean(sd, log_rr, se)
    return float(np.sum(residual * residual / (variance * variance) - 1.0 / variance))


def calibrate_p(null: NullDistribution, log_rr: np.ndarray, se: np.ndarray, two_sided: bool = True,
                upper: bool = True) -> np.ndarray:
    """Calibrated p-values (NaN where the estimate or its standard error is not finite)."""
    log_rr, se = np.asarray(log_rr, np.float64), np.asarray(se, np.float64)
    scale = np.sqrt(null.sd ** 2 + se ** 2)
    with np.errstate(invalid="ignore"):
        p_upper = stats.norm.cdf((null.mean - log_rr) / scale)
        p_lower = stats.norm.cdf((log_rr - null.mean) / scale)
    p = 2.0 * np.minimum(p_upper, p_lower) if two_sided else (p_upper if upper else p_lower)
    return np.where(_finite(log_rr, se), p, np.nan)


def null_error_model(null: NullDistribution) -> ErrorModel:
    """convertNullToErrorModel: the error the null describes, the same at every true effect."""
    return ErrorModel(null.mean, 1.0, math.log(null.sd) if null.sd > 0 else -math.inf, 0.0)


def error_model_log_likelihood(model: ErrorModel, log_rr: np.ndarray, se: np.ndarray,
                               true_log_rr: np.ndarray) -> float:
    sd = np.exp(model.sd_intercept + model.sd_slope * true_log_rr)
    mean = model.mean_intercept + model.mean_slope * true_log_rr
    return float(np.sum(stats.norm.logpdf(log_rr, loc=mean, scale=np.sqrt(sd * sd + se * se))))


def fit_systematic_error_model(log_rr: np.ndarray, se: np.ndarray, true_log_rr: np.ndarray) -> ErrorModel:
    """The maximum-likelihood systematic-error model from controls of known true effect (at least two distinct
    true effects: with negative controls alone use :func:`null_error_model`)."""
    log_rr, se, true_log_rr = (np.asarray(a, np.float64) for a in (log_rr, se, true_log_rr))
    keep = _finite(log_rr, se, true_log_rr) & (se > 0)
    log_rr, se, true_log_rr = log_rr[keep], se[keep], true_log_rr[keep]
    if np.unique(true_log_rr).size < 2:
        raise ValueError("the systematic-error model needs controls of at least two different true effects")

    def negative(theta: np.ndarray) -> float:
        return -error_model_log_likelihood(ErrorModel(*theta), log_rr, se, true_log_rr)

    null = fit_null(log_rr[true_log_rr == 0], se[true_log_rr == 0]) if np.sum(true_log_rr == 0) >= 2 else None
    starts = [np.array([0.0, 1.0, 0.5, 0.0]), np.array([0.0, 1.0, math.log(0.1), 0.0])]  # R's start, and one more
    if null is not None and null.sd > 0:
        starts.append(np.array([null.mean, 1.0, math.log(null.sd), 0.0]))
    best = None
    for start in starts:
        found = optimize.minimize(negative, start, method="Nelder-Mead",
                                  options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20_000, "maxfev": 40_000})
        found = optimize.minimize(negative, found.x, method="BFGS", options={"gtol": 1e-9})
        if best is None or found.fun < best.fun:
            best = found
    assert best is not None
    return ErrorModel(*(float(v) for v in best.x))


@dataclass(frozen=True)
class CalibratedInterval:
    log_rr: float  # calibrated estimate
    lower: float  # log scale
    upper: float
    se: float  # (upper - lower) / (2 z)


def _solve(model: ErrorModel, log_rr: float, se: float, z: float) -> float:
    """The true effect theta at which ``log_rr`` sits ``z`` of its error's sds above the error distribution's
    mean (z = 0: the calibrated estimate, mean(theta) = log_rr). The end nearest the calibrated estimate: bracketed
    by doubling steps out from it (EmpiricalCalibration's uniroot on [-50, 50] stops with an error when the error's
    sd grows with theta so fast that the gap has one sign at both ends), then Brent's method; NaN when no end lies
    within MAX_THETA_DISTANCE."""

    def gap(theta: float) -> float:
        return z + (model.mean(theta) - log_rr) / math.sqrt(model.sd(theta) ** 2 + se * se)

    if model.mean_slope == 0.0:
        return math.nan  # the estimate does not depend on the true effect: nothing to invert
    centre = (log_rr - model.mean_intercept) / model.mean_slope
    if z == 0.0:
        return centre
    # at the centre the gap is z; the end lies where it changes sign, on the side where mean(theta) moves away
    direction = -math.copysign(1.0, z) * math.copysign(1.0, model.mean_slope)
    inside, step = centre, FIRST_STEP
    while step <= MAX_THETA_DISTANCE:
        outside = centre + direction * step
        if gap(outside) * z <= 0.0:
            low, high = min(inside, outside), max(inside, outside)
            return float(optimize.brentq(gap, low, high, xtol=1e-12, rtol=4 * np.finfo(float).eps))
        inside, step = outside, 2.0 * step
    return math.nan


def calibrate_confidence_interval(log_rr: np.ndarray, se: np.ndarray, model: ErrorModel,
                                  level: float = 0.95) -> list[CalibratedInterval]:
    """Calibrated estimates and intervals (NaN where the estimate or its standard error is not finite)."""
    z = float(stats.norm.ppf((1.0 + level) / 2.0))
    intervals = []
    for x, s in zip(np.asarray(log_rr, np.float64).tolist(), np.asarray(se, np.float64).tolist(), strict=True):
        if not (math.isfinite(x) and math.isfinite(s)):
            intervals.append(CalibratedInterval(math.nan, math.nan, math.nan, math.nan))
            continue
        lower, upper = _solve(model, x, s, z), _solve(model, x, s, -z)
        intervals.append(CalibratedInterval(_solve(model, x, s, 0.0), lower, upper, (upper - lower) / (2.0 * z)))
    return intervals


@dataclass(frozen=True)
class Calibration:
    """Everything :func:`calibrate` derives from one set of estimates and their controls."""

    null: NullDistribution
    model: ErrorModel
    positive_controls: int  # positive controls with a finite estimate and standard error
    p: np.ndarray  # calibrated two-sided p-values, per estimate
    intervals: list[CalibratedInterval]


def calibrate(log_rr: np.ndarray, se: np.ndarray, negative: np.ndarray, positive_true_log_rr: np.ndarray,
              level: float = 0.95) -> Calibration:
    """The null from the ``negative`` estimates, the error model (``fitSystematicErrorModel`` over negatives and
    the positives, those with a finite ``positive_true_log_rr``, when any positive is usable; else the null's),
    and every estimate's calibrated p and interval."""
    log_rr, se = np.asarray(log_rr, np.float64), np.asarray(se, np.float64)
    negative = np.asarray(negative, dtype=bool)
    true_positive = np.asarray(positive_true_log_rr, np.float64)
    positive = np.isfinite(true_positive) & ~negative
    null = fit_null(log_rr[negative], se[negative])
    usable_positive = positive & _finite(log_rr, se)
    if usable_positive.any():
        controls = negative | positive
        true_effect = np.where(positive, true_positive, 0.0)
        model = fit_systematic_error_model(log_rr[controls], se[controls], true_effect[controls])
    else:
        model = null_error_model(null)
    return Calibration(null, model, int(usable_positive.sum()), calibrate_p(null, log_rr, se),
                       calibrate_confidence_interval(log_rr, se, model, level))
