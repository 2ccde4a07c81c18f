"""crve_bootstrap input checked at submission: formula errors and columns a stored dataset lacks are 422
problems naming the field, never formulaic's terminal escape codes (issue 14, "Bad input")."""

from __future__ import annotations

import time

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
    categorical = _spec(
        dataset_id, formula="y ~ np.log(x1 + 1) + C(x2) | year", bootcluster="year", param="np.log(x1 + 1)"
    )
    assert client.post("/v1/jobs", json=categorical, headers=alice).status_code == 202
    two_way = _spec(dataset_id, formula="y ~ x1 | firm + year", cluster=["firm", "year"], param=None,
                    hypothesis=["x1 = 0.5"])  # fmt: skip
    assert client.post("/v1/jobs", json=two_way, headers=alice).status_code == 202
    weighted = _spec(dataset_id, cluster=None, weights="x2", param=None, hypothesis=["x1 - x2 = 0", "x1 = 1"])
    assert client.post("/v1/jobs", json=weighted, headers=alice).status_code == 202
    assert client.post("/v1/jobs", json=categorical, headers=alice).status_code == 202


@pytest.mark.parametrize(
    ("formula", "says"),
    [
        ("y ~ x1 +", "Operator `+`"),
        ("y ~ x1 + (x2", "matching context marker"),
        ("y ~ log(x1", "quote context"),
        ("y ~ x1 **", "Operator `**`"),
        ("y x1", "has no '~'"),
        ("y ~ x1 | firm + (year", "must be a column or the interaction"),
        ("y ~ x1 | firm + firm", "named twice"),
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
        ({"cluster": ["firm", "county"]}, "params.cluster", "'county'"),
        ({"weights": "w"}, "params.weights", "'w'"),
        ({"formula": "y ~ x1 | firm^region"}, "params.formula", "['region']"),
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
    problem = _problem(client, alice, _spec(dataset_id, formula="y ~ x9 | region", cluster="county", param="x9"))
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


@pytest.mark.parametrize(
    ("params", "field", "says"),
    [
        ({"param": None, "hypothesis": "x1 - x3 = 0"}, "params.hypothesis", "'x3' is not a coefficient"),
        ({"param": None, "hypothesis": ["x1 = 0", "2*x1 = 1"]}, "params.hypothesis", "linearly dependent"),
        ({"param": None, "hypothesis": "x1 * x2 = 0"}, "params.hypothesis", "not linear"),
        ({"param": None, "hypothesis": "x1 + x2"}, "params.hypothesis", "single '='"),
        ({"param": "x3"}, "params.param", "'x3' is not a coefficient"),
        ({"param": None}, "params", "exactly one of param"),
        ({"hypothesis": "x1 = 0"}, "params", "exactly one of param"),
        ({"cluster": ["firm", "year", "x2", "x1"]}, "params.cluster", "1 to 3 cluster columns"),
        ({"cluster": None, "bootcluster": "firm"}, "params", "bootcluster needs cluster"),
        ({"param": None, "family": ["x1 = 0"]}, "params.family", "2 to 200"),
        ({"param": None, "family": ["x1 = 0", "x9 = 0"]}, "params.family", "'x9' is not a coefficient"),
        ({"family": ["x1 = 0", "x2 = 0"]}, "params", "exactly one of param"),
        ({"formula": "y ~ x1 | x2 ~ year"}, "params", "tests its endogenous coefficient"),
        ({"formula": "y ~ x1 | x2 ~ year", "param": "x2", "cluster": ["firm", "year"]}, "params", "['cluster']"),
        ({"formula": "y ~ x1 | x2 ~ x2", "param": "x2"}, "params.formula", "cannot instrument itself"),
        ({"param": None, "hypothesis": ["x1 = 0", "x2 = 0"], "bootstrap_type": "33"}, "params", "one restriction"),
    ],
)
def test_hypotheses_and_clusters_are_checked_at_submission(client, alice, dataset_id, params, field, says) -> None:
    problem = _problem(client, alice, _spec(dataset_id, **params))
    assert [error["field"] for error in problem["errors"]] == [field]
    assert says in problem["errors"][0]["message"]


def test_an_exponential_formula_is_a_quick_plain_422_on_params_formula(client, alice, dataset_id) -> None:
    formula = "y ~ " + "*".join(f"v{i}" for i in range(16))  # 57 characters; formulaic would make 65,535 terms
    started = time.monotonic()
    problem = _problem(client, alice, _spec(dataset_id, formula=formula))
    assert time.monotonic() - started < 2
    assert [error["field"] for error in problem["errors"]] == ["params.formula"]
    assert "interaction of more than 10 factors" in problem["detail"]
