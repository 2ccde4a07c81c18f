"""Several outcomes in one job (issue 15, item 4; kernels/sccs/outcomes.py): ``sccs_eras`` with ``outcomeId`` in
the events stacks one era build per outcome; ``sccs_analyses`` fits every exposure-outcome pair of the stacked
tables and calibrates over all of them; ``sccs_fit`` fits the outcome it is given.

References: the analyses of stacked tables against one single-outcome job on the same tables merged by hand
(outcome 2's strata and covariateIds renamed apart, so every pair is an ordinary covariate there) — estimates,
intervals, p-values and the calibration must agree; and each outcome's fit against the fit of its own tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from kernels.context import local_context, run_kind
from kernels.progress import LocalProgress
from kernels.sccs import jobs, synthetic
from kernels.sccs.outcomes import pair_columns, select_outcome
from kernels.sccs.spec import SccsAnalysesParams, SccsParams

KINDS = {kind.name: kind for kind in jobs.KINDS}
OFFSET = 1000  # outcome 2's covariateIds in the hand-merged reference


def _tables(seed: int, n_cases: int, n_drugs: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    data = synthetic.generate(np, n_cases, n_drugs, seed=seed, effect_share=0.5, effect_sd=0.5, min_eras=3,
                              max_eras=8).data
    t = synthetic.to_tables(data)
    return (pd.DataFrame({"rowId": t.row_id, "stratumId": t.stratum_id, "time": t.time, "y": t.y}),
            pd.DataFrame({"rowId": t.cov_row_id, "covariateId": t.cov_id, "covariateValue": t.cov_value}))


def _stacked() -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """Two outcomes' tables (outcome 2 with fewer drugs); their strata numbers overlap on purpose."""
    return {"1": _tables(3, 400, 12), "2": _tables(4, 300, 8)}


def _stack(parts: dict[str, tuple[pd.DataFrame, pd.DataFrame]], rename_apart: bool) -> dict[str, pd.DataFrame]:
    outcomes, covariates, offset = [], [], 0
    for number, (name, (rows, entries)) in enumerate(parts.items()):
        rows, entries = rows.copy(), entries.copy()
        rows["rowId"] += offset
        entries["rowId"] += offset
        offset = int(rows["rowId"].max()) + 1
        if rename_apart:
            rows["stratumId"] += number * 10**6
            entries["covariateId"] += number * OFFSET
        else:
            rows["outcomeId"] = int(name)
        outcomes.append(rows)
        covariates.append(entries)
    return {"outcomes_dataset_id": pd.concat(outcomes, ignore_index=True),
            "covariates_dataset_id": pd.concat(covariates, ignore_index=True)}


def _run(kind: str, params: dict, frames: dict[str, pd.DataFrame], progress: LocalProgress | None = None) -> dict:
    return run_kind(KINDS[kind], params, local_context("cpu", datasets=frames, progress=progress))


def _ids(frames: dict[str, str]) -> dict[str, str]:
    return {field: "d" for field in frames}


