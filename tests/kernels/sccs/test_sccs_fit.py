"""The NumPy CCD MAP fit against independent references: closed form, statsmodels, scipy.optimize, KKT."""

from __future__ import annotations

import math

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats
from scipy.special import gammaln

from kernels.sccs import ccd, model, synthetic
from kernels.sccs.ccd import FitOptions, coordinate_step
from kernels.sccs.data import from_coo
from kernels.sccs.model import Prior
from tests.kernels.sccs.sccs_helpers import build, negative_log_posterior, scipy_map, small_problem

TIGHT = FitOptions(tolerance=1e-10, convergence="gradient", max_iterations=5000)


def _prior(kind: str, variance: float, n: int, excluded: tuple[int, ...] = ()) -> Prior:
    penalised = np.ones(n, dtype=bool)
    penalised[list(excluded)] = False
    return Prior(kind, variance, penalised)


def test_single_binary_covariate_matches_the_closed_form() -> None:
    # Every case has an unexposed era of L0 days and an exposed one of L1 days: the conditional MLE of the
    # relative incidence is the rate ratio (Y1 / L1) / (Y0 / L0).
    generator = np.random.default_rng(4)
    n_cases, length0, length1 = 200, 300.0, 45.0
    events = generator.poisson([1.0, 0.4], size=(n_cases, 2)).astype(float)
    events[events.sum(axis=1) == 0, 0] = 1.0
    era_case = np.repeat(np.arange(n_cases), 2)
    data = from_coo(era_case, np.tile([length0, length1], n_cases), events.ravel(),
                    nz_era=2 * np.arange(n_cases) + 1, nz_col=np.zeros(n_cases, dtype=np.int64),
                    nz_value=np.ones(n_cases), n_covariates=1)
    expected = math.log((events[:, 1].sum() / length1) / (events[:, 0].sum() / length0))
    fit = ccd.fit(data, _prior("none", 1.0, 1), TIGHT)
    assert fit.converged
    assert abs(fit.beta[0] - expected) < 1e-9


def test_no_prior_equals_statsmodels_poisson_with_case_fixed_effects() -> None:
    data = small_problem(seed=21, n_cases=80, n_drugs=4, effect_share=1.0)
    fit = ccd.fit(data, _prior("none", 1.0, 4), TIGHT)
    dense = np.zeros((data.n_eras, data.n_covariates))
    for j in range(data.n_covariates):
        sl = slice(data.col_ptr[j], data.col_ptr[j + 1])
        dense[data.col_rows[sl], j] = data.col_values[sl]
    case_dummies = (data.era_case[:, None] == np.arange(data.n_cases)[None, :]).astype(float)
    glm = sm.GLM(data.era_events, np.hstack([dense, case_dummies]), family=sm.families.Poisson(),
                 offset=np.log(data.era_length)).fit(tol=1e-13, maxiter=200)
    np.testing.assert_allclose(fit.beta, glm.params[: data.n_covariates], rtol=0, atol=1e-6)
    # Profiling the case effects out of the Poisson likelihood gives the conditional one plus constants.
    n = data.case_events
    constant = np.sum(n * np.log(n) - n) - np.sum(gammaln(data.era_events + 1))
    assert abs(glm.llf - (fit.log_likelihood + constant)) < 1e-6


@pytest.mark.parametrize("variance", [0.05, 1.0])
def test_normal_prior_meets_kkt_and_beats_scipy(variance: float) -> None:
    data = small_problem(seed=5)
    prior = _prior("normal", variance, data.n_covariates)
    fit = ccd.fit(data, prior, TIGHT)
    residual = model.kkt_residual(fit.beta, model.gradient(data, fit.beta), prior)
    assert fit.converged and np.max(residual) < 1e-6 and fit.gradient_norm < 1e-6
    reference = scipy_map(data, prior)
    assert negative_log_posterior(data, prior, fit.beta) <= negative_log_posterior(data, prior, reference) + 1e-9
    np.testing.assert_allclose(fit.beta, reference, atol=1e-5)
    assert abs(fit.log_posterior - (model.log_likelihood(data, fit.beta) + model.log_prior(fit.beta, prior))) < 1e-9


