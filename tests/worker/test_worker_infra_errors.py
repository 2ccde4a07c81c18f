"""Database and broker errors inside the worker are infrastructure, not the job's failure: a dropped
connection under a claim, a progress write or the final write is retried; a progress write that keeps
failing is skipped; a result that cannot be stored is kept on disk and stored by the job's next run; users
see a stable code and message, never SQL or a host. On PostgreSQL the connection is really terminated
(``pg_terminate_backend``), under a statement of the worker's own and, for a real worker process, by
application_name while a job runs."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from core.settings import get_settings
from kernels.registry import get_kind
from store import work
from store.artifacts import pending_outcome_path
from store.db import session_scope
from store.models import Job, utcnow
from tests.worker.conftest import (
    KIND,
    LONG,
    SMALL,
    WorkerProcess,
    comparable,
    load,
    reference_result,
    submit,
    wait_for,
)
from worker import infra
from worker.execute import execute_job
from worker.infra import InfrastructureUnavailable, retry_infrastructure
from worker.reaper import reap_once

POSTGRES = [pytest.param("servers", marks=pytest.mark.servers)]


def dropped_connection(
    statement: str = "UPDATE jobs SET progress=%(progress)s WHERE jobs.id = %(id)s",
) -> OperationalError:
    """What SQLAlchemy raises when the server closed the connection under a statement."""
    return OperationalError(statement, {}, Exception("server closed the connection unexpectedly"))


def reference(params: dict[str, Any]) -> dict[str, Any]:
    return comparable(reference_result(params))


def assert_succeeded_like_undisturbed(job_id: str, params: dict[str, Any], attempts: int = 1) -> Job:
    job = load(job_id)
    assert (job.status, job.error, job.attempts) == ("succeeded", None, attempts), (job.status, job.error)
    assert job.result is not None and comparable(job.result) == reference(params)
    assert not pending_outcome_path(job_id).exists()
    return job


def use_settings(monkeypatch: pytest.MonkeyPatch, **values: float) -> None:
    for name, value in values.items():
        monkeypatch.setenv(f"GPUEST_{name.upper()}", str(value))
    get_settings.cache_clear()


# -- the retry itself ----------------------------------------------------------------------------------------


def test_retry_gives_up_after_its_budget_with_growing_bounded_delays() -> None:
    delays: list[float] = []

    def always_down() -> None:
        raise dropped_connection()

    started = time.monotonic()
    with pytest.raises(InfrastructureUnavailable) as raised:
        retry_infrastructure(always_down, what="test", budget_seconds=0.5, sleep=lambda s: time.sleep(min(s, 0.05)))
    assert time.monotonic() - started < 5
    assert "SELECT" not in str(raised.value) and "UPDATE" not in str(raised.value)
    assert isinstance(raised.value.__cause__, OperationalError)
    assert not isinstance(raised.value, ValueError)  # a kernel's `except ValueError` cannot swallow it

    calls = [0]

    def down_three_times() -> str:
        calls[0] += 1
        if calls[0] <= 3:
            raise dropped_connection()
        return "stored"

    assert retry_infrastructure(down_three_times, what="test", budget_seconds=60, sleep=delays.append) == "stored"
    assert calls[0] == 4 and len(delays) == 3
    # Exponential with jitter in [0.5, 1.5): each delay's midpoint doubles; all stay under the cap.
    assert all(infra.FIRST_DELAY_SECONDS * 2**i * 0.5 <= d < infra.FIRST_DELAY_SECONDS * 2**i * 1.5
               for i, d in enumerate(delays))


def test_retry_lets_other_errors_through_at_once() -> None:
    calls = [0]

    def broken() -> None:
        calls[0] += 1
        raise IntegrityError("INSERT ...", {}, Exception("duplicate key"))

    with pytest.raises(IntegrityError):
        retry_infrastructure(broken, what="test", budget_seconds=60, sleep=lambda _s: None)
    with pytest.raises(ValueError):
        retry_infrastructure(lambda: int("x"), what="test", budget_seconds=60, sleep=lambda _s: None)
    assert calls[0] == 1


def test_broker_errors_are_infrastructure() -> None:
    from kombu.exceptions import OperationalError as KombuOperationalError

    assert infra.is_infrastructure_error(KombuOperationalError("Error 111 connecting to localhost:6379"))
    assert infra.is_infrastructure_error(ConnectionRefusedError(111, "Connection refused"))
    assert not infra.is_infrastructure_error(ValueError("policy step did not converge"))
    assert not infra.is_infrastructure_error(ZeroDivisionError("float division by zero"))


# -- injected database errors (both stacks) ---------------------------------------------------------------


def failing_for(monkeypatch: pytest.MonkeyPatch, name: str, failures: int | None) -> list[int]:
    """``store.work.<name>`` (the lifecycle of jobs and chunks) raises a dropped connection for its first
    ``failures`` calls (None: always)."""
    real = getattr(work, name)
    calls = [0]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if failures is None or calls[0] <= failures:
            raise dropped_connection(f"{name.upper()} jobs ... [host db.internal:5432 pid 4242]")
        return real(*args, **kwargs)

    monkeypatch.setattr(work, name, flaky)
    return calls


@pytest.mark.parametrize("operation", ["claim", "record_progress", "finish"])
def test_a_few_dropped_connections_do_not_fail_the_job(
    stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    calls = failing_for(monkeypatch, operation, failures=2)
    job_id = submit(SMALL)
    assert execute_job(job_id, worker="w1") == "succeeded"
    assert calls[0] >= 3
    assert_succeeded_like_undisturbed(job_id, SMALL)


@pytest.mark.slow
def test_progress_writes_that_keep_failing_are_skipped_and_paused(
    stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = failing_for(monkeypatch, "record_progress", failures=None)
    job_id = submit(LONG)
    started = time.monotonic()
    assert execute_job(job_id, worker="w1") == "succeeded"
    seconds = time.monotonic() - started
    assert_succeeded_like_undisturbed(job_id, LONG)
    # Paused writes: far fewer tries than one per 0.5 s checkpoint interval times the retries within one.
    assert 1 <= calls[0] <= 10 + 4 * seconds, calls[0]


def run_but_keep_the_outcome(job_id: str) -> None:
    """Run the job while its outcome cannot be stored (every finish fails): it is left running, kept on disk."""
    with pytest.MonkeyPatch.context() as outage:
        use_settings(outage, worker_result_retry_seconds=1.0)
        failing_for(outage, "finish", failures=None)
        assert execute_job(job_id, worker="w1") is None  # left, not failed
    get_settings.cache_clear()  # the database is back, and the settings as the stack set them
    assert pending_outcome_path(job_id).exists()


def must_not_run(_params: Any, _ctx: Any) -> Any:
    raise AssertionError("the kernel ran again although its outcome was kept")


def forbid_running_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    real = get_kind(KIND)
    monkeypatch.setattr("worker.execute.get_kind", lambda _name: dataclasses.replace(real, run=must_not_run))


def make_silent(job_id: str, **values: Any) -> None:
    """The job's worker stopped heartbeating long ago (the reaper's case), with ``values`` set too."""
    with session_scope() as session:
        session.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=utcnow().replace(year=2000),
                                                                   **values))


def test_an_outcome_that_cannot_be_stored_is_kept_and_stored_by_the_next_run(
    stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = submit(SMALL)
    run_but_keep_the_outcome(job_id)
    job = load(job_id)
    assert (job.status, job.worker, job.error) == ("running", "w1", None)

    # The reaper re-queues the silent job; its next run stores the kept outcome without computing it again.
    make_silent(job_id)
    assert reap_once()["requeued"] == 1
    forbid_running_the_kernel(monkeypatch)
    assert execute_job(job_id, worker="w2") == "succeeded"
    assert_succeeded_like_undisturbed(job_id, SMALL, attempts=2)


def test_a_kept_outcome_is_stored_even_when_the_job_s_attempts_are_spent(
    stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reaper fails a silent job whose attempts are spent (WorkerLost), unless an earlier run kept its
    computed outcome on disk: then it is re-queued, and the next run stores that outcome."""
    spent = get_settings().max_attempts
    job_id = submit(SMALL)
    run_but_keep_the_outcome(job_id)
    make_silent(job_id, attempts=spent)
    assert reap_once()["requeued"] == 1
    assert load(job_id).status == "queued"
    forbid_running_the_kernel(monkeypatch)
    assert execute_job(job_id, worker="w2") == "succeeded"
    assert_succeeded_like_undisturbed(job_id, SMALL, attempts=spent + 1)

    # without a kept outcome, spent attempts still end the job (the reaper's rule is unchanged)
    doomed = submit(SMALL)
    make_silent(doomed, status="running", worker="lost", attempts=spent)
    assert reap_once()["failed"] == 1
    assert load(doomed).error["code"] == "worker_lost"