def test_pairs_of_stacked_tables_equal_a_hand_merged_single_outcome_job() -> None:
    parts = _stacked()
    stacked, merged = _stack(parts, rename_apart=False), _stack(parts, rename_apart=True)
    negatives = [{"covariate_id": 5, "outcome_id": 1}, {"covariate_id": 6, "outcome_id": 1},
                 {"covariate_id": 7, "outcome_id": 2}, 8]  # 8: a negative control with every outcome
    positives = [{"covariate_id": 2, "outcome_id": 2, "true_relative_risk": 2.0}]
    result = _run("sccs_analyses", {**_ids(stacked), "negative_controls": negatives,
                                    "positive_controls": positives}, stacked)
    reference = _run("sccs_analyses", {
        **_ids(merged), "negative_controls": [5, 6, OFFSET + 7, 8, OFFSET + 8],
        "positive_controls": [{"covariate_id": OFFSET + 2, "true_relative_risk": 2.0}]}, merged)
    assert result["n_outcomes"] == 2 and reference["n_outcomes"] is None
    assert result["n_cases"] == reference["n_cases"] and result["n_eras"] == reference["n_eras"]
    rows, expected = result["analyses"], reference["analyses"]
    assert [(r["outcome_id"], r["covariate_id"]) for r in rows] == [
        (1 if e["covariate_id"] < OFFSET else 2, e["covariate_id"] % OFFSET) for e in expected]
    assert sum(r["control"] == "negative" for r in rows) == 5
    assert [r["control"] for r in rows] == [e["control"] for e in expected]
    for row, other in zip(rows, expected, strict=True):
        for field in ("estimate", "ci_lower", "ci_upper", "p", "log_likelihood_ratio", "mdrr", "calibrated_p",
                      "calibrated_ci_lower", "calibrated_ci_upper"):
            if other[field] is None:
                assert row[field] is None, field
            else:
                assert row[field] == pytest.approx(other[field], rel=1e-9, abs=1e-12), field
        assert row["exposed_cases"] == other["exposed_cases"] and row["events"] == other["events"]
    for field in ("null_mean", "null_sd"):
        assert result["calibration"][field] == pytest.approx(reference["calibration"][field], rel=1e-9)


def test_pairs_outcome_ids_and_order() -> None:
    stacked = _stack(_stacked(), rename_apart=False)
    only_two = _run("sccs_analyses", {**_ids(stacked), "outcome_ids": [2], "exposures": [3, 1]}, stacked)
    assert [(r["outcome_id"], r["covariate_id"]) for r in only_two["analyses"]] == [(2, 3), (2, 1)]
    pairs = _run("sccs_analyses", {**_ids(stacked), "pairs": [{"covariate_id": 11, "outcome_id": 1},
                                                              {"covariate_id": 2}]}, stacked)
    assert [(r["outcome_id"], r["covariate_id"]) for r in pairs["analyses"]] == [(1, 11), (1, 2), (2, 2)]
    # Outcome 2 has drugs 1-8 only: drug 11 is analysed with outcome 1 alone.
    every = _run("sccs_analyses", _ids(stacked), stacked)
    assert len(every["analyses"]) == 12 + 8
    with pytest.raises(ValueError, match=r"pairs\.0: covariateId 11 has no era with outcome 2"):
        _run("sccs_analyses", {**_ids(stacked), "pairs": [{"covariate_id": 11, "outcome_id": 2}]}, stacked)
    with pytest.raises(ValueError, match="outcome_ids: 3 is not an outcomeId"):
        _run("sccs_analyses", {**_ids(stacked), "outcome_ids": [3]}, stacked)
    with pytest.raises(ValueError, match="negative_controls: 1 analysed pair"):
        _run("sccs_analyses", {**_ids(stacked), "negative_controls": [{"covariate_id": 11, "outcome_id": 1},
                                                                      {"covariate_id": 11, "outcome_id": 2}]}, stacked)


def test_analyses_of_one_outcome_tables_refuse_outcome_ids() -> None:
    rows, entries = _tables(3, 200, 5)
    frames = {"outcomes_dataset_id": rows, "covariates_dataset_id": entries}
    with pytest.raises(ValueError, match="outcome_ids: the outcomes table has no outcomeId column"):
        _run("sccs_analyses", {**_ids(frames), "outcome_ids": [1]}, frames)
    params = SccsAnalysesParams.model_validate({**_ids(frames), "outcome_ids": [1]})
    problems = params.dataset_column_problems({"outcomes_dataset_id": ["rowId", "stratumId", "time", "y"],
                                               "covariates_dataset_id": ["rowId", "covariateId"]})
    assert problems and problems[0][0] == "outcomes_dataset_id" and "outcomeId" in problems[0][1]


