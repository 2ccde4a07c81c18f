"""Fault injection on the real stack (uvicorn + two Celery workers, auth on) over a PostgreSQL cluster and a
Redis server of this module's own: a worker SIGKILLed mid-job, the broker stopped and started empty, every
database connection terminated mid-job (pg_terminate_backend, as a failover does) and the database stopped
and started mid-job.

After each fault every job must end ``succeeded``, recorded exactly once by a worker, with the result of an
undisturbed run of the same spec (the seed is part of it); while the database is down the API answers 503
problems with Retry-After, never a 500, and once it is back a bad key is a 401 again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.reliability import figures
from tests.reliability.conftest import Servers
from tests.reliability.stack import (
    ServiceStack,
    comparable,
    job,
    service_stack,
    submit,
    wait_terminal,
    wait_until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.servers]

KIND = "crve_montecarlo"
# About 3 s on one core of the development machine: long enough to be hit mid-run, short enough for CI.
PARAMS = {"n_clusters": 50, "cluster_size": 30, "n_regressors": 3, "replications": 6000, "seed": 12}
STALE_AFTER_SECONDS = 6.0  # longer than the database outage below, so the outage alone reaps nothing
DATABASE_OUTAGE_SECONDS = 4.0
BROKER_OUTAGE_SECONDS = 3.0
TERMINATION_STORM_SECONDS = 1.5
JOB_TIMEOUT_SECONDS = 120.0
LOG_CATCH_UP_SECONDS = 10.0  # the worker's "job finished" line follows the commit the status poll sees
DATABASE = "gpuest_faults"

_outcomes: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module")
def stack(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    database_url = servers.postgres.create_database(DATABASE)
    with service_stack(
        tmp_path_factory.mktemp("faults"),
        database_url,
        servers.redis.url,
        workers=2,
        api_workers=2,  # as compose runs it
        settings={
            "GPUEST_HEARTBEAT_SECONDS": "0.5",
            "GPUEST_STALE_AFTER_SECONDS": str(STALE_AFTER_SECONDS),
            "GPUEST_REAPER_INTERVAL_SECONDS": "0.5",
        },
    ) as running:
        yield running


@pytest.fixture(scope="module")
def api_key(stack: ServiceStack) -> str:
    return stack.create_api_key("reliability")


@pytest.fixture(scope="module")
def client(stack: ServiceStack, api_key: str) -> Iterator[httpx.Client]:
    with stack.client(api_key) as http:
        yield http


@pytest.fixture(scope="module")
def undisturbed(stack: ServiceStack, client: httpx.Client) -> dict[str, Any]:
    """The result of the spec run on the same stack with no fault: what every disturbed run must match."""
    started = time.monotonic()
    job_id = submit(client, KIND, PARAMS)
    state = wait_terminal(client, [job_id], JOB_TIMEOUT_SECONDS)[job_id]
    assert state["status"] == "succeeded", (state, stack.worker_logs()[-3000:])
    assert stack.finished_runs([job_id]) == {job_id: 1}
    figures.record("faults_undisturbed_job", kind=KIND, params=PARAMS,
                   submit_to_finish_seconds=round(time.monotonic() - started, 2))
    return comparable(client.get(f"/v1/jobs/{job_id}/result").json())


def wait_running(client: httpx.Client, job_id: str) -> None:
    """Until the job is mid-run: claimed and past its first progress checkpoint."""
    wait_until(lambda: (state := job(client, job_id))["status"] == "running" and state["progress"] > 0,
               JOB_TIMEOUT_SECONDS, f"job {job_id} to be running")


def settle(
    fault: str, stack: ServiceStack, client: httpx.Client, job_ids: list[str], undisturbed: dict[str, Any],
    server_errors: int = 0, **observed: Any,
) -> dict[str, Any]:
    """Wait for the jobs, record the fault's outcome (before asserting, so a failure is recorded too)."""
    states = wait_terminal(client, job_ids, JOB_TIMEOUT_SECONDS)
    succeeded = [job_id for job_id in job_ids if states.get(job_id, {}).get("status") == "succeeded"]
    # The worker logs "job finished" just after the commit that the status poll sees: give its log a moment
    # to catch up before counting (CI once read it first: "recorded as finished 0 times" for a success).
    deadline = time.monotonic() + LOG_CATCH_UP_SECONDS
    runs = stack.finished_runs(job_ids)
    while any(runs[job_id] == 0 for job_id in succeeded) and time.monotonic() < deadline:
        time.sleep(0.2)
        runs = stack.finished_runs(job_ids)
    same = [job_id for job_id in succeeded
            if comparable(client.get(f"/v1/jobs/{job_id}/result").json()) == undisturbed]
    outcome = {
        "jobs": len(job_ids),
        "jobs_lost": len(job_ids) - len(succeeded),  # failed, cancelled or never finished
        "finished_more_than_once": sum(1 for job_id in job_ids if runs[job_id] > 1),
        "result_differs": len(succeeded) - len(same),
        "attempts": [states.get(job_id, {}).get("attempts") for job_id in job_ids],
        "api_5xx_other_than_503": server_errors,
        **observed,
    }
    outcome["survived"] = not (outcome["jobs_lost"] or outcome["finished_more_than_once"]
                               or outcome["result_differs"] or server_errors)
    _outcomes[fault] = outcome
    figures.record("faults", injected=sorted(_outcomes), survived=sum(o["survived"] for o in _outcomes.values()),
                   jobs=sum(o["jobs"] for o in _outcomes.values()),
                   jobs_lost=sum(o["jobs_lost"] for o in _outcomes.values()), by_fault=_outcomes)
    for job_id in job_ids:
        state = states.get(job_id, {})
        assert state.get("status") == "succeeded", (
            f"{fault}: job {job_id} ended {state.get('status')} with {state.get('error')}\n"
            + stack.worker_logs()[-4000:]
        )
        assert runs[job_id] == 1, f"{fault}: job {job_id} recorded as finished {runs[job_id]} times"
    assert len(same) == len(job_ids), f"{fault}: a disturbed run's result differs from the undisturbed one"
    return outcome


