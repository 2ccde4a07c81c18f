"""A real ``celery worker`` process at its edges: it refuses an un-migrated database, and on SIGTERM it
hands the job it is running back to the queue, where the next worker runs it to the undisturbed result.
Its log lines keep their own level, and it keeps its healthcheck's alive file fresh."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from core.queue import broker_connection, send
from core.status import TERMINAL_STATUSES
from store import jobs as job_store
from tests import servers
from tests.worker.conftest import LONG, WorkerProcess, comparable, load, reference_result, submit, wait_for
from worker.execute import REQUEUED_STAGE
from worker.health import problem
from worker.tasks import EXIT_NOT_READY


def messages_waiting(queue: str) -> int:
    with broker_connection() as connection:
        return int(connection.default_channel.queue_declare(queue=queue, durable=True).message_count)


@pytest.fixture(params=["embedded", pytest.param("servers", marks=pytest.mark.servers)])
def unmigrated_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A database nobody migrated: a SQLite path that does not exist yet, or a new empty Postgres database."""
    env = {"GPUEST_DATA_DIR": str(tmp_path / "var"), "GPUEST_QUEUE": f"test-{uuid.uuid4().hex[:8]}"}
    if request.param == "servers":
        urls = servers.server_urls()
        if urls is None:
            pytest.skip("DATABASE_URL and REDIS_URL not set: the Postgres + Redis tier is skipped")
        database_url, drop = servers.fresh_postgres_database(urls[0])
        yield {**env, "DATABASE_URL": database_url, "BROKER_URL": urls[1]}
        drop()
        return
    yield {
        **env,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'var' / 'gpuest.sqlite3'}",
        "BROKER_URL": f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}",
    }


@pytest.mark.slow
def test_the_worker_refuses_an_unmigrated_database(unmigrated_env: dict[str, str], tmp_path: Path) -> None:
    worker = WorkerProcess(unmigrated_env, tmp_path / "worker.log")
    try:
        code = worker.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.stop()
        tail = worker.output()[-3000:]
        raise AssertionError(f"the worker kept running on an un-migrated database:\n{tail}") from None
    worker.stop()
    output = worker.output()
    assert code == EXIT_NOT_READY, output[-3000:]
    (refusal,) = [line for line in output.splitlines() if "refusing to start" in line]
    assert "gpuest db upgrade" in refusal and "no gpuest schema" in refusal
    assert "ready" not in output and "Traceback" not in output, output[-3000:]
    # It only looked: no empty database file left behind to pass for a real one.
    assert not (tmp_path / "var" / "gpuest.sqlite3").exists()


@pytest.mark.slow
def test_sigterm_hands_the_running_job_back_and_the_next_worker_finishes_it(
    stack_env: dict[str, str], start_worker: Callable[[], WorkerProcess], tmp_path: Path
) -> None:
    expected = comparable(reference_result(LONG))
    alive_file = tmp_path / "alive"
    # Only the hand-back may bring the job back here: the reaper's re-send waits far longer than this test.
    stack_env.update(GPUEST_STALE_AFTER_SECONDS="600", GPUEST_WORKER_ALIVE_FILE=str(alive_file))
    queue = stack_env["GPUEST_QUEUE"]
    first = start_worker()
    job_id = submit(LONG)
    send(job_id, queue=queue)
    wait_for(lambda: load(job_id).status == "running" and load(job_id).progress > 0, 90, "the job to run")
    assert problem(alive_file, max_age=30) is None  # touched when the worker became ready

    os.kill(first.process.pid, signal.SIGTERM)
    assert first.process.wait(timeout=30) == 0, first.output()[-3000:]
    released = load(job_id)
    assert (released.status, released.attempts, released.progress) == ("queued", 0, 0.0)
    assert (released.stage, released.worker) == (REQUEUED_STAGE, None)
    assert messages_waiting(queue) >= 1, "the released job was not sent again"

    second = start_worker()
    wait_for(lambda: load(job_id).status in TERMINAL_STATUSES, 180, "the handed-back job to finish")
    job = load(job_id)
    assert (job.status, job.attempts) == ("succeeded", 1), second.output()[-3000:]
    assert comparable(job.result) == expected

    # Log lines at their own level (not Celery's WARNING for redirected stdout).
    assert re.search(rf"INFO/MainProcess\] job started +job_id={job_id}", first.output()), first.output()[-3000:]
    assert not re.search(r"WARNING/MainProcess\].*\[info", first.output() + second.output())


