"""Deleting a job and the retention setting (issue 16): a finished job goes with its result and artifacts; a
queued or running one is refused until cancelled; another owner's job is a 404; expired jobs are deleted by
their owner's retention, files included, and the datasets they read stay."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from api_helpers import assert_problem
from test_api_jobs import run_through_store, submit

from store import jobs as job_store
from store.artifacts import job_artifact_dir, save_artifact
from store.db import session_scope
from store.models import Job, utcnow


@pytest.mark.both_backends
def test_a_finished_job_is_deleted_with_its_result_and_artifacts(client, alice, bob) -> None:
    job = submit(client, alice)
    reference = save_artifact(job["id"], "draws", np.arange(6.0))
    run_through_store(job["id"], result={"answer": 42}, artifacts={"draws": reference})
    folder = job_artifact_dir(job["id"])
    assert folder.is_dir()
    assert_problem(client.delete(f"/v1/jobs/{job['id']}", headers=bob), 404)  # not bob's: not even its existence
    response = client.delete(f"/v1/jobs/{job['id']}", headers=alice)
    assert response.status_code == 204 and response.content == b""
    assert not folder.exists()
    for path in ("", "/result", "/artifacts", "/artifacts/draws"):
        assert_problem(client.get(f"/v1/jobs/{job['id']}{path}", headers=alice), 404)
    assert_problem(client.delete(f"/v1/jobs/{job['id']}", headers=alice), 404)  # once only


@pytest.mark.both_backends
def test_queued_and_running_jobs_are_refused_until_cancelled(client, alice) -> None:
    queued = submit(client, alice)
    problem = assert_problem(client.delete(f"/v1/jobs/{queued['id']}", headers=alice), 409)
    assert problem["job_status"] == "queued" and "cancel it first" in problem["detail"]
    running = submit(client, alice, seed=2)
    with session_scope() as session:
        assert job_store.claim(session, running["id"], worker="w", device="cpu")
    assert assert_problem(client.delete(f"/v1/jobs/{running['id']}", headers=alice), 409)["job_status"] == "running"
    assert client.post(f"/v1/jobs/{queued['id']}/cancel", headers=alice).status_code == 200
    assert client.delete(f"/v1/jobs/{queued['id']}", headers=alice).status_code == 204
    assert client.get(f"/v1/jobs/{running['id']}", headers=alice).json()["status"] == "running"


def _finished_days_ago(job_id: str, days: float) -> None:
    with session_scope() as session:
        session.get(Job, job_id).finished_at = utcnow() - timedelta(days=days)


@pytest.mark.both_backends
def test_retention_expires_finished_jobs_by_their_owners_limit(client, alice, bob) -> None:
    old_alice, new_alice, old_bob = (submit(client, headers, seed=seed)
                                     for headers, seed in ((alice, 1), (alice, 2), (bob, 3)))
    for job in (old_alice, new_alice, old_bob):
        run_through_store(job["id"], result={}, artifacts={"x": save_artifact(job["id"], "x", np.ones(3))})
    _finished_days_ago(old_alice["id"], 40)
    _finished_days_ago(new_alice["id"], 2)
    _finished_days_ago(old_bob["id"], 40)
    waiting = submit(client, alice, seed=4)  # queued: never expires, whatever its age
    with session_scope() as session:
        session.get(Job, waiting["id"]).created_at = utcnow() - timedelta(days=400)
    with session_scope() as session:  # alice keeps 30 days, bob (0) forever
        expired = job_store.expire_finished_jobs(session, default_days=30, days_by_owner={"bob": 0})
    assert expired == [old_alice["id"]]
    assert not job_artifact_dir(old_alice["id"]).exists() and job_artifact_dir(new_alice["id"]).is_dir()
    assert_problem(client.get(f"/v1/jobs/{old_alice['id']}", headers=alice), 404)
    for job, headers in ((new_alice, alice), (old_bob, bob), (waiting, alice)):
        assert client.get(f"/v1/jobs/{job['id']}", headers=headers).status_code == 200
    with session_scope() as session:
        assert job_store.expire_finished_jobs(session, default_days=0, days_by_owner={}) == []


@pytest.mark.both_backends
def test_deleting_a_job_leaves_the_dataset_it_read(client, alice) -> None:
    csv = b"y,x,g\n" + b"".join(f"{i % 7},{i},{i % 3}\n".encode() for i in range(30))
    dataset = client.post("/v1/datasets", files={"file": ("d.csv", csv, "text/csv")}, headers=alice).json()
    response = client.post("/v1/jobs", json={"kind": "crve_bootstrap", "params": {
        "dataset_id": dataset["id"], "formula": "y ~ x", "cluster": "g", "param": "x", "reps": 99}}, headers=alice)
    assert response.status_code == 202, response.text
    job = response.json()
    run_through_store(job["id"], result={})
    assert client.delete(f"/v1/jobs/{job['id']}", headers=alice).status_code == 204
    assert client.get(f"/v1/datasets/{dataset['id']}", headers=alice).status_code == 200
