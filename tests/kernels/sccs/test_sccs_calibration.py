"""Empirical calibration (issue 15, item 4) against independent references: the null's maximum likelihood
against a dense grid of the likelihood written as EmpiricalCalibration writes it (``gaussianProduct``) and against
R's own optimiser path (Nelder-Mead over mean and precision from (0, 100)); calibrated p-values against numerical
integration of the null convolved with the estimate's error; the calibrated interval with a constant error
model against its closed form; and, on simulated controls, that calibrated p-values are uniform under the null
and calibrated intervals cover the true effect 95 % of the time where the raw ones do not."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from kernels.sccs import calibration as cal
from tests.kernels.sccs.sccs_helpers import BIAS, BIASED_ONLY, NEGATIVES, POSITIVES, REAL, biased_study_tables


def _gaussian_product(mu1: np.ndarray, mu2: float, sd1: np.ndarray, sd2: float) -> np.ndarray:
    """EmpiricalCalibration's Likelihoods.R: the density of mu1 - mu2 under N(0, sd1^2 + sd2^2)."""
    variance = sd1 ** 2 + sd2 ** 2
    return (2 * np.pi) ** -0.5 * variance ** -0.5 * np.exp(-((mu1 - mu2) ** 2) / (2 * variance))


def _controls(n: int, mean: float, sd: float, seed: int, true_log_rr: float = 0.0):
    generator = np.random.default_rng(seed)
    se = generator.uniform(0.1, 0.5, n)
    return true_log_rr + generator.normal(mean, sd, n) + generator.normal(0, se), se


def test_null_is_the_maximum_of_the_likelihood_on_a_grid_and_beats_r_optimiser() -> None:
    log_rr, se = _controls(40, 0.15, 0.25, seed=1)
    null = cal.fit_null(log_rr, se)

    def log_likelihood(mean: float, sd: float) -> float:
        return float(np.sum(np.log(_gaussian_product(log_rr, mean, se, sd))))

    means, sds = np.linspace(null.mean - 0.05, null.mean + 0.05, 201), np.linspace(null.sd - 0.05,
                                                                                   null.sd + 0.05, 201)
    grid = np.array([[log_likelihood(m, s) for s in sds] for m in means])
    i, j = np.unravel_index(np.argmax(grid), grid.shape)
    assert null.mean == pytest.approx(means[i], abs=5e-4) and null.sd == pytest.approx(sds[j], abs=5e-4)
    assert log_likelihood(null.mean, null.sd) >= grid.max() - 1e-9

    def r_objective(theta: np.ndarray) -> float:  # fitNull: theta = (mean, precision), optim's Nelder-Mead
        if theta[1] <= 0:
            return 99999.0
        return -log_likelihood(theta[0], 1 / math.sqrt(theta[1]))

    r_fit = optimize.minimize(r_objective, np.array([0.0, 100.0]), method="Nelder-Mead")
    assert log_likelihood(null.mean, null.sd) >= -r_fit.fun - 1e-9
    assert null.mean == pytest.approx(r_fit.x[0], abs=2e-3) and null.sd == pytest.approx(1 / math.sqrt(r_fit.x[1]),
                                                                                         abs=2e-3)


def test_null_and_calibrated_p_move_no_more_than_their_inputs() -> None:
    # A GPU and a NumPy fit give estimates apart in their last digits: the null (an interior maximum in sd) and
    # the calibrated p-values must follow at that scale, not at the 1e-8 of a maximum located from likelihood
    # values (the sccs_analyses example's calibrated_p once differed GPU vs NumPy by 8.5e-8 relative).
    rng = np.random.default_rng(11)
    for _ in range(20):
        se = rng.uniform(0.05, 0.4, 25)
        log_rr = 0.2 + rng.normal(0.0, 0.3, 25) + se * rng.normal(size=25)
        null = cal.fit_null(log_rr, se)
        assert null.sd > 0.0
        moved = cal.fit_null(log_rr * (1 + 1e-12 * rng.normal(size=25)), se * (1 + 1e-12 * rng.normal(size=25)))
        assert moved.sd == pytest.approx(null.sd, rel=1e-9) and moved.mean == pytest.approx(null.mean, rel=1e-9)
        targets = np.linspace(-1.0, 1.5, 11)
        np.testing.assert_allclose(cal.calibrate_p(moved, targets, np.full(11, 0.2)),
                                   cal.calibrate_p(null, targets, np.full(11, 0.2)), rtol=1e-9)


