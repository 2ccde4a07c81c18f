"""422 texts without noise (issue 16): a union's alternatives are not fields, the alternative the value matched
in shape is the one reported, and invalid JSON names no offset as a field."""

from __future__ import annotations

from api_helpers import assert_problem
from fastapi.testclient import TestClient


def _fit(**params: object) -> dict[str, object]:
    return {"kind": "sccs_fit", "params": {"outcomes_dataset_id": "a", "covariates_dataset_id": "b", **params}}


def test_a_list_alternative_reports_the_bad_element_only(client: TestClient, alice: dict[str, str]) -> None:
    # grid is list[float > 0] | 'auto': a list with a bad element is about that element, not about 'auto'
    problem = assert_problem(client.post("/v1/jobs", json=_fit(cross_validation={"grid": [0.5, -1.0]}),
                                         headers=alice), 422)
    assert [(e["field"], e["message"]) for e in problem["errors"]] == [
        ("params.cross_validation.grid.1", "Input should be greater than 0")]
    assert "[" not in problem["detail"] and "literal" not in problem["detail"]


def test_a_value_of_no_alternative_lists_them_in_one_error(client: TestClient, alice: dict[str, str]) -> None:
    problem = assert_problem(client.post("/v1/jobs", json=_fit(cross_validation={"grid": "nope"}), headers=alice),
                             422)
    assert len(problem["errors"]) == 1
    error = problem["errors"][0]
    assert error["field"] == "params.cross_validation.grid" and error["type"] == "union"
    assert "valid list" in error["message"] and "'auto'" in error["message"] and ", or " in error["message"]


def test_invalid_json_names_the_character_not_a_field(client: TestClient, alice: dict[str, str]) -> None:
    response = client.post("/v1/jobs", content=b'{"kind": "crve_montecarlo", "params": {',
                           headers={**alice, "content-type": "application/json"})
    problem = assert_problem(response, 422)
    assert [e["field"] for e in problem["errors"]] == ["body"]
    assert problem["errors"][0]["message"].startswith("invalid JSON at character 39: ")
    assert "39: JSON decode error" not in problem["detail"]
