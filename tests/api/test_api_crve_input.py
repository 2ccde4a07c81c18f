"""crve_bootstrap input checked at submission: formula errors and columns a stored dataset lacks are 422
problems naming the field, never formulaic's terminal escape codes (issue 14, "Bad input")."""

from __future__ import annotations

import pytest
from api_helpers import assert_problem
from fastapi.testclient import TestClient

CSV = b"y,x1,x2,firm,year\n" + b"".join(
    f"{i * 0.5 + (i % 3)},{i},{(i * 7) % 11},{i % 4},{i % 5}\n".encode() for i in range(40)
)


@pytest.fixture
def dataset_id(client: TestClient, alice: dict[str, str]) -> str:
    response = client.post("/v1/datasets", files={"file": ("panel.csv", CSV, "text/csv")}, headers=alice)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _spec(dataset_id: str, **params: object) -> dict[str, object]:
    base = {"dataset_id": dataset_id, "formula": "y ~ x1 + x2 | year", "cluster": "firm", "param": "x1", "reps": 99}
    return {"kind": "crve_bootstrap", "params": {**base, **params}}


def _problem(client: TestClient, headers: dict[str, str], spec: dict[str, object]) -> dict:
    response = client.post("/v1/jobs", json=spec, headers=headers)
    problem = assert_problem(response, 422)
    assert "\x1b" not in response.text and "\\u001b" not in response.text  # no terminal escape codes
    return problem


def test_a_valid_spec_is_accepted(client, alice, dataset_id) -> None:
    assert client.post("/v1/jobs", json=_spec(dataset_id), headers=alice).status_code == 202
    categorical = _spec(dataset_id, formula="y ~ np.log(x1 + 1) + C(x2) | year", bootcluster="year")
    assert client.post("/v1/jobs", json=categorical, headers=alice).status_code == 202


@pytest.mark.parametrize(
    ("formula", "says"),
    [
        ("y ~ x1 +", "Operator `+`"),
        ("y ~ x1 + (x2", "matching context marker"),
        ("y ~ log(x1", "quote context"),
        ("y ~ x1 **", "Operator `**`"),
        ("y x1", "has no '~'"),
        ("y ~ x1 | firm + year", "only one absorbed fixed effect"),
    ],
)
def test_formula_typos_are_plain_422s_on_params_formula(client, alice, dataset_id, formula, says) -> None:
    problem = _problem(client, alice, _spec(dataset_id, formula=formula))
    assert [error["field"] for error in problem["errors"]] == ["params.formula"]
    assert says in problem["errors"][0]["message"]
    assert "\n" not in problem["errors"][0]["message"]


@pytest.mark.parametrize(
    ("params", "field", "says"),
    [
        ({"formula": "y ~ x1 + x9"}, "params.formula", "['x9']"),
        ({"formula": "y ~ x1 | region"}, "params.formula", "['region']"),
        ({"formula": "y ~ x1 + foo(x2)"}, "params.formula", "['foo']"),
        ({"cluster": "county"}, "params.cluster", "'county'"),
        ({"bootcluster": "state"}, "params.bootcluster", "'state'"),
    ],
)
def test_columns_the_dataset_lacks_are_422s_naming_field_and_column(
    client, alice, dataset_id, params, field, says
) -> None:
    problem = _problem(client, alice, _spec(dataset_id, **params))
    assert [error["field"] for error in problem["errors"]] == [field]
    assert says in problem["errors"][0]["message"]
    assert problem["errors"][0]["type"] == "dataset_column"
    assert client.get("/v1/jobs", headers=alice).json()["total"] == 0  # nothing stored or queued


def test_every_missing_column_is_reported_at_once(client, alice, dataset_id) -> None:
    problem = _problem(client, alice, _spec(dataset_id, formula="y ~ x9 | region", cluster="county"))
    assert sorted(error["field"] for error in problem["errors"]) == ["params.cluster", "params.formula"]


def test_synthetic_data_has_no_stored_schema_and_is_checked_when_the_job_runs(client, alice) -> None:
    # The parse check needs no data, so it applies to synthetic jobs as well; column names are checked by the
    # runner (a failed job whose message names the field: tests/kernels/crve/test_crve_formula_errors.py).
    synthetic = {"n_obs": 100, "n_clusters": 5}
    spec = {"kind": "crve_bootstrap", "params": {"synthetic": synthetic, "formula": "y ~ x1 +", "cluster": "cluster",
                                                 "param": "x1"}}
    problem = _problem(client, alice, spec)
    assert problem["errors"][0]["field"] == "params.formula"
    spec["params"]["formula"] = "y ~ x1 + x9"
    assert client.post("/v1/jobs", json=spec, headers=alice).status_code == 202
