"""Fifty jobs submitted at once by several clients over HTTP all finish, each exactly once, on the real
embedded stack (uvicorn + Celery worker processes) and on Postgres + Redis."""

from __future__ import annotations

import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cli.serve import EmbeddedStack

CLIENTS = 5
JOBS_PER_CLIENT = 10
TINY = {"n_clusters": 12, "cluster_size": 5, "n_regressors": 2, "replications": 20}


def _submit_batch(base_url: str, client_number: int) -> list[str]:
    with httpx.Client(base_url=base_url, timeout=30) as client:
        ids = []
        for job_number in range(JOBS_PER_CLIENT):
            response = client.post(
                "/v1/jobs",
                json={"kind": "crve_montecarlo", "params": {**TINY, "seed": 100 * client_number + job_number}},
            )
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
        return ids


@pytest.mark.slow
def test_fifty_jobs_from_several_clients_each_run_exactly_once(stack: EmbeddedStack, tmp_path: Path) -> None:
    with ThreadPoolExecutor(CLIENTS) as pool:
        batches = list(pool.map(lambda number: _submit_batch(stack.base_url, number), range(CLIENTS)))
    job_ids = [job_id for batch in batches for job_id in batch]
    assert len(set(job_ids)) == CLIENTS * JOBS_PER_CLIENT

    deadline = time.monotonic() + 240
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        while True:
            listing = client.get("/v1/jobs", params={"kind": "crve_montecarlo", "limit": 200}).json()
            statuses = Counter(job["status"] for job in listing["items"])
            if statuses.get("succeeded", 0) == len(job_ids) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert statuses == Counter({"succeeded": len(job_ids)}), (statuses, stack.worker.log_tail())
        jobs = [client.get(f"/v1/jobs/{job_id}").json() for job_id in job_ids]
    assert all(job["attempts"] == 1 and job["device"] == "cpu" for job in jobs)

    worker_log = (tmp_path / "logs" / "worker.log").read_text(errors="replace")
    finished = Counter(re.findall(r"job finished\s+job_id=([0-9a-f-]{36})", worker_log))
    assert set(finished) == set(job_ids) and set(finished.values()) == {1}