def test_worker_killed_mid_job_reruns_it_to_the_same_result(
    stack: ServiceStack, client: httpx.Client, undisturbed: dict[str, Any]
) -> None:
    job_id = submit(client, KIND, PARAMS)
    wait_running(client, job_id)
    stack.kill_worker(stack.worker_running(job_id))
    stack.start_worker()  # what a supervisor (gpuest serve, compose's restart policy) does
    outcome = settle("worker_sigkill", stack, client, [job_id], undisturbed)
    assert outcome["attempts"] == [2]  # the killed run counted, the re-run finished it


def test_broker_outage_loses_no_job(
    stack: ServiceStack, servers: Servers, client: httpx.Client, undisturbed: dict[str, Any]
) -> None:
    before = [submit(client, KIND, PARAMS) for _ in range(2)]
    wait_running(client, before[0])
    servers.redis.stop()
    try:
        # The broker is not needed to accept a job: it stays queued and the reaper sends it later.
        during = [submit(client, KIND, PARAMS) for _ in range(2)]
        time.sleep(BROKER_OUTAGE_SECONDS)
    finally:
        servers.redis.start()  # empty: every message sent before the outage is gone
    settle("broker_stop_start", stack, client, before + during, undisturbed)


def test_connection_termination_mid_job_does_not_fail_it(
    stack: ServiceStack, servers: Servers, client: httpx.Client, undisturbed: dict[str, Any]
) -> None:
    job_id = submit(client, KIND, PARAMS)
    wait_running(client, job_id)
    # First the case, made certain: the worker's progress UPDATE is held on the job's row lock and
    # its session terminated while the statement is in flight (a pool's pre-ping cannot save that one).
    in_flight = servers.postgres.terminate_blocked_statements(
        DATABASE, "SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (job_id,), matching="progress"
    )
    assert any("progress" in statement for statement in in_flight), in_flight
    # A pause, so that a worker failing the job over it has its failure recorded (not hidden by what follows);
    # then every session of the database, ten times a second, through the rest of the run and its finish.
    time.sleep(1.0)
    terminated = len(in_flight)
    deadline = time.monotonic() + TERMINATION_STORM_SECONDS
    while time.monotonic() < deadline:
        terminated += servers.postgres.terminate_backends(DATABASE)
        time.sleep(0.1)
    outcome = settle("pg_terminate_backend", stack, client, [job_id], undisturbed, sessions_terminated=terminated,
                     statements_terminated_in_flight=len(in_flight))
    assert outcome["attempts"] == [1], "a dropped connection cost a re-run: the worker did not retry the write"