@pytest.mark.parametrize("variance", [0.05, 0.1])
def test_laplace_prior_meets_kkt_and_beats_scipy(variance: float) -> None:
    data = small_problem(seed=6, n_drugs=10, n_cases=600)
    prior = _prior("laplace", variance, data.n_covariates)
    fit = ccd.fit(data, prior, TIGHT)
    grad = model.gradient(data, fit.beta)
    rate = math.sqrt(2.0 / variance)
    zero = fit.beta == 0
    assert zero.any() and (~zero).any()  # the test covers both KKT branches
    assert np.all(np.abs(grad[zero]) <= rate + 1e-6)
    np.testing.assert_allclose(grad[~zero], rate * np.sign(fit.beta[~zero]), atol=1e-6)
    reference = scipy_map(data, prior)
    assert negative_log_posterior(data, prior, fit.beta) <= negative_log_posterior(data, prior, reference) + 1e-9


def test_excluded_covariates_are_unpenalised() -> None:
    data = small_problem(seed=7)
    prior = _prior("laplace", 0.01, data.n_covariates, excluded=(0, 2))
    fit = ccd.fit(data, prior, TIGHT)
    grad = model.gradient(data, fit.beta)
    assert np.max(np.abs(grad[[0, 2]])) < 1e-6  # plain score equations
    assert fit.beta[0] != 0 and fit.beta[2] != 0
    assert fit.gradient_norm < 1e-6


def test_paper_criterion_default_is_close_to_the_optimum_and_reports_the_gradient() -> None:
    data = small_problem(seed=8, n_cases=600)
    prior = _prior("normal", 0.5, data.n_covariates)
    loose = ccd.fit(data, prior)
    tight = ccd.fit(data, prior, TIGHT)
    assert loose.converged and loose.criterion <= 5e-4 and loose.iterations < tight.iterations
    assert np.max(np.abs(loose.beta - tight.beta)) < 1e-2
    residual = model.kkt_residual(loose.beta, model.gradient(data, loose.beta), prior)
    assert loose.gradient_norm == pytest.approx(np.max(residual), rel=1e-12)


def test_max_iterations_stops_unconverged() -> None:
    data = small_problem(seed=9)
    fit = ccd.fit(data, _prior("normal", 1.0, data.n_covariates),
                  FitOptions(tolerance=1e-14, convergence="gradient", max_iterations=2))
    assert fit.iterations == 2 and not fit.converged and fit.gradient_norm > 1e-14


def test_case_weights_equal_duplicated_cases() -> None:
    data = small_problem(seed=10, n_cases=120)
    tables = synthetic.to_tables(data)
    multiplicity = np.random.default_rng(1).integers(0, 4, size=data.n_cases)
    multiplicity[0] = 1  # keep at least one case
    # Duplicate each case m times (as new strata) in the tables.
    keep_rows, strata = [], []
    for case, m in enumerate(multiplicity.tolist()):
        rows = np.flatnonzero(tables.stratum_id == case)
        for copy in range(m):
            keep_rows.append(rows)
            strata.append(np.full(rows.size, case * 10 + copy))
    rows = np.concatenate(keep_rows)
    new_row = np.arange(rows.size)
    row_map = {int(old): [] for old in rows}
    for new, old in zip(new_row.tolist(), rows.tolist(), strict=True):
        row_map[old].append(new)
    cov_rows, cov_ids, cov_vals = [], [], []
    for r, c, v in zip(tables.cov_row_id.tolist(), tables.cov_id.tolist(), tables.cov_value.tolist(), strict=True):
        for new in row_map.get(r, []):
            cov_rows.append(new)
            cov_ids.append(c)
            cov_vals.append(v)
    duplicated = build(type(tables)(new_row, np.concatenate(strata), tables.time[rows], tables.y[rows],
                                    np.asarray(cov_rows), np.asarray(cov_ids), np.asarray(cov_vals)))
    prior = _prior("laplace", 0.2, data.n_covariates)
    weighted = ccd.fit(data, prior, TIGHT, case_weights=multiplicity.astype(float))
    plain = ccd.fit(duplicated, prior, TIGHT)
    np.testing.assert_allclose(weighted.beta, plain.beta, atol=1e-8)
    assert weighted.log_likelihood == pytest.approx(plain.log_likelihood, rel=1e-10)


def test_float32_precision_stays_close_to_float64() -> None:
    data = small_problem(seed=12, n_cases=500)
    prior = _prior("normal", 1.0, data.n_covariates)
    f64 = ccd.fit(data, prior, FitOptions(tolerance=1e-6))
    f32 = ccd.fit(data, prior, FitOptions(tolerance=1e-6, precision="float32"))
    np.testing.assert_allclose(f32.beta, f64.beta, atol=1e-4)


