"""Sweeps and priorities on the real stack (uvicorn + a Celery worker process, issue 16): a 200-member Monte
Carlo sweep runs to the end and its results table equals the members' own results; a high-priority job
submitted behind a queue of low ones starts before every one of them still waiting."""

from __future__ import annotations

import io
import time
import uuid

import httpx
import pandas as pd
import pytest

from cli.serve import EmbeddedStack
from tests import servers

TINY = {"cluster_size": 5, "n_regressors": 2, "replications": 20}


def _wait_for_group(client: httpx.Client, group_id: str, stack: EmbeddedStack, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        group = client.get(f"/v1/job-groups/{group_id}").json()
        if group["status"] not in ("queued", "running") or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert group["status"] == "succeeded", (group, stack.worker.log_tail())
    return group


@pytest.mark.slow
def test_a_sweep_of_200_monte_carlo_jobs_runs_and_its_table_equals_the_members_results(
    stack: EmbeddedStack,
) -> None:
    grid = {"params.n_clusters": [8, 12, 16, 20], "params.seed": list(range(50))}
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        response = client.post(
            "/v1/job-groups", json={"name": "cgm", "base": {"kind": "crve_montecarlo", "params": TINY}, "grid": grid}
        )
        assert response.status_code == 202, response.text
        group = _wait_for_group(client, response.json()["id"], stack, seconds=170)
        assert group["member_count"] == 200 and group["counts"]["succeeded"] == 200 and group["progress"] == 1.0

        csv = client.get(
            f"/v1/job-groups/{group['id']}/results",
            params={"fields": "rejection_rate.0.05,mean_se,replications,timings.total"},
        )
        assert csv.status_code == 200, csv.text
        table = pd.read_csv(io.StringIO(csv.text))
        parquet = pd.read_parquet(
            io.BytesIO(client.get(f"/v1/job-groups/{group['id']}/results", params={"format": "parquet"}).content)
        )
        assert len(table) == len(parquet) == 200 and list(table["member"]) == list(range(200))
        for row in table.itertuples(index=False):
            job = client.get(f"/v1/jobs/{row.job_id}").json()
            result = client.get(f"/v1/jobs/{row.job_id}/result").json()
            assert (job["params"]["n_clusters"], job["params"]["seed"]) == (row[3], row[4])
            assert row[5] == pytest.approx(result["rejection_rate"]["0.05"], rel=1e-12, abs=0)
            assert row.mean_se == pytest.approx(result["mean_se"], rel=1e-12, abs=0)
            assert row.replications == result["replications"]
            assert row[8] == pytest.approx(result["timings"]["total"], rel=1e-12, abs=0)
        # the Parquet table's default columns are the results' top-level scalar fields, the same values
        assert parquet["mean_se"].tolist() == pytest.approx(table["mean_se"].tolist(), rel=1e-12)
        assert "rejection_rate" not in parquet.columns  # an object, not a scalar: only when asked for by path
        # the grid's values reached the members: their results differ by seed within each size
        assert table.groupby(["params.n_clusters"])["mean_se"].nunique().min() == 50


def test_a_high_priority_job_starts_before_the_low_priority_jobs_queued_before_it(stack: EmbeddedStack) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        # members of about 0.1 s each, so that most are still queued when the high-priority job comes
        base = {"kind": "crve_montecarlo", "params": {**TINY, "replications": 2000}}
        low = client.post(
            "/v1/job-groups", json={"base": base, "grid": {"params.n_clusters": [12], "params.seed": list(range(60))}}
        )
        assert low.status_code == 202 and low.json()["priority"] == "low"
        time.sleep(0.5)  # the worker is busy with the sweep now
        high = client.post(
            "/v1/jobs",
            json={"kind": "crve_montecarlo", "priority": "high", "params": {**TINY, "n_clusters": 12, "seed": 999}},
        ).json()
        waiting = [
            job["id"]
            for job in client.get(
                "/v1/jobs", params={"group_id": low.json()["id"], "status": "queued", "limit": 200}
            ).json()["items"]
        ]
        assert len(waiting) > 10, "the sweep finished too fast for the test to mean anything"
        _wait_for_group(client, low.json()["id"], stack, seconds=120)
        high = client.get(f"/v1/jobs/{high['id']}").json()
        assert high["status"] == "succeeded" and high["priority"] == "high"
        started = {job_id: client.get(f"/v1/jobs/{job_id}").json()["started_at"] for job_id in waiting}
    # One waiting member may have been mid-claim when the high-priority job was stored; every other one
    # started after it.
    before_high = [job_id for job_id, moment in started.items() if moment < high["started_at"]]
    assert len(before_high) <= 1, (high["started_at"], sorted(started.values()))


@pytest.mark.servers
def test_redis_delivers_a_high_priority_message_before_low_ones_sent_earlier(monkeypatch) -> None:
    """The broker's half of priorities (the worker orders queued jobs itself as well): Celery message
    priorities over Redis's priority lists."""
    from core.queue import broker_connection, send, send_many
    from core.settings import get_settings
    from core.status import JobPriority

    urls = servers.server_urls()
    assert urls is not None
    queue = f"priority-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("BROKER_URL", urls[1])
    monkeypatch.setenv("GPUEST_QUEUE", queue)
    get_settings.cache_clear()
    try:
        send_many(["low-1", "low-2"], queue=queue, priority=JobPriority.LOW)
        send("normal-1", queue=queue)
        send("high-1", queue=queue, priority=JobPriority.HIGH)
        order = []
        with broker_connection() as connection:
            simple = connection.SimpleQueue(queue)
            for _ in range(4):
                message = simple.get(timeout=5)
                order.append(message.payload[0][0])  # Celery's protocol 2 body: (args, kwargs, embed)
                message.ack()
            simple.close()
    finally:
        get_settings.cache_clear()
    assert order == ["high-1", "normal-1", "low-1", "low-2"]
