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
    assert np.all(result.converged)


def test_warm_starts_take_fewer_cycles_than_cold_starts_and_give_the_same_fits() -> None:
    # The paper's warm starts: each fold's fit at the next (larger) variance starts from its previous fit.
    data = small_problem(seed=31, n_cases=400, n_drugs=10)
    prior = Prior("normal", 1.0, np.ones(data.n_covariates, dtype=bool))
    options = FitOptions(tolerance=1e-8, convergence="gradient", max_iterations=5000)
    fitter = ccd.numpy_batch_fitter(data, prior, options)
    starts: list[np.ndarray] = []

    def recording(variances, weights, beta0, on_cycle):
        starts.append(np.array(beta0))
        return fitter(variances, weights, beta0, on_cycle)

    def cold(variances, weights, beta0, on_cycle):
        return fitter(variances, weights, np.zeros_like(beta0), on_cycle)

    grid = [0.01, 0.1, 1.0, 10.0]
    warm = cv.cross_validate(data, recording, grid, folds=4, seed=3)
    reference = cv.cross_validate(data, cold, grid, folds=4, seed=3)
    assert np.all(warm.converged) and np.all(reference.converged)
    np.testing.assert_allclose(warm.coefficients, reference.coefficients, atol=1e-7)
    np.testing.assert_allclose(warm.fold_loglik, reference.fold_loglik, rtol=1e-9)
    assert int(warm.iterations.sum()) < int(reference.iterations.sum())
    # Variance v's batch started from the fits at variance v - 1 (and the first from zero).
    assert np.all(starts[0] == 0)
    for v in range(1, len(grid)):
        np.testing.assert_array_equal(starts[v], warm.coefficients[:, v - 1])


def test_auto_grid_is_cyclops_default() -> None:
    # Cyclops createControl(lowerLimit = 0.01, upperLimit = 20, gridSteps = 10): log-uniform, 0.01 * 2000^(i/9).
    expected = [0.01, 0.023269181687763627, 0.05414548164181542, 0.12599210498948732, 0.29317331822241705,
                0.6821903207721968, 1.5874010519681991, 3.693752348959515, 8.59505945175426, 20.0]
    np.testing.assert_allclose(cv.DEFAULT_GRID, expected, rtol=1e-13)
    from kernels.sccs.spec import CrossValidationSpec

    spec = CrossValidationSpec()
    assert spec.grid == "auto"
    np.testing.assert_allclose(spec.variances(), expected, rtol=1e-13)
    assert CrossValidationSpec(grid=[0.5, 2.0]).variances() == [0.5, 2.0]


def test_batches_report_every_cycle_and_stop_at_the_first_report_after_a_cancel() -> None:
    from kernels.progress import JobCancelled

    data = small_problem(seed=33, n_cases=200, n_drugs=6)
    prior = Prior("laplace", 0.1, np.ones(data.n_covariates, dtype=bool))
    options = FitOptions(tolerance=1e-9, convergence="gradient")
    fitter = ccd.numpy_batch_fitter(data, prior, options)
    weights = boot.case_weights(np, data.n_cases, 0, 5, seed=2)
    start = np.zeros((5, data.n_covariates))
    calls: list[tuple[int, int]] = []
    results = fitter(np.full(5, 0.1), weights, start, lambda finished, cycle: calls.append((finished, cycle)))
    assert len(calls) == sum(r.iterations for r in results) > 5
    assert [f for f, _ in calls] == sorted(f for f, _ in calls) and calls[-1][0] == 5

    seen: list[tuple[int, int]] = []

    def cancel_at_third(finished: int, cycle: int) -> None:
        seen.append((finished, cycle))
        if len(seen) == 3:
            raise JobCancelled("cancelled")

    with pytest.raises(JobCancelled):
        fitter(np.full(5, 0.1), weights, start, cancel_at_third)
    assert seen == calls[:3]  # stopped inside the batch, right after the third cycle


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
    calls: list[tuple[int, int]] = []
    whole = boot.bootstrap(np, data.n_cases, fitter, 0.1, beta_hat, 12, seed=5, chunk=12,
                           on_cycle=lambda finished, cycle: calls.append((finished, cycle)))
    chunked = boot.bootstrap(np, data.n_cases, fitter, 0.1, beta_hat, 12, seed=5, chunk=5)
    # One report per CCD cycle of every replicate; the finished count never decreases and ends at 12.
    assert len(calls) == int(whole.iterations.sum())
    finished = [f for f, _ in calls]
    assert finished == sorted(finished) and finished[-1] == 12 and finished[0] <= 1
    np.testing.assert_array_equal(whole.estimates, chunked.estimates)
    np.testing.assert_array_equal(whole.ci_lower, np.quantile(whole.estimates, 0.025, axis=0))
    np.testing.assert_array_equal(whole.ci_upper, np.quantile(whole.estimates, 0.975, axis=0))
    np.testing.assert_array_equal(whole.nonzero_share, np.mean(whole.estimates != 0, axis=0))
    # Replicate 3 is the fit to that resample.
    single = ccd.fit(data, prior, options, case_weights=boot.case_weights(np, data.n_cases, 3, 1, seed=5)[0],
                     beta0=beta_hat)
    np.testing.assert_array_equal(whole.estimates[3], single.beta)
    assert np.all(whole.ci_lower <= whole.ci_upper)


def test_capacity_counts_the_engine_buffers() -> None:
    # Importable without CuPy; the measured peak is checked on the device (test_sccs_gpu.py).
    from kernels.sccs import gpu

    data = small_problem(seed=34, n_cases=500, n_drugs=8)
    k, n, j = data.n_eras, data.n_cases, data.n_covariates
    for precision, real in (("float64", 8), ("float32", 4)):
        # eta, eta_start, w (K, precision); sums (precision), case weights and weighted events (float64) per
        # case; numerator, beta, trust per covariate.
        buffers = k * 3 * real + n * (real + 16) + j * 24
        per_replicate = gpu.bytes_per_replicate(data, precision)
        assert buffers < per_replicate < 4 * buffers
        assert gpu.capacity_for(data, precision, 200, 7 * per_replicate + 1) == 7
        assert gpu.capacity_for(data, precision, 5, 7 * per_replicate) == 5
        assert gpu.capacity_for(data, precision, 200, 10) == 1
    assert gpu.bytes_per_replicate(data, "float32") < gpu.bytes_per_replicate(data, "float64")
    # Each more era costs eta, eta_start and w: compare two designs of equal N and J.
    longer = synthetic.generate(np, 500, 8, seed=34, effect_share=0.5, min_eras=20, max_eras=30).data
    assert longer.n_cases == n and longer.n_covariates == j and longer.n_eras > k + 5000
    for precision, real in (("float64", 8), ("float32", 4)):
        extra = gpu.bytes_per_replicate(longer, precision) - gpu.bytes_per_replicate(data, precision)
        assert extra >= (longer.n_eras - k) * 3 * real