def test_a_stopping_worker_passes_a_new_message_on_without_claiming(stack_env: dict[str, str]) -> None:
    from worker.execute import execute_job
    from worker.progress import worker_stopping

    job_id = submit(LONG)
    worker_stopping.set()
    try:
        assert execute_job(job_id, worker="w1") is None
    finally:
        worker_stopping.clear()
    job = load(job_id)
    assert (job.status, job.attempts, job.started_at) == ("queued", 0, None)
    assert messages_waiting(stack_env["GPUEST_QUEUE"]) == 1


def _claim(job_id: str, worker: str) -> Any:
    from store.db import session_scope

    with session_scope() as session:
        assert job_store.claim(session, job_id, worker=worker, device="cpu")


def test_release_gives_the_attempt_back_only_to_the_holder_and_not_past_a_cancel(stack_env: dict[str, str]) -> None:
    from store.db import session_scope

    job_id = submit(LONG)
    _claim(job_id, "w1")
    with session_scope() as session:
        assert not job_store.release(session, job_id, worker="someone-else", stage=REQUEUED_STAGE)
        assert job_store.release(session, job_id, worker="w1", stage=REQUEUED_STAGE)
    job = load(job_id)
    assert (job.status, job.attempts, job.worker) == ("queued", 0, None)

    _claim(job_id, "w2")
    with session_scope() as session:
        job_store.request_cancel(session, job_id, "tester")
    with session_scope() as session:
        assert not job_store.release(session, job_id, worker="w2", stage=REQUEUED_STAGE)
    assert load(job_id).status == "running"  # left for the worker to finish as cancelled


@pytest.fixture
def stop_mid_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A stand-in runner in which the worker's warm shutdown begins between two checkpoints; yields the
    list of checkpoints the runner got past."""
    import dataclasses

    from kernels.registry import get_kind
    from worker.progress import worker_stopping

    passed: list[str] = []
    real = get_kind("crve_montecarlo")

    def runner(params: Any, ctx: Any) -> Any:
        ctx.progress(0.1, "block 1")
        passed.append("block 1")
        worker_stopping.set()  # what Celery's worker_shutting_down handler does on SIGTERM
        ctx.progress(0.2, "block 2")
        passed.append("block 2")
        raise AssertionError("the checkpoint after the shutdown did not stop the job")

    monkeypatch.setattr("worker.execute.get_kind", lambda name: dataclasses.replace(real, run=runner))
    yield passed
    worker_stopping.clear()


def test_the_next_checkpoint_after_a_shutdown_hands_the_job_back(stack_env: dict[str, str], stop_mid_run) -> None:
    from worker.execute import execute_job

    job_id = submit(LONG)
    assert execute_job(job_id, worker="w1") == "queued"
    assert stop_mid_run == ["block 1"]
    job = load(job_id)
    assert (job.status, job.attempts, job.progress, job.stage, job.finished_at) == (
        "queued", 0, 0.0, REQUEUED_STAGE, None
    )
    assert messages_waiting(stack_env["GPUEST_QUEUE"]) == 1


@pytest.mark.usefixtures("stop_mid_run")
def test_a_job_cancelled_while_its_worker_stops_ends_cancelled(
    stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from store.db import session_scope
    from worker.execute import execute_job

    release = job_store.release

    def cancel_then_release(session: Any, job_id: str, **kwargs: Any) -> bool:
        with session_scope() as other:  # the user's cancel lands just before the worker lets go
            job_store.request_cancel(other, job_id, "tester")
        return release(session, job_id, **kwargs)

    monkeypatch.setattr(job_store, "release", cancel_then_release)
    job_id = submit(LONG)
    assert execute_job(job_id, worker="w1") == "cancelled"
    job = load(job_id)
    assert (job.status, job.attempts) == ("cancelled", 1)
    assert messages_waiting(stack_env["GPUEST_QUEUE"]) == 0
