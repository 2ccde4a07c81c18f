"""Many single-covariate SCCS analyses in one batch (issue 15, item 4; kernels/sccs/analyses.py) against an
independent reference: each covariate's one-column model built as its own data set, its conditional
log-likelihood from model.py (itself tested against statsmodels' Poisson GLM with case fixed effects) maximised
by SciPy, the likelihood-ratio interval's ends by Brent's method on it; binary and non-binary covariates, and an
exposure without exposed events (an infinite estimate with an open lower end)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize, stats

from kernels.sccs import model, synthetic
from kernels.sccs.analyses import single_covariate_fits
from kernels.sccs.data import from_coo


def _data(binary: bool, seed: int = 7):
    data = synthetic.generate(np, 800, 10, seed=seed, effect_share=1.0, effect_sd=0.6, min_eras=3, max_eras=8).data
    if binary:
        return data
    values = 0.5 + 1.5 * np.random.default_rng(seed).random(data.nnz)
    col = np.repeat(np.arange(data.n_covariates), np.diff(data.col_ptr))
    return from_coo(data.era_case, data.era_length, data.era_events, data.col_rows, col, values, data.n_covariates)


def _alone(data, column: int):
    """The data of covariate ``column`` alone: the same eras, only its nonzeros."""
    start, stop = int(data.col_ptr[column]), int(data.col_ptr[column + 1])
    rows = data.col_rows[start:stop]
    return from_coo(data.era_case, data.era_length, data.era_events, rows, np.zeros(rows.size, np.int64),
                    data.col_values[start:stop], 1)


def _reference(data, column: int, level: float) -> tuple[float, float, float, float]:
    single = _alone(data, column)

    def ll(b: float) -> float:
        return model.log_likelihood(single, np.array([b]))

    found = optimize.minimize_scalar(lambda b: -ll(b), bounds=(-8, 8), method="bounded", options={"xatol": 1e-11})
    top = -found.fun
    threshold = top - 0.5 * stats.chi2.ppf(level, 1)
    lower = optimize.brentq(lambda b: ll(b) - threshold, found.x - 20, found.x, xtol=1e-12)
    upper = optimize.brentq(lambda b: ll(b) - threshold, found.x, found.x + 20, xtol=1e-12)
    return float(found.x), lower, upper, top - ll(0.0)


@pytest.mark.parametrize(("binary", "level"), [(True, 0.95), (False, 0.9)])
def test_each_covariate_alone_matches_its_own_one_column_fit(binary: bool, level: float) -> None:
    data = _data(binary)
    columns = np.array([0, 3, 4, 9, 2])
    fits = single_covariate_fits(data, columns, level)
    for a, column in enumerate(columns):
        estimate, lower, upper, ratio = _reference(data, int(column), level)
        assert fits.estimate[a] == pytest.approx(estimate, abs=2e-6)
        assert fits.lower[a] == pytest.approx(lower, abs=1e-9) and fits.upper[a] == pytest.approx(upper, abs=1e-9)
        assert fits.log_likelihood_ratio[a] == pytest.approx(ratio, rel=1e-9, abs=1e-10)
        assert fits.p_value[a] == pytest.approx(stats.chi2.sf(2 * ratio, 1), rel=1e-6)


def test_an_exposure_without_exposed_events_has_an_infinite_estimate_and_an_open_lower_end() -> None:
    # three cases; covariate 0 is exposed only in eras without events, covariate 1 in eras with them
    era_case = np.array([0, 0, 1, 1, 2, 2, 2])
    length = np.array([10.0, 20.0, 15.0, 15.0, 5.0, 30.0, 10.0])
    events = np.array([0.0, 2.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    rows, cols = np.array([0, 3, 5, 1, 2, 6]), np.array([0, 0, 0, 1, 1, 1])
    data = from_coo(era_case, length, events, rows, cols, np.ones(6), 2)
    fits = single_covariate_fits(data, np.array([0, 1]))
    assert fits.estimate[0] == -np.inf and np.isnan(fits.lower[0])
    single = _alone(data, 0)
    sup = model.log_likelihood(single, np.array([-60.0]))  # the supremum, approached as b -> -inf
    threshold = sup - 0.5 * stats.chi2.ppf(0.95, 1)
    upper = optimize.brentq(lambda b: model.log_likelihood(single, np.array([b])) - threshold, -20, 20, xtol=1e-12)
    assert fits.upper[0] == pytest.approx(upper, abs=1e-9)
    assert np.isfinite(fits.estimate[1]) and fits.estimate[1] > 0


# -- the sccs_analyses job ---------------------------------------------------------------------------------


def _run(params: dict, frames: dict) -> tuple[dict, dict]:
    from kernels.context import local_context, run_kind
    from kernels.progress import LocalProgress
    from kernels.registry import get_kind

    progress = LocalProgress()
    base = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c"}
    result = run_kind(get_kind("sccs_analyses"), {**base, **params},
                      local_context(device="cpu", datasets=frames, progress=progress))
    return result, progress.artifacts


def test_analyses_job_fits_each_exposure_alone_and_calibrates_by_its_negative_controls() -> None:
    from kernels.sccs.tables import load_tables
    from tests.kernels.sccs.sccs_helpers import BIASED_ONLY, NEGATIVES, REAL, biased_study_tables

    frames = biased_study_tables()
    result, artifacts = _run({"negative_controls": NEGATIVES}, frames)
    rows = {row["covariate_id"]: row for row in result["analyses"]}
    assert [row["covariate_id"] for row in result["analyses"]] == list(range(1, 16))
    assert all(rows[c]["control"] == "negative" for c in NEGATIVES) and rows[REAL]["control"] is None
    data = load_tables(frames["outcomes_dataset_id"], frames["covariates_dataset_id"]).data
    for covariate in (1, BIASED_ONLY, REAL):  # each row is its covariate's one-column fit
        estimate, lower, upper, _ = _reference(data, covariate - 1, 0.95)
        assert rows[covariate]["estimate"] == pytest.approx(estimate, abs=2e-6)
        assert (rows[covariate]["ci_lower"], rows[covariate]["ci_upper"]) == pytest.approx((lower, upper), abs=1e-9)
    # every drug carries +0.5: alone, each also sees the others' windows in its baseline, so the null's mean is
    # a little lower; a drug biased only is significant raw, not calibrated; the RR-3 drug stays significant
    summary = result["calibration"]
    assert 0.25 < summary["null_mean"] < 0.6 and summary["negative_controls"] == 10
    assert rows[BIASED_ONLY]["p"] < 1e-3 and rows[BIASED_ONLY]["calibrated_p"] > 0.01
    assert rows[REAL]["calibrated_p"] < 1e-6 and rows[REAL]["calibrated_estimate"] > 0.5
    table = artifacts["analyses"]
    assert table["covariate_id"].tolist() == list(range(1, 16))
    assert table["calibrated_p"].tolist() == pytest.approx([rows[c]["calibrated_p"] for c in range(1, 16)])


def test_analyses_job_without_controls_and_with_chosen_exposures() -> None:
    from kernels.sccs.examples import cyclops_frames

    frames = cyclops_frames(n_cases=500, n_drugs=6, seed=3)
    result, _ = _run({"exposures": [5, 2]}, frames)
    assert [row["covariate_id"] for row in result["analyses"]] == [5, 2] and result["calibration"] is None
    assert all(row["calibrated_p"] is None and row["mdrr"] is not None for row in result["analyses"])
    with pytest.raises(ValueError, match="exposures: covariateId 9"):
        _run({"exposures": [9, 2]}, frames)


@pytest.mark.parametrize(("params", "message"), [
    ({"exposures": [1, 2], "negative_controls": [1, 3]}, "negative_controls: covariateId 3 is not among"),
    ({"negative_controls": [1]}, "at least 2"),
    ({"negative_controls": [1, 2], "positive_controls": [{"covariate_id": 2, "true_relative_risk": 2.0}]},
     "both a negative and a positive"),
    ({"positive_controls": [{"covariate_id": 2, "true_relative_risk": 2.0}]}, "need negative_controls"),
    ({"exposures": [1, 1]}, "twice"),
])
def test_analyses_spec_refuses_inconsistent_controls(params: dict, message: str) -> None:
    from pydantic import ValidationError

    from kernels.sccs.spec import SccsAnalysesParams

    with pytest.raises(ValidationError, match=message):
        SccsAnalysesParams.model_validate({"outcomes_dataset_id": "o", "covariates_dataset_id": "c", **params})
