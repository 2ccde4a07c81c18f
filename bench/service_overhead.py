"""Service overhead on the Postgres + Redis stack: submit-to-result of a trivial job, and status polls.

    DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1/postgres REDIS_URL=redis://127.0.0.1:6379/0 \
        python bench/service_overhead.py [--jobs 30] [--rate 200 ...] [--seconds 10] [--api-workers 2]

Starts the real stack (uvicorn with ``--api-workers`` processes and one Celery worker, as `gpuest serve`
does) on a throwaway database created beside the one DATABASE_URL names and a queue of its own on Redis,
then measures:

1. submit-to-result: POST /v1/jobs of a tiny ``crve_montecarlo``, poll GET /v1/jobs/{id} every 5 ms until it
   succeeds, GET its result; the median over ``--jobs`` jobs run one after another.
2. status polls: GET /v1/jobs/{id} on a fixed schedule of ``--rate`` per second for ``--seconds`` over 16
   keep-alive connections, latency percentiles from the scheduled send time to the answer.

Prints a Markdown section for bench/RESULTS.md. Every request goes to 127.0.0.1 and both loops are bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.orm import Session

from cli.serve import embedded_stack
from store.db import engine_for
from store.keys import create_key

TINY_JOB = {
    "kind": "crve_montecarlo",
    "params": {"n_clusters": 10, "cluster_size": 5, "n_regressors": 2, "replications": 10, "seed": 1},
}
POLL_SECONDS = 0.005


@contextmanager
def throwaway_database(admin_url: str) -> Iterator[str]:
    name = f"gpuest_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(make_url(admin_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def submit_to_result(client: httpx.Client) -> float:
    started = time.perf_counter()
    response = client.post("/v1/jobs", json=TINY_JOB)
    response.raise_for_status()
    job_id = response.json()["id"]
    deadline = started + 60
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] == "succeeded":
            break
        if job["status"] in {"failed", "cancelled"} or time.perf_counter() > deadline:
            raise RuntimeError(f"job {job_id} ended {job['status']}: {job.get('error')}")
        time.sleep(POLL_SECONDS)
    client.get(f"/v1/jobs/{job_id}/result").raise_for_status()
    return time.perf_counter() - started


@dataclass
class PollRun:
    rate: float
    latencies: list[float]
    errors: int
    elapsed: float
    client_cpu: float  # CPU seconds the load generator itself used

    def row(self) -> str:
        p50, p99 = (percentile(self.latencies, q) * 1000 for q in (0.50, 0.99))
        answered = len(self.latencies) / self.elapsed
        return (
            f"| status polls at {self.rate:.0f}/s ({len(self.latencies)} requests over {self.elapsed:.1f} s, "
            f"{self.errors} errors, client CPU {self.client_cpu:.1f} s) | answered {answered:.0f}/s, "
            f"p50 {p50:.1f} ms, p99 {p99:.1f} ms (from the scheduled send) | p99 < 50 ms at 200/s |"
        )


POLL_CONNECTIONS = 16


async def paced_polls(base_url: str, headers: Any, job_id: str, rate: float, seconds: float) -> PollRun:
    """GET /v1/jobs/{id} on a fixed schedule of ``rate`` per second over ``POLL_CONNECTIONS`` keep-alive
    connections (one client each: a single pool with thousands of waiters costs the client more CPU than the
    server). Latency is measured from the scheduled send time, so time spent waiting for a free connection
    when the server falls behind counts too (no coordinated omission)."""
    schedule: asyncio.Queue[float | None] = asyncio.Queue()
    latencies: list[float] = []
    errors = 0
    total = int(rate * seconds)

    async def connection_loop(client: httpx.AsyncClient) -> None:
        nonlocal errors
        while (scheduled := await schedule.get()) is not None:
            response = await client.get(f"/v1/jobs/{job_id}")
            latencies.append(time.perf_counter() - scheduled)
            errors += response.status_code != 200

    # Clients made and connected before the clock starts: creating one costs milliseconds of CPU (its SSL
    # context), which would otherwise land on the first scheduled requests.
    clients = [httpx.AsyncClient(base_url=base_url, timeout=30.0, headers=headers) for _ in range(POLL_CONNECTIONS)]
    await asyncio.gather(*(client.get("/healthz") for client in clients))
    cpu_before = time.process_time()
    loops = [asyncio.create_task(connection_loop(client)) for client in clients]
    start = time.perf_counter()
    for index in range(total):
        due = start + index / rate
        if (delay := due - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        schedule.put_nowait(due)
    for _ in loops:
        schedule.put_nowait(None)
    await asyncio.gather(*loops)
    elapsed, client_cpu = time.perf_counter() - start, time.process_time() - cpu_before
    await asyncio.gather(*(client.aclose() for client in clients))
    return PollRun(rate, latencies, errors, elapsed, client_cpu)


def headers_for(database_url: str, auth: bool) -> dict[str, str]:
    """With auth on, a fresh API key in the bench database (migrated by the stack) for every request."""
    if not auth:
        return {}
    with Session(engine_for(database_url)) as session:
        secret = create_key(session, "bench")
        session.commit()
    return {"Authorization": f"Bearer {secret}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--rate", type=float, nargs="+", default=[200.0], help="poll rates to try, in turn")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--api-workers", type=int, default=2, help="uvicorn server processes (one per core)")
    parser.add_argument(
        "--auth", action="store_true", help="API keys on, as in the compose stack: every request sends one"
    )
    args = parser.parse_args()
    database_url, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    if not (database_url or "").startswith("postgresql") or not (redis_url or "").startswith("redis"):
        sys.exit("set DATABASE_URL (postgresql+psycopg://...) and REDIS_URL (redis://...)")
    assert database_url is not None and redis_url is not None
    load_before = " ".join(f"{value:.2f}" for value in os.getloadavg())

    with throwaway_database(database_url) as bench_db, tempfile.TemporaryDirectory() as data_dir:
        env = {
            "DATABASE_URL": bench_db,
            "BROKER_URL": redis_url,
            "GPUEST_QUEUE": f"bench-{uuid.uuid4().hex[:8]}",
            "GPUEST_DEVICE": "cpu",
            "GPUEST_AUTH_ENABLED": "true" if args.auth else "false",
        }
        with embedded_stack(
            Path(data_dir), env=env, log_dir=Path(data_dir) / "logs", api_workers=args.api_workers
        ) as stack, httpx.Client(
            base_url=stack.base_url, timeout=30.0, headers=headers_for(bench_db, args.auth)
        ) as client:
            submit_to_result(client)  # warm-up: imports in the worker, first connections
            durations = [submit_to_result(client) for _ in range(args.jobs)]
            job_id = client.post("/v1/jobs", json=TINY_JOB).json()["id"]
            # Warm-up: both API processes loaded, their connection pools filled, the client's pool open.
            asyncio.run(paced_polls(stack.base_url, client.headers, job_id, 100.0, 2.0))
            polls = [
                asyncio.run(paced_polls(stack.base_url, client.headers, job_id, rate, args.seconds))
                for rate in args.rate
            ]

    median_ms = statistics.median(durations) * 1000
    command = "python bench/service_overhead.py " + " ".join(sys.argv[1:])
    auth = "on (an API key in every request)" if args.auth else "off"
    print(f"""
## Service overhead (Postgres + Redis stack), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC

Command: `DATABASE_URL=postgresql+psycopg://... REDIS_URL=redis://127.0.0.1:6379/0 {command.strip()}`
Machine: {platform.node() or "?"}, {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()};
uvicorn with {args.api_workers} server process(es), auth {auth}, one Celery worker (solo pool), PostgreSQL and
Redis on the same machine, the client (httpx, asyncio for the paced polls) on loopback; load average before
the run {load_before}.

| measure | value | target |
| --- | --- | --- |
| submit-to-result of a tiny `crve_montecarlo`, median of {len(durations)} (5 ms status polls) | \
{median_ms:.0f} ms (min {min(durations) * 1000:.0f}, max {max(durations) * 1000:.0f}) | < 300 ms |
""" + "\n".join(run.row() for run in polls))


if __name__ == "__main__":
    main()
