"""A job's log at GET /v1/jobs/{id}/events (issue 16): written where the API and the worker change the job
(submitted, started, stages, re-queued after a lost worker, re-sent, cancel, how it ended), oldest first,
paginated like the jobs list; another owner's job is a 404; the log goes with a deleted job."""

from __future__ import annotations

from datetime import timedelta

import pytest
from api_helpers import assert_problem
from test_api_jobs import submit

from store import jobs as job_store
from store.db import session_scope
from store.models import Job, JobEvent
from worker.progress import JobProgress


def events(client, headers, job_id: str, **params: int) -> dict:
    response = client.get(f"/v1/jobs/{job_id}/events", params=params, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.both_backends
def test_the_log_follows_a_job_from_submission_through_a_lost_worker_to_success(client, alice) -> None:
    job = submit(client, alice)
    with session_scope() as session:
        assert job_store.claim(session, job["id"], worker="w1", device="cpu")
    progress = JobProgress(job["id"], "w1", min_interval=0.0)
    progress(0.2, "drawing")
    progress(0.3, "drawing")  # the same stage again: no new line
    progress(0.6, "testing")
    with session_scope() as session:  # w1 goes silent: the reaper re-queues the job
        row = session.get(Job, job["id"])
        row.heartbeat_at = row.heartbeat_at - timedelta(minutes=5)
    with session_scope() as session:
        stale = job_store.stale_running_jobs(session, stale_after=timedelta(seconds=30))
        assert job_store.requeue_or_fail_stale(session, stale[0], max_attempts=3) == "queued"
    with session_scope() as session:
        assert job_store.claim(session, job["id"], worker="w2", device="cpu")
    with session_scope() as session:
        assert job_store.finish(session, job["id"], worker="w2", status="succeeded", result={"x": 1})

    log = events(client, alice, job["id"])
    assert [(item["type"], item["level"]) for item in log["items"]] == [
        ("submitted", "info"),
        ("started", "info"),
        ("stage", "info"),
        ("stage", "info"),
        ("requeued", "warning"),
        ("started", "info"),
        ("succeeded", "info"),
    ]
    messages = [item["message"] for item in log["items"]]
    assert messages[1] == "started on cpu (attempt 1)" and messages[5] == "started on cpu (attempt 2)"
    assert messages[2:4] == ["drawing", "testing"]
    assert "attempt 1 stopped responding" in messages[4]
    assert log["items"][2]["data"] == {"progress": 0.2}
    ids = [item["id"] for item in log["items"]]
    assert ids == sorted(ids) and log["total"] == 7 and log["next"] is None

    first = events(client, alice, job["id"], limit=3)
    assert [item["id"] for item in first["items"]] == ids[:3] and first["next"].endswith("limit=3&offset=3")
    assert [item["id"] for item in events(client, alice, job["id"], limit=3, offset=6)["items"]] == ids[6:]


@pytest.mark.both_backends
def test_failure_and_cancel_are_logged(client, alice) -> None:
    failed, cancelled = submit(client, alice), submit(client, alice)
    with session_scope() as session:
        assert job_store.claim(session, failed["id"], worker="w", device="cpu")
    with session_scope() as session:
        job_store.finish(
            session,
            failed["id"],
            worker="w",
            status="failed",
            error={"type": "ValueError", "code": "kernel_error", "message": "singular design"},
        )
    last = events(client, alice, failed["id"])["items"][-1]
    assert (last["type"], last["level"]) == ("failed", "error")
    assert last["message"] == "failed: kernel_error: singular design"
    client.post(f"/v1/jobs/{cancelled['id']}/cancel", headers=alice)
    assert events(client, alice, cancelled["id"])["items"][-1]["type"] == "cancelled"


@pytest.mark.both_backends
def test_another_owners_log_is_a_404_and_a_deleted_job_takes_its_log(client, alice, bob) -> None:
    job = submit(client, alice)
    assert_problem(client.get(f"/v1/jobs/{job['id']}/events", headers=bob), 404)
    client.post(f"/v1/jobs/{job['id']}/cancel", headers=alice)
    assert client.delete(f"/v1/jobs/{job['id']}", headers=alice).status_code == 204
    with session_scope() as session:
        assert session.query(JobEvent).filter_by(job_id=job["id"]).count() == 0