def test_warm_start_at_the_optimum_stops_after_one_cycle() -> None:
    data = small_problem(seed=13)
    prior = _prior("normal", 1.0, data.n_covariates)
    first = ccd.fit(data, prior, TIGHT)
    again = ccd.fit(data, prior, TIGHT, beta0=first.beta)
    assert again.iterations == 1 and np.max(np.abs(again.beta - first.beta)) < 1e-9


def test_coordinate_step_rules() -> None:
    # Normal: Newton step including the prior, clipped by the trust region, which then adapts.
    step, trust = coordinate_step(-4.0, 1.0, 0.0, 10.0, "normal", True, 1.0)
    assert step == pytest.approx(2.0) and trust == pytest.approx(5.0)
    step, trust = coordinate_step(-40.0, 1.0, 0.0, 1.0, "normal", True, 1.0)
    assert step == 1.0 and trust == 2.0
    # Laplace at zero: stays while |G| <= lambda (= sqrt(2/v) = 2 for v = 0.5), leaves otherwise.
    assert coordinate_step(1.5, 1.0, 0.0, 10.0, "laplace", True, 0.5)[0] == 0.0
    assert coordinate_step(-3.0, 1.0, 0.0, 10.0, "laplace", True, 0.5)[0] == pytest.approx(1.0)
    assert coordinate_step(3.0, 1.0, 0.0, 10.0, "laplace", True, 0.5)[0] == pytest.approx(-1.0)
    # Laplace never crosses zero in one step.
    assert coordinate_step(5.0, 1.0, 0.5, 10.0, "laplace", True, 0.5)[0] == pytest.approx(-0.5)
    # Unpenalised or no prior: plain Newton; a flat direction (H = 0) does not move.
    assert coordinate_step(2.0, 4.0, 0.0, 10.0, "laplace", False, 0.5)[0] == pytest.approx(-0.5)
    assert coordinate_step(2.0, 0.0, 0.0, 10.0, "none", True, 1.0)[0] == 0.0


def test_invalid_inputs_are_refused() -> None:
    data = small_problem(seed=14)
    with pytest.raises(ValueError, match="prior kind"):
        Prior("ridge", 1.0, np.ones(data.n_covariates, bool))
    with pytest.raises(ValueError, match="variance"):
        Prior("normal", 0.0, np.ones(data.n_covariates, bool))
    with pytest.raises(ValueError, match="convergence"):
        FitOptions(convergence="loglik")
    prior = _prior("normal", 1.0, data.n_covariates)
    with pytest.raises(ValueError, match="beta0"):
        ccd.fit(data, prior, beta0=np.zeros(data.n_covariates + 1))
    with pytest.raises(ValueError, match="non-negative"):
        ccd.fit(data, prior, case_weights=-np.ones(data.n_cases))


@pytest.mark.parametrize("kind", ["normal", "laplace"])
def test_log_posterior_minus_log_likelihood_is_the_prior_density(kind: str) -> None:
    # Cyclops' parametrisation: Normal N(0, v); Laplace with variance v, i.e. scale 1 / sqrt(2 / v).
    data = small_problem(seed=15)
    variance = 0.3
    prior = _prior(kind, variance, data.n_covariates, excluded=(1, 4))
    penalised = np.array([j not in (1, 4) for j in range(data.n_covariates)])

    def density(b: np.ndarray) -> float:
        if kind == "normal":
            return float(stats.norm.logpdf(b, loc=0.0, scale=math.sqrt(variance)).sum())
        law = stats.laplace(loc=0.0, scale=1.0 / math.sqrt(2.0 / variance))
        assert law.var() == pytest.approx(variance, rel=1e-12)
        return float(law.logpdf(b).sum())

    fit = ccd.fit(data, prior, TIGHT)
    assert fit.log_posterior - fit.log_likelihood == pytest.approx(density(fit.beta[penalised]), rel=1e-12)
    beta = np.random.default_rng(3).normal(size=data.n_covariates)
    beta[2] = 0.0
    assert model.log_prior(beta, prior) == pytest.approx(density(beta[penalised]), rel=1e-12)
    assert model.log_prior(beta, _prior("none", 1.0, data.n_covariates)) == 0.0


def _dense(data) -> np.ndarray:
    dense = np.zeros((data.n_eras, data.n_covariates))
    for j in range(data.n_covariates):
        sl = slice(data.col_ptr[j], data.col_ptr[j + 1])
        dense[data.col_rows[sl], j] = data.col_values[sl]
    return dense


