"""The job lifecycle in the worker: claim, run, progress, cancel, failure, the reaper, and a real
worker process killed with SIGKILL in the middle of a job."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import update

from core.queue import broker_connection, send
from core.status import TERMINAL_STATUSES
from kernels.registry import get_kind
from store import jobs as job_store
from store.db import session_scope
from store.models import Job, utcnow
from tests.worker.conftest import LONG, SMALL, comparable, load, reference_result, submit, wait_for
from worker.execute import execute_job
from worker.reaper import reap_once


def test_job_runs_to_success_with_device_and_timings(stack_env: dict[str, str]) -> None:
    job_id = submit(SMALL)
    assert execute_job(job_id, worker="w1") == "succeeded"
    job = load(job_id)
    assert (job.status, job.progress, job.attempts, job.device) == ("succeeded", 1.0, 1, "cpu")
    assert job.result is not None and comparable(job.result) == comparable(reference_result(SMALL))
    assert job.result["device"] == "cpu" and "total" in job.result["timings"]
    # The worker's own seconds only: the per-stage timings live once, in the result.
    assert set(job.timings) == {"queue_wait", "run"}
    assert job.timings["run"] > 0 and job.timings["queue_wait"] >= 0
    assert job.started_at is not None and job.finished_at is not None


def test_second_delivery_of_a_finished_job_does_nothing(stack_env: dict[str, str]) -> None:
    job_id = submit(SMALL)
    assert execute_job(job_id, worker="w1") == "succeeded"
    first = load(job_id)
    assert execute_job(job_id, worker="w2") is None
    again = load(job_id)
    assert (again.attempts, again.worker, again.result) == (1, "w1", first.result)


@pytest.mark.parametrize(
    ("raised", "error_type", "code"),
    [(ValueError("n_regressors=3 needs more observations"), "ValueError", "kernel_error"),
     (ZeroDivisionError("float division by zero"), "ZeroDivisionError", "internal_error")],
)
def test_kernel_error_fails_the_job_with_a_readable_reason(
    stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, raised: Exception, error_type: str, code: str
) -> None:
    # A runner that raises after its first checkpoint (a stand-in kernel: which inputs a real kernel
    # refuses is the kernel's business; what the worker does with the exception is this test's).
    real = get_kind("crve_montecarlo")

    def failing_run(params: Any, ctx: Any) -> Any:
        ctx.progress(0.0, "starting the kernel")
        raise raised

    monkeypatch.setattr("worker.execute.get_kind", lambda name: dataclasses.replace(real, run=failing_run))
    job_id = submit(SMALL)
    assert execute_job(job_id, worker="w1") == "failed"
    job = load(job_id)
    assert (job.error["type"], job.error["code"]) == (error_type, code) and job.result is None
    # A kernel's own refusal is for the user; an unexpected error's text goes to the log only, under an id.
    if code == "kernel_error":
        assert job.error["message"] == str(raised)
    else:
        assert str(raised) not in job.error["message"] and job.error["correlation_id"] in job.error["message"]
    assert job.status == "failed" and job.finished_at is not None


def test_invalid_stored_params_fail_instead_of_crashing(stack_env: dict[str, str]) -> None:
    job_id = submit({**SMALL, "replications": -5})
    assert execute_job(job_id, worker="w1") == "failed"
    assert "replications" in load(job_id).error["message"]


def test_cancel_of_a_running_job_stops_it_at_the_next_checkpoint(stack_env: dict[str, str]) -> None:
    job_id = submit(LONG)
    outcome: list[str | None] = []
    runner = threading.Thread(target=lambda: outcome.append(execute_job(job_id, worker="w1")))
    runner.start()
    wait_for(lambda: load(job_id).status == "running", 20, "the job to start")
    with session_scope() as session:
        assert job_store.request_cancel(session, job_id, "tester").status == "running"
    runner.join(timeout=30)
    job = load(job_id)
    assert outcome == ["cancelled"] and job.status == "cancelled" and job.result is None
    assert job.progress < 1.0


def test_cancel_of_a_queued_job_means_it_never_runs(stack_env: dict[str, str]) -> None:
    job_id = submit(SMALL)
    with session_scope() as session:
        assert job_store.request_cancel(session, job_id, "tester").status == "cancelled"
    assert execute_job(job_id, worker="w1") is None
    job = load(job_id)
    assert (job.status, job.attempts, job.started_at) == ("cancelled", 0, None)


def _make_stale(job_id: str, attempts: int) -> None:
    with session_scope() as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status="running", worker="lost", attempts=attempts, heartbeat_at=utcnow() - timedelta(hours=1))
        )


def test_reaper_requeues_a_silent_job_then_fails_it_when_attempts_are_spent(stack_env: dict[str, str]) -> None:
    job_id = submit(SMALL)
    _make_stale(job_id, attempts=1)
    assert reap_once()["requeued"] == 1
    assert load(job_id).status == "queued"
    assert execute_job(job_id, worker="w2") == "succeeded"

    doomed = submit(SMALL)
    _make_stale(doomed, attempts=3)
    assert reap_once()["failed"] == 1
    job = load(doomed)
    assert job.status == "failed" and job.error["type"] == "WorkerLost"


def test_the_reaper_deletes_finished_jobs_past_the_retention(stack_env: dict[str, str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from core.settings import get_settings
    from store.artifacts import job_artifact_dir, save_artifact

    old, recent = submit(SMALL), submit(SMALL)
    assert execute_job(old, worker="w") == "succeeded" and execute_job(recent, worker="w") == "succeeded"
    save_artifact(old, "extra", np.arange(3.0))  # a file that must go with the job
    _set_times(old, finished_at=utcnow() - timedelta(days=8))
    assert "expired" not in reap_once()  # retention off (the default): nothing is deleted
    assert job_artifact_dir(old).is_dir()
    monkeypatch.setenv("GPUEST_RETENTION_DAYS", "7")
    get_settings.cache_clear()
    try:
        assert reap_once()["expired"] == 1
    finally:
        get_settings.cache_clear()
    with session_scope() as session:
        assert session.get(Job, old) is None and session.get(Job, recent) is not None
    assert not job_artifact_dir(old).exists()


def _messages_waiting(queue: str) -> int:
    with broker_connection() as connection:
        return int(connection.default_channel.queue_declare(queue=queue, durable=True).message_count)


def _set_times(job_id: str, **values: Any) -> None:
    with session_scope() as session:
        session.execute(update(Job).where(Job.id == job_id).values(**values))


def test_reaper_resends_only_its_own_queues_jobs_whose_last_send_is_stale(stack_env: dict[str, str]) -> None:
    own, other = stack_env["GPUEST_QUEUE"], f"{stack_env['GPUEST_QUEUE']}-other"
    long_ago = utcnow() - timedelta(hours=1)
    lost = submit(SMALL)
    _set_times(lost, created_at=long_ago, enqueued_at=long_ago)
    recently_sent = submit(SMALL)
    _set_times(recently_sent, created_at=long_ago)  # old, but its message went out just now
    elsewhere = submit(SMALL, queue=other)
    _set_times(elsewhere, created_at=long_ago, enqueued_at=long_ago)
    from_before_0002 = submit(SMALL)  # no queue, no send time: the one queue, sent when created
    _set_times(from_before_0002, created_at=long_ago, enqueued_at=None, queue=None)

    assert reap_once()["resent"] == 2
    assert _messages_waiting(own) == 2 and _messages_waiting(other) == 0
    assert load(from_before_0002).queue == own
    assert load(lost).enqueued_at.replace(tzinfo=None) > long_ago.replace(tzinfo=None) + timedelta(minutes=59)
    assert load(elsewhere).enqueued_at.replace(tzinfo=None) == long_ago.replace(tzinfo=None)
    # The next passes leave it alone: its new message has the stale limit to be taken.
    assert reap_once()["resent"] == 0 and reap_once()["resent"] == 0
    assert _messages_waiting(own) == 2
    assert execute_job(lost, worker="w1") == "succeeded"


def test_reaper_resends_nothing_while_its_worker_runs_or_just_ran_a_job(
    stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker import reaper

    activity = reaper.Activity()
    monkeypatch.setattr(reaper, "activity", activity)
    waiting = submit(SMALL)  # behind a long job, say: its message is not lost, only not taken yet
    long_ago = utcnow() - timedelta(hours=1)
    _set_times(waiting, created_at=long_ago, enqueued_at=long_ago)
    activity.started()
    assert reap_once()["resent"] == 0
    activity.finished()  # between two jobs of a backlog: the worker is about to take the next message
    assert reap_once()["resent"] == 0
    time.sleep(float(stack_env["GPUEST_REAPER_INTERVAL_SECONDS"]))
    assert reap_once()["resent"] == 1


def test_reaper_requeues_a_stale_job_on_the_jobs_own_queue(stack_env: dict[str, str]) -> None:
    own, other = stack_env["GPUEST_QUEUE"], f"{stack_env['GPUEST_QUEUE']}-other"
    job_id = submit(SMALL, queue=other)
    _make_stale(job_id, attempts=1)
    before = utcnow()
    assert reap_once()["requeued"] == 1
    job = load(job_id)
    assert job.status == "queued" and job.enqueued_at.replace(tzinfo=None) >= before.replace(tzinfo=None)
    assert _messages_waiting(other) == 1 and _messages_waiting(own) == 0


@pytest.mark.slow
def test_worker_killed_mid_job_is_recovered_exactly_once(stack_env: dict[str, str], start_worker: Any) -> None:
    expected = comparable(reference_result(LONG))
    first = start_worker()
    job_id = submit(LONG)
    send(job_id)
    wait_for(lambda: load(job_id).status == "running" and load(job_id).progress > 0, 60, "the job to run")
    first.kill_hard()
    assert load(job_id).status == "running"

    second = start_worker()
    wait_for(lambda: load(job_id).status in TERMINAL_STATUSES, 120, "the rescued job to finish")
    job = load(job_id)
    assert job.status == "succeeded", second.output()[-3000:]
    assert job.attempts == 2 and job.worker != "lost"
    assert comparable(job.result) == expected

    def finished_lines() -> list[str]:
        return [line for line in second.output().splitlines() if "job finished" in line and job_id in line]

    # the worker logs the line just after its commit, so the status can be read before the line is out
    wait_for(lambda: len(finished_lines()) > 0, 10, "the worker's 'job finished' line")
    assert len(finished_lines()) == 1, finished_lines()


@pytest.mark.slow
def test_worker_keeps_serving_after_a_failing_job(stack_env: dict[str, str], start_worker: Any) -> None:
    start_worker()
    failing = submit({**SMALL, "n_clusters": 2, "cluster_size": 1, "n_regressors": 3})
    healthy = submit(SMALL)
    send(failing)
    send(healthy)
    wait_for(lambda: load(healthy).status in TERMINAL_STATUSES, 60, "the second job")
    assert load(failing).status == "failed" and load(healthy).status == "succeeded"


def test_a_demanded_gpu_that_is_missing_fails_the_job_instead_of_looping(
    stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernels.backend import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    monkeypatch.setenv("GPUEST_DEVICE", "gpu")
    job_id = submit(SMALL)
    assert execute_job(job_id, worker="w1") == "failed"
    job = load(job_id)
    assert job.device == "unavailable" and job.error["type"] == "GPUUnavailableError"
    assert "GPUEST_DEVICE=gpu" in job.error["message"]