def test_null_recovers_simulated_systematic_error_and_finds_a_zero_sd() -> None:
    log_rr, se = _controls(2000, 0.2, 0.3, seed=2)
    null = cal.fit_null(log_rr, se)
    assert null.mean == pytest.approx(0.2, abs=0.03) and null.sd == pytest.approx(0.3, abs=0.03)
    assert null.n_controls == 2000
    exact = cal.fit_null(np.full(5, 0.1), np.full(5, 0.2))  # no spread beyond the random error: sd = 0
    assert exact.sd == 0.0 and exact.mean == pytest.approx(0.1, abs=1e-12)
    dropped = cal.fit_null(np.array([0.1, 0.3, np.inf, 0.2]), np.array([0.2, 0.1, 0.3, np.nan]))
    assert dropped.n_controls == 2
    with pytest.raises(ValueError, match="at least 2 negative controls"):
        cal.fit_null(np.array([0.1, np.nan]), np.array([0.2, 0.2]))


def test_calibrated_p_is_the_null_convolved_with_the_random_error() -> None:
    null = cal.NullDistribution(0.12, 0.21, 30)
    for x, s in ((0.9, 0.3), (-0.4, 0.15), (0.12, 0.5)):
        # P(null estimate >= x): systematic error t ~ N(mu, sigma^2), then the estimate t + e, e ~ N(0, s^2)
        upper, _ = integrate.quad(lambda t, x=x, s=s: stats.norm.pdf(t, 0.12, 0.21) * stats.norm.sf(x, t, s),
                                  -np.inf, np.inf, epsabs=1e-13)
        assert cal.calibrate_p(null, np.array([x]), np.array([s]), two_sided=False)[0] == pytest.approx(upper,
                                                                                                        rel=1e-8)
        assert cal.calibrate_p(null, np.array([x]), np.array([s]))[0] == pytest.approx(2 * min(upper, 1 - upper),
                                                                                      rel=1e-8)
        lower = cal.calibrate_p(null, np.array([x]), np.array([s]), two_sided=False, upper=False)[0]
        assert lower == pytest.approx(1 - upper, rel=1e-8)
    assert np.isnan(cal.calibrate_p(null, np.array([np.inf]), np.array([0.2]))[0])


def test_calibrated_p_is_uniform_under_the_null_where_the_raw_one_is_not() -> None:
    null = cal.fit_null(*_controls(200, 0.25, 0.2, seed=3))
    log_rr, se = _controls(4000, 0.25, 0.2, seed=4)  # new negative controls from the same systematic error
    calibrated = cal.calibrate_p(null, log_rr, se)
    raw = 2 * stats.norm.sf(np.abs(log_rr / se))
    assert np.mean(calibrated < 0.05) == pytest.approx(0.05, abs=0.015)
    assert np.mean(raw < 0.05) > 0.2  # 24 %: the systematic error inflates the raw type I error fivefold


def test_calibrated_interval_of_a_constant_error_model_is_its_closed_form() -> None:
    null = cal.NullDistribution(0.1, 0.2, 10)
    model = cal.null_error_model(null)
    (interval,) = cal.calibrate_confidence_interval(np.array([0.8]), np.array([0.3]), model)
    half = stats.norm.ppf(0.975) * math.sqrt(0.2 ** 2 + 0.3 ** 2)
    assert interval.log_rr == pytest.approx(0.7, abs=1e-10)
    assert interval.lower == pytest.approx(0.7 - half, abs=1e-10) and interval.upper == pytest.approx(0.7 + half,
                                                                                                      abs=1e-10)
    assert interval.se == pytest.approx(math.sqrt(0.13), abs=1e-10)
    (zero_sd,) = cal.calibrate_confidence_interval(np.array([0.8]), np.array([0.3]),
                                                   cal.null_error_model(cal.NullDistribution(0.1, 0.0, 10)))
    assert zero_sd.lower == pytest.approx(0.7 - stats.norm.ppf(0.975) * 0.3, abs=1e-10)