def test_xbeta_criterion_is_genkins_relative_change_on_a_hand_built_case() -> None:
    # Every case: an unexposed era of 100 days and an exposed one of 25 days (p = 25 / 125 of the time at b = 0).
    # Weighted (c = 0 drops a case, c = 2 doubles it), no prior, so each cycle is one bounded Newton step on b:
    #   G = -(sum c y1 - sum c n p(b)),  H = sum c n p (1 - p),  p(b) = 25 e^b / (100 + 25 e^b),
    # and the paper's criterion after a cycle is sum_k c |d eta_k| / (1 + sum_k c |eta_k|) = M |d b| / (1 + M |b|)
    # with M = sum c (one exposed era per case).
    y = np.array([[1, 1], [2, 0], [0, 1], [1, 2], [3, 1], [1, 0]], dtype=float)
    c = np.array([1.0, 2.0, 0.0, 1.0, 1.0, 2.0])
    n_cases = y.shape[0]
    data = from_coo(np.repeat(np.arange(n_cases), 2), np.tile([100.0, 25.0], n_cases), y.ravel(),
                    nz_era=2 * np.arange(n_cases) + 1, nz_col=np.zeros(n_cases, dtype=np.int64),
                    nz_value=np.ones(n_cases), n_covariates=1)
    n = y.sum(axis=1)
    m = c.sum()
    b, trust, expected = 0.0, 1.0, []
    for _ in range(3):
        p = 25 * math.exp(b) / (100 + 25 * math.exp(b))
        grad = -(np.sum(c * y[:, 1]) - np.sum(c * n * p))
        hess = np.sum(c * n * p * (1 - p))
        step = min(max(-grad / hess, -trust), trust)
        trust = max(2 * abs(step), trust / 2)
        b += step
        expected.append(m * abs(step) / (1 + m * abs(b)))
    assert expected[0] > expected[1] > expected[2]
    prior = _prior("none", 1.0, 1)
    for cycles in (1, 2, 3):
        fit = ccd.fit(data, prior, FitOptions(tolerance=1e-300, max_iterations=cycles), case_weights=c)
        assert fit.iterations == cycles and not fit.converged
        assert fit.criterion == pytest.approx(expected[cycles - 1], rel=1e-12)
    # The decision: the first cycle whose criterion is at most the tolerance stops the fit.
    stops = ccd.fit(data, prior, FitOptions(tolerance=expected[1] * 1.0001), case_weights=c)
    assert stops.converged and stops.iterations == 2
    goes_on = ccd.fit(data, prior, FitOptions(tolerance=expected[1] * 0.9999, max_iterations=3), case_weights=c)
    assert goes_on.iterations == 3 and goes_on.converged == (expected[2] <= expected[1] * 0.9999)


def test_xbeta_criterion_of_the_first_cycle_from_the_returned_coefficients() -> None:
    # Independently of the sparse updates: from b = 0, one cycle moves X b to X b1, so the criterion is
    # sum_k c |X b1|_k / (1 + sum_k c |X b1|_k) over the eras (held-out cases, c = 0, do not count).
    data = small_problem(seed=16, n_cases=150)
    weights = np.random.default_rng(5).integers(0, 3, size=data.n_cases).astype(float)
    prior = _prior("laplace", 0.5, data.n_covariates)
    fit = ccd.fit(data, prior, FitOptions(tolerance=1e-300, max_iterations=1), case_weights=weights)
    era_weight = weights[data.era_case]
    size = np.sum(era_weight * np.abs(_dense(data) @ fit.beta))
    assert size > 0 and fit.criterion == pytest.approx(size / (1 + size), rel=1e-10)
    # Cycle 2 from its own start: the change is X (b2 - b1), the size X b2.
    again = ccd.fit(data, prior, FitOptions(tolerance=1e-300, max_iterations=2), case_weights=weights)
    change = np.sum(era_weight * np.abs(_dense(data) @ (again.beta - fit.beta)))
    size = np.sum(era_weight * np.abs(_dense(data) @ again.beta))
    assert again.criterion == pytest.approx(change / (1 + size), rel=1e-9)


def test_fit_reports_every_cycle() -> None:
    data = small_problem(seed=17)
    calls: list[tuple[int, bool]] = []
    fit = ccd.fit(data, _prior("normal", 1.0, data.n_covariates), TIGHT,
                  on_cycle=lambda cycle, finished: calls.append((cycle, finished)))
    assert calls == [(i, i == fit.iterations) for i in range(1, fit.iterations + 1)]
