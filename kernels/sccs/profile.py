"""Profile-likelihood confidence intervals of SCCS coefficients (Cyclops's ``getCyclopsProfileLogLikelihood``
and ``confint(..., method = "profile")``).

For coefficient j the profile is ``p(b) = max over the others of log_posterior(beta)`` with ``beta_j = b``, and
the interval at level L is ``{b : 2 (p(b_hat) - p(b)) <= chi2_1(L)}``. With the prior of the fit (Cyclops profiles
the penalised likelihood of a MAP fit) the log posterior includes ``log p(b)`` when j is penalised.

A constrained refit needs no change to the fitter: the model is ``mu = length exp(X beta)`` per era, so fixing
``beta_j = b`` moves ``exp(b x_j)`` into the era lengths (the offset) and removes column j; the refit is an
ordinary CCD fit of J - 1 coefficients, warm-started at the MAP's other coefficients. Each end of the interval
is the root of ``p(b) - (p(b_hat) - chi2_1(L) / 2)`` on its side of ``b_hat``. The profile is concave (a maximum
over the others of a concave log posterior), so there is one root on each side, or none before the search's
limit (a profile that flattens, e.g. towards -inf for an exposure without events): an open end, reported as None.

Two paths compute the same intervals:

* :func:`profile_intervals`, the host reference: coefficient by coefficient, end by end, each evaluation one
  CCD fit of the constrained data (NumPy), warm-started at the MAP; each end by stepping out from ``b_hat``
  (doubling) until the profile falls below the threshold, then SciPy's ``brentq`` on the last step;
* :func:`batched_profile_intervals`, what ``sccs_fit`` runs: every (coefficient, end) search advances in
  lockstep, and each round evaluates the profile at one point per live search as ONE batch of constrained
  refits, each warm-started from its search's previous solution. A refit holds ``beta_j = b`` in place (the
  fitter skips coordinate j; the linear predictor keeps ``b x_j``: ``ccd.fit(..., fixed_column=j)``, and the
  batch engine's ``fixed_columns`` / ``refit_moved`` on the GPU). Its cost is its rounds (each as many CCD
  cycles as its slowest refit takes), so its search (:func:`crossing_steps`) is built to take few. It works
  on the signed root deviance ``u(s) = sqrt(2 (p(b_hat) - p(b_hat +- s)))``, linear in the distance ``s`` for
  a quadratic profile and nearly so for a real one; its first point is the Wald-type half-width
  ``z / sqrt(information)`` (the Hessian's diagonal at the maximum), each next one the inverse interpolation
  of ``s(u)`` at ``z`` through the points seen (safeguarded by the bracket, with bisection when it creeps);
  and it stops, as ``brentq`` does, when the crossing is bracketed within the root's tolerance, but with the
  bracket's ends certified by the profile's concavity rather than evaluated (:func:`_certified_bracket`), so
  that a point landing near the crossing ends the search without a second one across it. A search takes 3
  refits on a nearly quadratic profile, 4-6 on a skewed one, where the reference's takes 6-8; its refits stop
  at a KKT residual of 1e-5 (``SEARCH_REFIT_TOLERANCE``). Its ends are the reference's to the root's
  tolerance. On NumPy the batch's refits run one after another; on the GPU as one batch of the engine (in
  groups of what fits in the device's memory). Its refits run in the new coordinates of the dense unpenalised
  columns (the splines: :mod:`kernels.sccs.precondition`), in which CCD converges in a few cycles instead of
  tens; the profile, a maximum over those coordinates, is the same.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, stats

from kernels.backend import is_numpy, to_host
from kernels.sccs import ccd, fixed_sums, model
from kernels.sccs import precondition as precondition_
from kernels.sccs.data import SccsData, from_coo
from kernels.sccs.model import Prior

MAX_DISTANCE = 20.0  # on the log scale: exp(20) ~ 5e8, beyond any relative incidence worth bounding
FIRST_STEP = 0.25  # the reference's first step out
ROOT_TOLERANCE = 1e-6  # on b (log relative incidence)
# The batched search's first guess, z / sqrt(information), goes at most this far: the information of an exposure
# with few events in its windows is small or nil (its interval wide, or open on one side).
LARGEST_FIRST_GUESS = 4.0
# Before the threshold is bracketed, a guess goes at most this many times farther out than the farthest point
# inside (a profile that flattens reaches the search's limit in a few rounds).
GROWTH = 8.0
MAX_SEARCH_STEPS = 100
# The batched search's constrained refits stop at this KKT residual (the maximum's refit, and the reference's
# refits, at 1e-8): a refit that stops at a residual g of the others reads p(b) low by g' H^-1 g / 2, second order
# in g (~1e-10 / the others' smallest curvature here), far below what moves an end by the root's tolerance, and
# each round takes a cycle or two fewer (measured on the study bench: the ends at 1e-5 = those at 1e-8 to 3e-12).
SEARCH_REFIT_TOLERANCE = 1e-5
# Share of the GPU's free memory the profile's batch may take.
GPU_MEMORY_SHARE = 0.6


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
    return from_coo(
        host.era_case,
        length,
        host.era_events,
        host.col_rows[keep],
        new_col,
        host.col_values[keep],
        host.n_covariates - 1,
        np.delete(host.covariate_ids, column),
    )


def _prior_term(prior: Prior, column: int, value: float) -> float:
    """log p(beta_column = value) under the fit's prior (0 when the coefficient is not penalised)."""
    if prior.kind == "none" or not prior.penalised[column]:
        return 0.0
    if prior.kind == "normal":
        return -0.5 * value * value / prior.variance - 0.5 * math.log(2 * math.pi * prior.variance)
    return math.log(prior.laplace_rate / 2) - prior.laplace_rate * abs(value)


