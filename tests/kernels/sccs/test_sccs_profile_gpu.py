"""The batched profile on the GPU (issue 15, item 2) against its NumPy twin: the engine's held coefficients
(``fixed_columns``, ``refit_moved``) = ``ccd.fit(..., fixed_column=...)`` on the host; a profile engine's state
gradient and log-likelihood = the model's, from scratch; and the intervals of the batched profile on CuPy = those
on NumPy (= the host reference, ``test_sccs_profile.py``) to the root's tolerance, open ends included."""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from kernels.sccs import ccd, model, synthetic
from kernels.sccs.ccd import FitOptions
from kernels.sccs.data import from_coo
from kernels.sccs.model import Prior
from kernels.sccs.profile import ROOT_TOLERANCE, batched_profile_intervals
from tests.kernels.sccs.test_sccs_profile import data_with_a_drug_without_events

pytestmark = pytest.mark.gpu

TIGHT = FitOptions(tolerance=1e-9, convergence="gradient")


def _fresh(n_cases: int = 2000, n_drugs: int = 12, binary: bool = True):
    seed = secrets.randbits(31)
    data = synthetic.generate(
        np, n_cases, n_drugs, seed=seed, effect_share=1.0, effect_sd=0.5, min_eras=3, max_eras=8
    ).data
    if not binary:  # the same design with covariate values in [0.5, 2)
        values = 0.5 + 1.5 * np.random.default_rng(seed).random(data.nnz)
        col = np.repeat(np.arange(n_drugs), np.diff(data.col_ptr))
        data = from_coo(data.era_case, data.era_length, data.era_events, data.col_rows, col, values, n_drugs)
    return seed, data


def _prior(kind: str, n: int) -> Prior:
    penalised = np.ones(n, dtype=bool)
    penalised[2] = False
    return Prior(kind, 0.3, penalised)


@pytest.mark.parametrize(("kind", "binary"), [("none", True), ("normal", False), ("laplace", True)])
def test_held_coefficients_on_the_engine_equal_numpy_held_fits(kind: str, binary: bool) -> None:
    # the plain engine (criterion from scratch) with per-replicate held columns = ccd.fit holding the same column,
    # replicate by replicate, to 1e-10 (same cycles); a replicate without a held column is the ordinary fit
    from kernels.sccs import gpu

    seed, data = _fresh(binary=binary)
    prior = _prior(kind, data.n_covariates)
    fixed = np.array([0, 2, -1, 5, 2])
    starts = np.zeros((fixed.size, data.n_covariates))
    held = fixed >= 0
    starts[np.flatnonzero(held), fixed[held]] = [0.4, -0.3, 0.8, 1.1]
    engine = gpu.BatchEngine(data, prior, TIGHT, capacity=6)
    device = engine.fit_batch(
        np.full(fixed.size, prior.variance), np.ones((fixed.size, data.n_cases)), starts, fixed_columns=fixed
    )
    for r, result in enumerate(device):
        host = ccd.fit(data, prior, TIGHT, beta0=starts[r], fixed_column=None if fixed[r] < 0 else int(fixed[r]))
        assert result.iterations == host.iterations, f"seed {seed}, replicate {r}"
        assert np.max(np.abs(result.beta - host.beta)) / max(1.0, np.max(np.abs(host.beta))) < 1e-10, f"seed {seed}"
        assert result.log_posterior == pytest.approx(host.log_posterior, rel=1e-10), f"seed {seed}"
        if fixed[r] >= 0:
            assert result.beta[fixed[r]] == starts[r, fixed[r]]


