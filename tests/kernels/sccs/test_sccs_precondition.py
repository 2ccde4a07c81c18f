"""New coordinates for the spline block (kernels/sccs/precondition.py): the same likelihood, an identity Hessian
block at the point they were made at, refits in a few cycles; and the batched profile that uses them gives the
host reference's intervals (which refits in the original coordinates) on a study with age and season splines."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.sccs import ccd, model, study
from kernels.sccs import precondition as pre
from kernels.sccs.data import SccsData, build_from_tables
from kernels.sccs.model import Prior
from kernels.sccs.profile import ROOT_TOLERANCE, batched_profile_intervals, profile_intervals

FIRST_DRUG = 1000


def spline_study(n_cases: int = 400, n_drugs: int = 8, seed: int = 5) -> SccsData:
    """Cases observed 300-700 days from 2015 with about 2 events each and 6 exposures of ``n_drugs`` drugs
    (covariateIds 1000, 1001, ...), each drug's window its days + 30, age (5 knots) and season (5 knots) splines:
    the eras of ``study.study_eras``."""
    g = np.random.default_rng(seed)
    start = 16_436 + g.integers(0, 365, n_cases)
    end = start + g.integers(300, 700, n_cases)
    event_case = g.integers(0, n_cases, 2 * n_cases)
    exposures = 6 * n_cases
    exposure_start = 16_436 + g.integers(-100, 1500, exposures)
    inputs = study.PersonInputs(
        np.arange(n_cases),
        start,
        end,
        event_case,
        start[event_case] + g.integers(0, 1000, event_case.size),
        g.integers(0, n_cases, exposures),
        FIRST_DRUG - 1 + g.integers(1, n_drugs + 1, exposures),
        exposure_start,
        exposure_start + g.integers(0, 60, exposures),
        g.integers(0, 25_000, n_cases),
    )
    design = study.Design(legacy=study.LegacyWindow(0, 30), age=study.Spline(5), season=study.Spline(5))
    t = study.study_eras(inputs, design).tables
    return build_from_tables(t.row_id, t.stratum_id, t.time, t.y, t.cov_row_id, t.cov_id, t.cov_value).data


def study_prior(data: SccsData, flat_drugs: list[int]) -> Prior:
    """Laplace on the other drugs; ``flat_drugs`` and the spline components unpenalised (as a study fits them)."""
    flat = np.isin(data.covariate_ids, flat_drugs) | np.isin(data.covariate_ids, np.asarray(study.RESERVED_IDS))
    return Prior("laplace", 0.1, ~flat)


def column_of(data: SccsData, covariate_id: int) -> int:
    return int(np.flatnonzero(data.covariate_ids == covariate_id)[0])


def test_new_coordinates_keep_the_likelihood_and_whiten_the_block() -> None:
    data = spline_study()
    prior = study_prior(data, [FIRST_DRUG])
    fit = ccd.fit(data, prior)
    block = pre.dense_block(data, prior, fit.beta)
    assert block is not None
    assert sorted(data.covariate_ids[block.columns].tolist()) == [100, 101, 102, 103, 104, 201, 202, 203]
    new = pre.apply(data, block)
    assert new.covariate_ids.tolist() == data.covariate_ids.tolist()
    rng = np.random.default_rng(1)
    for _ in range(3):
        beta = fit.beta + rng.normal(0.0, 0.3, data.n_covariates)
        gamma = block.to_new(beta)
        assert np.allclose(block.to_original(gamma), beta, rtol=0, atol=1e-12)
        assert model.log_likelihood(new, gamma) == pytest.approx(model.log_likelihood(data, beta), rel=1e-12)
        assert model.log_prior(gamma, prior) == pytest.approx(model.log_prior(beta, prior), rel=1e-14)
    # in the new coordinates the block's Hessian at the point is the identity; it was far from it before
    at = block.to_new(fit.beta)
    assert np.allclose(pre.hessian_block(new, at, block.columns), np.eye(block.columns.size), atol=1e-9)
    before = np.linalg.eigvalsh(pre.hessian_block(data, fit.beta, block.columns))
    assert before[-1] / before[0] > 100
    # so a refit after moving a drug's coefficient takes a few cycles instead of tens, to the same posterior
    options = ccd.FitOptions(tolerance=1e-8, convergence="gradient", max_iterations=5000)
    drug = column_of(data, FIRST_DRUG)
    start = fit.beta.copy()
    start[drug] += 0.25
    raw = ccd.fit(data, prior, options, beta0=start, fixed_column=drug)
    fast = ccd.fit(new, prior, options, beta0=block.to_new(start), fixed_column=drug)
    assert fast.iterations <= 10 < 30 <= raw.iterations
    assert fast.log_posterior == pytest.approx(raw.log_posterior, abs=1e-9)


def test_no_block_without_two_dense_unpenalised_columns() -> None:
    data = spline_study()
    everything_penalised = Prior("normal", 0.5, np.ones(data.n_covariates, dtype=bool))
    assert pre.dense_block(data, everything_penalised, np.zeros(data.n_covariates)) is None
    one_flat = np.ones(data.n_covariates, dtype=bool)
    one_flat[column_of(data, 101)] = False
    assert pre.dense_block(data, Prior("normal", 0.5, one_flat), np.zeros(data.n_covariates)) is None


@pytest.mark.slow
def test_the_batched_profile_of_a_spline_study_equals_the_host_path() -> None:
    # a drug searched in the new coordinates and a spline component (a column of the block: searched in the
    # original ones, after the others): both ends of both = the host reference's to the root's tolerance
    data = spline_study()
    prior = study_prior(data, [FIRST_DRUG])
    fit = ccd.fit(data, prior)
    columns = [column_of(data, FIRST_DRUG), column_of(data, 102)]
    host = profile_intervals(data, prior, fit, columns)
    batched = batched_profile_intervals(data, prior, fit, columns)
    for reference, interval in zip(host, batched, strict=True):
        assert interval.covariate == reference.covariate
        # both maxima stop at a KKT residual of 1e-8: the posterior agrees to ~1e-12, a spline component's
        # coefficient (along a direction of curvature ~1e-2) to ~1e-6
        assert interval.maximum == pytest.approx(reference.maximum, abs=1e-9)
        assert interval.estimate == pytest.approx(reference.estimate, abs=1e-5)
        for end in ("lower", "upper"):
            assert getattr(reference, end) is not None
            assert getattr(interval, end) == pytest.approx(getattr(reference, end), abs=ROOT_TOLERANCE)