class _Profile:
    """p(b) for one coefficient, each call a warm-started constrained refit."""

    def __init__(
        self, data: SccsData, prior: Prior, options: ccd.FitOptions, beta_hat: np.ndarray, column: int
    ) -> None:
        self.data, self.prior, self.options, self.column = data, prior, options, column
        self.others = np.delete(beta_hat, column)
        self.sub_prior = Prior(prior.kind, prior.variance, np.delete(prior.penalised, column))
        self.evaluations = 0
        self.points: dict[float, float] = {}

    def __call__(self, value: float) -> float:
        if float(value) in self.points:  # Brent's method starts at the bracket's ends, which stepping out found
            return self.points[float(value)]
        self.evaluations += 1
        refit = ccd.fit(
            constrained_data(self.data, self.column, value), self.sub_prior, self.options, beta0=self.others
        )
        if not refit.converged:
            raise ValueError(
                f"a constrained refit for covariate column {self.column} at {value:g} did not converge "
                f"in {self.options.max_iterations} cycles"
            )
        self.points[float(value)] = refit.log_posterior + _prior_term(self.prior, self.column, value)
        return self.points[float(value)]


def _reach(estimate: float, direction: float) -> float:
    """How far the search of an end goes: MAX_DISTANCE beyond the estimate, and at least to +-MAX_DISTANCE (an
    estimate that ran off towards -inf, as for a drug without events in its windows, still gets its finite
    upper end)."""
    limit = max(estimate + MAX_DISTANCE, MAX_DISTANCE) if direction > 0 else min(estimate - MAX_DISTANCE, -MAX_DISTANCE)
    return abs(limit - estimate)


def _end(profile: _Profile, estimate: float, threshold: float, direction: float) -> float | None:
    """The root of p(b) = threshold on one side of the estimate, or None when none lies before the search's limit
    (:func:`_reach`): stepping out by doubling from the estimate until the profile falls below the threshold,
    then SciPy's ``brentq`` on the last step."""
    reach = _reach(estimate, direction)
    inside, step = estimate, FIRST_STEP
    while True:
        outside = estimate + direction * min(step, reach)
        if profile(outside) < threshold:
            return float(
                optimize.brentq(
                    lambda b: profile(b) - threshold, min(inside, outside), max(inside, outside), xtol=ROOT_TOLERANCE
                )
            )
        if step >= reach:
            return None
        inside, step = outside, 2 * step