def test_a_state_engine_reads_the_models_gradient_and_log_likelihood() -> None:
    # the profile engine's criterion (KKT residual from w and S on the device) and its results' log-likelihood
    # (from eta and w) are the model's, computed from scratch at the same coefficients
    from kernels.sccs import gpu

    seed, data = _fresh(binary=False)
    for kind in ("none", "normal", "laplace"):
        prior = _prior(kind, data.n_covariates)
        fixed = np.array([1, -1, 4])
        engine = gpu.BatchEngine(
            data,
            prior,
            FitOptions(tolerance=1e-9, convergence="gradient", max_iterations=3),
            capacity=3,
            state_gradient=True,
        )
        starts = np.random.default_rng(seed).normal(0.0, 0.3, (3, data.n_covariates))
        results = engine.fit_batch(
            np.full(3, prior.variance), np.ones((3, data.n_cases)), starts, fixed_columns=fixed
        )  # 3 cycles: far from converged, the gradient is large
        for r, result in enumerate(results):
            column = None if fixed[r] < 0 else int(fixed[r])
            ll, grad = model.log_likelihood_and_gradient(data, result.beta)
            scale = max(1.0, float(np.max(np.abs(grad))))
            assert result.log_likelihood == pytest.approx(ll, rel=1e-12), f"seed {seed}, {kind}"
            assert result.log_posterior == pytest.approx(ll + model.log_prior(result.beta, prior), rel=1e-12)
            expected = ccd.kkt_max(result.beta, grad, prior, column)
            assert abs(result.gradient_norm - expected) <= 1e-10 * scale, f"seed {seed}, {kind}"
            assert expected > 1e-6  # not converged: a criterion that read zero would fail above


def test_refit_moved_equals_numpy_refits_from_the_previous_solution() -> None:
    # a moved replicate is refitted from its own state: = ccd.fit from its previous solution with the held value
    # changed; a replicate not moved stays as it was
    from kernels.sccs import gpu

    seed, data = _fresh()
    prior = _prior("normal", data.n_covariates)
    fit = ccd.fit(data, prior, TIGHT)
    fixed = np.array([0, 0, 3, 7])
    starts = np.tile(fit.beta, (4, 1))
    starts[np.arange(4), fixed] = fit.beta[fixed] + np.array([-0.25, 0.25, 0.5, -0.1])
    engine = gpu.BatchEngine(data, prior, TIGHT, capacity=4, state_gradient=True)
    first = engine.fit_batch(np.full(4, prior.variance), np.ones((4, data.n_cases)), starts, fixed_columns=fixed)
    values = np.array([fit.beta[0] - 0.6, np.nan, fit.beta[3] + 0.9, fit.beta[7] - 0.3])
    moved = engine.refit_moved(values)
    assert moved[1] is None
    for r in (0, 2, 3):
        start = first[r].beta.copy()
        start[fixed[r]] = values[r]
        host = ccd.fit(data, prior, TIGHT, beta0=start, fixed_column=int(fixed[r]))
        result = moved[r]
        assert result is not None and result.converged and result.beta[fixed[r]] == values[r]
        assert np.max(np.abs(result.beta - host.beta)) < 1e-8, f"seed {seed}, replicate {r}"
        assert result.log_posterior == pytest.approx(host.log_posterior, rel=1e-11, abs=1e-9), f"seed {seed}"
    # the frozen replicate was not touched: a further move of it starts from its first solution
    again = engine.refit_moved(np.array([np.nan, fit.beta[0] + 0.3, np.nan, np.nan]))
    start = first[1].beta.copy()
    start[0] = fit.beta[0] + 0.3
    host = ccd.fit(data, prior, TIGHT, beta0=start, fixed_column=0)
    assert again[1] is not None and np.max(np.abs(again[1].beta - host.beta)) < 1e-8


@pytest.mark.parametrize("kind", ["none", "normal", "laplace"])
def test_batched_profile_on_the_gpu_equals_numpy(kind: str) -> None:
    import cupy

    seed, data = _fresh(n_cases=3000, n_drugs=10)
    prior = _prior(kind, data.n_covariates)
    fit = ccd.fit(data, prior)
    columns = [0, 2, 5, 9]
    host = batched_profile_intervals(data, prior, fit, columns)
    device_data = data.to(cupy)
    device = batched_profile_intervals(device_data, prior, fit, columns)
    grouped = batched_profile_intervals(device_data, prior, fit, columns, capacity=3)  # three groups
    for reference, interval, in_groups in zip(host, device, grouped, strict=True):
        assert interval.maximum == pytest.approx(reference.maximum, abs=1e-9), f"seed {seed}"
        assert interval.estimate == pytest.approx(reference.estimate, abs=1e-8), f"seed {seed}"
        for end in ("lower", "upper"):
            assert getattr(interval, end) == pytest.approx(getattr(reference, end), abs=ROOT_TOLERANCE)
            assert getattr(in_groups, end) == pytest.approx(getattr(reference, end), abs=ROOT_TOLERANCE)
        # the same searches: the same number of points, at the same b and profile
        assert len(interval.points) == len(reference.points), f"seed {seed}"
        for (b, value), (b_ref, value_ref) in zip(interval.points, reference.points, strict=True):
            assert b == pytest.approx(b_ref, abs=ROOT_TOLERANCE) and value == pytest.approx(value_ref, abs=1e-7)