def test_systematic_error_model_recovers_its_parameters_and_calibrated_intervals_cover() -> None:
    """Controls at true effects 1, 2 and 4 with error mean 0.1 + 0.9 theta and sd exp(-1.6 + 0.3 theta)."""
    true_effects = np.log([1.0, 2.0, 4.0])

    def simulate(n_each: int, seed: int):
        generator = np.random.default_rng(seed)
        theta = np.repeat(true_effects, n_each)
        se = generator.uniform(0.1, 0.4, theta.size)
        systematic = generator.normal(0.1 + 0.9 * theta, np.exp(-1.6 + 0.3 * theta))
        return systematic + generator.normal(0, se), se, theta

    log_rr, se, theta = simulate(400, seed=5)
    model = cal.fit_systematic_error_model(log_rr, se, theta)
    assert model.mean_intercept == pytest.approx(0.1, abs=0.03) and model.mean_slope == pytest.approx(0.9, abs=0.05)
    assert model.sd_intercept == pytest.approx(-1.6, abs=0.2) and model.sd_slope == pytest.approx(0.3, abs=0.3)
    r_start = optimize.minimize(
        lambda t: -cal.error_model_log_likelihood(cal.ErrorModel(*t), log_rr, se, theta),
        np.array([0.0, 1.0, 0.5, 0.0]), method="Nelder-Mead")  # R's optim from its start
    assert cal.error_model_log_likelihood(model, log_rr, se, theta) >= -r_start.fun - 1e-9

    new_log_rr, new_se, new_theta = simulate(700, seed=6)
    intervals = cal.calibrate_confidence_interval(new_log_rr, new_se, model)
    lower, upper = np.array([i.lower for i in intervals]), np.array([i.upper for i in intervals])
    assert np.mean((lower <= new_theta) & (new_theta <= upper)) == pytest.approx(0.95, abs=0.02)
    z = stats.norm.ppf(0.975)
    raw = (new_log_rr - z * new_se <= new_theta) & (new_theta <= new_log_rr + z * new_se)
    assert np.mean(raw) < 0.8
    for interval, x, s in list(zip(intervals, new_log_rr, new_se, strict=True))[:20]:  # the defining equations
        for end, sign in ((interval.lower, 1), (interval.upper, -1)):
            spread = math.sqrt(model.sd(end) ** 2 + s * s)
            assert model.mean(end) == pytest.approx(x - sign * z * spread, abs=1e-9)
    with pytest.raises(ValueError, match="two different true effects"):
        cal.fit_systematic_error_model(log_rr[:5], se[:5], np.zeros(5))


# -- calibration in a fit ----------------------------------------------------------------------------------

def _fit(frames: dict, calibration: dict, profiled: list[int] | None = None) -> dict:
    from kernels.context import local_context, run_kind
    from kernels.registry import get_kind

    params = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c", "prior": {"type": "none"},
              "profile": {"covariates": profiled} if profiled else {}, "diagnostics": None, "calibration": calibration}
    return run_kind(get_kind("sccs_fit"), params, local_context(device="cpu", datasets=frames))


Z95 = stats.norm.ppf(0.975)


def _interval_se(c: dict, prefix: str) -> float:
    return (c[f"{prefix}_ci_upper"] - c[f"{prefix}_ci_lower"]) / (2 * Z95)