def _is_problem(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith("application/problem+json")


def test_database_outage_answers_503_and_loses_no_job(
    stack: ServiceStack, servers: Servers, client: httpx.Client, undisturbed: dict[str, Any]
) -> None:
    job_id = submit(client, KIND, PARAMS)
    wait_running(client, job_id)
    unknown_key = {"Authorization": f"Bearer gpe_{uuid.uuid4().hex}"}
    probes: list[tuple[str, httpx.Response]] = []
    servers.postgres.stop("fast")
    try:
        deadline = time.monotonic() + DATABASE_OUTAGE_SECONDS
        while time.monotonic() < deadline:
            probes += [
                ("GET job", client.get(f"/v1/jobs/{job_id}")),
                ("GET jobs", client.get("/v1/jobs")),
                ("POST job", client.post("/v1/jobs", json={"kind": KIND, "params": PARAMS})),
                ("GET datasets", client.get("/v1/datasets")),
                ("unknown key", client.get("/v1/jobs", headers=unknown_key)),
                ("readyz", client.get("/readyz")),
            ]
            healthz = client.get("/healthz")
            assert healthz.status_code == 200, "the process answers whatever the database does"
            time.sleep(0.25)
    finally:
        servers.postgres.start()
    answers = [(what, response.status_code) for what, response in probes]
    server_errors = sum(1 for _, response in probes if response.status_code >= 500 and response.status_code != 503)
    # Back up: a bad key is a 401 again and a good one reads its job (a few 503s while pools reconnect at most).
    after: list[tuple[str, int]] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        bad, good = client.get("/v1/jobs", headers=unknown_key), client.get(f"/v1/jobs/{job_id}")
        after += [("unknown key", bad.status_code), ("GET job", good.status_code)]
        if (bad.status_code, good.status_code) == (401, 200):
            break
        time.sleep(0.25)
    server_errors += sum(1 for _, status in after if status >= 500 and status != 503)
    outcome = settle(
        "postgres_stop_start", stack, client, [job_id], undisturbed, server_errors=server_errors,
        api_answers_while_down=len(probes),
        answered_503_problem_with_retry_after=sum(
            1 for _, response in probes if response.status_code == 503 and _is_problem(response)
            and response.headers.get("retry-after", "").isdigit()
        ),
    )
    # Shorter than the stale limit: the worker waits the outage out and no reaper re-runs the job.
    assert outcome["attempts"] == [1], "the outage cost a re-run: the worker did not retry its writes"

    assert all(status == 503 for _, status in answers), f"while the database was down: {answers}"
    for what, response in probes:
        assert _is_problem(response), f"{what}: {response.headers.get('content-type')} {response.text[:200]}"
        assert response.headers.get("retry-after", "").isdigit(), f"{what}: no Retry-After"
        assert f":{servers.postgres.port}" not in response.text, f"{what} names the database's address"
    assert after[-2:] == [("unknown key", 401), ("GET job", 200)], f"after the database came back: {after}"
    assert all(status in (200, 401, 503) for _, status in after), after