def _refit_options(options: ccd.FitOptions | None) -> ccd.FitOptions:
    """The refits' options: the fit's, with the gradient criterion at a tolerance of at most 1e-8 (the
    profile's differences near the threshold are of order one, but its curvature at the estimate needs an
    accurate maximum), at least 1000 cycles, float64."""
    options = options or ccd.FitOptions()
    return ccd.FitOptions(min(options.tolerance, 1e-8), max(options.max_iterations, 1000), "gradient", "float64")


def _threshold(top: float, level: float) -> float:
    return top - 0.5 * float(stats.chi2.ppf(level, 1))


def profile_intervals(
    data: SccsData,
    prior: Prior,
    fit: ccd.FitResult,
    columns: list[int],
    level: float = 0.95,
    options: ccd.FitOptions | None = None,
) -> list[ProfileInterval]:
    """Profile-likelihood intervals of ``columns`` (indices) around the MAP ``fit`` of ``data`` under ``prior``
    (the host reference, one search after another; see :func:`_refit_options` for the refits)."""
    host = data.to(np)
    refit_options = _refit_options(options)
    # the job's fit stops at its own tolerance: the interval's threshold needs the maximum itself
    full = ccd.fit(host, prior, refit_options, beta0=np.asarray(to_host(fit.beta), dtype=np.float64))
    if not full.converged:
        raise ValueError("the refit at the maximum for the profile intervals did not converge")
    beta_hat = full.beta
    top = model.log_likelihood(host, beta_hat) + model.log_prior(beta_hat, prior)
    threshold = _threshold(top, level)
    intervals = []
    for column in columns:
        profile = _Profile(host, prior, refit_options, beta_hat, column)
        estimate = float(beta_hat[column])
        lower = _end(profile, estimate, threshold, -1.0)
        upper = _end(profile, estimate, threshold, +1.0)
        points = tuple(sorted({**profile.points, estimate: float(top)}.items()))
        intervals.append(
            ProfileInterval(column, estimate, lower, upper, profile.evaluations, points, float(top), threshold)
        )
    return intervals


# -- the batched profile: every (coefficient, end) search in lockstep -------------------------------------

# Progress of the batched profile: (searches finished, searches) after every CCD cycle of every refit; it may
# raise (JobCancelled) to abandon the profile: the cancel point.
ProfileProgress = Callable[[int, int], None]
# A search as a coroutine: it yields the next b to evaluate, is sent p(b), and returns the end (None: open).
_Steps = Generator[float, float, "float | None"]


# A point of a search: (distance s from the estimate, signed root deviance u there).
_Point = tuple[float, float]


def _inverse_interpolation(seen: list[_Point], target: float) -> float:
    """s at u = target on the polynomial s(u) through the (up to) three points nearest the target in u (with
    distinct u): inverse quadratic interpolation, exact for a quadratic profile's u = sqrt(c) s and nearly so
    for a real one. NaN under two points."""
    used: list[_Point] = []
    for point in sorted(seen, key=lambda point: abs(point[1] - target)):
        if all(abs(point[1] - other[1]) > 1e-12 * target for other in used):
            used.append(point)
        if len(used) == 3:
            break
    if len(used) < 2:
        return math.nan
    total = 0.0
    for i, (s_i, u_i) in enumerate(used):
        term = s_i
        for k, (_, u_k) in enumerate(used):
            if k != i:
                term *= (target - u_k) / (u_i - u_k)
        total += term
    return total


