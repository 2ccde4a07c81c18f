"""GPU path = NumPy path (float64, relative 1e-10) on fresh random data; no pydantic/pandas imports here."""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from kernels.sccs import bootstrap as boot
from kernels.sccs import ccd, synthetic
from kernels.sccs.ccd import FitOptions
from kernels.sccs.data import from_coo
from kernels.sccs.model import Prior

pytestmark = pytest.mark.gpu


def _fresh(n_cases: int = 3000, n_drugs: int = 40, binary: bool = True):
    seed = secrets.randbits(31)
    data = synthetic.generate(np, n_cases, n_drugs, seed=seed, effect_share=0.3).data
    if not binary:  # the same design with covariate values in [0.5, 2)
        values = 0.5 + 1.5 * np.random.default_rng(seed).random(data.nnz)
        col = np.repeat(np.arange(n_drugs), np.diff(data.col_ptr))
        data = from_coo(data.era_case, data.era_length, data.era_events, data.col_rows, col, values, n_drugs)
    return seed, data


def _assert_same(host: ccd.FitResult, device: ccd.FitResult, seed: int) -> None:
    scale = max(1.0, float(np.max(np.abs(host.beta))))
    assert device.iterations == host.iterations, f"seed {seed}"
    assert np.max(np.abs(device.beta - host.beta)) / scale < 1e-10, f"seed {seed}"
    assert abs(device.log_likelihood - host.log_likelihood) / abs(host.log_likelihood) < 1e-10, f"seed {seed}"
    assert device.converged == host.converged


@pytest.mark.parametrize(("kind", "variance", "binary"), [
    ("none", 1.0, True), ("normal", 0.3, True), ("laplace", 0.05, True), ("laplace", 0.5, False),
])
def test_gpu_fit_equals_numpy(kind: str, variance: float, binary: bool) -> None:
    from kernels.sccs import cuda

    seed, data = _fresh(binary=binary)
    penalised = np.ones(data.n_covariates, dtype=bool)
    penalised[3] = False
    prior = Prior(kind, variance, penalised)
    host = ccd.fit(data, prior)
    device = cuda.fit(data, prior)
    _assert_same(host, device, seed)
    tight = FitOptions(tolerance=1e-9, convergence="gradient")
    _assert_same(ccd.fit(data, prior, tight), cuda.fit(data, prior, tight), seed)


def test_graph_replay_equals_direct_launches() -> None:
    from kernels.sccs import cuda

    _, data = _fresh(n_cases=1000, n_drugs=20)
    prior = Prior("laplace", 0.2, np.ones(data.n_covariates, dtype=bool))
    graph = cuda.BatchEngine(data, prior, FitOptions(), capacity=1)
    assert graph.graph_used
    with_graph = cuda.fit(data, prior)
    direct = cuda.fit(data, prior, use_graph=False)
    np.testing.assert_array_equal(with_graph.beta, direct.beta)


def test_batched_fits_equal_numpy_fits_one_by_one() -> None:
    from kernels.sccs import cuda

    seed, data = _fresh(n_cases=2000, n_drugs=30)
    prior = Prior("laplace", 0.1, np.ones(data.n_covariates, dtype=bool))
    options = FitOptions()
    replicates = 7
    weights = boot.case_weights(np, data.n_cases, 0, replicates, seed=seed)
    weights[0] = 1.0
    weights[1] = (np.arange(data.n_cases) % 3 != 0).astype(float)  # a CV training fold
    variances = np.linspace(0.05, 1.0, replicates)
    beta0 = np.zeros((replicates, data.n_covariates))
    beta0[2] = 0.1
    host = ccd.numpy_batch_fitter(data, prior, options)(variances, weights, beta0, None)
    done: list[int] = []
    device = cuda.batch_fitter(data, prior, options, capacity=3)(variances, weights, beta0, done.append)
    assert done == list(range(replicates))
    for h, d in zip(host, device, strict=True):
        _assert_same(h, d, seed)


def test_float32_gpu_is_close_to_float32_numpy() -> None:
    from kernels.sccs import cuda

    seed, data = _fresh()
    prior = Prior("normal", 0.5, np.ones(data.n_covariates, dtype=bool))
    options = FitOptions(tolerance=1e-6, precision="float32")
    host, device = ccd.fit(data, prior, options), cuda.fit(data, prior, options)
    assert np.max(np.abs(device.beta - host.beta)) < 1e-4, f"seed {seed}"


def test_synthetic_on_gpu_matches_numpy() -> None:
    import cupy

    seed = secrets.randbits(31)
    host = synthetic.generate(np, 5000, 50, seed=seed)
    device = synthetic.generate(cupy, 5000, 50, seed=seed)
    np.testing.assert_array_equal(device.data.col_rows.get(), host.data.col_rows)
    np.testing.assert_array_equal(device.data.touched_case.get(), host.data.touched_case)
    np.testing.assert_allclose(device.true_beta, host.true_beta, rtol=1e-13)
    # Events are placed by a float64 cumulative sum, summed in another order on the GPU.
    assert np.mean(device.data.era_events.get() == host.data.era_events) > 0.999


def test_bootstrap_weights_on_gpu_match_numpy() -> None:
    import cupy

    np.testing.assert_array_equal(boot.case_weights(cupy, 777, 5, 3, seed=4).get(),
                                  boot.case_weights(np, 777, 5, 3, seed=4))


def test_cross_validation_and_bootstrap_on_gpu_equal_numpy() -> None:
    import cupy

    from kernels.sccs import cuda, cv

    seed, data = _fresh(n_cases=1500, n_drugs=20)
    prior = Prior("laplace", 0.1, np.ones(data.n_covariates, dtype=bool))
    options = FitOptions()
    grid = [0.02, 0.2, 2.0]
    host_cv = cv.cross_validate(data, ccd.numpy_batch_fitter(data, prior, options), grid, folds=3, seed=seed)
    device_data = data.to(cupy)
    device_cv = cv.cross_validate(device_data, cuda.batch_fitter(device_data, prior, options, capacity=3), grid,
                                  folds=3, seed=seed)
    np.testing.assert_allclose(device_cv.fold_loglik, host_cv.fold_loglik, rtol=1e-10)
    np.testing.assert_array_equal(device_cv.iterations, host_cv.iterations)
    assert device_cv.chosen_variance == host_cv.chosen_variance
    beta_hat = ccd.fit(data, prior.with_variance(host_cv.chosen_variance), options).beta
    host_boot = boot.bootstrap(np, data.n_cases, ccd.numpy_batch_fitter(data, prior, options),
                               host_cv.chosen_variance, beta_hat, 6, seed=seed, chunk=6)
    device_boot = boot.bootstrap(cupy, data.n_cases, cuda.batch_fitter(device_data, prior, options, capacity=4),
                                 host_cv.chosen_variance, beta_hat, 6, seed=seed, chunk=4)
    assert np.max(np.abs(device_boot.estimates - host_boot.estimates)) < 1e-10 * max(
        1.0, float(np.max(np.abs(host_boot.estimates)))), f"seed {seed}"
    np.testing.assert_array_equal(device_boot.nonzero_share, host_boot.nonzero_share)
