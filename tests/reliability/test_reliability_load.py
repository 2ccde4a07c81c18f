"""A small load on the real stack (two uvicorn processes, two Celery workers, auth on) over a PostgreSQL
cluster and a Redis server of this module's own: 50 jobs submitted at once, then 200 status polls a second
for 10 s while they run. Every job must end ``succeeded``, recorded exactly once, and every poll answered
200; the latencies (p50, p99) are recorded, not asserted: speed goals belong to bench/, not to tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.reliability import figures
from tests.reliability.conftest import Servers
from tests.reliability.stack import ServiceStack, service_stack, wait_terminal

pytestmark = [pytest.mark.reliability, pytest.mark.servers]

CONCURRENT_SUBMITS = 50
POLL_RATE = 200.0  # per second
POLL_SECONDS = 10.0
POLL_CONNECTIONS = 16
TINY = {"n_clusters": 12, "cluster_size": 5, "n_regressors": 2, "replications": 20}


@pytest.fixture(scope="module")
def stack(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    database_url = servers.postgres.create_database("gpuest_load")
    # A short stale limit: a job whose message went missing is re-sent within seconds, not half a minute.
    with service_stack(tmp_path_factory.mktemp("load"), database_url, servers.redis.url, workers=2,
                       api_workers=2, settings={"GPUEST_STALE_AFTER_SECONDS": "6",
                                                "GPUEST_REAPER_INTERVAL_SECONDS": "0.5"}) as running:
        yield running


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def milliseconds(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(values, 0.50) * 1000, 1), "p99_ms": round(percentile(values, 0.99) * 1000, 1)}


async def paced_polls(base_url: str, headers: dict[str, str], job_ids: list[str]) -> tuple[list[float], list[int]]:
    """GET /v1/jobs/{id} on a fixed schedule of POLL_RATE per second over POLL_CONNECTIONS keep-alive
    connections, cycling through the jobs. A latency runs from the scheduled send time, so a request that
    waits for a free connection while the server falls behind counts its wait (no coordinated omission)."""
    schedule: asyncio.Queue[tuple[float, str] | None] = asyncio.Queue()
    latencies: list[float] = []
    failures: list[int] = []

    async def connection_loop(client: httpx.AsyncClient) -> None:
        while (item := await schedule.get()) is not None:
            scheduled, job_id = item
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                response = await client.get(f"/v1/jobs/{job_id}")
                status = response.status_code
            except httpx.HTTPError:
                status = 0
            latencies.append(time.perf_counter() - scheduled)
            if status != 200:
                failures.append(status)

    clients = [httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) for _ in range(POLL_CONNECTIONS)]
    try:
        start = time.perf_counter() + 0.2
        total = int(POLL_RATE * POLL_SECONDS)
        for number in range(total):
            schedule.put_nowait((start + number / POLL_RATE, job_ids[number % len(job_ids)]))
        for _ in clients:
            schedule.put_nowait(None)
        await asyncio.gather(*(connection_loop(client) for client in clients))
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))
    return latencies, failures


def test_fifty_concurrent_submits_and_200_polls_a_second(stack: ServiceStack) -> None:
    headers = {"Authorization": f"Bearer {stack.create_api_key('load')}"}

    def submit(number: int) -> tuple[str, float]:
        started = time.perf_counter()
        with httpx.Client(base_url=stack.base_url, headers=headers, timeout=60) as client:
            response = client.post("/v1/jobs", json={"kind": "crve_montecarlo", "params": {**TINY, "seed": number}})
        assert response.status_code == 202, response.text
        return str(response.json()["id"]), time.perf_counter() - started

    with ThreadPoolExecutor(CONCURRENT_SUBMITS) as pool:
        submitted = list(pool.map(submit, range(CONCURRENT_SUBMITS)))
    job_ids = [job_id for job_id, _ in submitted]
    assert len(set(job_ids)) == CONCURRENT_SUBMITS

    latencies, failed_polls = asyncio.run(paced_polls(stack.base_url, headers, job_ids))

    with stack.client(headers["Authorization"].removeprefix("Bearer ")) as client:
        states = wait_terminal(client, job_ids, 120)
    runs = stack.finished_runs(job_ids)
    # The broker was up throughout: every job's message must have gone out when it was submitted, none may
    # have needed the reaper (which only hides a failed send behind a delay of the stale limit).
    api_log = stack.api.log_tail(10**8)
    failed_sends = api_log.count("could not enqueue job")
    resent = stack.worker_logs().count("re-sent the message of a queued job")
    once = [job_id for job_id in job_ids if states[job_id]["status"] == "succeeded" and runs[job_id] == 1]
    figures.record(
        "load",
        concurrent_submits=CONCURRENT_SUBMITS,
        submit=milliseconds([seconds for _, seconds in submitted]),
        polls=len(latencies),
        poll_rate_per_second=POLL_RATE,
        poll_seconds=POLL_SECONDS,
        poll=milliseconds(latencies),
        poll_errors=len(failed_polls),
        succeeded_exactly_once=len(once),
        jobs_lost=CONCURRENT_SUBMITS - len(once),
        failed_sends=failed_sends,
        reaper_resends=resent,
        api_processes=2,
        workers=2,
    )
    assert not failed_polls, f"{len(failed_polls)} polls not answered 200: {sorted(set(failed_polls))}"
    assert len(once) == CONCURRENT_SUBMITS, {
        job_id: (states[job_id]["status"], runs[job_id]) for job_id in job_ids if job_id not in once
    }
    first_failure = api_log[api_log.find("could not enqueue job"):][:3000] if failed_sends else ""
    assert (failed_sends, resent) == (0, 0), (
        f"a submitted job's message did not reach a live broker; api.log from the first failure:\n{first_failure}"
    )