def test_spec_refuses_pairs_with_exposures_and_repeated_pairs() -> None:
    base = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c"}
    with pytest.raises(ValidationError, match="not both"):
        SccsAnalysesParams.model_validate({**base, "pairs": [{"covariate_id": 1}], "exposures": [1]})
    with pytest.raises(ValidationError, match="pairs lists a pair twice"):
        SccsAnalysesParams.model_validate({**base, "pairs": [{"covariate_id": 1, "outcome_id": 2}] * 2})
    with pytest.raises(ValidationError, match="negative_controls lists a pair twice"):
        SccsAnalysesParams.model_validate({**base, "negative_controls": [3, {"covariate_id": 3}]})


def test_fit_of_one_outcome_of_stacked_tables_equals_the_fit_of_its_tables() -> None:
    parts = _stacked()
    stacked = _stack(parts, rename_apart=False)
    prior = {"type": "normal", "variance": 2.0}
    result = _run("sccs_fit", {**_ids(stacked), "outcome_id": 2, "prior": prior, "diagnostics": None}, stacked)
    rows, entries = parts["2"]
    alone = {"outcomes_dataset_id": rows, "covariates_dataset_id": entries}
    reference = _run("sccs_fit", {**_ids(alone), "prior": prior, "diagnostics": None}, alone)
    got = {c["covariate_id"]: c["estimate"] for c in result["coefficients"]}
    want = {c["covariate_id"]: c["estimate"] for c in reference["coefficients"]}
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-10, abs=1e-12)
    with pytest.raises(ValueError, match="holds 2 outcomes"):
        _run("sccs_fit", {**_ids(stacked), "prior": prior, "diagnostics": None}, stacked)
    with pytest.raises(ValueError, match="outcome_id: 5 is not an outcomeId"):
        _run("sccs_fit", {**_ids(stacked), "outcome_id": 5, "diagnostics": None}, stacked)
    with pytest.raises(ValueError, match="no outcomeId column"):
        _run("sccs_fit", {**_ids(alone), "outcome_id": 1, "diagnostics": None}, alone)
    params = SccsParams.model_validate({**_ids(alone), "outcome_id": 1})
    assert params.dataset_column_problems({"outcomes_dataset_id": ["rowId", "stratumId", "time", "y"]})


def test_pair_columns_keep_strata_apart_and_name_pairs() -> None:
    columns = {"row_id": np.array([10, 11, 12, 13]), "stratum_id": np.array([1, 1, 1, 2]),
               "time": np.ones(4), "y": np.ones(4), "cov_row_id": np.array([13, 10, 12, 11]),
               "cov_id": np.array([7, 7, 7, 9]), "cov_value": np.ones(4)}
    pairs = pair_columns(columns, np.array([1, 1, 2, 2]))
    # rows 10, 11 are outcome 1's stratum 1; row 12 outcome 2's stratum 1 (another stratum); row 13 stratum 2.
    assert pairs.columns["stratum_id"].tolist() == [0, 0, 1, 2]
    assert list(zip(pairs.outcome.tolist(), pairs.covariate.tolist(), strict=True)) == [(1, 7), (1, 9), (2, 7)]
    assert pairs.columns["cov_id"].tolist() == [2, 0, 2, 1]
    with pytest.raises(ValueError, match="covariates rowId 99 is not a rowId"):
        pair_columns({**columns, "cov_row_id": np.array([13, 10, 12, 99])}, np.array([1, 1, 2, 2]))
    frame = pd.DataFrame({"rowId": [1, 2], "outcomeId": [1.5, 2.0]})
    with pytest.raises(ValueError, match="outcomeId must hold integers: row 1"):
        select_outcome(frame, pd.DataFrame({"rowId": [1]}), 1)


