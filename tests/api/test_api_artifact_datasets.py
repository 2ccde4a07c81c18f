"""A job's table artifact registered as a dataset (issue 15, item 5): ``POST /v1/datasets/from-artifact``.

The job is moved through the store as the worker would (claim, then finish with artifacts written by
``store.artifacts.save_artifact``). Checked: the dataset holds the artifact's table and schema, a job spec
naming it is accepted or refused at submission by its stored columns like an upload, the owner checks (another
owner's job reads as missing), a job that has not succeeded, a missing or array artifact, and that deleting the
job leaves the dataset whole."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
from api_helpers import assert_problem
from fastapi.testclient import TestClient

from store import jobs as job_store
from store.artifacts import save_artifact
from store.db import session_scope

OUTCOMES = pd.DataFrame({"rowId": [1, 2, 3], "stratumId": [1, 1, 2], "time": [10.0, 20.0, 5.0], "y": [1, 0, 2]})
COVARIATES = pd.DataFrame({"rowId": [2, 3], "covariateId": [7, 7], "covariateValue": [1.0, 1.0]})
ERAS_PARAMS = {"cases_dataset_id": "c", "events_dataset_id": "e", "exposures_dataset_id": "x"}


def _job(owner: str, status: str = "succeeded") -> str:
    """A stored sccs_eras job of ``owner`` that ran to ``status`` with the two tables and an array artifact."""
    with session_scope() as session:
        job, _ = job_store.create_job(session, owner=owner, kind="sccs_eras", params=ERAS_PARAMS, dataset_ids={},
                                      queue="q")
        job_id = job.id
        if status == "queued":
            return job_id
        assert job_store.claim(session, job_id, worker="w", device="cpu")
        if status == "running":
            return job_id
        artifacts = {"outcomes": save_artifact(job_id, "outcomes", OUTCOMES),
                     "covariates": save_artifact(job_id, "covariates", COVARIATES),
                     "trace": save_artifact(job_id, "trace", np.arange(3.0))}
        assert job_store.finish(session, job_id, worker="w", status=status, result={"kind": "sccs_eras"},
                                artifacts=artifacts)
        return job_id


def _register(client: TestClient, headers: dict[str, str], job_id: str, artifact: str, **extra: str):
    return client.post("/v1/datasets/from-artifact", json={"job": job_id, "artifact": artifact, **extra},
                       headers=headers)


def _field_errors(problem: dict) -> dict[str, str]:
    return {error["field"]: error["type"] for error in problem["errors"]}


@pytest.mark.both_backends
def test_a_table_artifact_becomes_a_dataset_with_its_schema_and_rows(client, alice) -> None:
    job_id = _job("alice")
    response = _register(client, alice, job_id, "outcomes")
    assert response.status_code == 201, response.text
    dataset = response.json()
    assert response.headers["location"] == f"/v1/datasets/{dataset['id']}"
    assert dataset["source_format"] == "artifact" and dataset["n_rows"] == 3
    assert [column["name"] for column in dataset["columns"]] == ["rowId", "stratumId", "time", "y"]
    assert dataset["name"] == f"outcomes of sccs_eras job {job_id}"
    assert client.get(f"/v1/datasets/{dataset['id']}", headers=alice).json()["id"] == dataset["id"]
    named = _register(client, alice, job_id, "covariates", name="my covariates").json()
    assert named["name"] == "my covariates" and named["n_rows"] == 2


def test_a_registered_artifact_is_accepted_by_a_job_and_its_columns_checked(client, alice) -> None:
    job_id = _job("alice")
    outcomes = _register(client, alice, job_id, "outcomes").json()["id"]
    covariates = _register(client, alice, job_id, "covariates").json()["id"]
    spec = {"kind": "sccs_fit", "params": {"outcomes_dataset_id": outcomes, "covariates_dataset_id": covariates}}
    assert client.post("/v1/jobs", json=spec, headers=alice).status_code == 202
    swapped = {"kind": "sccs_fit", "params": {"outcomes_dataset_id": covariates, "covariates_dataset_id": outcomes}}
    problem = assert_problem(client.post("/v1/jobs", json=swapped, headers=alice), 422)
    assert _field_errors(problem) == {"params.outcomes_dataset_id": "dataset_column",
                                      "params.covariates_dataset_id": "dataset_column"}


def test_another_owners_job_reads_as_missing(client, alice, bob) -> None:
    job_id = _job("alice")
    problem = assert_problem(_register(client, bob, job_id, "outcomes"), 422)
    assert _field_errors(problem) == {"job": "job_not_found"}
    assert problem["errors"][0]["message"] == f"no job with id {job_id!r}"
    problem = assert_problem(_register(client, alice, "no-such-job\x00", "outcomes"), 422)
    assert _field_errors(problem) == {"job": "job_not_found"}
    assert client.get("/v1/datasets", headers=bob).json()["total"] == 0


@pytest.mark.parametrize("status", ["queued", "running", "failed"])
def test_a_job_that_has_not_succeeded_is_a_conflict_naming_the_job(client, alice, status) -> None:
    problem = assert_problem(_register(client, alice, _job("alice", status), "outcomes"), 409)
    assert _field_errors(problem) == {"job": "job_not_succeeded"}
    assert problem["job_status"] == status


def test_a_missing_or_array_artifact_is_named_with_the_jobs_tables(client, alice) -> None:
    job_id = _job("alice")
    problem = assert_problem(_register(client, alice, job_id, "eras"), 422)
    assert _field_errors(problem) == {"artifact": "artifact_not_table"}
    assert "no artifact named 'eras' (its tables: covariates, outcomes)" in problem["errors"][0]["message"]
    problem = assert_problem(_register(client, alice, job_id, "trace"), 422)
    assert "is an array, not a table" in problem["errors"][0]["message"]
    assert_problem(client.post("/v1/datasets/from-artifact", json={"job": job_id}, headers=alice), 422)
    assert client.get("/v1/datasets", headers=alice).json()["total"] == 0


@pytest.mark.both_backends
def test_deleting_the_job_leaves_the_dataset_and_deleting_the_dataset_leaves_the_artifact(client, alice) -> None:
    job_id = _job("alice")
    first = _register(client, alice, job_id, "outcomes").json()["id"]
    second = _register(client, alice, job_id, "outcomes").json()["id"]
    assert client.delete(f"/v1/datasets/{first}", headers=alice).status_code == 204
    artifact = client.get(f"/v1/jobs/{job_id}/artifacts/outcomes", headers=alice)
    assert artifact.status_code == 200
    pd.testing.assert_frame_equal(pd.read_parquet(io.BytesIO(artifact.content)), OUTCOMES)
    assert client.delete(f"/v1/jobs/{job_id}", headers=alice).status_code == 204
    spec = {"kind": "sccs_fit", "params": {"outcomes_dataset_id": second, "covariates_dataset_id": second}}
    problem = assert_problem(client.post("/v1/jobs", json=spec, headers=alice), 422)  # still there: its columns
    assert _field_errors(problem) == {"params.covariates_dataset_id": "dataset_column"}
    from store.datasets import get_dataset
    from store.decoded import load_frame

    with session_scope() as session:
        stored = get_dataset(session, second, "alice")
        assert stored is not None
        pd.testing.assert_frame_equal(load_frame(stored), OUTCOMES)