def _certified_bracket(seen: list[_Point], target: float) -> tuple[float, float]:
    """[low, high] holding the crossing, from the points seen and the concavity of the profile (a maximum over
    the others of a concave log posterior): with ``q = -u^2 / 2 = p - p(b_hat)`` and ``t = -target^2 / 2``,

    * q lies above the chord between the farthest point inside (q >= t) and the nearest outside (q < t): where
      the chord crosses t, q >= t (inside);
    * q lies below the line through two points beyond the segment between them: the line through the farthest
      point inside and the point before it, extended outwards, and the line through the nearest point outside
      and the point after it, extended inwards, each bound where q < t (outside).

    So a point near the crossing closes the bracket with its neighbours, without a point evaluated across it.
    ``high`` is inf while nothing bounds the crossing."""
    t = -0.5 * target * target
    points = sorted((s, -0.5 * u * u) for s, u in seen)
    inside = [point for point in points if point[1] >= t]
    outside = [point for point in points if point[1] < t]
    (s_in, q_in), high = inside[-1], math.inf
    low = s_in
    if len(inside) >= 2 and inside[-2][0] < s_in:
        s_before, q_before = inside[-2]
        slope = (q_in - q_before) / (s_in - s_before)
        if slope < 0:
            high = s_in + (t - q_in) / slope
    if outside:
        s_out, q_out = outside[0]
        low = max(low, s_in + (q_in - t) * (s_out - s_in) / (q_in - q_out))
        high = min(high, s_out)
        if len(outside) >= 2 and outside[1][0] > s_out:
            s_after, q_after = outside[1]
            slope = (q_after - q_out) / (s_after - s_out)
            if slope < 0:
                high = min(high, s_out + (t - q_out) / slope)
    return low, high


def _next_distance(seen: list[_Point], low: float, high: float, target: float, reach: float, tolerance: float) -> float:
    """The search's next s: the inverse interpolation's estimate of the crossing, safeguarded.

    While nothing bounds the crossing, beyond the farthest point inside and at most GROWTH times as far (the
    secant from 0 when the interpolation does not go out); once bracketed, inside the bracket and a step at most
    half the step before last (Brent's rule, which bounds the steps by bisection's when the interpolation creeps),
    else bisection; and an eighth of the tolerance inside the bracket's ends (which may be points seen)."""
    estimate = _inverse_interpolation(seen, target)
    if math.isinf(high):
        farthest, at_farthest = max(point for point in seen if point[1] <= target)
        if not estimate > farthest:  # (NaN included) an interpolation that does not go out: the secant from 0
            estimate = farthest * target / at_farthest if at_farthest > 0 else GROWTH * farthest
        return min(estimate, GROWTH * farthest, reach)
    before_last = abs(seen[-2][0] - seen[-3][0]) if len(seen) >= 3 else math.inf
    if not (low < estimate < high and abs(estimate - seen[-1][0]) <= 0.5 * before_last):
        estimate = 0.5 * (low + high)
    return min(max(estimate, low + tolerance / 8), high - tolerance / 8, reach)


def crossing_steps(
    target: float, reach: float, first_guess: float, tolerance: float = ROOT_TOLERANCE
) -> Generator[float, float, float | None]:
    """The s in (0, reach] where u(s), increasing from u(0) = 0, crosses ``target``, for u the signed root
    deviance of a concave profile, as a coroutine: yields each s to evaluate, is sent u(s), returns the crossing
    (to ``tolerance``) or None when u(reach) <= target.

    It stops when the bracket that the points and the profile's concavity give (:func:`_certified_bracket`) is at
    most ``tolerance`` wide (``brentq``'s criterion, with the bracket's ends certified instead of evaluated), and
    returns the inverse interpolation's estimate in it."""
    seen: list[_Point] = [(0.0, 0.0)]
    s = min(max(first_guess, tolerance), reach)
    for _ in range(MAX_SEARCH_STEPS):
        u = yield s
        seen.append((s, u))
        if u <= target and s >= reach:
            return None
        low, high = _certified_bracket(seen, target)
        if high - low <= tolerance:
            estimate = _inverse_interpolation(seen, target)
            return estimate if low <= estimate <= high else 0.5 * (low + high)
        s = _next_distance(seen, low, high, target, reach, tolerance)
    raise RuntimeError(f"the profile search did not converge in {MAX_SEARCH_STEPS} steps")


