"""Diagnostics of the SCCS assumptions, as SelfControlledCaseSeries 6.x defines them (``docs/sccs.md``):

- **minimum detectable relative risk** (``computeMdrr``, method ``SRL1``: the signed-root likelihood-ratio
  formula, expression 7 of Musonda, Farrington & Whitaker 2006): per covariate, from the share r of the exposed
  cases' observed time spent exposed and their number of events n;
- **event-exposure independence** (``checkEventExposureIndependenceAssumption``): the estimate of a
  pre-exposure window and its 95 % interval; it passes when the interval meets the null bounds (0.8, 1.25);
- **event-observation independence** (``checkEventObservationIndependenceAssumption``): likewise for a probe
  window at the end of each observation period, null bounds (0.5, 2);
- **time stability** (``checkTimeStabilityAssumption``): observed against expected events per calendar month,
  the expected ones from each case's own constant rate; the mean ratio x maximises the mixture likelihood
  ``prod_m [Pois(o_m; e_m x) + Pois(o_m; e_m / x)]`` and the one-sided likelihood-ratio test of
  ``x <= max_ratio`` (1.10) passes at p > alpha.

The exposure statistics are computed with the data's namespace (NumPy or CuPy); everything after them is
small host arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from kernels.backend import is_numpy, to_host
from kernels.sccs import fixed_sums, model
from kernels.sccs.data import SccsData

MAX_LOG_RR = 10.0  # the MDRR search's bound (SelfControlledCaseSeries' too): RR e^10 ~ 22,000
_BISECTIONS = 60  # halvings of [0, MAX_LOG_RR]: ~1e-17 on the log scale, below float64 spacing at 10


# -- exposure statistics and the minimum detectable relative risk ------------------------------------------

@dataclass(frozen=True)
class ExposureStatistics:
    """Per covariate column (host arrays): the cases with a nonzero value in some era (``exposed_cases``), the
    days of those eras (``time_exposed``), the whole observed days of those cases (``time_total``) and their
    events (``events``); SelfControlledCaseSeries' covariate statistics ``dayCount``, ``observedDayCount``
    and ``observedOutcomeCount``."""

    exposed_cases: np.ndarray
    time_exposed: np.ndarray
    time_total: np.ndarray
    events: np.ndarray


def _segment_sums(xp, values, pointers, n_segments: int):
    """Sums of ``values`` over the segments ``pointers[s]:pointers[s + 1]`` (no long cumsum): on the GPU one block
    per segment in a fixed order (the same bits every run, and no atomics contending on long segments)."""
    if not is_numpy(xp):
        return fixed_sums.long_segment_sums(pointers, values)
    segment = np.repeat(np.arange(n_segments), np.diff(pointers))
    return np.bincount(segment, weights=values, minlength=n_segments)


def exposure_statistics(data: SccsData) -> ExposureStatistics:
    """The per-covariate statistics of ``data``, computed where its arrays live."""
    xp, n_covariates = data.xp, data.n_covariates
    case_time = model.case_sums(data, data.era_length)
    time_exposed = _segment_sums(xp, data.era_length[data.col_rows], data.col_ptr, n_covariates)
    time_total = _segment_sums(xp, case_time[data.touched_case], data.touched_col_ptr, n_covariates)
    events = _segment_sums(xp, data.case_events[data.touched_case], data.touched_col_ptr, n_covariates)
    return ExposureStatistics(
        exposed_cases=np.asarray(to_host(xp.diff(data.touched_col_ptr)), dtype=np.int64),
        time_exposed=np.asarray(to_host(time_exposed), dtype=np.float64),
        time_total=np.asarray(to_host(time_total), dtype=np.float64),
        events=np.asarray(to_host(events), dtype=np.float64),
    )


def srl1_power(log_rr: np.ndarray, share_exposed: np.ndarray, events: np.ndarray, z: float) -> np.ndarray:
    """Power of the signed-root likelihood-ratio test at log relative risk ``log_rr`` > 0 (Musonda et al. 2006,
    expression 7): Phi((sqrt(n A) - z) / sqrt(B)) with, for rho = e^b and r the exposed share of time,
    A = 2 [rho r / (rho r + 1 - r) b - log(rho r + 1 - r)] and B = b^2 rho r (1 - r) / (A (rho r + 1 - r)^2)."""
    b, r, n = log_rr, share_exposed, events
    scale = np.exp(b) * r + 1.0 - r
    a = 2.0 * (np.exp(b) * r / scale * b - np.log(scale))
    bb = b * b / a * np.exp(b) * r * (1.0 - r) / (scale * scale)
    return stats.norm.cdf((np.sqrt(n * a) - z) / np.sqrt(bb))


def minimum_detectable_relative_risk(share_exposed: np.ndarray, events: np.ndarray, alpha: float = 0.05,
                                     power: float = 0.8, two_sided: bool = True) -> np.ndarray:
    """The relative risk at which the SRL1 power reaches ``power`` (``computeMdrr(method = "SRL1")``), per entry;
    inf where it is not reached by RR e^10, where n < 1, or where r is 0 or 1 (nothing to compare)."""
    r = np.asarray(share_exposed, dtype=np.float64)
    n = np.asarray(events, dtype=np.float64)
    z = float(stats.norm.ppf(1.0 - (alpha / 2.0 if two_sided else alpha)))
    defined = (n >= 1.0) & (r > 0.0) & (r < 1.0)
    r_safe, n_safe = np.where(defined, r, 0.5), np.where(defined, n, 1.0)
    reached = defined & (srl1_power(np.full(r.shape, MAX_LOG_RR), r_safe, n_safe, z) >= power)
    low, high = np.zeros(r.shape), np.full(r.shape, MAX_LOG_RR)
    for _ in range(_BISECTIONS):  # the power rises with b > 0: bisection on every covariate at once
        middle = 0.5 * (low + high)
        # Near b = 0, A is a difference of nearly equal terms (0/0 in the limit): a NaN power there compares
        # False, which moves the search up, as the power near b = 0 (about alpha) is below any sensible target.
        with np.errstate(invalid="ignore", divide="ignore"):
            above = srl1_power(middle, r_safe, n_safe, z) >= power
        high, low = np.where(above, middle, high), np.where(above, low, middle)
    return np.where(reached, np.exp(high), math.inf)


# -- the interval checks (pre-exposure window, end-of-observation probe) -----------------------------------

@dataclass(frozen=True)
class IntervalCheck:
    """The estimate of a window on the relative-incidence scale, its interval (None: open on that side) and
    whether the interval meets the null bounds."""

    ratio: float
    lower: float | None
    upper: float | None
    passed: bool


def interval_check(log_estimate: float, log_lower: float | None, log_upper: float | None,
                   null_bounds: tuple[float, float]) -> IntervalCheck:
    """Pass when the interval [lb, ub] intersects [null_bounds]: lb <= bounds[1] and ub >= bounds[0]
    (SelfControlledCaseSeries' rule; an open end reaches as far as it goes)."""
    lower = None if log_lower is None else math.exp(log_lower)
    upper = None if log_upper is None else (math.exp(log_upper) if log_upper < 700 else math.inf)
    meets = (lower is None or lower <= null_bounds[1]) and (upper is None or upper >= null_bounds[0])
    ratio = math.exp(log_estimate) if log_estimate < 700 else math.inf
    return IntervalCheck(ratio, lower, upper, bool(meets))


# -- time stability ----------------------------------------------------------------------------------------

def month_of_day(day: np.ndarray) -> np.ndarray:
    """Calendar months since 1970-01 of day numbers since 1970-01-01 (negative before)."""
    return np.asarray(day, dtype=np.int64).astype("datetime64[D]").astype("datetime64[M]").astype(np.int64)


def first_day_of_month(month: np.ndarray) -> np.ndarray:
    return np.asarray(month, dtype=np.int64).astype("datetime64[M]").astype("datetime64[D]").astype(np.int64)


@dataclass(frozen=True)
class MonthlyCounts:
    month: np.ndarray  # calendar months since 1970-01, consecutive
    observed: np.ndarray  # events in the month (inside their case's observation period)
    expected: np.ndarray  # under each case's constant rate; sums to the observed total


def monthly_counts(observation_start: np.ndarray, observation_end: np.ndarray, case_events: np.ndarray,
                   event_day: np.ndarray) -> MonthlyCounts:
    """Observed and expected events per calendar month (inclusive day numbers since 1970-01-01).

    Case i observed d_im days of month m (of D_m days) weighs w_im = d_im / D_m months there; its rate is
    n_i / sum_m w_im events per month, so e_m = sum_i w_im n_i / sum_m' w_im'. (SelfControlledCaseSeries takes
    every month as 31 days and its rate's denominator one month longer than the months weighed; here the
    months are the calendar's and the expected total equals the observed one.) ``event_day`` holds the days of
    the events counted in ``case_events`` (those inside the observation periods)."""
    start, end = np.asarray(observation_start, np.int64), np.asarray(observation_end, np.int64)
    first_month, last_month = month_of_day(start), month_of_day(end)
    months_per_case = last_month - first_month + 1
    case = np.repeat(np.arange(start.size), months_per_case)
    offset = np.arange(case.size) - np.repeat(np.cumsum(months_per_case) - months_per_case, months_per_case)
    month = first_month[case] + offset
    month_begin, next_begin = first_day_of_month(month), first_day_of_month(month + 1)
    days_observed = np.minimum(end[case] + 1, next_begin) - np.maximum(start[case], month_begin)
    weight = days_observed / (next_begin - month_begin)
    rate = np.asarray(case_events, np.float64) / np.bincount(case, weights=weight, minlength=start.size)
    low, high = int(first_month.min()), int(last_month.max())
    expected = np.bincount(month - low, weights=weight * rate[case], minlength=high - low + 1)
    observed = np.bincount(month_of_day(event_day) - low, minlength=high - low + 1).astype(np.float64)
    return MonthlyCounts(np.arange(low, high + 1), observed, expected)


@dataclass(frozen=True)
class TimeStability:
    ratio: float  # the mixture likelihood's maximiser x >= 1
    p: float  # one-sided: H0 x <= max_ratio
    passed: bool  # p > alpha
    months: int


def mixture_log_likelihood(x: float, observed: np.ndarray, expected: np.ndarray) -> float:
    """sum_m log[Pois(o_m; e_m x) + Pois(o_m; e_m / x)] (checkTimeStabilityAssumption's likelihood), summed
    in logs so that months far from either mean do not underflow."""
    first = stats.poisson.logpmf(observed, expected * x)
    second = stats.poisson.logpmf(observed, expected / x)
    return float(np.sum(np.logaddexp(first, second)))


def time_stability(observed: np.ndarray, expected: np.ndarray, max_ratio: float = 1.10,
                   alpha: float = 0.05) -> TimeStability:
    """checkTimeStabilityAssumption on monthly counts: x-hat over [1, 10] (where the likelihood is finite on
    SelfControlledCaseSeries' grid 1, 1.1, ..., 10), then 2 [l(max(x-hat, max_ratio)) - l(min(x-hat,
    max_ratio))] against chi2_1. Fewer than two months: no test (p = 1, passes)."""
    o = np.asarray(observed, np.float64)
    e = np.where(np.asarray(expected, np.float64) == 0.0, np.finfo(np.float64).eps, expected)
    if o.size < 2:
        return TimeStability(math.nan, 1.0, True, int(o.size))
    grid = np.round(np.arange(10, 101) / 10.0, 1)
    finite = grid[[math.isfinite(mixture_log_likelihood(x, o, e)) for x in grid]]
    if finite.size == 0:
        raise ValueError("time stability: the mixture likelihood is not finite anywhere on [1, 10]")
    low, high = float(finite.min()), float(finite.max())
    if high > low:
        found = optimize.minimize_scalar(lambda x: -mixture_log_likelihood(x, o, e), bounds=(low, high),
                                         method="bounded", options={"xatol": 1e-9})
        x_hat = float(found.x)
    else:
        x_hat = low
    null_x, alternative_x = min(x_hat, max_ratio), max(x_hat, max_ratio)
    statistic = 2.0 * (mixture_log_likelihood(alternative_x, o, e) - mixture_log_likelihood(null_x, o, e))
    # A NaN statistic (both likelihoods -inf): decided by which side of max_ratio x-hat lies, as SCCS does.
    p = (0.0 if x_hat > max_ratio else 1.0) if math.isnan(statistic) else float(stats.chi2.sf(statistic, 1))
    return TimeStability(x_hat, p, p > alpha, int(o.size))
