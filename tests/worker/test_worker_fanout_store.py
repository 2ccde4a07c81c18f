"""The fan-out's bookkeeping in-process (issue 19), on SQLite and on Postgres + Redis: a job's chunks run by
``execute_chunk`` reduce to the single run exactly even when the chord's callback never comes (a reaper
reduces it); a failed chunk fails its job at once and cancels the chunks still queued; a chunk of a lost
worker is re-queued alone until its attempts are spent; the device a worker advertises."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import numpy as np
import pytest
from celery import _state as celery_state
from sqlalchemy import event

import core.queue
from core.settings import get_settings
from core.status import JobStatus
from kernels.context import RunContext, local_context, run_kind
from kernels.crve import jobs as crve_jobs
from kernels.registry import get_kind
from store import chunks as chunk_store
from store import jobs as job_store
from store import work
from store.db import get_engine, session_scope
from store.models import JobChunk, utcnow
from tests.worker.conftest import comparable, load, submit
from worker import fanout, reaper
from worker.device import worker_device
from worker.progress import JobProgress

PARAMS = {"n_clusters": 12, "cluster_size": 7, "n_regressors": 3, "replications": 1_003, "seed": 5}
WORKER = "host:1:parent"


@pytest.fixture
def fanned_job(stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A claimed job fanned out into 3 chunks of 37-replication blocks (its chord sent, nobody consuming)."""
    monkeypatch.setenv("GPUEST_FANOUT_CHUNKS", "3")
    get_settings.cache_clear()
    monkeypatch.setattr(core.queue, "_celery_app", None)  # an app for this test's broker and result backend
    monkeypatch.setattr(crve_jobs, "NUMPY_BLOCK_ELEMENTS", 37 * 12 * 7 * 5)
    job_id = submit(PARAMS, queue=stack_env["GPUEST_QUEUE"])
    with session_scope() as session:
        assert job_store.claim(session, job_id, worker=WORKER, device="cpu")
    ctx = RunContext(np, JobProgress(job_id, WORKER), lambda field: None)
    # Fan-out happens inside a worker, where Celery does not subscribe to the results of what it sends.
    monkeypatch.setattr(celery_state, "_task_join_will_block", True)
    kind = get_kind("crve_montecarlo")
    params = kind.params_model.model_validate(PARAMS)
    assert fanout.try_fan_out(job_id, WORKER, kind, params, ctx, stack_env["GPUEST_QUEUE"])
    yield job_id
    app = core.queue.get_celery_app()
    pool = getattr(getattr(app.backend, "client", None), "connection_pool", None)
    if pool is not None:  # the Redis result backend's connections, closed now rather than at interpreter exit
        pool.disconnect()
    app.close()


def rows(job_id: str) -> list[JobChunk]:
    with session_scope() as session:
        found = chunk_store.chunks_of(session, job_id)
        for row in found:
            session.expunge(row)
        return found


def test_chunks_reduce_to_the_single_run_and_a_lost_callback_is_reduced_by_a_reaper(
    fanned_job: str, chunk_workers_die_after_storing: None
) -> None:
    chunks = rows(fanned_job)
    assert [row.status for row in chunks] == ["succeeded", "queued", "queued", "queued"]
    assert sum(row.spec["size"] for row in chunks) == PARAMS["replications"]
    for row in reversed(chunks[1:]):  # any order
        assert fanout.execute_chunk(row.id, f"host:2:{row.chunk_index}") == JobStatus.SUCCEEDED
        assert fanout.execute_chunk(row.id, "host:3:late") is None  # a duplicate message does nothing
    assert load(fanned_job).status == JobStatus.RUNNING  # no callback came (no worker consumes the chord)
    counts = reaper.reap_work(timedelta(seconds=0), max_attempts=3, idle=False, queue=get_settings().queue,
                              models=[JobChunk])
    assert counts["reduced"] == 1
    job = load(fanned_job)
    assert job.status == JobStatus.SUCCEEDED and job.progress == 1.0
    assert comparable(job.result) == comparable(run_kind(get_kind("crve_montecarlo"), PARAMS,
                                                         local_context(device="cpu")))
    assert fanout.settle(fanned_job) is None  # once only


def test_the_last_chunk_to_succeed_ends_its_job_without_the_callback(fanned_job: str) -> None:
    """A chunk's worker settles the job once its chunk is stored: the chunks before the last leave it running,
    the last ends it with the single run's result (no chord callback comes here: nobody consumes it)."""
    chunks = rows(fanned_job)
    for row in chunks[1:-1]:
        assert fanout.execute_chunk(row.id, f"host:2:{row.chunk_index}") == JobStatus.SUCCEEDED
        assert load(fanned_job).status == JobStatus.RUNNING
    assert fanout.execute_chunk(chunks[-1].id, "host:2:last") == JobStatus.SUCCEEDED
    job = load(fanned_job)
    assert job.status == JobStatus.SUCCEEDED and job.progress == 1.0
    assert comparable(job.result) == comparable(run_kind(get_kind("crve_montecarlo"), PARAMS,
                                                         local_context(device="cpu")))
    assert fanout.settle(fanned_job) is None  # the callback, when it comes, finds it done
    counts = reaper.reap_work(timedelta(seconds=0), max_attempts=3, idle=False, queue=get_settings().queue,
                              models=[JobChunk])
    assert counts["reduced"] == 0