@pytest.mark.slow
def test_calibration_in_a_fit_removes_the_systematic_error_of_the_negative_controls() -> None:
    result = _fit(biased_study_tables(), {"negative_controls": NEGATIVES})
    summary = result["calibration"]
    assert summary["negative_controls"] == 10 and summary["positive_controls"] == 0 and summary["level"] == 0.95
    assert summary["null_mean"] == pytest.approx(BIAS, abs=0.1) and summary["null_sd"] < 0.15
    by_id = {c["covariate_id"]: c for c in result["coefficients"]}
    biased, real = by_id[BIASED_ONLY], by_id[REAL]
    raw_p = 2 * stats.norm.sf(abs(biased["estimate"]) / _interval_se(biased, "profile"))
    assert raw_p < 1e-3 and biased["calibrated_p"] > 0.01  # significant only through the systematic error
    assert abs(biased["calibrated_estimate"]) < 3 * _interval_se(biased, "calibrated")
    # the real effect stays: within three calibrated standard errors of log 3, far from 0
    assert real["calibrated_p"] < 1e-6
    assert abs(real["calibrated_estimate"] - math.log(3)) < 3 * _interval_se(real, "calibrated")
    assert real["relative_incidence_calibrated_ci_lower"] == pytest.approx(math.exp(real["calibrated_ci_lower"]))
    # the job's null is fitNull of the controls' profile estimates and interval-implied standard errors (the
    # job takes the profile's refitted maximum, the coefficient the fit's estimate at its tolerance: 1e-3)
    negatives = [by_id[c] for c in NEGATIVES]
    null = cal.fit_null(np.array([c["estimate"] for c in negatives]),
                        np.array([_interval_se(c, "profile") for c in negatives]))
    assert summary["null_mean"] == pytest.approx(null.mean, abs=1e-3)
    assert summary["null_sd"] == pytest.approx(null.sd, abs=1e-3)
    for c in by_id.values():  # calibrated p of the null-only model: the estimate's distance from the null mean
        spread = math.sqrt(summary["null_sd"] ** 2 + _interval_se(c, "profile") ** 2)
        assert c["calibrated_p"] == pytest.approx(2 * stats.norm.sf(abs(c["estimate"] - null.mean) / spread),
                                                  rel=0.05, abs=1e-12)


def test_calibration_with_positive_controls_fits_the_systematic_error_model() -> None:
    controls = NEGATIVES + POSITIVES
    result = _fit(biased_study_tables(n_cases=1500, seed=22),
                  {"negative_controls": NEGATIVES,
                   "positive_controls": [{"covariate_id": c, "true_relative_risk": 2.0} for c in POSITIVES]},
                  profiled=[*controls, REAL])
    summary = result["calibration"]
    assert summary["negative_controls"] == 10 and summary["positive_controls"] == 3
    by_id = {c["covariate_id"]: c for c in result["coefficients"]}
    model = cal.fit_systematic_error_model(np.array([by_id[c]["estimate"] for c in controls]),
                                           np.array([_interval_se(by_id[c], "profile") for c in controls]),
                                           np.array([0.0] * 10 + [math.log(2)] * 3))
    assert summary["error_model"][:2] == pytest.approx([model.mean_intercept, model.mean_slope], abs=5e-3)
    assert summary["error_model"][1] == pytest.approx(1.0, abs=0.35)  # the error's mean follows the true effect
    assert by_id[REAL]["calibrated_p"] < 1e-6 and by_id[BIASED_ONLY]["calibrated_p"] is None  # not profiled


def test_calibration_spec_needs_profiled_distinct_controls() -> None:
    from pydantic import ValidationError

    from kernels.sccs.spec import SccsParams

    base = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c"}
    with pytest.raises(ValidationError, match="calibration needs profile"):
        SccsParams.model_validate({**base, "calibration": {"negative_controls": [1, 2]}})
    with pytest.raises(ValidationError, match=r"control covariateId 2 is not in profile\.covariates"):
        SccsParams.model_validate({**base, "profile": {"covariates": [1, 3]},
                                   "calibration": {"negative_controls": [1, 2]}})
    with pytest.raises(ValidationError, match="both a negative and a positive control"):
        SccsParams.model_validate({**base, "profile": {}, "calibration": {
            "negative_controls": [1, 2], "positive_controls": [{"covariate_id": 2, "true_relative_risk": 2.0}]}})
    with pytest.raises(ValidationError, match="at least 2"):
        SccsParams.model_validate({**base, "profile": {}, "calibration": {"negative_controls": [1]}})


def test_an_unknown_control_names_the_field() -> None:
    from kernels.context import local_context, run_kind
    from kernels.registry import get_kind
    from kernels.sccs.examples import cyclops_frames

    params = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c", "profile": {"covariates": [1, 2, 99]},
              "calibration": {"negative_controls": [1, 99]}}
    frames = cyclops_frames(n_cases=200, n_drugs=3, seed=2)
    with pytest.raises(ValueError, match="covariateId 99 is not a covariate of the fit"):
        run_kind(get_kind("sccs_fit"), params, local_context(device="cpu", datasets=frames))
