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
    from kernels.sccs import gpu

    seed, data = _fresh(binary=binary)
    penalised = np.ones(data.n_covariates, dtype=bool)
    penalised[3] = False
    prior = Prior(kind, variance, penalised)
    host = ccd.fit(data, prior)
    device = gpu.fit(data, prior)
    _assert_same(host, device, seed)
    tight = FitOptions(tolerance=1e-9, convergence="gradient")
    _assert_same(ccd.fit(data, prior, tight), gpu.fit(data, prior, tight), seed)


def test_graph_replay_equals_direct_launches() -> None:
    from kernels.sccs import gpu

    _, data = _fresh(n_cases=1000, n_drugs=20)
    prior = Prior("laplace", 0.2, np.ones(data.n_covariates, dtype=bool))
    graph = gpu.BatchEngine(data, prior, FitOptions(), capacity=1)
    assert graph.graph_used
    with_graph = gpu.fit(data, prior)
    direct = gpu.fit(data, prior, use_graph=False)
    np.testing.assert_array_equal(with_graph.beta, direct.beta)


def test_batched_fits_equal_numpy_fits_one_by_one() -> None:
    from kernels.sccs import gpu

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
    calls: list[tuple[int, int]] = []
    device = gpu.batch_fitter(data, prior, options, capacity=3)(
        variances, weights, beta0, lambda finished, cycle: calls.append((finished, cycle)))
    finished = [f for f, _ in calls]
    assert finished == sorted(finished) and finished[-1] == replicates
    for h, d in zip(host, device, strict=True):
        _assert_same(h, d, seed)


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_grouped_slot_loops_give_the_bits_of_one_nonzero_at_a_time(precision: str) -> None:
    """ccd.cu's coordinate kernels load a case's nonzeros in groups (SLOT_GROUP) before adding them in order: the
    fits' bits equal those of groups of one, the plain loop, on slots longer than a group and warm starts."""
    from kernels.sccs import gpu

    seed, data = _fresh(n_cases=4000, n_drugs=12, binary=False)
    assert int(np.max(np.diff(data.touched_ptr))) > 8  # some slots span two groups of the default 8
    prior = Prior("laplace", 0.05, np.ones(data.n_covariates, dtype=bool))
    weights = np.stack([(np.arange(data.n_cases) % 4 != f).astype(float) for f in range(3)])
    results = []
    for defines in (None, {"SLOT_GROUP": 1}, {"SLOT_GROUP": 3}):
        engine = gpu.BatchEngine(data, prior, FitOptions(precision=precision), capacity=3)
        engine._kernels = gpu._Kernels.load(precision, defines)
        engine._capture()
        first = engine.fit_batch(np.full(3, 0.05), weights, np.zeros((3, data.n_covariates)))
        warm = engine.fit_batch(np.full(3, 0.5), weights, np.stack([fit.beta for fit in first]))
        results.append([(fit.beta.tobytes(), fit.iterations, fit.log_likelihood) for fit in first + warm])
    assert results[1] == results[0], f"seed {seed}"
    assert results[2] == results[0], f"seed {seed}"
    assert all(iterations > 1 for _, iterations, _ in results[0])


def test_float32_gpu_is_close_to_float32_numpy() -> None:
    from kernels.sccs import gpu

    seed, data = _fresh()
    prior = Prior("normal", 0.5, np.ones(data.n_covariates, dtype=bool))
    options = FitOptions(tolerance=1e-6, precision="float32")
    host, device = ccd.fit(data, prior, options), gpu.fit(data, prior, options)
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


def test_folds_dealt_on_gpu_equal_numpy_even_with_tied_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy

    from kernels import rng
    from kernels.sccs import cv

    seed = secrets.randbits(31)
    for n_cases, folds in ((777, 10), (100_003, 7), (12, 12)):
        np.testing.assert_array_equal(cv.fold_of_case(n_cases, folds, seed, cupy).get(),
                                      cv.fold_of_case(n_cases, folds, seed), err_msg=f"seed {seed}")
    uniform = rng.uniform

    def tied(xp, seed, stream, index):  # type: ignore[no-untyped-def]
        return xp.floor(uniform(xp, seed, stream, index) * 5.0) / 5.0  # five values: ties everywhere

    monkeypatch.setattr(rng, "uniform", tied)
    host = cv.fold_of_case(1000, 4, seed)
    assert np.ptp(np.bincount(host, minlength=4)) <= 1  # still a permutation dealt round-robin
    np.testing.assert_array_equal(cv.fold_of_case(1000, 4, seed, cupy).get(), host, err_msg=f"seed {seed}")


