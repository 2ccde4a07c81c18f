"""Profile-likelihood confidence intervals of SCCS coefficients (Cyclops's ``getCyclopsProfileLogLikelihood``
and ``confint(..., method = "profile")``).

For coefficient j the profile is ``p(b) = max over the others of log_posterior(beta)`` with ``beta_j = b``, and
the interval at level L is ``{b : 2 (p(b_hat) - p(b)) <= chi2_1(L)}``. With the prior of the fit (Cyclops profiles
the penalised likelihood of a MAP fit) the log posterior includes ``log p(b)`` when j is penalised.

A constrained refit needs no change to the fitter: the model is ``mu = length exp(X beta)`` per era, so fixing
``beta_j = b`` moves ``exp(b x_j)`` into the era lengths (the offset) and removes column j; the refit is an
ordinary CCD fit of J - 1 coefficients, warm-started at the MAP's other coefficients. Each end of the interval
is a bracketed root of ``p(b) - (p(b_hat) - chi2_1(L) / 2)``: steps out from ``b_hat`` (doubling) until the
profile falls below the threshold, then Brent's method. An end that the search does not reach by its limit (a
profile that flattens, e.g. towards -inf for an exposure without events) is reported as None, an open interval.

Runs on the host (NumPy) whatever the job's device: each evaluation is one CCD fit of the host path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from kernels.backend import to_host
from kernels.sccs import ccd, model
from kernels.sccs.data import SccsData, from_coo
from kernels.sccs.model import Prior

MAX_DISTANCE = 20.0  # on the log scale: exp(20) ~ 5e8, beyond any relative incidence worth bounding
FIRST_STEP = 0.25
ROOT_TOLERANCE = 1e-6  # on b (log relative incidence)


@dataclass(frozen=True)
class ProfileInterval:
    covariate: int  # column index
    estimate: float
    lower: float | None  # None: the profile does not fall to the threshold within MAX_DISTANCE
    upper: float | None
    evaluations: int  # constrained refits spent
    # The profile where the search evaluated it, (b, p(b)) sorted by b, with the maximum (b_hat, p(b_hat)):
    # what a plot of the profile draws; ``maximum`` is p(b_hat), ``threshold`` the p(b) of the interval's ends.
    points: tuple[tuple[float, float], ...] = ()
    maximum: float = math.nan
    threshold: float = math.nan


def constrained_data(data: SccsData, column: int, value: float) -> SccsData:
    """The data of the fit with ``beta_column = value`` held: ``exp(value x_column)`` moved into the era lengths
    and the column removed (the other columns keep their order)."""
    host = data.to(np)
    start, stop = int(host.col_ptr[column]), int(host.col_ptr[column + 1])
    length = host.era_length.copy()
    length[host.col_rows[start:stop]] *= np.exp(value * host.col_values[start:stop])
    col_of_nz = np.repeat(np.arange(host.n_covariates), np.diff(host.col_ptr))
    keep = col_of_nz != column
    new_col = col_of_nz[keep] - (col_of_nz[keep] > column)
    return from_coo(host.era_case, length, host.era_events, host.col_rows[keep], new_col, host.col_values[keep],
                    host.n_covariates - 1, np.delete(host.covariate_ids, column))


def _prior_term(prior: Prior, column: int, value: float) -> float:
    """log p(beta_column = value) under the fit's prior (0 when the coefficient is not penalised)."""
    if prior.kind == "none" or not prior.penalised[column]:
        return 0.0
    if prior.kind == "normal":
        return -0.5 * value * value / prior.variance - 0.5 * math.log(2 * math.pi * prior.variance)
    return math.log(prior.laplace_rate / 2) - prior.laplace_rate * abs(value)


class _Profile:
    """p(b) for one coefficient, each call a warm-started constrained refit."""

    def __init__(self, data: SccsData, prior: Prior, options: ccd.FitOptions, beta_hat: np.ndarray,
                 column: int) -> None:
        self.data, self.prior, self.options, self.column = data, prior, options, column
        self.others = np.delete(beta_hat, column)
        self.sub_prior = Prior(prior.kind, prior.variance, np.delete(prior.penalised, column))
        self.evaluations = 0
        self.points: dict[float, float] = {}

    def __call__(self, value: float) -> float:
        if float(value) in self.points:  # Brent's method starts at the bracket's ends, which stepping out found
            return self.points[float(value)]
        self.evaluations += 1
        refit = ccd.fit(constrained_data(self.data, self.column, value), self.sub_prior, self.options,
                        beta0=self.others)
        if not refit.converged:
            raise ValueError(f"a constrained refit for covariate column {self.column} at {value:g} did not converge "
                             f"in {self.options.max_iterations} cycles")
        self.points[float(value)] = refit.log_posterior + _prior_term(self.prior, self.column, value)
        return self.points[float(value)]


def _end(profile: _Profile, estimate: float, threshold: float, direction: float) -> float | None:
    """The root of p(b) = threshold on one side of the estimate, or None when none lies before the search's limit
    (MAX_DISTANCE beyond the estimate, and at least to +-MAX_DISTANCE: an estimate that ran off towards -inf,
    as for a drug without events in its windows, still gets its finite upper end)."""
    limit = max(estimate + MAX_DISTANCE, MAX_DISTANCE) if direction > 0 else min(estimate - MAX_DISTANCE,
                                                                                   -MAX_DISTANCE)
    reach = abs(limit - estimate)
    inside, step = estimate, FIRST_STEP
    while True:
        outside = estimate + direction * min(step, reach)
        if profile(outside) < threshold:
            return float(optimize.brentq(lambda b: profile(b) - threshold, min(inside, outside),
                                         max(inside, outside), xtol=ROOT_TOLERANCE))
        if step >= reach:
            return None
        inside, step = outside, 2 * step


def profile_intervals(data: SccsData, prior: Prior, fit: ccd.FitResult, columns: list[int], level: float = 0.95,
                      options: ccd.FitOptions | None = None) -> list[ProfileInterval]:
    """Profile-likelihood intervals of ``columns`` (indices) around the MAP ``fit`` of ``data`` under ``prior``.

    The refits use ``options`` (the fit's, with a tolerance of at most 1e-8: the profile's differences near
    the threshold are of order one, but its curvature at the estimate needs an accurate maximum)."""
    host = data.to(np)
    options = options or ccd.FitOptions()
    refit_options = ccd.FitOptions(min(options.tolerance, 1e-8), max(options.max_iterations, 1000), "gradient",
                                   "float64")
    # the job's fit stops at its own tolerance: the interval's threshold needs the maximum itself
    full = ccd.fit(host, prior, refit_options, beta0=np.asarray(to_host(fit.beta), dtype=np.float64))
    if not full.converged:
        raise ValueError("the refit at the maximum for the profile intervals did not converge")
    beta_hat = full.beta
    top = model.log_likelihood(host, beta_hat) + model.log_prior(beta_hat, prior)
    threshold = top - 0.5 * float(stats.chi2.ppf(level, 1))
    intervals = []
    for column in columns:
        profile = _Profile(host, prior, refit_options, beta_hat, column)
        estimate = float(beta_hat[column])
        lower = _end(profile, estimate, threshold, -1.0)
        upper = _end(profile, estimate, threshold, +1.0)
        points = tuple(sorted({**profile.points, estimate: float(top)}.items()))
        intervals.append(ProfileInterval(column, estimate, lower, upper, profile.evaluations, points, float(top),
                                         threshold))
    return intervals
