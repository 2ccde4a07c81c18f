"""An isolated job store (SQLite + SQLAlchemy broker in a temp dir, or the real Postgres + Redis) and
real Celery worker processes for the worker tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import core.queue
from core.settings import get_settings
from kernels.context import local_context, run_kind
from kernels.registry import get_kind
from store import db
from store import jobs as job_store
from store.db import session_scope
from store.migrate import upgrade_to_head
from store.models import Job
from tests import servers

REPO_ROOT = Path(__file__).resolve().parents[2]

# The worker tests' job: crve_montecarlo, small (a fraction of a second) or long (several seconds of NumPy
# work on two cores, with a progress checkpoint per block of replications).
KIND = "crve_montecarlo"
SMALL = {"n_clusters": 20, "cluster_size": 10, "n_regressors": 3, "replications": 200, "seed": 11}
LONG = {"n_clusters": 50, "cluster_size": 30, "n_regressors": 3, "replications": 4000, "seed": 12}


def submit(params: dict[str, Any], kind: str = KIND, queue: str | None = None) -> str:
    with session_scope() as session:
        job, _ = job_store.create_job(
            session, owner="tester", kind=kind, params=params, dataset_ids={}, queue=queue or get_settings().queue
        )
        return job.id


def load(job_id: str) -> Job:
    with session_scope() as session:
        job = job_store.get_job(session, job_id)
        assert job is not None
        return job


def reference_result(params: dict[str, Any]) -> dict[str, Any]:
    """The undisturbed run's result, computed in this process."""
    return run_kind(get_kind(KIND), params, local_context(device="cpu"))


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key not in ("timings", "device")}


def _clear_caches() -> None:
    get_settings.cache_clear()
    db.engine_for.cache_clear()
    db._session_factory.cache_clear()


BACKENDS = ["embedded", pytest.param("servers", marks=pytest.mark.servers)]


@pytest.fixture(params=BACKENDS)
def stack_env(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    migrated_sqlite: Callable[[Path], None],
) -> Iterator[dict[str, str]]:
    """Environment of an isolated, migrated job store; the current process uses it too."""
    env = {
        "GPUEST_DATA_DIR": str(tmp_path / "var"),
        "GPUEST_DEVICE": "cpu",
        "GPUEST_HEARTBEAT_SECONDS": "0.5",
        "GPUEST_STALE_AFTER_SECONDS": "3",
        "GPUEST_REAPER_INTERVAL_SECONDS": "0.5",
        "GPUEST_QUEUE": f"test-{uuid.uuid4().hex[:8]}",
    }
    cleanup: Callable[[], None] | None = None
    server_urls = servers.server_urls()
    for name in ("DATABASE_URL", "BROKER_URL", "REDIS_URL", "GPUEST_DATABASE_URL", "GPUEST_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    if request.param == "servers":
        if server_urls is None:
            pytest.skip("DATABASE_URL and REDIS_URL not set: the Postgres + Redis tier is skipped")
        database_url, cleanup = servers.fresh_postgres_database(server_urls[0])
        env.update(DATABASE_URL=database_url, BROKER_URL=server_urls[1])
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _clear_caches()
    # This process's Celery app is built on first use from the settings of that moment: a test module that
    # imports worker.tasks builds one at collection, for no store of the tests (its result backend in ./var).
    monkeypatch.setattr(core.queue, "_celery_app", None)
    if request.param == "servers":
        upgrade_to_head()
    else:  # a copy of the session's migrated SQLite database
        migrated_sqlite(Path(get_settings().resolved_database_url().removeprefix("sqlite:///")))
    yield env
    db.get_engine().dispose()
    _clear_caches()
    if cleanup is not None:
        cleanup()


class WorkerProcess:
    """A real ``celery worker`` process, as production runs it (solo pool, one job at a time)."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "worker.tasks:celery_app",
                "worker",
                "-Q",
                env["GPUEST_QUEUE"],
                "--pool",
                "solo",
                "--concurrency",
                "1",
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"test-{uuid.uuid4().hex[:6]}@%h",
            ],
            cwd=REPO_ROOT,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill_hard(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill_hard()
        self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def start_worker(stack_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[[], WorkerProcess]]:
    workers: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        worker = WorkerProcess(stack_env, tmp_path / f"worker-{len(workers)}.log")
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture
def in_process(stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fan-out in this process into 3 chunks, whose chords nobody consumes (the Celery app of this test's store
    is built with these settings: stack_env cleared the process's)."""
    from celery import _state as celery_state

    monkeypatch.setenv("GPUEST_FANOUT_CHUNKS", "3")
    get_settings.cache_clear()
    monkeypatch.setattr(celery_state, "_task_join_will_block", True)  # as inside a worker
    yield
    app = core.queue.get_celery_app()
    pool = getattr(getattr(app.backend, "client", None), "connection_pool", None)
    if pool is not None:
        pool.disconnect()
    app.close()


@pytest.fixture
def chunk_workers_die_after_storing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk's worker stores its chunk and dies before it settles the job (worker/fanout.execute_chunk): what
    ends the job is then the chord's callback or a reaper, as these tests drive them."""
    from worker import fanout

    monkeypatch.setattr(fanout, "settle_quietly", lambda job_id: None)