def test_cross_validation_and_bootstrap_on_gpu_equal_numpy() -> None:
    import cupy

    from kernels.sccs import cv, gpu

    seed, data = _fresh(n_cases=1500, n_drugs=20)
    prior = Prior("laplace", 0.1, np.ones(data.n_covariates, dtype=bool))
    options = FitOptions()
    grid = [0.02, 0.2, 2.0]
    host_cv = cv.cross_validate(data, ccd.numpy_batch_fitter(data, prior, options), grid, folds=3, seed=seed)
    device_data = data.to(cupy)
    device_cv = cv.cross_validate(device_data, gpu.batch_fitter(device_data, prior, options, capacity=3), grid,
                                  folds=3, seed=seed)
    np.testing.assert_allclose(device_cv.fold_loglik, host_cv.fold_loglik, rtol=1e-10)
    np.testing.assert_array_equal(device_cv.iterations, host_cv.iterations)
    assert device_cv.chosen_variance == host_cv.chosen_variance
    beta_hat = ccd.fit(data, prior.with_variance(host_cv.chosen_variance), options).beta
    host_boot = boot.bootstrap(np, data.n_cases, ccd.numpy_batch_fitter(data, prior, options),
                               host_cv.chosen_variance, beta_hat, 6, seed=seed, chunk=6)
    device_boot = boot.bootstrap(cupy, data.n_cases, gpu.batch_fitter(device_data, prior, options, capacity=4),
                                 host_cv.chosen_variance, beta_hat, 6, seed=seed, chunk=4)
    assert np.max(np.abs(device_boot.estimates - host_boot.estimates)) < 1e-10 * max(
        1.0, float(np.max(np.abs(host_boot.estimates)))), f"seed {seed}"
    np.testing.assert_array_equal(device_boot.nonzero_share, host_boot.nonzero_share)


def test_gpu_batch_reports_every_cycle_and_cancels_between_cycles() -> None:
    from kernels.progress import JobCancelled
    from kernels.sccs import gpu

    seed, data = _fresh(n_cases=2000, n_drugs=30)
    prior = Prior("laplace", 0.1, np.ones(data.n_covariates, dtype=bool))
    options = FitOptions(tolerance=1e-9, convergence="gradient")
    replicates = 8
    weights = boot.case_weights(np, data.n_cases, 0, replicates, seed=seed)
    variances = np.full(replicates, 0.1)
    beta0 = np.zeros((replicates, data.n_covariates))
    fitter = gpu.batch_fitter(data, prior, options, capacity=replicates)
    calls: list[tuple[int, int]] = []
    results = fitter(variances, weights, beta0, lambda finished, cycle: calls.append((finished, cycle)))
    cycles = max(r.iterations for r in results)
    assert cycles > 2, f"seed {seed}"
    # One report per batched cycle; finished = replicates whose fit ended by then (monotone, ends at R).
    assert [c for _, c in calls] == list(range(1, cycles + 1))
    assert [f for f, _ in calls] == [sum(r.iterations <= c for r in results) for c in range(1, cycles + 1)]
    assert calls[-1][0] == replicates

    seen: list[int] = []

    def cancel_at_second(finished: int, cycle: int) -> None:
        seen.append(cycle)
        if len(seen) == 2:
            raise JobCancelled("cancelled")

    with pytest.raises(JobCancelled):
        fitter(variances, weights, beta0, cancel_at_second)
    assert seen == [1, 2]  # the batch stopped after its second cycle, not at its end
    again = fitter(variances, weights, beta0, None)  # the engine is reusable after a cancelled batch
    for a, r in zip(again, results, strict=True):
        np.testing.assert_array_equal(a.beta, r.beta)


def test_gpu_bootstrap_progress_is_per_cycle_and_monotone() -> None:
    import cupy

    from kernels.sccs import gpu

    seed, data = _fresh(n_cases=1500, n_drugs=20)
    prior = Prior("laplace", 0.1, np.ones(data.n_covariates, dtype=bool))
    options = FitOptions()
    beta_hat = ccd.fit(data, prior, options).beta
    device_data = data.to(cupy)
    calls: list[tuple[int, int]] = []
    result = boot.bootstrap(cupy, data.n_cases, gpu.batch_fitter(device_data, prior, options, capacity=6), 0.1,
                            beta_hat, 12, seed=seed, chunk=6,
                            on_cycle=lambda finished, cycle: calls.append((finished, cycle)))
    finished = [f for f, _ in calls]
    assert finished == sorted(finished) and finished[-1] == 12
    # Two batches of 6: as many reports as the longest refit of each batch has cycles.
    assert len(calls) == int(result.iterations[:6].max() + result.iterations[6:].max())


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_capacity_estimate_covers_the_measured_memory_per_replicate(precision: str) -> None:
    import cupy

    from kernels.sccs import fixed_sums, gpu

    seed, data = _fresh(n_cases=20_000, n_drugs=40)
    device_data = data.to(cupy)
    prior = Prior("normal", 0.5, np.ones(data.n_covariates, dtype=bool))
    options = FitOptions(precision=precision, max_iterations=2)
    beta_hat = np.full(data.n_covariates, 0.1)  # a warm start: the set-up's X b product runs
    pool = cupy.get_default_memory_pool()

    def pool_growth(capacity: int) -> int:
        pool.free_all_blocks()
        before = pool.total_bytes()
        fitter = gpu.batch_fitter(device_data, prior, options, capacity)
        boot.bootstrap(cupy, data.n_cases, fitter, 0.5, beta_hat, capacity, seed=seed, chunk=capacity)
        cupy.cuda.Device().synchronize()
        grown = pool.total_bytes() - before
        del fitter
        pool.free_all_blocks()
        return grown

    fixed_sums.prepare(device_data)  # the data set's index (built once, by the first engine): not per replicate
    measured = (pool_growth(10) - pool_growth(2)) / 8
    estimate = gpu.bytes_per_replicate(device_data, precision)
    assert 0 < measured <= estimate, f"measured {measured:.0f} B per replicate, estimated {estimate} B"
    assert estimate < 3 * measured, f"measured {measured:.0f} B per replicate, estimated {estimate} B"
