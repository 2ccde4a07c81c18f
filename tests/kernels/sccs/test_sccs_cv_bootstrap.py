"""Cross-validation of the prior variance and the case bootstrap (NumPy path)."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.sccs import bootstrap as boot
from kernels.sccs import ccd, cv, model, synthetic
from kernels.sccs.ccd import FitOptions
from kernels.sccs.model import Prior
from tests.kernels.sccs.sccs_helpers import build, small_problem

TIGHT = FitOptions(tolerance=1e-10, convergence="gradient", max_iterations=5000)


def test_folds_are_balanced_seeded_and_random() -> None:
    fold = cv.fold_of_case(103, 10, seed=1)
    sizes = np.bincount(fold)
    assert sizes.size == 10 and sizes.max() - sizes.min() <= 1
    np.testing.assert_array_equal(fold, cv.fold_of_case(103, 10, seed=1))
    assert np.any(fold != cv.fold_of_case(103, 10, seed=2))
    assert np.any(fold != np.arange(103) % 10)
    with pytest.raises(ValueError, match="folds"):
        cv.fold_of_case(5, 10, seed=1)


def _subset(data, cases: np.ndarray):
    tables = synthetic.to_tables(data)
    keep = np.isin(tables.stratum_id, cases)
    keep_cov = keep[tables.cov_row_id]
    return build(type(tables)(tables.row_id[keep], tables.stratum_id[keep], tables.time[keep], tables.y[keep],
                              tables.cov_row_id[keep_cov], tables.cov_id[keep_cov], tables.cov_value[keep_cov]))


def test_cross_validation_scores_are_held_out_fits_of_training_folds() -> None:
    data = small_problem(seed=31, n_cases=200, n_drugs=6)
    prior = Prior("normal", 1.0, np.ones(data.n_covariates, dtype=bool))
    grid = [1.0, 0.01, 0.1]
    result = cv.cross_validate(data, ccd.numpy_batch_fitter(data, prior, TIGHT), grid, folds=4, seed=3)
    np.testing.assert_array_equal(result.variances, [0.01, 0.1, 1.0])
    assert result.chosen_variance == result.variances[np.argmax(result.mean_loglik)]
    np.testing.assert_allclose(result.mean_loglik, result.fold_loglik.mean(axis=0))
    # Independent check of one cell: fit the training cases alone (cold start), score the held-out cases alone.
    fold = cv.fold_of_case(data.n_cases, 4, seed=3)
    training, held_out = np.flatnonzero(fold != 2), np.flatnonzero(fold == 2)
    fit = ccd.fit(_subset(data, training), prior.with_variance(0.1), TIGHT)
    expected = model.log_likelihood(_subset(data, held_out), fit.beta)
    assert result.fold_loglik[2, 1] == pytest.approx(expected, abs=1e-7)
    np.testing.assert_allclose(result.coefficients[2, 1], fit.beta, atol=1e-8)
    # Warm starts: later variances start where the previous fit ended, so they need fewer cycles than cold ones.
    assert np.all(result.converged)


def test_bootstrap_weights_are_resamples_and_chunking_does_not_matter() -> None:
    weights = boot.case_weights(np, 50, 0, 4, seed=9)
    assert weights.shape == (4, 50) and np.all(weights.sum(axis=1) == 50)
    np.testing.assert_array_equal(boot.case_weights(np, 50, 2, 2, seed=9), weights[2:])
    assert np.any(weights[0] != weights[1])

    data = small_problem(seed=32, n_cases=150, n_drugs=5)
    prior = Prior("laplace", 0.1, np.ones(data.n_covariates, dtype=bool))
    options = FitOptions(tolerance=1e-8, convergence="gradient")
    beta_hat = ccd.fit(data, prior, options).beta
    fitter = ccd.numpy_batch_fitter(data, prior, options)
    calls: list[int] = []
    whole = boot.bootstrap(np, data.n_cases, fitter, 0.1, beta_hat, 12, seed=5, chunk=12,
                           on_fit=lambda: calls.append(1))
    chunked = boot.bootstrap(np, data.n_cases, fitter, 0.1, beta_hat, 12, seed=5, chunk=5)
    assert len(calls) == 12
    np.testing.assert_array_equal(whole.estimates, chunked.estimates)
    np.testing.assert_array_equal(whole.ci_lower, np.quantile(whole.estimates, 0.025, axis=0))
    np.testing.assert_array_equal(whole.ci_upper, np.quantile(whole.estimates, 0.975, axis=0))
    np.testing.assert_array_equal(whole.nonzero_share, np.mean(whole.estimates != 0, axis=0))
    # Replicate 3 is the fit to that resample.
    single = ccd.fit(data, prior, options, case_weights=boot.case_weights(np, data.n_cases, 3, 1, seed=5)[0],
                     beta0=beta_hat)
    np.testing.assert_array_equal(whole.estimates[3], single.beta)
    assert np.all(whole.ci_lower <= whole.ci_upper)