def test_a_database_error_raised_through_the_kernel_hands_the_job_back(stack_env: dict[str, str]) -> None:
    real = get_kind(KIND)

    def runner_hit_by_an_outage(_params: Any, ctx: Any) -> Any:
        ctx.progress(0.1, "computing")
        raise dropped_connection("SELECT datasets.path FROM datasets WHERE datasets.id = %(pk_1)s")

    job_id = submit(SMALL)
    with pytest.MonkeyPatch.context() as outage:
        outage.setattr("worker.execute.get_kind", lambda _name: dataclasses.replace(real, run=runner_hit_by_an_outage))
        assert execute_job(job_id, worker="w1") is None
    job = load(job_id)
    # Back in the queue with its attempt given back, for the next worker; no error for the user.
    assert (job.status, job.error, job.attempts, job.worker) == ("queued", None, 0, None)
    assert execute_job(job_id, worker="w2") == "succeeded"
    assert_succeeded_like_undisturbed(job_id, SMALL)


def test_users_see_a_code_and_message_never_the_internals(
    stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = get_kind(KIND)

    def buggy(_params: Any, _ctx: Any) -> Any:
        raise RuntimeError("cannot open /srv/gpuest/var/cuda-cache/x.cubin on gpu-host-7:31337")

    monkeypatch.setattr("worker.execute.get_kind", lambda _name: dataclasses.replace(real, run=buggy))
    job_id = submit(SMALL)
    assert execute_job(job_id, worker="gpu-host-7:31337:abcd") == "failed"
    error = load(job_id).error
    assert set(error) == {"type", "code", "message", "correlation_id"}
    assert (error["type"], error["code"]) == ("RuntimeError", "internal_error")
    assert "/srv" not in error["message"] and "gpu-host-7" not in error["message"]
    assert error["correlation_id"] in error["message"]

    def not_converged(_params: Any, _ctx: Any) -> Any:
        raise ValueError("policy step did not converge in 500 iterations; raise max_policy_iterations")

    monkeypatch.setattr("worker.execute.get_kind", lambda _name: dataclasses.replace(real, run=not_converged))
    job_id = submit(SMALL)
    assert execute_job(job_id, worker="w1") == "failed"
    error = load(job_id).error
    assert (error["code"], error["message"]) == (
        "kernel_error", "policy step did not converge in 500 iterations; raise max_policy_iterations")


# -- real connection termination on PostgreSQL ------------------------------------------------------------


@pytest.fixture
def admin(stack_env: dict[str, str]) -> Iterator[Callable[[str, dict[str, Any]], Any]]:
    """Runs SQL on its own autocommit connection (outside the worker's pool) to terminate backends."""
    engine = create_engine(stack_env["DATABASE_URL"], isolation_level="AUTOCOMMIT")

    def execute(sql: str, params: dict[str, Any]) -> Any:
        with engine.connect() as connection:
            return connection.execute(text(sql), params).all()

    yield execute
    engine.dispose()


@pytest.mark.parametrize("stack_env", POSTGRES, indirect=True)
@pytest.mark.parametrize("operation", ["claim", "record_progress", "finish"])
def test_terminated_backend_under_a_worker_statement_is_survived(
    stack_env: dict[str, str], admin: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    """pg_terminate_backend of the very connection the worker is about to run ``operation`` on (the issue's
    failure: a progress UPDATE on a terminated connection failed the job)."""
    real = getattr(work, operation)
    terminated: list[int] = []

    def on_a_terminated_connection(session: Session, *args: Any, **kwargs: Any) -> Any:
        if len(terminated) < 2:  # twice: the retry's fresh connection is terminated too
            pid = session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            assert admin("SELECT pg_terminate_backend(:pid)", {"pid": pid}) == [(True,)]
            terminated.append(pid)
        return real(session, *args, **kwargs)

    monkeypatch.setattr(work, operation, on_a_terminated_connection)
    job_id = submit(SMALL)
    assert execute_job(job_id, worker="w1") == "succeeded"
    assert len(terminated) == 2 and terminated[0] != terminated[1]
    assert_succeeded_like_undisturbed(job_id, SMALL)


@pytest.mark.parametrize("stack_env", POSTGRES, indirect=True)
def test_worker_process_survives_its_connections_being_terminated_mid_job(
    stack_env: dict[str, str], admin: Callable[..., Any], tmp_path: Any
) -> None:
    """A real worker, its every database connection terminated (as a restart or failover does) every
    0.01 s while a several-second job runs: the job ends succeeded, once, with the undisturbed result."""
    application_name = f"gpuest-h2-{uuid.uuid4().hex[:10]}"
    url = make_url(stack_env["DATABASE_URL"]).update_query_dict({"application_name": application_name})
    worker = WorkerProcess({**stack_env, "DATABASE_URL": url.render_as_string(hide_password=False)},
                           tmp_path / "worker.log")
    try:
        job_id = submit(LONG)
        from core.queue import send

        send(job_id, queue=stack_env["GPUEST_QUEUE"])
        wait_for(lambda: load(job_id).status != "queued" and load(job_id).progress > 0, 60, "the job to progress")
        killed: list[int] = []
        stop = threading.Event()

        def terminate_worker_connections() -> None:
            while not stop.wait(0.01):
                rows = admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE application_name = :name AND pid <> pg_backend_pid()", {"name": application_name})
                killed.extend(1 for terminated, in rows if terminated)

        terminator = threading.Thread(target=terminate_worker_connections, daemon=True)
        terminator.start()
        try:
            wait_for(lambda: load(job_id).status in ("succeeded", "failed", "cancelled"), 120, "the job to end")
        finally:
            stop.set()
            terminator.join(timeout=5)
        job = load(job_id)
        assert job.status == "succeeded", (job.error, worker.output()[-3000:])
        assert len(killed) >= 3, "the test terminated too few connections to mean anything"
        # Ended once, with the undisturbed result. (Under this storm a run may also be re-queued by the reaper
        # when heartbeats keep failing for the stale limit; its next run gives the same result.)
        assert_succeeded_like_undisturbed(job_id, LONG, attempts=job.attempts)
        assert job.attempts <= 2 and job.finished_at is not None
    finally:
        worker.stop()