def _person(seed: int = 5, n: int = 400) -> dict[str, pd.DataFrame]:
    g = np.random.default_rng(seed)
    start = g.integers(0, 300, n)
    end = start + g.integers(200, 700, n)
    event_case = g.integers(0, n, 2 * n)
    events = pd.DataFrame({"caseId": event_case, "day": start[event_case] + g.integers(-20, 650, event_case.size),
                           "outcomeId": g.choice([3, 8], event_case.size, p=[0.7, 0.3])})
    m = 3 * n
    exposure_start = g.integers(0, 900, m)
    return {
        "cases_dataset_id": pd.DataFrame({"caseId": np.arange(n), "observationStart": start, "observationEnd": end,
                                          "ageAtObsStart": g.integers(300, 25_000, n)}),
        "events_dataset_id": events,
        "exposures_dataset_id": pd.DataFrame({"caseId": g.integers(0, n, m), "drugId": g.integers(1, 5, m),
                                              "start": exposure_start, "end": exposure_start + g.integers(0, 40, m)}),
    }


@pytest.mark.parametrize("design", [{"risk_window_end": 14}, {
    "exposures": [{"drug_ids": [1, 2], "windows": [{"start": -30, "end": -1, "end_anchor": "exposure_start"},
                                                   {"start": 0, "end": 0}]}],
    "season": {"knots": 4}, "age": {"knots": 3}}])
def test_eras_by_outcome_stack_each_outcomes_own_build(design: dict) -> None:
    frames = _person()
    params = {"cases_dataset_id": "c", "events_dataset_id": "e", "exposures_dataset_id": "x", **design}
    progress = LocalProgress()
    result = _run("sccs_eras", params, frames, progress)
    stacked_rows, stacked_entries = progress.artifacts["outcomes"], progress.artifacts["covariates"]
    assert sorted(set(stacked_rows["outcomeId"])) == [3, 8] and stacked_rows["rowId"].is_unique
    assert [o["outcome_id"] for o in result["outcomes"]] == [3, 8]
    events = frames["events_dataset_id"]
    total_inside = 0
    for summary in result["outcomes"]:
        outcome = summary["outcome_id"]
        own_events = events[events["outcomeId"] == outcome].drop(columns="outcomeId")
        cases, exposures = frames["cases_dataset_id"], frames["exposures_dataset_id"]
        own = {"events_dataset_id": own_events, "cases_dataset_id": cases[cases["caseId"].isin(own_events["caseId"])],
               "exposures_dataset_id": exposures[exposures["caseId"].isin(own_events["caseId"])]}
        alone = LocalProgress()
        reference = _run("sccs_eras", params, own, alone)
        rows = stacked_rows[stacked_rows["outcomeId"] == outcome]
        for column in ("stratumId", "time", "y"):
            assert rows[column].tolist() == alone.artifacts["outcomes"][column].tolist()
        entries = stacked_entries[stacked_entries["rowId"].isin(rows["rowId"])]
        shift = int(rows["rowId"].iloc[0]) - int(alone.artifacts["outcomes"]["rowId"].iloc[0])
        assert (entries["rowId"] - shift).tolist() == alone.artifacts["covariates"]["rowId"].tolist()
        assert entries["covariateId"].tolist() == alone.artifacts["covariates"]["covariateId"].tolist()
        assert np.allclose(entries["covariateValue"], alone.artifacts["covariates"]["covariateValue"], rtol=0, atol=0)
        assert summary["n_eras"] == reference["n_eras"]
        assert summary["n_cases_with_events"] == reference["n_cases_with_events"]
        assert summary["events_in_observation"] == reference["events_in_observation"]
        assert summary["knots"] == reference.get("knots")
        total_inside += summary["events_in_observation"]
    assert result["events_in_observation"] == total_inside
    assert result["events_outside_observation"] == len(events) - total_inside
    # The stacked tables feed sccs_analyses, every pair at once.
    tables = {"outcomes_dataset_id": stacked_rows, "covariates_dataset_id": stacked_entries}
    analyses = _run("sccs_analyses", _ids(tables), tables)
    assert analyses["n_outcomes"] == 2
    assert {row["outcome_id"] for row in analyses["analyses"]} == {3, 8}
    assert all(row["estimate"] is None or math.isfinite(row["estimate"]) for row in analyses["analyses"])
