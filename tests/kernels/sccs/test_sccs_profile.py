"""Profile-likelihood intervals (issue 15, item 2) against an independent brute force: the profile of the log
posterior computed by maximising over the other coefficients with SciPy's L-BFGS on the full model (beta_j
pinned, no offset trick, no CCD), scanned on a grid and interpolated at the chi-square threshold."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from kernels.sccs import ccd, model, synthetic
from kernels.sccs.data import from_coo
from kernels.sccs.model import Prior
from kernels.sccs.profile import (
    ROOT_TOLERANCE,
    _first_guess,
    _local_model,
    batched_profile_intervals,
    constrained_data,
    crossing_steps,
    profile_intervals,
)


def _data(seed: int = 3):
    return synthetic.generate(np, 400, 4, seed=seed, effect_share=1.0, effect_sd=0.6, min_eras=3, max_eras=8).data


def _brute_profile(data, prior: Prior, column: int, value: float, start: np.ndarray) -> float:
    free = np.delete(np.arange(data.n_covariates), column)

    def negative(other: np.ndarray) -> tuple[float, np.ndarray]:
        beta = start.copy()
        beta[free], beta[column] = other, value
        ll, grad = model.log_likelihood_and_gradient(data, beta)
        penalty = model.log_prior(beta, prior)
        prior_grad = np.where(prior.penalised, -beta / prior.variance, 0.0) if prior.kind == "normal" else 0.0
        return -(ll + penalty), -(np.asarray(grad) + prior_grad)[free]

    found = optimize.minimize(negative, start[free], jac=True, method="L-BFGS-B", options={"gtol": 1e-10})
    assert found.success
    return -float(found.fun)


@pytest.mark.parametrize("intervals_of", [profile_intervals, batched_profile_intervals], ids=["host", "batched"])
@pytest.mark.parametrize("prior_kind", ["none", "normal"])
def test_profile_interval_ends_match_a_brute_force_scan(prior_kind: str, intervals_of) -> None:
    data = _data()
    prior = Prior(prior_kind, 0.5, np.array([True, True, False, True]))  # column 2 unpenalised
    fit = ccd.fit(data, prior, ccd.FitOptions(tolerance=1e-10, convergence="gradient"))
    top = model.log_likelihood(data, fit.beta) + model.log_prior(fit.beta, prior)
    threshold = top - 0.5 * stats.chi2.ppf(0.95, 1)
    intervals = intervals_of(data, prior, fit, [0, 2])
    for interval in intervals:
        j = interval.covariate
        assert interval.lower is not None and interval.upper is not None
        assert interval.lower < fit.beta[j] < interval.upper
        for end in (interval.lower, interval.upper):
            # the independent profile is at the threshold at each end (to the root's tolerance)
            assert _brute_profile(data, prior, j, end, fit.beta) == pytest.approx(threshold, abs=2e-5)
        # and above it inside, below it outside
        assert _brute_profile(data, prior, j, 0.5 * (interval.lower + fit.beta[j]), fit.beta) > threshold
        assert _brute_profile(data, prior, j, interval.upper + 0.05, fit.beta) < threshold
        # without a prior the interval is close to Wald's (log-likelihood nearly quadratic at N = 400)
        if prior_kind == "none":
            info = _observed_information(data, fit.beta)
            half = stats.norm.ppf(0.975) * math.sqrt(np.linalg.inv(info)[j, j])
            assert interval.upper - interval.lower == pytest.approx(2 * half, rel=0.1)


@pytest.mark.parametrize("intervals_of", [profile_intervals, batched_profile_intervals], ids=["host", "batched"])
def test_the_recorded_profile_points_are_the_profile(intervals_of) -> None:
    # what the profile plot draws: every point the search evaluated is the brute-force profile there, the
    # maximum is at the estimate, and the ends lie among recorded points on both sides of the threshold
    data = _data()
    prior = Prior("normal", 0.5, np.ones(4, dtype=bool))
    fit = ccd.fit(data, prior, ccd.FitOptions(tolerance=1e-10, convergence="gradient"))
    (interval,) = intervals_of(data, prior, fit, [1])
    b, p = (np.array(values) for values in zip(*interval.points, strict=True))
    assert np.all(np.diff(b) > 0) and b.size == interval.evaluations + 1
    assert p.max() == interval.maximum == p[np.flatnonzero(b == interval.estimate)[0]]
    for value, profile in list(zip(b, p, strict=True))[:: max(1, b.size // 6)]:
        assert profile == pytest.approx(_brute_profile(data, prior, 1, value, fit.beta), abs=1e-6)
    assert interval.threshold == pytest.approx(interval.maximum - 0.5 * stats.chi2.ppf(0.95, 1))
    inside = (b >= interval.lower) & (b <= interval.upper)
    assert np.all(p[inside] >= interval.threshold - 1e-6) and np.all(p[~inside] <= interval.threshold + 1e-6)
    if intervals_of is profile_intervals:  # brentq's bracket: evaluated points on both sides of each end
        assert np.any(b < interval.lower) and np.any(b > interval.upper)
    else:  # the batched search's bracket is closed by the profile's concavity, near a point it evaluated
        assert np.min(np.abs(b - interval.lower)) < 1e-4 and np.min(np.abs(b - interval.upper)) < 1e-4


def _observed_information(data, beta: np.ndarray) -> np.ndarray:
    step, n = 1e-5, beta.size
    info = np.empty((n, n))
    for k in range(n):
        up, down = beta.copy(), beta.copy()
        up[k] += step
        down[k] -= step
        info[:, k] = -(np.asarray(model.gradient(data, up)) - np.asarray(model.gradient(data, down))) / (2 * step)
    return 0.5 * (info + info.T)


def test_the_offset_trick_is_the_pinned_likelihood() -> None:
    # a constrained refit's data give the full model's likelihood with beta_j pinned, for any other coefficients
    data = _data(seed=5)
    rng = np.random.default_rng(7)
    beta = rng.normal(0, 0.4, data.n_covariates)
    reduced = constrained_data(data, 1, beta[1])
    assert reduced.n_covariates == data.n_covariates - 1
    assert reduced.covariate_ids.tolist() == np.delete(data.covariate_ids, 1).tolist()
    assert model.log_likelihood(reduced, np.delete(beta, 1)) == pytest.approx(
        model.log_likelihood(data, beta), rel=1e-12
    )


def data_with_a_drug_without_events(column: int = 3):
    """``_data(seed=11)`` with no event in the exposed eras of ``column`` (cases left without events dropped)."""
    host = _data(seed=11)
    start, stop = int(host.col_ptr[column]), int(host.col_ptr[column + 1])
    events = host.era_events.copy()
    events[host.col_rows[start:stop]] = 0.0
    case_has_events = np.bincount(host.era_case, weights=events, minlength=host.n_cases) > 0
    keep = case_has_events[host.era_case]
    new_case = np.cumsum(case_has_events) - 1
    rows = np.flatnonzero(keep)
    position = -np.ones(host.n_eras, dtype=np.int64)
    position[rows] = np.arange(rows.size)
    col = np.repeat(np.arange(host.n_covariates), np.diff(host.col_ptr))
    nz_keep = keep[host.col_rows]
    return from_coo(
        new_case[host.era_case[rows]],
        host.era_length[rows],
        events[rows],
        position[host.col_rows[nz_keep]],
        col[nz_keep],
        host.col_values[nz_keep],
        host.n_covariates,
    )


def test_a_profile_that_never_falls_gives_an_open_end() -> None:
    # a drug whose exposed eras hold no events: the likelihood keeps rising as b -> -inf (no prior); the
    # batched search leaves the same end open and finds the same upper end
    data = data_with_a_drug_without_events()
    prior = Prior("none", 1.0, np.ones(4, dtype=bool))
    fit = ccd.fit(data, prior, ccd.FitOptions(tolerance=1e-8, convergence="gradient", max_iterations=5000))
    (interval,) = profile_intervals(data, prior, fit, [3])
    assert interval.lower is None and interval.upper is not None
    (batched,) = batched_profile_intervals(data, prior, fit, [3])
    assert batched.lower is None and batched.upper == pytest.approx(interval.upper, abs=ROOT_TOLERANCE)


def _run_crossing(u, target: float, reach: float, first_guess: float) -> tuple[float | None, list[float]]:
    steps = crossing_steps(target, reach, first_guess)
    asked: list[float] = []
    try:
        s = next(steps)
        while True:
            asked.append(s)
            s = steps.send(u(s))
    except StopIteration as stop:
        return stop.value, asked


def _scanned_crossing(u, target: float, reach: float) -> float | None:
    """Brute force: the first cell of a 200,000-cell grid on [0, reach] where u passes the target, bisected to
    1e-13 (None: u stays at or below the target up to reach)."""
    grid = np.linspace(0.0, reach, 200_001)
    above = np.flatnonzero(np.array([u(s) for s in grid]) > target)
    if above.size == 0:
        return None
    low, high = grid[above[0] - 1], grid[above[0]]
    while high - low > 1e-13:
        middle = 0.5 * (low + high)
        low, high = (low, middle) if u(middle) > target else (middle, high)
    return 0.5 * (low + high)


Z = math.sqrt(stats.chi2.ppf(0.95, 1))


def _deviance_of(q):
    """u = sqrt(2 (p(b_hat) - p)) of a profile given as q(s) = p(b_hat +- s) - p(b_hat) (concave, q(0) = 0)."""
    return lambda s: math.sqrt(max(0.0, -2.0 * q(s)))


# The signed root deviance u(s) = sqrt(2 (p(b_hat) - p(b_hat +- s))) of concave profiles of various shapes, the
# slope of u's linear part at the estimate (whose Wald-type guess Z / slope the search starts from), and the most
# refits the search may take from a guess that is right, short or long.
SHAPES = {
    "quadratic": (lambda s: 1.3 * s, 1.3, 2),
    "mildly-skewed": (lambda s: 2.0 * s + 0.2 * s * s, 2.0, 4),
    "skewed": (lambda s: 2.0 * s + 0.8 * s * s, 2.0, 6),  # falls ever faster than a quadratic profile
    # an exposure with few events, y b - E (e^b - 1) about its maximum: slower than quadratic below, faster above
    "few-events-lower": (_deviance_of(lambda s: -2.25 * (math.exp(-s) - 1.0 + s)), 1.5, 5),
    "few-events-upper": (_deviance_of(lambda s: -2.25 * (math.exp(s) - 1.0 - s)), 1.5, 6),
    "kink": (_deviance_of(lambda s: -(0.9 * s + 0.5 * s * s)), 1.0, 5),  # a Laplace prior's kink at b_hat = 0
    "flat-then-linear": (_deviance_of(lambda s: -2.0 * max(0.0, s - 2.0)), 0.5, 4),
    "flat-then-steep": (lambda s: 0.01 * s if s < 5 else 0.05 + 10.0 * (s - 5), 0.01, 10),
    # crossing beyond the search's limit: an open end
    "flat-then-linear-open": (_deviance_of(lambda s: -0.1 * max(0.0, s - 10.0)), 0.5, 3),
    "beyond-reach": (lambda s: 0.05 * s, 0.05, 2),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("guess_error", [1.0, 0.3, 3.0], ids=["right-guess", "short-guess", "long-guess"])
def test_the_crossing_search_finds_a_brute_force_scans_crossing(shape: str, guess_error: float) -> None:
    # the batched profile's search: the crossing that a brute-force scan finds, to the root's tolerance, in a few
    # evaluations; none (an open end) where the scan finds none up to the search's limit, which it evaluated
    u, slope, most = SHAPES[shape]
    reach = 20.0
    expected = _scanned_crossing(u, Z, reach)
    found, asked = _run_crossing(u, Z, reach, min(guess_error * Z / slope, reach))
    assert len(asked) <= most
    if expected is None:
        assert found is None and asked[-1] == reach
    else:
        assert found is not None and found == pytest.approx(expected, abs=ROOT_TOLERANCE)


def test_the_local_model_is_the_hessians_diagonal_and_the_gradient() -> None:
    # the searches' first guesses come from the diagonal of the negative log posterior's Hessian (a finite
    # difference of the model's gradient; normal prior: plus 1 / variance on a penalised coefficient) and the
    # log-likelihood's gradient
    data = _data(seed=9)
    beta = np.array([0.3, -0.2, 0.5, 0.1])
    prior = Prior("normal", 0.5, np.array([True, False, True, True]))
    expected = np.diag(_observed_information(data, beta)) + np.where(prior.penalised, 1 / 0.5, 0.0)
    information, gradient = _local_model(data, prior, beta, [0, 1, 3])
    assert information == pytest.approx(expected[[0, 1, 3]], rel=1e-6)
    assert gradient == pytest.approx(np.asarray(model.gradient(data, beta))[[0, 1, 3]], rel=1e-12, abs=1e-9)
    information, _ = _local_model(data, Prior("laplace", 0.5, prior.penalised), beta, [2])
    assert information == pytest.approx(expected[[2]] - 1 / 0.5, rel=1e-6)


@pytest.mark.parametrize(("information", "slope"), [(40.0, 0.0), (40.0, 3.0), (0.0, 3.0), (1e-3, 0.0)])
def test_the_first_guess_is_where_the_local_model_falls_to_the_threshold(information: float, slope: float) -> None:
    # q(s) = -slope s - information s^2 / 2 (the fall at a Laplace prior's kink, and the curvature): the guess is
    # where q falls by z^2 / 2, within the largest first step
    top, threshold = -100.0, -100.0 - 0.5 * Z * Z
    guess = _first_guess(information, slope, top, threshold)
    if information * 4.0**2 / 2 + slope * 4.0 < 0.5 * Z * Z:  # the model does not fall that far within 4
        assert guess == 4.0
    else:
        assert -slope * guess - information * guess * guess / 2 == pytest.approx(threshold - top, rel=1e-12)
    if slope == 0.0 and information > 0:
        assert guess == pytest.approx(min(Z / math.sqrt(information), 4.0))


def test_batched_profile_at_a_laplace_kink_equals_the_host_path() -> None:
    # a strong Laplace prior holds most coefficients at 0 (the profile has a kink at b_hat: it falls on either
    # side at the prior's rate less the likelihood's slope): the searches start from the local model with that
    # slope and end at the host path's ends, the concave profile's certificates holding across the kink
    data = synthetic.generate(np, 1500, 12, seed=8, effect_share=0.3, effect_sd=0.3, min_eras=3, max_eras=8).data
    prior = Prior("laplace", 0.01, np.ones(12, dtype=bool))
    fit = ccd.fit(data, prior, ccd.FitOptions(tolerance=1e-10, convergence="gradient"))
    columns = [0, 1, 4, 7]
    assert np.count_nonzero(fit.beta[columns] == 0.0) == 2  # columns 1 and 7 at the kink, 0 and 4 off it
    host = profile_intervals(data, prior, fit, columns)
    batched = batched_profile_intervals(data, prior, fit, columns)
    for reference, interval in zip(host, batched, strict=True):
        for end in ("lower", "upper"):
            assert getattr(interval, end) == pytest.approx(getattr(reference, end), abs=ROOT_TOLERANCE)
        assert interval.evaluations <= min(8, reference.evaluations - 6)


@pytest.mark.parametrize("prior_kind", ["none", "normal", "laplace"])
def test_batched_profile_equals_the_host_path(prior_kind: str) -> None:
    # every end of the lockstep search equals the host path's to the root's tolerance (both bracket the one
    # crossing of the concave profile on each side to that tolerance, each by its own points)
    data = synthetic.generate(np, 1500, 12, seed=8, effect_share=1.0, effect_sd=0.6, min_eras=3, max_eras=8).data
    penalised = np.ones(12, dtype=bool)
    penalised[4] = False
    prior = Prior(prior_kind, 0.3, penalised)
    fit = ccd.fit(data, prior)  # the job's fit, at its own (paper's) tolerance: both paths refit the maximum
    columns = [0, 4, 7, 11]
    host = profile_intervals(data, prior, fit, columns)
    batched = batched_profile_intervals(data, prior, fit, columns)
    for reference, interval in zip(host, batched, strict=True):
        assert interval.covariate == reference.covariate
        assert interval.estimate == pytest.approx(reference.estimate, abs=1e-9)
        assert interval.maximum == pytest.approx(reference.maximum, abs=1e-9)
        assert interval.threshold == pytest.approx(reference.threshold, abs=1e-9)
        for end in ("lower", "upper"):
            assert getattr(interval, end) == pytest.approx(getattr(reference, end), abs=ROOT_TOLERANCE)
        # the batched search spends fewer refits: 3 an end here, where stepping out and Brent take 6-8
        assert interval.evaluations <= min(6, reference.evaluations - 6)
        assert len(interval.points) == interval.evaluations + 1


def test_searches_in_groups_give_the_same_intervals_and_report_progress() -> None:
    # a capacity below the number of searches runs them in groups, one group after another: each search is the
    # same sequence of refits, so the intervals are identical; progress counts finished searches up to all
    data = _data(seed=4)
    prior = Prior("normal", 0.5, np.ones(4, dtype=bool))
    fit = ccd.fit(data, prior)
    reports: list[tuple[int, int]] = []
    together = batched_profile_intervals(data, prior, fit, [0, 1, 2, 3])
    grouped = batched_profile_intervals(
        data, prior, fit, [0, 1, 2, 3], capacity=3, progress=lambda done, total: reports.append((done, total))
    )
    assert grouped == together
    assert {total for _, total in reports} == {8}
    finished = [done for done, _ in reports]
    assert finished == sorted(finished) and finished[0] == 0 and finished[-1] >= 6  # the last group's end

    class Stop(Exception):
        pass

    def cancel(done: int, total: int) -> None:
        raise Stop

    with pytest.raises(Stop):
        batched_profile_intervals(data, prior, fit, [0], progress=cancel)


def test_a_held_coefficient_is_the_offset_trick() -> None:
    # ccd.fit holding column j at b (what a batched refit does) = the fit of the constrained data (column j
    # moved into the era lengths), with log p(b) added to the log posterior; its KKT residual leaves j out
    data = _data(seed=6)
    prior = Prior("normal", 0.5, np.ones(4, dtype=bool))
    options = ccd.FitOptions(tolerance=1e-10, convergence="gradient")
    start = np.array([0.1, -0.2, 0.3, 0.05])
    held = ccd.fit(data, prior, options, beta0=start, fixed_column=2)
    reduced = ccd.fit(
        constrained_data(data, 2, 0.3), Prior("normal", 0.5, np.ones(3, dtype=bool)), options, beta0=np.delete(start, 2)
    )
    assert held.beta[2] == 0.3
    assert np.max(np.abs(np.delete(held.beta, 2) - reduced.beta)) < 1e-9
    prior_term = -0.5 * 0.3**2 / 0.5 - 0.5 * math.log(2 * math.pi * 0.5)
    assert held.log_posterior == pytest.approx(reduced.log_posterior + prior_term, abs=1e-9)
    assert held.converged and held.gradient_norm <= 1e-10
    free = ccd.fit(data, prior, options)
    assert abs(free.beta[2] - 0.3) > 1e-3  # held away from its optimum: the full gradient at j is not zero
    assert abs(float(model.gradient(data, held.beta)[2]) - 0.3 / 0.5) > 1e-3
    with pytest.raises(ValueError, match="fixed_column"):
        ccd.fit(data, prior, options, fixed_column=4)


def test_the_fit_job_reports_profile_intervals_on_both_scales() -> None:
    from kernels.progress import LocalProgress
    from tests.kernels.sccs.test_sccs_jobs import _frames, _params, run_fit

    frames = _frames()
    params = _params(prior={"type": "normal", "variance": 1.0}, profile={"covariates": [2, 5]})
    progress = LocalProgress()
    result = run_fit(params, frames, progress)
    assert "profile" in result["timings"]
    curves = progress.artifacts["profile_curves"]
    assert sorted(set(curves["covariateId"])) == [2, 5]
    assert curves["deviance"].min() == pytest.approx(0.0, abs=1e-9)
    assert curves["criticalDeviance"].iloc[0] == pytest.approx(stats.chi2.ppf(0.95, 1))
    for c in result["coefficients"]:
        if c["covariate_id"] in (2, 5):
            assert c["profile_ci_lower"] < c["estimate"] < c["profile_ci_upper"]
            assert c["relative_incidence_profile_ci_lower"] == pytest.approx(math.exp(c["profile_ci_lower"]))
            assert c["relative_incidence_profile_ci_upper"] == pytest.approx(math.exp(c["profile_ci_upper"]))
        else:
            assert c["profile_ci_lower"] is None and c["profile_ci_upper"] is None
    with pytest.raises(ValueError, match=r"profile\.covariates: covariateId 99 is not a covariate of the fit"):
        run_fit(_params(profile={"covariates": [99]}), frames, LocalProgress())


@pytest.mark.gpu
def test_profile_intervals_of_a_gpu_fit_equal_numpys() -> None:
    # the profile runs on the host from the fit's estimate (refitted to 1e-8 first): a GPU job reports the
    # NumPy job's intervals to the root's tolerance
    from kernels.backend import get_namespace
    from kernels.context import local_context, run_kind
    from kernels.progress import LocalProgress
    from kernels.registry import get_kind

    try:
        get_namespace("gpu")
    except Exception:
        pytest.skip("no CUDA device usable through CuPy")
    from tests.kernels.sccs.test_sccs_jobs import _frames, _params

    frames, params = _frames(), _params(prior={"type": "normal", "variance": 1.0}, profile={})
    runs = [
        run_kind(get_kind("sccs_fit"), params, local_context(device, datasets=frames, progress=LocalProgress()))
        for device in ("cpu", "gpu")
    ]
    for cpu, gpu in zip(runs[0]["coefficients"], runs[1]["coefficients"], strict=True):
        for end in ("profile_ci_lower", "profile_ci_upper"):
            assert gpu[end] == pytest.approx(cpu[end], abs=1e-5)