def test_the_searches_local_model_on_the_gpu_equals_numpys_and_repeats_bit_for_bit() -> None:
    # the first guesses' curvature and slope (fixed-order sums on the device) = NumPy's to 1e-10, and the same
    # bits twice (the searches, and so the profile points, are the same on every run)
    import cupy

    from kernels.sccs.profile import _local_model

    seed, data = _fresh(binary=False)
    device_data = data.to(cupy)
    beta = np.random.default_rng(seed).normal(0.0, 0.3, data.n_covariates)
    for kind in ("normal", "laplace"):
        prior = _prior(kind, data.n_covariates)
        host = _local_model(data, prior, beta, [0, 2, 5])
        device = _local_model(device_data, prior, beta, [0, 2, 5])
        again = _local_model(device_data, prior, beta, [0, 2, 5])
        for on_host, on_device, repeated in zip(host, device, again, strict=True):
            assert on_device == pytest.approx(on_host, rel=1e-10, abs=1e-9), f"seed {seed}, {kind}"
            assert on_device.tobytes() == repeated.tobytes()


def test_an_open_end_stays_open_on_the_gpu() -> None:
    import cupy

    data = data_with_a_drug_without_events()
    prior = Prior("none", 1.0, np.ones(4, dtype=bool))
    fit = ccd.fit(data, prior, FitOptions(tolerance=1e-8, convergence="gradient", max_iterations=5000))
    (host,) = batched_profile_intervals(data, prior, fit, [3, 1])[:1]
    device = batched_profile_intervals(data.to(cupy), prior, fit, [3, 1])
    assert host.lower is None and device[0].lower is None
    assert device[0].upper == pytest.approx(host.upper, abs=ROOT_TOLERANCE)
    assert device[1].lower is not None and device[1].upper is not None


def test_the_batched_profile_of_a_spline_study_on_the_gpu_equals_numpy() -> None:
    # the new coordinates of the spline block built on the device (= on the host), a drug searched in them and
    # a spline component in the original ones: the same ends as on NumPy
    import cupy

    from kernels.sccs import precondition as pre
    from tests.kernels.sccs.test_sccs_precondition import FIRST_DRUG, column_of, spline_study, study_prior

    data = spline_study()
    prior = study_prior(data, [FIRST_DRUG])
    fit = ccd.fit(data, prior)
    block = pre.dense_block(data, prior, fit.beta)
    device_data = data.to(cupy)
    device_block = pre.dense_block(device_data, prior, fit.beta)
    assert block is not None and device_block is not None
    assert np.array_equal(device_block.columns, block.columns)
    assert np.allclose(device_block.factor, block.factor, rtol=1e-10, atol=0)
    gamma = block.to_new(fit.beta)
    assert model.log_likelihood(pre.apply(device_data, device_block), gamma) == pytest.approx(
        model.log_likelihood(pre.apply(data, block), gamma), rel=1e-12
    )
    columns = [column_of(data, FIRST_DRUG), column_of(data, 102)]
    host = batched_profile_intervals(data, prior, fit, columns)
    device = batched_profile_intervals(device_data, prior, fit, columns)
    for reference, interval in zip(host, device, strict=True):
        assert interval.maximum == pytest.approx(reference.maximum, abs=1e-9)
        for end in ("lower", "upper"):
            assert getattr(interval, end) == pytest.approx(getattr(reference, end), abs=ROOT_TOLERANCE)
