"""A CPU worker running a job that would take many minutes (the caps lifted by the operator) hears a cancel and
a warm shutdown (SIGTERM) within seconds: the long loops' paced checkpoints reach the worker's progress
channel, which reads the job's cancel flag and the shutdown flag."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import _clear_caches, load, submit

from store import jobs as job_store
from store.db import session_scope
from worker.execute import execute_job
from worker.progress import worker_stopping

# After the cancel or shutdown: a checkpoint a second plus one loop iteration, then the progress write's
# pause (0.5 s) and the job's ending, with room for a busy CI machine.
LATENCY_SECONDS = 10.0
WIDE_POLICY_GRID = {
    "n_agents": 1_000,
    "periods": 200,
    "k_grid": {"size": 1000},
    "K_grid": {"size": 100},
    "policy_max_iterations": 1_000_000,
    "policy_tolerance": 1e-12,
    "den_haan_periods": 0,
}
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


@pytest.fixture
def caps_lifted(stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GPUEST_CPU_MAX_WORK", '{"ks_solve": 0, "dualcontrol_solve": 0}')
    _clear_caches()
    yield
    worker_stopping.clear()


def after(seconds: float, action: Callable[[], None]) -> tuple[threading.Timer, list[float]]:
    fired: list[float] = []

    def run() -> None:
        action()
        fired.append(time.monotonic())

    timer = threading.Timer(seconds, run)
    timer.start()
    return timer, fired


def run_until_stopped(job_id: str, stop: Callable[[], None], delay: float) -> tuple[Any, float]:
    timer, fired = after(delay, stop)
    try:
        outcome = execute_job(job_id, worker="w1")
    finally:
        timer.cancel()
    assert fired, "the job ended before it was stopped"
    return outcome, time.monotonic() - fired[0]


def cancel(job_id: str, stages: list[str]) -> Callable[[], None]:
    """The owner's cancel; ``stages`` gets the stage the job had reported by then."""

    def request() -> None:
        stages.append(str(load(job_id).stage))
        with session_scope() as session:
            job_store.request_cancel(session, job_id, owner="tester")

    return request


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "params", "delay", "loop"),
    [
        ("ks_solve", WIDE_POLICY_GRID, 3.0, "iteration 1: policy step"),
        ("dualcontrol_solve", LONG_SIMULATION, 8.0, "simulating "),
    ],
    ids=["ks", "dualcontrol"],
)
def test_a_long_cpu_job_is_cancelled_within_seconds(
    caps_lifted: None, kind: str, params: dict[str, Any], delay: float, loop: str
) -> None:
    job_id = submit(params, kind=kind)
    stages: list[str] = []
    outcome, latency = run_until_stopped(job_id, cancel(job_id, stages), delay)
    assert stages[0].startswith(loop)  # the cancel came inside the loop under test
    assert outcome == "cancelled" and load(job_id).status == "cancelled"
    assert latency < LATENCY_SECONDS


@pytest.mark.slow
def test_a_warm_shutdown_hands_a_long_cpu_job_back_within_seconds(caps_lifted: None) -> None:
    job_id = submit(WIDE_POLICY_GRID, kind="ks_solve")
    outcome, latency = run_until_stopped(job_id, worker_stopping.set, 3.0)  # Celery's SIGTERM handler
    assert outcome == "queued" and load(job_id).status == "queued"
    assert latency < LATENCY_SECONDS
