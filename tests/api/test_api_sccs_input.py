"""sccs_fit and sccs_eras input checked at submission: a stored dataset that lacks a column its table needs is
a 422 problem naming the params field and the missing column (issues 15 and 16, "Bad input"), not a job that
fails in the worker."""

from __future__ import annotations

import pytest
from api_helpers import assert_problem
from fastapi.testclient import TestClient


def _upload(client: TestClient, headers: dict[str, str], name: str, text: str) -> str:
    response = client.post("/v1/datasets", files={"file": (name, text.encode(), "text/csv")}, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["id"]


@pytest.fixture
def tables(client: TestClient, alice: dict[str, str]) -> dict[str, str]:
    return {
        "outcomes": _upload(client, alice, "outcomes.csv", "rowId,stratumId,time,y\n1,1,10,1\n2,1,20,0\n"),
        "covariates": _upload(client, alice, "covariates.csv", "rowId,covariateId\n2,7\n"),
        "no_time": _upload(client, alice, "no_time.csv", "rowId,stratumId,y\n1,1,1\n"),
        "names": _upload(client, alice, "names.csv", "covariateId,label\n7,drug\n"),
        "cases": _upload(client, alice, "cases.csv",
                         "caseId,observationStart,observationEnd\n1,2020-01-01,2020-12-31\n"),
        "events": _upload(client, alice, "events.csv", "caseId,date\n1,2020-03-01\n"),
        "exposures": _upload(client, alice, "exposures.csv", "caseId,drugId,start,end\n1,7,2020-02-01,2020-02-20\n"),
    }


def test_fit_with_its_columns_is_accepted(client, alice, tables) -> None:
    spec = {"kind": "sccs_fit", "params": {"outcomes_dataset_id": tables["outcomes"],
                                           "covariates_dataset_id": tables["covariates"]}}
    assert client.post("/v1/jobs", json=spec, headers=alice).status_code == 202


def test_fit_tables_missing_columns_are_named(client, alice, tables) -> None:
    spec = {"kind": "sccs_fit", "params": {"outcomes_dataset_id": tables["no_time"],
                                           "covariates_dataset_id": tables["covariates"],
                                           "names_dataset_id": tables["names"]}}
    problem = assert_problem(client.post("/v1/jobs", json=spec, headers=alice), 422)
    errors = {error["field"]: error["message"] for error in problem["errors"]}
    assert set(errors) == {"params.outcomes_dataset_id", "params.names_dataset_id"}
    assert "lacks column(s) 'time'" in errors["params.outcomes_dataset_id"]
    assert "lacks column(s) 'covariateName'" in errors["params.names_dataset_id"]


def test_eras_tables_missing_columns_are_named(client, alice, tables) -> None:
    spec = {"kind": "sccs_eras", "params": {"cases_dataset_id": tables["cases"], "events_dataset_id": tables["events"],
                                            "exposures_dataset_id": tables["exposures"]}}
    problem = assert_problem(client.post("/v1/jobs", json=spec, headers=alice), 422)
    assert [error["field"] for error in problem["errors"]] == ["params.events_dataset_id"]
    assert "lacks column(s) 'day'" in problem["errors"][0]["message"]
    assert "has caseId, date" in problem["errors"][0]["message"]


def test_eras_study_design_errors_are_422_naming_the_field(client, alice, tables) -> None:
    events = _upload(client, alice, "events_day.csv", "caseId,day\n1,2020-03-01\n")
    base = {"cases_dataset_id": tables["cases"], "events_dataset_id": events,
            "exposures_dataset_id": tables["exposures"]}
    overlapping = {**base, "exposures": [{"drug_ids": [7], "windows": [
        {"label": "risk", "start": 0, "end": 30, "end_anchor": "exposure_start"},
        {"label": "washout", "start": 20, "start_anchor": "exposure_start", "end": 60}]}]}
    problem = assert_problem(client.post("/v1/jobs", json={"kind": "sccs_eras", "params": overlapping},
                                         headers=alice), 422)
    fields = [error["field"] for error in problem["errors"]]
    assert fields == ["params.exposures.0.windows"], problem
    assert "windows 0 and 1 of one exposure overlap" in problem["errors"][0]["message"]
    # The age spline needs the cases table's ageAtObsStart column: checked against the stored schema.
    aged = {**base, "exposures": [{"drug_ids": [7]}], "age": {"knots": [3650, 7300]}}
    problem = assert_problem(client.post("/v1/jobs", json={"kind": "sccs_eras", "params": aged}, headers=alice), 422)
    assert [error["field"] for error in problem["errors"]] == ["params.cases_dataset_id"]
    assert "lacks column(s) 'ageAtObsStart'" in problem["errors"][0]["message"]
    ok = {**base, "exposures": [{"drug_ids": [7], "windows": [{"start": -30, "end": -1, "end_anchor": "exposure_start"},
                                                              {}]}], "season": {"knots": 4}}
    assert client.post("/v1/jobs", json={"kind": "sccs_eras", "params": ok}, headers=alice).status_code == 202
