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
from kernels.sccs.profile import constrained_data, profile_intervals


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


@pytest.mark.parametrize("prior_kind", ["none", "normal"])
def test_profile_interval_ends_match_a_brute_force_scan(prior_kind: str) -> None:
    data = _data()
    prior = Prior(prior_kind, 0.5, np.array([True, True, False, True]))  # column 2 unpenalised
    fit = ccd.fit(data, prior, ccd.FitOptions(tolerance=1e-10, convergence="gradient"))
    top = model.log_likelihood(data, fit.beta) + model.log_prior(fit.beta, prior)
    threshold = top - 0.5 * stats.chi2.ppf(0.95, 1)
    intervals = profile_intervals(data, prior, fit, [0, 2])
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


def test_the_recorded_profile_points_are_the_profile() -> None:
    # what the profile plot draws: every point the search evaluated is the brute-force profile there, the
    # maximum is at the estimate, and the ends lie between recorded points on both sides of the threshold
    data = _data()
    prior = Prior("normal", 0.5, np.ones(4, dtype=bool))
    fit = ccd.fit(data, prior, ccd.FitOptions(tolerance=1e-10, convergence="gradient"))
    (interval,) = profile_intervals(data, prior, fit, [1])
    b, p = (np.array(values) for values in zip(*interval.points, strict=True))
    assert np.all(np.diff(b) > 0) and b.size == interval.evaluations + 1
    assert p.max() == interval.maximum == p[np.flatnonzero(b == interval.estimate)[0]]
    for value, profile in list(zip(b, p, strict=True))[:: max(1, b.size // 6)]:
        assert profile == pytest.approx(_brute_profile(data, prior, 1, value, fit.beta), abs=1e-6)
    assert interval.threshold == pytest.approx(interval.maximum - 0.5 * stats.chi2.ppf(0.95, 1))
    inside = (b >= interval.lower) & (b <= interval.upper)
    assert np.all(p[inside] >= interval.threshold - 1e-6) and np.all(p[~inside] <= interval.threshold + 1e-6)
    assert np.any(b < interval.lower) and np.any(b > interval.upper)


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
    assert model.log_likelihood(reduced, np.delete(beta, 1)) == pytest.approx(model.log_likelihood(data, beta),
                                                                              rel=1e-12)


def test_a_profile_that_never_falls_gives_an_open_end() -> None:
    # a drug whose exposed eras hold no events: the likelihood keeps rising as b -> -inf (no prior)
    data = _data(seed=11)
    host = data
    start, stop = int(host.col_ptr[3]), int(host.col_ptr[3 + 1])
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
    data = from_coo(
        new_case[host.era_case[rows]], host.era_length[rows], events[rows], position[host.col_rows[nz_keep]],
        col[nz_keep], host.col_values[nz_keep], host.n_covariates)
    prior = Prior("none", 1.0, np.ones(4, dtype=bool))
    fit = ccd.fit(data, prior, ccd.FitOptions(tolerance=1e-8, convergence="gradient", max_iterations=5000))
    (interval,) = profile_intervals(data, prior, fit, [3])
    assert interval.lower is None and interval.upper is not None


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
    runs = [run_kind(get_kind("sccs_fit"), params, local_context(device, datasets=frames, progress=LocalProgress()))
            for device in ("cpu", "gpu")]
    for cpu, gpu in zip(runs[0]["coefficients"], runs[1]["coefficients"], strict=True):
        for end in ("profile_ci_lower", "profile_ci_upper"):
            assert gpu[end] == pytest.approx(cpu[end], abs=1e-5)
