"""sccs_fit's diagnostics input checked at submission (issue 15, item 3): the optional person-level tables of the
time-stability diagnostic have their columns checked like every dataset a spec names, must come together, and
the null bounds must hold 1."""

from __future__ import annotations

from api_helpers import assert_problem
from fastapi.testclient import TestClient


def _upload(client: TestClient, headers: dict[str, str], name: str, text: str) -> str:
    response = client.post("/v1/datasets", files={"file": (name, text.encode(), "text/csv")}, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _fit(client: TestClient, alice: dict[str, str], **extra: object) -> dict:
    outcomes = _upload(client, alice, "outcomes.csv", "rowId,stratumId,time,y\n1,1,10,1\n2,1,20,0\n")
    covariates = _upload(client, alice, "covariates.csv", "rowId,covariateId\n2,7\n")
    return {"kind": "sccs_fit", "params": {"outcomes_dataset_id": outcomes, "covariates_dataset_id": covariates,
                                           **extra}}


def test_person_tables_for_time_stability_are_checked_by_their_columns(client, alice) -> None:
    cases = _upload(client, alice, "cases.csv", "caseId,observationStart,observationEnd\n1,2020-01-01,2020-12-31\n")
    events = _upload(client, alice, "events.csv", "caseId,day\n1,2020-03-01\n")
    dated = _upload(client, alice, "dated.csv", "caseId,date\n1,2020-03-01\n")
    accepted = _fit(client, alice, cases_dataset_id=cases, events_dataset_id=events,
                    diagnostics={"pre_exposure_covariates": [7], "time_stability_max_ratio": 1.2})
    assert client.post("/v1/jobs", json=accepted, headers=alice).status_code == 202
    refused = _fit(client, alice, cases_dataset_id=cases, events_dataset_id=dated)
    problem = assert_problem(client.post("/v1/jobs", json=refused, headers=alice), 422)
    assert [error["field"] for error in problem["errors"]] == ["params.events_dataset_id"]
    assert "lacks column(s) 'day'" in problem["errors"][0]["message"]


def test_one_person_table_alone_or_bounds_without_one_are_refused(client, alice) -> None:
    cases = _upload(client, alice, "cases.csv", "caseId,observationStart,observationEnd\n1,0,300\n")
    problem = assert_problem(client.post("/v1/jobs", json=_fit(client, alice, cases_dataset_id=cases),
                                         headers=alice), 422)
    assert "events_dataset_id is needed too" in problem["detail"]
    bad_bounds = _fit(client, alice, diagnostics={"pre_exposure_null_bounds": [1.1, 1.5]})
    problem = assert_problem(client.post("/v1/jobs", json=bad_bounds, headers=alice), 422)
    assert "pre_exposure_null_bounds must hold 1" in problem["detail"]


def test_analyses_tables_are_checked_by_their_columns_and_controls_by_the_spec(client, alice) -> None:
    fit = _fit(client, alice)["params"]
    accepted = {"kind": "sccs_analyses", "params": {**fit, "negative_controls": [7, 8]}}
    assert client.post("/v1/jobs", json=accepted, headers=alice).status_code == 202
    no_time = _upload(client, alice, "no_time.csv", "rowId,stratumId,y\n1,1,1\n")
    refused = {"kind": "sccs_analyses", "params": {**fit, "outcomes_dataset_id": no_time}}
    problem = assert_problem(client.post("/v1/jobs", json=refused, headers=alice), 422)
    assert [error["field"] for error in problem["errors"]] == ["params.outcomes_dataset_id"]
    one_control = {"kind": "sccs_analyses", "params": {**fit, "negative_controls": [7]}}
    assert "at least 2" in assert_problem(client.post("/v1/jobs", json=one_control, headers=alice), 422)["detail"]
