"""sccs_fit with ``precondition: splines`` (kernels/sccs/precondition.py FitCoordinates): the fits run in whitened
coordinates of the spline block and every reported number comes back in the original ones. Checked against the
same job with the switch off (to the fit tolerance), statsmodels' Poisson GLM with case dummies (an independent
fit), independent recomputations of the mapped numbers, and the fan-out (chunks == the single run, bit for bit)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from kernels.context import local_context, run_kind
from kernels.progress import LocalProgress
from kernels.registry import get_kind
from kernels.sccs import bootstrap, model, study, synthetic
from kernels.sccs import precondition as pre
from kernels.sccs.data import SccsData, build_from_tables
from kernels.sccs.fit_plan import FitPlan
from kernels.sccs.fit_profiles import default_profiled
from kernels.sccs.model import Prior
from kernels.sccs.spec import SccsParams
from tests.kernels.sccs.test_sccs_chunks import assert_same_artifacts, chunked_run, single_run
from tests.kernels.sccs.test_sccs_precondition import FIRST_DRUG, spline_study

SPLINE_IDS = [100, 101, 102, 103, 104, 201, 202, 203]
DATASETS = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c"}
# Both runs stop at a KKT residual of 1e-8 (in their own coordinates): their posteriors' maxima then agree to
# ~1e-12 and the coefficients to ~1e-8 / (the smallest curvature, 5.6e-3 along a spline direction) ~ 2e-6.
TIGHT = {"convergence": "gradient", "tolerance": 1e-8, "max_iterations": 5000}
COEFFICIENT_TOLERANCE = 1e-5
STUDY_JOB: dict[str, Any] = {
    **DATASETS,
    "prior": {"type": "laplace", "variance": 0.1, "exclude": [FIRST_DRUG, *SPLINE_IDS]},
    "cross_validation": {"folds": 3, "grid": [0.3, 1.0, 3.0], "seed": 7},  # a curve without near-ties
    "bootstrap": {"replicates": 8, "seed": 3},
    "profile": {"covariates": [FIRST_DRUG, 102]},
    "diagnostics": None,
}


def frames_of(data: SccsData) -> dict[str, pd.DataFrame]:
    tables = synthetic.to_tables(data)
    return {
        "outcomes_dataset_id": pd.DataFrame(
            {"rowId": tables.row_id, "stratumId": tables.stratum_id, "time": tables.time, "y": tables.y}
        ),
        "covariates_dataset_id": pd.DataFrame(
            {"rowId": tables.cov_row_id, "covariateId": tables.cov_id, "covariateValue": tables.cov_value}
        ),
    }


def run(job: dict[str, Any], frames: dict[str, pd.DataFrame], xp: Any = np) -> tuple[dict, LocalProgress]:
    progress = LocalProgress()
    result = run_kind(get_kind("sccs_fit"), job, local_context(xp=xp, datasets=frames, progress=progress))
    return result, progress


def column(result: dict, field: str) -> np.ndarray:
    return np.array([np.nan if c[field] is None else c[field] for c in result["coefficients"]], dtype=float)


@pytest.fixture(scope="module")
def study_frames() -> dict[str, pd.DataFrame]:
    return frames_of(spline_study())


@pytest.fixture(scope="module")
def both_runs(study_frames: dict[str, pd.DataFrame]) -> dict[str, tuple[dict, LocalProgress]]:
    return {setting: run({**STUDY_JOB, **TIGHT, "precondition": setting}, study_frames)
            for setting in ("none", "splines")}  # fmt: skip


def test_the_switch_is_off_by_default_and_named() -> None:
    assert SccsParams.model_validate(DATASETS).precondition == "none"
    assert SccsParams.model_validate({**DATASETS, "precondition": "splines"}).precondition == "splines"
    with pytest.raises(ValidationError, match="precondition"):
        SccsParams.model_validate({**DATASETS, "precondition": "all"})


@pytest.mark.slow
def test_switch_on_gives_the_switch_off_answers_to_the_fit_tolerance(both_runs: dict) -> None:
    (off, off_progress), (on, on_progress) = both_runs["none"], both_runs["splines"]
    assert on["variance"] == off["variance"]
    np.testing.assert_allclose(column(on, "estimate"), column(off, "estimate"), rtol=0, atol=COEFFICIENT_TOLERANCE)
    # The posterior is flat at its maximum (second order in the coefficients' ~1e-6 difference); the likelihood is
    # not (its gradient there is the prior's, sqrt(2 / variance) on a non-zero Laplace coefficient): first order.
    assert on["log_posterior"] == pytest.approx(off["log_posterior"], rel=0, abs=1e-9)
    assert on["log_likelihood"] == pytest.approx(off["log_likelihood"], rel=0, abs=1e-6)
    assert on["nonzero_coefficients"] == off["nonzero_coefficients"]
    for end in ("ci_lower", "ci_upper"):  # the same replicates, each refitted to the tolerance
        np.testing.assert_allclose(column(on, end), column(off, end), rtol=0, atol=COEFFICIENT_TOLERANCE)
    for end in ("profile_ci_lower", "profile_ci_upper"):  # the profile refits the maximum (to 1e-8) from either
        np.testing.assert_allclose(column(on, end), column(off, end), rtol=0, atol=1e-8, equal_nan=True)
    for point_on, point_off in zip(on["cv_curve"], off["cv_curve"], strict=True):
        assert point_on["predictive_log_likelihood"] == pytest.approx(point_off["predictive_log_likelihood"], abs=1e-7)
    boot_on, boot_off = on_progress.artifacts["bootstrap_estimates"], off_progress.artifacts["bootstrap_estimates"]
    np.testing.assert_allclose(boot_on["estimates"], boot_off["estimates"], rtol=0, atol=COEFFICIENT_TOLERANCE)
    cv_on = on_progress.artifacts["cv_predictive_log_likelihood"]
    cv_off = off_progress.artifacts["cv_predictive_log_likelihood"]
    np.testing.assert_allclose(cv_on["coefficients"], cv_off["coefficients"], rtol=0, atol=COEFFICIENT_TOLERANCE)
    np.testing.assert_array_equal(on_progress.artifacts["coefficients"]["estimate"], column(on, "estimate"))
    # and it ran in the new coordinates: a few cycles per fit where the original ones take tens
    assert on["iterations"] <= 10 < 30 <= off["iterations"]
    assert boot_on["iterations"].sum() * 5 < boot_off["iterations"].sum()
    assert cv_on["iterations"].sum() * 5 < cv_off["iterations"].sum()


def test_reported_gradient_norms_are_the_original_coordinates_kkt_residuals(both_runs: dict) -> None:
    """Recomputed from scratch on the original data at the reported coefficients (NumPy's model.py)."""
    on, progress = both_runs["splines"]
    data = spline_study()  # the data the job's tables were written from (same columns, eras and cases)
    assert [c["covariate_id"] for c in on["coefficients"]] == data.covariate_ids.tolist()
    prior = Prior("laplace", on["variance"], ~np.isin(data.covariate_ids, [FIRST_DRUG, *SPLINE_IDS]))

    def kkt(beta: np.ndarray, weights: np.ndarray | None) -> float:
        return float(model.kkt_residual(beta, model.gradient(data, beta, weights), prior).max())

    assert on["gradient_norm"] == pytest.approx(kkt(column(on, "estimate"), None), rel=1e-6, abs=1e-13)
    boot = progress.artifacts["bootstrap_estimates"]
    replicates = STUDY_JOB["bootstrap"]["replicates"]
    weights = bootstrap.case_weights(np, data.n_cases, 0, replicates, STUDY_JOB["bootstrap"]["seed"])
    for replicate in range(replicates):
        expected = kkt(boot["estimates"][replicate], weights[replicate])
        assert boot["gradient_norm"][replicate] == pytest.approx(expected, rel=1e-6, abs=1e-13)


def test_centred_new_coordinates_keep_the_likelihood_and_its_gradient() -> None:
    data = spline_study()
    prior = Prior("laplace", 0.1, ~np.isin(data.covariate_ids, [FIRST_DRUG, *SPLINE_IDS]))
    coordinates = pre.fit_coordinates(data, prior)
    assert coordinates is not None
    block, new = coordinates.block, coordinates.data
    assert sorted(data.covariate_ids[block.columns].tolist()) == SPLINE_IDS
    # the new block's values are within-case deviations: each case's length-weighted mean is 0
    dense = np.zeros((new.n_eras, block.columns.size))
    for a, j in enumerate(block.columns.tolist()):
        dense[new.col_rows[new.col_ptr[j] : new.col_ptr[j + 1]], a] = new.col_values[
            new.col_ptr[j] : new.col_ptr[j + 1]
        ]
    np.testing.assert_allclose(pre.case_means(new, dense), 0.0, atol=1e-12)
    generator = np.random.default_rng(3)
    weights = generator.integers(0, 3, data.n_cases).astype(np.float64)
    for _ in range(3):
        beta = generator.normal(0.0, 0.5, data.n_covariates)
        gamma = block.to_new(beta)
        assert model.log_likelihood(new, gamma, weights) == pytest.approx(
            model.log_likelihood(data, beta, weights), rel=1e-12
        )
        np.testing.assert_allclose(
            coordinates.original_gradient(model.gradient(new, gamma, weights)),
            model.gradient(data, beta, weights),
            rtol=1e-9,
            atol=1e-9,
        )
    # and the block's Hessian there at b = 0 is the identity
    np.testing.assert_allclose(
        pre.hessian_block(new, np.zeros(new.n_covariates), block.columns), np.eye(block.columns.size), atol=1e-9
    )


def test_a_tight_gradient_rule_is_met_in_a_few_cycles(study_frames: dict[str, pd.DataFrame]) -> None:
    """Centred, the new coordinates have no rounding floor above 1e-10 here (uncentred, the incremental case sums
    of fits from 0 stalled near 5e-9 and cycled to the cap: the reason for the centring)."""
    job = {**STUDY_JOB, "profile": None, "convergence": "gradient", "tolerance": 1e-10, "max_iterations": 200}
    result, progress = run({**job, "precondition": "splines"}, study_frames)
    cv_fits, boot = progress.artifacts["cv_predictive_log_likelihood"], progress.artifacts["bootstrap_estimates"]
    assert result["converged"] and cv_fits["converged"].all() and boot["converged"].all()
    assert max(result["iterations"], cv_fits["iterations"].max(), boot["iterations"].max()) <= 20


@pytest.mark.slow
def test_whitened_fit_equals_statsmodels_poisson_with_case_dummies() -> None:
    """The spline-study GLM reference of test_sccs_study.py, fitted by sccs_fit in the new coordinates."""
    import statsmodels.api as sm

    from tests.kernels.sccs.test_sccs_study import _glm_person_inputs, reference_study_eras

    inputs = _glm_person_inputs(31, 120)
    exposures = (
        study.Exposure((1,), (study.Window(0, "exposure_start", 0, "exposure_end", 1000, "on"),)),
        study.Exposure((2,), (study.Window(0, "exposure_start", 14, "exposure_start", 1001, "risk"),)),
    )
    design = study.Design(exposures=exposures, age=study.Spline((8000.0, 12000.0, 16000.0, 21000.0)),
                          season=study.Spline(5))  # fmt: skip
    built = study.study_eras(inputs, design)
    tables = built.tables
    data = build_from_tables(tables.row_id, tables.stratum_id, tables.time, tables.y, tables.cov_row_id,
                             tables.cov_id, tables.cov_value).data  # fmt: skip
    job = {**DATASETS, "prior": {"type": "none"}, "diagnostics": None, **TIGHT, "tolerance": 1e-9}
    result, _ = run({**job, "precondition": "splines"}, frames_of(data))
    coordinates = pre.fit_coordinates(data, Prior("none", 1.0, np.ones(data.n_covariates, dtype=bool)))
    assert coordinates is not None and set(data.covariate_ids[coordinates.block.columns]) >= {100, 101, 201, 202}

    rows = reference_study_eras(inputs, design, built.knots)
    ids = data.covariate_ids.tolist()
    dense = np.zeros((len(rows), len(ids)))
    for r, (_, _, _, entries) in enumerate(rows):
        for covariate, value in entries:
            dense[r, ids.index(covariate)] = value
    cases = np.unique([r[0] for r in rows], return_inverse=True)[1]
    dummies = (cases[:, None] == np.arange(cases.max() + 1)[None, :]).astype(float)
    glm = sm.GLM(np.array([r[2] for r in rows], float), np.hstack([dense, dummies]), family=sm.families.Poisson(),
                 offset=np.log([r[1] for r in rows])).fit(tol=1e-13, maxiter=300)  # fmt: skip
    assert result["converged"]
    np.testing.assert_allclose(column(result, "estimate"), glm.params[: len(ids)], rtol=0, atol=1e-6)


def test_no_dense_unpenalised_block_fits_in_the_original_coordinates_with_the_same_bits(
    study_frames: dict[str, pd.DataFrame],
) -> None:
    # Every spline component penalised: nothing to whiten, so the switch changes nothing at all.
    job = {**STUDY_JOB, "prior": {"type": "normal", "variance": 0.5}, "profile": None, "bootstrap": {"replicates": 3}}
    off, off_progress = run({**job, "precondition": "none"}, study_frames)
    on, on_progress = run({**job, "precondition": "splines"}, study_frames)
    assert {k: v for k, v in on.items() if k != "timings"} == {k: v for k, v in off.items() if k != "timings"}
    assert_same_artifacts(on_progress, off_progress)


def test_coordinates_are_made_once_and_only_when_a_fit_needs_them(study_frames: dict[str, pd.DataFrame]) -> None:
    params = SccsParams.model_validate({**STUDY_JOB, **TIGHT, "precondition": "splines"})
    ctx = local_context(xp=np, datasets=study_frames)
    plan = FitPlan.load(params, ctx)
    assert "precondition" not in ctx.timer.seconds  # a fanned-out job's finish that fits nothing makes none
    fitter = plan.fitter(2)
    coordinates = plan.coordinates
    assert coordinates is not None and plan.fit_data is coordinates.data and "precondition" in ctx.timer.seconds
    starts = np.zeros((2, plan.data.n_covariates))
    starts[1, coordinates.block.columns] = 0.1
    fits = fitter(np.array([0.1, 0.1]), np.ones((2, plan.data.n_cases)), starts, None)
    for fit in fits:  # the log-likelihood is the original data's at the returned (original) coefficients
        assert fit.log_likelihood == pytest.approx(model.log_likelihood(plan.data, fit.beta), rel=1e-12)
    assert math.isclose(fits[0].log_posterior, fits[1].log_posterior, rel_tol=1e-12)  # one MAP from both starts
    # a start is taken in the original coordinates: from the maximum, the refit stops after its first cycle
    again = fitter(np.array([0.1]), np.ones((1, plan.data.n_cases)), fits[0].beta[None, :], None)[0]
    assert again.iterations == 1
    np.testing.assert_allclose(again.beta, fits[0].beta, rtol=0, atol=1e-6)


SPLIT_CASES: dict[str, dict[str, Any]] = {
    "cross_validation": {"cross_validation": {"folds": 4, "grid": [0.02, 0.2, 2.0], "seed": 4},
                         "bootstrap": {"replicates": 5, "seed": 3}},
    "bootstrap": {"bootstrap": {"replicates": 23, "seed": 1}},
}  # fmt: skip


def split_params(split: str) -> SccsParams:
    prior = {"type": "laplace", "variance": 0.3, "exclude": [FIRST_DRUG, *SPLINE_IDS]}
    return SccsParams.model_validate(
        {**DATASETS, "prior": prior, "precondition": "splines", "diagnostics": None, **SPLIT_CASES[split]}
    )


@pytest.mark.parametrize("split", sorted(SPLIT_CASES))
@pytest.mark.parametrize("n_chunks", [2, 3])
def test_chunked_run_with_the_switch_equals_the_single_run_exactly(
    study_frames: dict[str, pd.DataFrame], split: str, n_chunks: int
) -> None:
    params = split_params(split)
    single, single_progress = single_run(params, study_frames)
    chunked, chunked_progress, _ = chunked_run(params, study_frames, n_chunks, order_seed=n_chunks)
    assert chunked == single
    assert_same_artifacts(single_progress, chunked_progress)
    for left, right in zip(single["coefficients"], chunked["coefficients"], strict=True):
        assert np.float64(left["estimate"]).tobytes() == np.float64(right["estimate"]).tobytes()


# -- the GPU ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_fit_with_the_switch_equals_numpy(study_frames: dict[str, pd.DataFrame]) -> None:
    cp = pytest.importorskip("cupy")
    job = {**STUDY_JOB, "precondition": "splines", "profile": None}
    host, host_progress = run(job, study_frames)
    device, device_progress = run(job, study_frames, cp)
    assert device["device"] != "cpu" and device["variance"] == host["variance"]
    np.testing.assert_allclose(column(device, "estimate"), column(host, "estimate"), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(column(device, "ci_lower"), column(host, "ci_lower"), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(column(device, "ci_upper"), column(host, "ci_upper"), rtol=1e-9, atol=1e-12)
    assert device["log_likelihood"] == pytest.approx(host["log_likelihood"], rel=1e-12)
    assert device["gradient_norm"] == pytest.approx(host["gradient_norm"], rel=1e-6, abs=1e-12)
    for artifact in ("bootstrap_estimates", "cv_predictive_log_likelihood"):
        np.testing.assert_array_equal(device_progress.artifacts[artifact]["iterations"],
                                      host_progress.artifacts[artifact]["iterations"])  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("split", sorted(SPLIT_CASES))
def test_chunked_gpu_run_with_the_switch_equals_the_single_gpu_run_exactly(
    study_frames: dict[str, pd.DataFrame], split: str
) -> None:
    """Needs the GPU fit to give the same bits on every run (fixed-order sums) and the coordinates to be the same
    in every chunk (their Hessian's case sums in a fixed order too)."""
    cp = pytest.importorskip("cupy")
    params = split_params(split)
    single, single_progress = single_run(params, study_frames, cp)
    again, again_progress = single_run(params, study_frames, cp)
    assert again == single
    assert_same_artifacts(single_progress, again_progress)
    chunked, chunked_progress, _ = chunked_run(params, study_frames, 3, order_seed=3, xp=cp)
    assert chunked == single
    assert_same_artifacts(single_progress, chunked_progress)


def test_default_profile_leaves_out_the_spline_components_but_not_controls() -> None:
    ids = [*SPLINE_IDS, 1000, 1001, 7]
    assert default_profiled(ids) == [1000, 1001, 7]
    assert default_profiled(ids, {101, 1001}) == [101, 1000, 1001, 7]  # a control is the null's data: profiled
    assert default_profiled([100, 150, 399]) == [100, 150, 399]  # the user's own ids in that range: all of them
    assert default_profiled([99, 400]) == [99, 400]


def test_a_job_without_profile_covariates_profiles_the_exposures_of_a_spline_study(
    study_frames: dict[str, pd.DataFrame],
) -> None:
    job = {**STUDY_JOB, "cross_validation": None, "bootstrap": None, "profile": {}, "precondition": "splines"}
    result, progress = run(job, study_frames)
    exposures = [c["covariate_id"] for c in result["coefficients"] if c["covariate_id"] not in SPLINE_IDS]
    assert len(exposures) == 8 and min(exposures) == FIRST_DRUG
    assert sorted(set(progress.artifacts["profile_curves"]["covariateId"])) == exposures
    for coefficient in result["coefficients"]:
        profiled = coefficient["profile_ci_lower"] is not None
        assert profiled == (coefficient["covariate_id"] in exposures), coefficient["covariate_id"]