def end_steps(estimate: float, at_estimate: float, threshold: float, direction: float, first_guess: float) -> _Steps:
    """One end's search as a coroutine: yields each b, is sent p(b), returns the end (None: the profile stays
    above the threshold up to the search's limit, :func:`_reach`). The root of p(b) = threshold on the
    ``direction`` side of the estimate, found by :func:`crossing_steps` on the signed root deviance; p at the
    estimate is ``at_estimate`` (the maximum), not a refit; ``first_guess`` is the first distance tried."""
    target = math.sqrt(2.0 * (at_estimate - threshold))
    crossing = crossing_steps(target, _reach(estimate, direction), first_guess)
    try:
        s = next(crossing)
        while True:
            at_b = yield estimate + direction * s
            s = crossing.send(math.sqrt(2.0 * max(at_estimate - at_b, 0.0)))
    except StopIteration as stop:
        return None if stop.value is None else estimate + direction * stop.value


def _local_model(data: SccsData, prior: Prior, beta: np.ndarray, columns: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """For ``columns`` at ``beta`` (host arrays, computed on ``data``'s device): the diagonal of the negative log
    posterior's Hessian, ``sum_i n_i (sum_k p_k x_kj^2 - a_ij^2)`` with ``a_ij = sum_{k in i} p_k x_kj`` (see
    :func:`kernels.sccs.precondition.hessian_block`) plus ``1 / variance`` under a normal prior, and the
    log-likelihood's gradient ``sum_k x_kj (y_k - n_i p_k)``. The diagonal is at least the profile's curvature
    (the others held), whose ``z / sqrt`` is the Wald half-width the searches start from; the gradient gives the
    profile's slope at a Laplace prior's kink. On the GPU every sum runs in a fixed order (the same first guesses,
    so the same searches, on every run)."""
    xp = data.xp
    share = model.era_shares(data, beta)
    col_ptr = np.asarray(to_host(data.col_ptr), dtype=np.int64)
    touched_col_ptr = np.asarray(to_host(data.touched_col_ptr), dtype=np.int64)
    information, gradient = np.zeros(len(columns)), np.zeros(len(columns))
    for m, column in enumerate(columns):
        start, stop = int(col_ptr[column]), int(col_ptr[column + 1])
        first, last = int(touched_col_ptr[column]), int(touched_col_ptr[column + 1])
        rows, values = data.col_rows[start:stop], data.col_values[start:stop]
        expected = data.case_events[data.era_case[rows]] * share[rows]  # n_i p_k
        a = _touched_case_sums(data, start, first, last, share[rows] * values)  # a_ij of the cases j touches
        information[m] = _total(xp, expected * values * values) - _total(
            xp, data.case_events[data.touched_case[first:last]] * a * a
        )
        gradient[m] = _total(xp, values * (data.era_events[rows] - expected))
        if prior.kind == "normal" and prior.penalised[column]:
            information[m] += 1.0 / prior.variance
    return information, gradient


def _touched_case_sums(data: SccsData, start: int, first: int, last: int, values: Any) -> Any:
    """Per case that a column touches (``touched_case[first:last]``), the sum of ``values`` over the column's
    nonzeros ``start ..`` in that case: on the GPU in a fixed order."""
    if is_numpy(data.xp):
        return np.bincount(
            data.nnz_touched[start : start + values.shape[0]] - first, weights=values, minlength=last - first
        )
    return fixed_sums.segment_sums(data.touched_ptr[first : last + 1] - start, values)


def _total(xp: Any, values: Any) -> float:
    """The sum of a vector as a host float: on the GPU in a fixed order."""
    return float(np.sum(values)) if is_numpy(xp) else fixed_sums.total(values)


def _first_guess(information: float, slope: float, at_estimate: float, threshold: float) -> float:
    """Where ``q(s) = -slope s - information s^2 / 2`` falls to the threshold: the Wald-type half-width
    ``z / sqrt(information)`` where the profile leaves the estimate flat; at most LARGEST_FIRST_GUESS."""
    drop = at_estimate - threshold  # z^2 / 2
    if information > 0:
        guess = 2.0 * drop / (slope + math.sqrt(slope * slope + 2.0 * information * drop))
    else:
        guess = drop / slope if slope > 0 else math.inf
    return min(guess, LARGEST_FIRST_GUESS)


def _kink_slope(prior: Prior, column: int, estimate: float, gradient: float, direction: float) -> float:
    """How fast the profile falls as it leaves a coefficient that a Laplace prior holds at 0, on the
    ``direction`` side: the prior's rate less the log-likelihood's slope that way (at most the rate; none off the
    kink, where the maximum leaves the profile flat)."""
    if prior.kind != "laplace" or not prior.penalised[column] or estimate != 0.0:
        return 0.0
    return max(prior.laplace_rate - direction * gradient, 0.0)


@dataclass
class _Search:
    """One end of one coefficient's interval: its coroutine, the profile it has seen, and its end."""

    column: int
    steps: _Steps
    points: dict[float, float] = field(default_factory=dict)
    evaluations: int = 0
    end: float | None = None
    done: bool = False
    waiting: float = math.nan  # the b whose p(b) the search waits for

    def start(self) -> float:
        return self._ask(next(self.steps))

    def receive(self, value: float) -> float:
        """Take p at the point waited for; the next point to evaluate, or NaN when the search has ended."""
        self.points[self.waiting] = value
        self.evaluations += 1
        try:
            return self._ask(self.steps.send(value))
        except StopIteration as stop:
            self.end, self.done = stop.value, True
            return math.nan

    def _ask(self, b: float) -> float:
        b = float(b)
        while b in self.points:  # a point seen before is not refitted (as the reference's cache)
            b = float(self.steps.send(self.points[b]))
        self.waiting = b
        return b


def _converged_log_posterior(result: ccd.FitResult, column: int, value: float, options: ccd.FitOptions) -> float:
    if not result.converged:
        raise ValueError(
            f"a constrained refit for covariate column {column} at {value:g} did not converge in "
            f"{options.max_iterations} cycles"
        )
    return result.log_posterior


class _HostRefits:
    """A group's constrained refits on the host, member by member: ``ccd.fit`` holding the member's column,
    warm-started from the member's previous solution (the first from the maximum). The maximum's refit runs
    under ``options``, the constrained refits under ``search_options``."""

    def __init__(
        self,
        data: SccsData,
        prior: Prior,
        options: ccd.FitOptions,
        search_options: ccd.FitOptions,
        tick: Callable[[], None],
    ) -> None:
        self.data, self.prior, self.options, self.search_options, self.tick = data, prior, options, search_options, tick
        self.columns = np.zeros(0, dtype=np.int64)
        self.betas = np.zeros((0, data.n_covariates))

    def _on_cycle(self, cycle: int, finished: bool) -> None:
        self.tick()

    def maximum(self, beta0: np.ndarray) -> ccd.FitResult:
        return ccd.fit(self.data, self.prior, self.options, beta0=beta0, on_cycle=self._on_cycle)

    def first(self, columns: np.ndarray, values: np.ndarray, beta_hat: np.ndarray) -> np.ndarray:
        self.columns = columns
        self.betas = np.tile(beta_hat, (columns.size, 1))
        return self.move(values)

    def move(self, values: np.ndarray) -> np.ndarray:
        """p at ``values[m]`` for every member m with a value (NaN: none; its p is NaN)."""
        out = np.full(values.size, math.nan)
        for m in np.flatnonzero(~np.isnan(values)).tolist():
            column, start = int(self.columns[m]), self.betas[m].copy()
            start[column] = values[m]
            result = ccd.fit(
                self.data, self.prior, self.search_options, beta0=start, on_cycle=self._on_cycle, fixed_column=column
            )
            out[m] = _converged_log_posterior(result, column, float(values[m]), self.search_options)
            self.betas[m] = result.beta
        return out


class _DeviceRefits:
    """A group's constrained refits as one batch of the GPU engine (``state_gradient``): the first round set up
    from the maximum with each member's column held, each later round moved and refitted from the state. The
    maximum's refit runs under ``options``, the constrained refits under ``search_options`` (the engine reads its
    ``options`` at every batch)."""

    def __init__(
        self,
        data: SccsData,
        prior: Prior,
        options: ccd.FitOptions,
        search_options: ccd.FitOptions,
        capacity: int,
        tick: Callable[[], None],
    ) -> None:
        from kernels.sccs import gpu

        self.engine = gpu.BatchEngine(data, prior, options, capacity, state_gradient=True)
        self.cp, self.data, self.prior, self.tick = self.engine.cp, data, prior, tick
        self.options, self.search_options = options, search_options
        self.columns = np.zeros(0, dtype=np.int64)

    def _on_cycle(self, finished: int, cycle: int) -> None:
        self.tick()

    def _batch(self, beta0: np.ndarray, fixed: np.ndarray, on_cycle: Any = None) -> list[ccd.FitResult]:
        count = beta0.shape[0]
        return self.engine.fit_batch(
            np.full(count, self.prior.variance),
            self.cp.ones((count, self.data.n_cases)),
            beta0,
            on_cycle,
            fixed_columns=fixed,
        )

    def maximum(self, beta0: np.ndarray) -> ccd.FitResult:
        self.engine.options = self.options
        return self._batch(beta0[None, :], np.full(1, -1), self._on_cycle)[0]

    def first(self, columns: np.ndarray, values: np.ndarray, beta_hat: np.ndarray) -> np.ndarray:
        self.columns = columns
        self.engine.options = self.search_options
        starts = np.tile(beta_hat, (columns.size, 1))
        starts[np.arange(columns.size), columns] = values
        results = self._batch(starts, columns, self._on_cycle)
        return np.asarray(
            [
                _converged_log_posterior(result, int(c), float(v), self.search_options)
                for result, c, v in zip(results, columns, values, strict=True)
            ]
        )

    def move(self, values: np.ndarray) -> np.ndarray:
        results = self.engine.refit_moved(values, self._on_cycle)
        return np.asarray(
            [
                math.nan
                if result is None
                else _converged_log_posterior(result, int(self.columns[m]), float(values[m]), self.search_options)
                for m, result in enumerate(results)
            ]
        )


def _device_capacity(data: SccsData, searches: int) -> int:
    """How many refits of a profile engine fit in the GPU's free memory (at least 1, at most ``searches``)."""
    from kernels.sccs import gpu

    cp = data.xp
    free = cp.cuda.Device().mem_info[0] + cp.get_default_memory_pool().free_bytes()
    return gpu.capacity_for(data, "float64", searches, int(free * GPU_MEMORY_SHARE), state_gradient=True)


def _run_group(refits: _HostRefits | _DeviceRefits, group: list[_Search], beta_hat: np.ndarray) -> None:
    """Advance a group's searches in lockstep until each has its end: a round is one batch of refits, at one
    point per live search."""
    wanted = np.asarray([search.start() for search in group])
    values = refits.first(np.asarray([search.column for search in group], dtype=np.int64), wanted, beta_hat)
    while True:
        wanted = np.asarray(
            [math.nan if search.done else search.receive(float(values[m])) for m, search in enumerate(group)]
        )
        if np.all(np.isnan(wanted)):
            return
        values = refits.move(wanted)


def _refits_for(
    data: SccsData, prior: Prior, options: ccd.FitOptions, capacity: int | None, searches: int, tick: Callable[[], None]
) -> tuple[_HostRefits | _DeviceRefits, int]:
    """The refits of ``data``'s device (the maximum under ``options``, the constrained refits at the search's
    tolerance) and how many searches advance together (see :func:`batched_profile_intervals`)."""
    search_options = dataclasses.replace(options, tolerance=SEARCH_REFIT_TOLERANCE)
    if is_numpy(data.xp):
        return _HostRefits(data, prior, options, search_options, tick), capacity or max(searches, 1)
    capacity = capacity or _device_capacity(data, max(searches, 1))
    return _DeviceRefits(data, prior, options, search_options, capacity, tick), capacity


def _run_searches(
    refits: _HostRefits | _DeviceRefits, capacity: int, searches: list[_Search], beta_hat: np.ndarray
) -> None:
    for first in range(0, len(searches), capacity):
        _run_group(refits, searches[first : first + capacity], beta_hat)


def batched_profile_intervals(
    data: SccsData,
    prior: Prior,
    fit: ccd.FitResult,
    columns: list[int],
    level: float = 0.95,
    options: ccd.FitOptions | None = None,
    progress: ProfileProgress | None = None,
    capacity: int | None = None,
    precondition: bool = True,
) -> list[ProfileInterval]:
    """The intervals of :func:`profile_intervals`, every (coefficient, end) search in lockstep on ``data``'s
    device: NumPy data refit member by member on the host, CuPy data as batches of the GPU engine. At most
    ``capacity`` searches advance together (default: all of them on NumPy, what fits in the GPU's free memory
    there); more run in groups, one after another. ``progress(finished, searches)`` runs after every CCD cycle
    and may raise to abandon the profile.

    ``precondition``: the refits run in the new coordinates of the dense unpenalised columns (the splines;
    :mod:`kernels.sccs.precondition`), which leave the profile unchanged and make each refit a few cycles. A
    profiled column of that block is held in coordinates of the block without it, one pass per such column after
    the others."""
    refit_options = _refit_options(options)
    searches: list[_Search] = []

    def tick() -> None:
        if progress is not None:
            progress(sum(search.done for search in searches), 2 * len(columns))  # (none yet at the maximum)

    beta_fit = np.asarray(to_host(fit.beta), dtype=np.float64)
    block = precondition_.dense_block(data, prior, beta_fit) if precondition else None
    in_block = set() if block is None else set(block.columns.tolist())
    outside = sum(column not in in_block for column in columns)
    refits, group = _refits_for(_in_coordinates(data, block), prior, refit_options, capacity, 2 * outside, tick)
    full = refits.maximum(beta_fit if block is None else block.to_new(beta_fit))
    if not full.converged:
        raise ValueError("the refit at the maximum for the profile intervals did not converge")
    top = full.log_posterior
    beta_hat = full.beta if block is None else block.to_original(full.beta)  # = full.beta outside the block
    threshold = _threshold(top, level)
    information, gradient = _local_model(data, prior, beta_hat, columns)
    for m, column in enumerate(columns):
        estimate = float(beta_hat[column])
        for direction in (-1.0, 1.0):
            slope = _kink_slope(prior, column, estimate, float(gradient[m]), direction)
            first_guess = _first_guess(float(information[m]), slope, top, threshold)
            searches.append(_Search(column, end_steps(estimate, top, threshold, direction, first_guess)))
    _run_searches(refits, group, [search for search in searches if search.column not in in_block], full.beta)
    del refits  # (a GPU engine's buffers go before the next one's)
    for column in sorted({search.column for search in searches if search.column in in_block}):
        assert block is not None
        rest = block.without(column)
        held = [search for search in searches if search.column == column]
        refits, group = _refits_for(_in_coordinates(data, rest), prior, refit_options, capacity, len(held), tick)
        _run_searches(refits, group, held, beta_hat if rest is None else rest.to_new(beta_hat))
        del refits
    intervals = []
    for lower, upper in zip(searches[0::2], searches[1::2], strict=True):
        estimate = float(beta_hat[lower.column])
        points = tuple(sorted({**lower.points, **upper.points, estimate: float(top)}.items()))
        intervals.append(
            ProfileInterval(
                lower.column,
                estimate,
                lower.end,
                upper.end,
                lower.evaluations + upper.evaluations,
                points,
                float(top),
                threshold,
            )
        )
    return intervals


def _in_coordinates(data: SccsData, block: precondition_.DenseBlock | None) -> SccsData:
    return data if block is None else precondition_.apply(data, block)
