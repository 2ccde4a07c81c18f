"""GPU-sized jobs against CPU workers on the real stack (uvicorn + two Celery workers, auth on,
``GPUEST_DEVICE=auto``, so only the workers know they compute on a CPU), over a PostgreSQL cluster and a Redis
server of this module's own.

With no cap set, a KS policy grid of 1,000 x 100 at a million Euler steps (work) and a panel of 2x10^8
agents (memory) fail at the worker before computing, and the workers stay free for another owner's job. With
the operator's cap lifted, a dual-control simulation of a million paths x 5,000 periods (tens of minutes on a
CPU) is cancelled within seconds, and SIGTERM's warm shutdown hands it back within seconds.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.reliability import figures
from tests.reliability.conftest import Servers
from tests.reliability.stack import ServiceStack, job, service_stack, submit, wait_terminal, wait_until

pytestmark = [pytest.mark.reliability, pytest.mark.servers]

DATABASE = "gpuest_cpu_caps"
# A paced checkpoint (about a second) plus one period of the simulation, the progress write and the job's end
STOP_SECONDS = 15.0
JOB_TIMEOUT_SECONDS = 120.0
WIDE_POLICY_GRID = {
    "n_agents": 1_000,
    "k_grid": {"size": 1000},
    "K_grid": {"size": 100},
    "policy_max_iterations": 1_000_000,
}
HUGE_PANEL = {"n_agents": 200_000_000}
AXES = {
    axis: {"size": 8, "min": low, "max": high}
    for axis, low, high in (("x", -9.0, 11.0), ("mu", -4.0, 4.0), ("sigma", 0.02, 2.0))
}
LONG_SIMULATION = {
    "policy": "myopic",
    "grid": AXES,
    "quadrature_nodes": 4,
    "error_estimate": False,
    "report_states": [[1.0, 0.5, 0.5]],
    "simulation": {"paths": 1_000_000, "horizon": 5000},
}
SMALL_MONTECARLO = {"n_clusters": 10, "cluster_size": 5, "n_regressors": 2, "replications": 20}


@pytest.fixture(scope="module")
def stack(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    database_url = servers.postgres.create_database(DATABASE)
    settings = {"GPUEST_DEVICE": "auto", "GPUEST_CPU_MAX_WORK": '{"dualcontrol_solve": 0}'}
    with service_stack(
        tmp_path_factory.mktemp("cpu-caps"), database_url, servers.redis.url, workers=2, settings=settings
    ) as running:
        yield running


@pytest.fixture(scope="module")
def alice(stack: ServiceStack) -> Iterator[httpx.Client]:
    with stack.client(stack.create_api_key("alice")) as http:
        yield http


@pytest.fixture(scope="module")
def bob(stack: ServiceStack) -> Iterator[httpx.Client]:
    with stack.client(stack.create_api_key("bob")) as http:
        yield http


def wait_simulating(client: httpx.Client, job_id: str) -> None:
    wait_until(
        lambda: str(job(client, job_id)["stage"]).startswith("simulating "),
        JOB_TIMEOUT_SECONDS,
        f"job {job_id} to be in its simulation",
    )


def test_gpu_sized_jobs_fail_fast_and_leave_the_workers_free(alice: httpx.Client, bob: httpx.Client) -> None:
    started = time.monotonic()
    work, memory = submit(alice, "ks_solve", WIDE_POLICY_GRID), submit(alice, "ks_solve", HUGE_PANEL)
    states = wait_terminal(alice, [work, memory], JOB_TIMEOUT_SECONDS)
    failed_after = time.monotonic() - started
    other = submit(bob, "crve_montecarlo", SMALL_MONTECARLO)
    other_state = wait_terminal(bob, [other], JOB_TIMEOUT_SECONDS)[other]
    figures.record(
        "cpu_caps_refused_at_the_worker",
        seconds=round(failed_after, 2),
        codes=[states[work]["error"]["code"], states[memory]["error"]["code"]],
    )
    assert states[work]["status"] == "failed" and states[work]["error"]["code"] == "cpu_work_cap"
    assert states[memory]["status"] == "failed" and states[memory]["error"]["code"] == "cpu_memory_cap"
    assert "params.n_agents" in states[memory]["error"]["message"]
    assert failed_after < 30
    assert other_state["status"] == "succeeded"


def test_a_long_cpu_job_is_cancelled_within_seconds(alice: httpx.Client, bob: httpx.Client) -> None:
    job_id = submit(alice, "dualcontrol_solve", LONG_SIMULATION)
    wait_simulating(alice, job_id)
    cancelled_at = time.monotonic()
    assert alice.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    state = wait_terminal(alice, [job_id], JOB_TIMEOUT_SECONDS)[job_id]
    stopped_after = time.monotonic() - cancelled_at
    figures.record("cpu_long_loop_cancel", seconds=round(stopped_after, 2))
    assert state["status"] == "cancelled" and stopped_after < STOP_SECONDS
    other = submit(bob, "crve_montecarlo", SMALL_MONTECARLO)
    assert wait_terminal(bob, [other], JOB_TIMEOUT_SECONDS)[other]["status"] == "succeeded"


def test_a_warm_shutdown_hands_a_long_cpu_job_back_within_seconds(stack: ServiceStack, alice: httpx.Client) -> None:
    job_id = submit(alice, "dualcontrol_solve", LONG_SIMULATION)
    wait_simulating(alice, job_id)
    worker = stack.worker_running(job_id)
    assert worker.process is not None
    signalled_at = time.monotonic()
    os.killpg(worker.process.pid, signal.SIGTERM)  # Celery's warm shutdown
    worker.process.wait(timeout=60)
    exited_after = time.monotonic() - signalled_at
    handed_back = "job handed back to the queue" in worker.log_tail(10**6)
    figures.record("cpu_long_loop_warm_shutdown", seconds=round(exited_after, 2))
    alice.post(f"/v1/jobs/{job_id}/cancel")  # the other worker has it now: do not leave it running
    assert exited_after < STOP_SECONDS and handed_back