def test_a_settle_reads_the_chunks_outputs_only_to_reduce_them(fanned_job: str) -> None:
    """Every chunk's worker settles the job after storing its chunk; those that find chunks still to run must
    not read the others' outputs (megabytes a chunk for an SCCS bootstrap): only the last settle reduces."""
    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(statement)

    def reads_outputs() -> bool:  # the outputs of the job's chunks (a chunk's claim reads its own row whole)
        return any(statement.lstrip().startswith("SELECT") and "job_chunks.output" in statement
                   and "job_chunks.job_id = " in statement for statement in statements)

    chunks = rows(fanned_job)
    engine = get_engine()
    event.listen(engine, "before_cursor_execute", record)
    try:
        for row in chunks[1:-1]:
            assert fanout.execute_chunk(row.id, f"host:2:{row.chunk_index}") == JobStatus.SUCCEEDED
        assert statements and not reads_outputs()
        assert fanout.execute_chunk(chunks[-1].id, "host:2:last") == JobStatus.SUCCEEDED
        assert reads_outputs()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert comparable(load(fanned_job).result) == comparable(run_kind(get_kind("crve_montecarlo"), PARAMS,
                                                                      local_context(device="cpu")))


def test_a_failed_chunk_fails_the_job_at_once_and_cancels_the_queued_chunks(fanned_job: str) -> None:
    first, second = rows(fanned_job)[1:3]
    with session_scope() as session:
        assert work.claim(session, JobChunk, first.id, worker="w", device="cpu")
        error = {"type": "ValueError", "code": "kernel_error", "message": "chunk 1: bad", "correlation_id": "x"}
        assert work.finish(session, JobChunk, first.id, worker="w", status=JobStatus.FAILED, error=error)
    assert fanout.settle(fanned_job) == JobStatus.FAILED
    job = load(fanned_job)
    assert job.status == JobStatus.FAILED and job.error["message"] == "chunk 1: bad" and job.result is None
    assert [row.status for row in rows(fanned_job)[2:]] == ["cancelled", "cancelled"]
    backend = core.queue.get_celery_app().backend
    if not backend.supports_native_join:  # SQLite: chord_unlock's poll must find every part's result, or never end
        assert all(backend.get_state(row.id) == "SUCCESS" for row in rows(fanned_job)[1:])
    assert fanout.execute_chunk(second.id, "w2") is None  # a message that comes later runs nothing


def test_a_reduction_that_raises_fails_the_job_once(fanned_job: str, chunk_workers_die_after_storing: None) -> None:
    for row in rows(fanned_job)[1:]:
        assert fanout.execute_chunk(row.id, "w") == JobStatus.SUCCEEDED
    with session_scope() as session:  # a stored output the reduction cannot read
        session.get(JobChunk, rows(fanned_job)[2].id).output = {"unexpected": True}
    assert fanout.settle(fanned_job) == JobStatus.FAILED
    job = load(fanned_job)
    assert job.error["code"] == "internal_error" and job.error["type"] == "KeyError" and job.result is None
    assert fanout.settle(fanned_job) is None


def test_a_stale_chunk_is_requeued_alone_until_its_attempts_are_spent(fanned_job: str) -> None:
    chunk = rows(fanned_job)[2]
    for attempt in (1, 2):
        with session_scope() as session:
            assert work.claim(session, JobChunk, chunk.id, worker=f"lost-{attempt}", device="cpu")
            session.get(JobChunk, chunk.id).heartbeat_at = utcnow() - timedelta(seconds=60)
        counts = reaper.reap_work(timedelta(seconds=30), max_attempts=2, idle=False, queue=get_settings().queue,
                                  models=[JobChunk])
        if attempt == 1:
            assert counts["chunks_requeued"] == 1 and rows(fanned_job)[2].status == JobStatus.QUEUED
            assert load(fanned_job).status == JobStatus.RUNNING
            assert [row.status for row in rows(fanned_job)[1:]] == ["queued"] * 3  # the others are untouched
    assert counts["chunks_failed"] == 1
    job = load(fanned_job)
    assert job.status == JobStatus.FAILED and job.error["code"] == "worker_lost" and "chunk 2" in job.error["message"]
    assert rows(fanned_job)[2].attempts == 2
    with session_scope() as session:  # the job itself was never in the jobs' reaper's hands
        assert fanned_job not in [stale.id for stale in job_store.stale_running_jobs(
            session, stale_after=timedelta(0), now=utcnow() + timedelta(hours=1))]


def test_a_cpu_worker_advertises_cpu_whatever_cuda_visible_devices_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert worker_device(np) == "cpu"


@pytest.mark.gpu
def test_a_gpu_worker_advertises_its_gpu_number_and_pci_bus(monkeypatch: pytest.MonkeyPatch) -> None:
    cp = pytest.importorskip("cupy")
    from kernels.backend import device_label

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    advertised = worker_device(cp)
    assert advertised.startswith(f"{device_label(cp)} (GPU 0, PCI ") and advertised.endswith(")"), advertised
