"""The API validates a job's params once per submission and parses crve_bootstrap's formula once: its later
checks (the restrictions, the IV rules, the columns of the stored dataset, the CPU cap) read that one parse.

``BootstrapParams`` parses its formula in the formula field's validator, and nothing else parses it: for a
single job the count of ``parse_formula`` calls is the count of validations, and of parses, of its params. A
job group validates each member once and parses each distinct formula once (the validation context's memo):
its members sharing a formula share its parse."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

import kernels.crve.spec
from kernels.spec import memoized_parse
from tests.formula_parses import count_parses

CSV = b"y,x1,x2,z,firm,year\n" + b"".join(
    f"{i * 0.5 + (i % 3)},{i},{(i * 7) % 11},{(i * 5) % 13},{i % 4},{i % 5}\n".encode() for i in range(40)
)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The formulas parsed from here on (wherever crve code parses one)."""
    return count_parses(monkeypatch)


@pytest.fixture
def dataset_id(client: TestClient, alice: dict[str, str]) -> str:
    response = client.post("/v1/datasets", files={"file": ("panel.csv", CSV, "text/csv")}, headers=alice)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _spec(dataset_id: str, **params: object) -> dict[str, object]:
    base = {"dataset_id": dataset_id, "formula": "y ~ x1 + x2 | year", "cluster": "firm", "param": "x1", "reps": 99}
    return {"kind": "crve_bootstrap", "params": {**base, **params}}


SPECS: dict[str, Callable[[str], dict[str, object]]] = {
    "param": lambda dataset_id: _spec(dataset_id),
    "joint hypothesis": lambda dataset_id: _spec(dataset_id, param=None, hypothesis=["x1 = 0", "x2 = 0"]),
    "family": lambda dataset_id: _spec(dataset_id, param=None, family=["x1 = 0", "x2 = 0", "x1 - x2 = 0"]),
    "IV": lambda dataset_id: _spec(dataset_id, formula="y ~ x2 | x1 ~ z", param="x1"),
}


@pytest.mark.parametrize("name", SPECS)
def test_a_submission_validates_its_params_and_parses_the_formula_once(
    client: TestClient, alice: dict[str, str], dataset_id: str, parses: list[str], name: str
) -> None:
    spec = SPECS[name](dataset_id)
    response = client.post("/v1/jobs", json=spec, headers=alice)
    assert response.status_code == 202, response.text
    assert parses == [spec["params"]["formula"]]  # type: ignore[index]
    # The stored params are the dump of that one model: the formula as the user wrote it, plain JSON text.
    assert response.json()["params"]["formula"] == spec["params"]["formula"]  # type: ignore[index]


def test_a_refused_column_is_found_from_the_one_parse(
    client: TestClient, alice: dict[str, str], dataset_id: str, parses: list[str]
) -> None:
    response = client.post("/v1/jobs", json=_spec(dataset_id, formula="y ~ x1 + x9"), headers=alice)
    assert response.status_code == 422
    assert [error["field"] for error in response.json()["errors"]] == ["params.formula"]
    assert parses == ["y ~ x1 + x9"]


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The formulas the formula field's validator saw from here on: one per validation of a member's params."""
    seen: list[str] = []

    def counting(info, key, parse):  # type: ignore[no-untyped-def]
        if key[0] == "crve formula":
            seen.append(key[1])
        return memoized_parse(info, key, parse)

    monkeypatch.setattr(kernels.crve.spec, "memoized_parse", counting)
    return seen


def test_a_sweep_validates_each_member_once_and_parses_each_distinct_formula_once(
    client: TestClient, alice: dict[str, str], dataset_id: str, parses: list[str], validations: list[str]
) -> None:
    formulas = ["y ~ x1 + x2 | year", "y ~ x1 | year"]
    body = {"base": _spec(dataset_id), "grid": {"params.formula": formulas, "params.seed": [1, 2, 3]}}
    response = client.post("/v1/job-groups", json=body, headers=alice)
    assert response.status_code == 202, response.text
    assert validations == [formulas[0]] * 3 + [formulas[1]] * 3
    assert parses == formulas


def test_a_formula_every_member_shares_is_refused_from_one_parse(
    client: TestClient, alice: dict[str, str], dataset_id: str, parses: list[str]
) -> None:
    body = {"base": _spec(dataset_id, formula="y ~ x1 +"), "grid": {"params.seed": list(range(50))}}
    response = client.post("/v1/job-groups", json=body, headers=alice)
    assert response.status_code == 422, response.text
    assert response.json()["invalid_members"] == 50
    assert response.json()["errors"][0]["field"] == "members.0.params.formula"
    assert parses == ["y ~ x1 +"]
