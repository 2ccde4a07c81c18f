"""DELETE /v1/job-groups/{id} (issue 16): a group whose members have all ended goes with its members (rows,
results, artifact files, logs) and the webhooks; while a member is queued or running it is a 409 that says to
cancel first; another owner's group is a 404."""

from __future__ import annotations

import pytest
from api_helpers import assert_problem, montecarlo_spec
from test_api_jobs import run_through_store

from store.artifacts import job_artifact_dir
from store.db import session_scope
from store.models import Job, JobEvent, JobGroup, WebhookDelivery


def create_group(client, headers) -> tuple[dict, list[dict]]:
    response = client.post("/v1/job-groups", headers=headers, json={
        "base": montecarlo_spec(), "grid": {"params.seed": [1, 2, 3]}, "callback_url": "https://example.com/h"})
    assert response.status_code == 202, response.text
    group = response.json()
    members = client.get("/v1/jobs", params={"group_id": group["id"]}, headers=headers).json()["items"]
    return group, members


def counts() -> tuple[int, int, int, int]:
    with session_scope() as session:
        return (session.query(JobGroup).count(), session.query(Job).count(), session.query(JobEvent).count(),
                session.query(WebhookDelivery).count())


@pytest.mark.both_backends
def test_a_finished_group_is_deleted_with_its_members_and_their_files(client, alice, bob) -> None:
    group, members = create_group(client, alice)
    kept = client.post("/v1/jobs", json=montecarlo_spec(), headers=alice).json()  # not a member: stays
    run_through_store(members[0]["id"], result={"x": 1})
    artifact_dir = job_artifact_dir(members[0]["id"])
    artifact_dir.mkdir(parents=True, exist_ok=True)
    (artifact_dir / "draws.npy").write_bytes(b"\x93NUMPY")

    problem = assert_problem(client.delete(f"/v1/job-groups/{group['id']}", headers=alice), 409)
    assert problem["active_members"] == 2 and "cancel the group" in problem["detail"]
    assert counts()[:2] == (1, 4)
    assert_problem(client.delete(f"/v1/job-groups/{group['id']}", headers=bob), 404)

    assert client.post(f"/v1/job-groups/{group['id']}/cancel", headers=alice).status_code == 200
    response = client.delete(f"/v1/job-groups/{group['id']}", headers=alice)
    assert response.status_code == 204, response.text
    assert_problem(client.get(f"/v1/job-groups/{group['id']}", headers=alice), 404)
    assert all(client.get(f"/v1/jobs/{m['id']}", headers=alice).status_code == 404 for m in members)
    assert not artifact_dir.exists()
    groups, jobs, _, deliveries = counts()
    assert (groups, jobs, deliveries) == (0, 1, 0)
    with session_scope() as session:
        assert {event.job_id for event in session.query(JobEvent)} == {kept["id"]}
    assert client.get(f"/v1/jobs/{kept['id']}", headers=alice).status_code == 200
