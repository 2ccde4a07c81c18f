"""One job fanned out over the workers of its queue as a Celery chord.

A job of a kind that declares a split (``JobKind.split``, :class:`kernels.fanout.Split`: ``crve_montecarlo``,
``sccs_fit``, ``sccs_analyses``, ``crve_bootstrap`` split by replications, folds, analyses or draws) whose
planner finds it large enough (``GPUEST_FANOUT_CHUNKS`` >= 2, ``GPUEST_FANOUT_MIN_BLOCKS``, the kind's
``GPUEST_FANOUT_MIN_WORK`` entry; the planner gets the job's datasets' stored rows, never the database) is
fanned out by the worker that claimed it: that worker computes the lead (Monte Carlo's block 0, which fixes the
centre of the sums; nothing for SCCS, whose chunks need nothing from one another), records the chunks
(``store/chunks.py``: a row each, with attempts and heartbeat like a job) and sends a **chord**, a group of one
``gpuest.run_chunk`` task per chunk whose task id is the chunk's id, and ``gpuest.reduce_chunks`` as its
callback. Any worker of the queue runs the chunks (reading the job's datasets where the kind has any). The
worker of the last chunk to succeed ends the job at once, as the callback would (the callback then finds it
done); the callback stands behind it, and the reapers behind both. The job ends in one of two ways:

* a split with a ``reduce`` (Monte Carlo): the chunks' partials reduced in chunk order are the job's result, the
  single run's bit for bit (``kernels/crve/montecarlo_chunks.py``);
* a split with a ``finish`` (SCCS, whose reduction is the rest of the run: the final fit, profiles,
  diagnostics, artifacts, on the tables and the device): the job goes back to its queue, and the worker that
  claims it runs the kind with the chunks' outputs in place of what they computed
  (:func:`kind_to_run`, ``kernels/sccs/chunks.py``), as a job: heartbeat, progress, cancel, warm shutdown and
  reaper as for any job.

The database stays the truth, as for jobs: a chunk is claimed by a conditional UPDATE, its heartbeat is
watched by the reapers, and a chunk whose worker died is re-queued alone and sent again **with its own task
id, group id and callback** (Celery's chord then counts it as the part it is: Redis's chord counter, or
``celery.chord_unlock`` polling the result backend). A reduction whose callback was lost anyway (a chord
that could not be sent, a broker restarted empty) is done by a reaper once every chunk has ended for the
stale limit. A failed chunk fails the job at once; a cancel stops every chunk at its next checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import Any

import structlog
from pydantic import ValidationError
from sqlalchemy.orm import Session

import core.queue
from core.settings import get_settings
from core.status import TERMINAL_STATUSES, JobPriority, JobStatus
from kernels.backend import GPUUnavailableError
from kernels.context import RunContext, namespace_for
from kernels.fanout import PlanInputs
from kernels.progress import JobCancelled
from kernels.registry import SPLITS, JobKind, get_kind
from kernels.spec import JobParams, ResultModel
from store import chunks as chunk_store
from store import jobs as job_store
from store import work
from store.db import session_scope
from store.models import Job, JobChunk, utcnow
from worker.dataset_loader import dataset_loader, dataset_rows
from worker.device import job_cache, worker_device
from worker.infra import InfrastructureUnavailable, describe, is_infrastructure_error, retry_infrastructure
from worker.progress import WorkerStopping, worker_stopping
from worker.supervision import supervised
from worker.time_limit import TIME_LIMIT_CODE, TimeLimit, TimeLimitExceeded, end_worker_process, limit_for

log = structlog.get_logger("gpuest.worker")

RUN_CHUNK_TASK = "gpuest.run_chunk"
REDUCE_TASK = "gpuest.reduce_chunks"
CHORD_UNLOCK_INTERVAL_SECONDS = 0.2
MAX_MESSAGE_CHARS = 2000


# --- the parent: fan out ---------------------------------------------------------------------------------


def try_fan_out(job_id: str, worker: str, kind: JobKind, spec: JobParams, ctx: RunContext,
                queue: str | None) -> bool:
    """Fan the claimed job out if its kind splits and it is large enough; False to run it whole. Raises what
    the kind's run would raise for bad params or a kernel error in the lead (the job then fails as usual),
    :class:`JobCancelled` when the job was cancelled meanwhile."""
    settings = get_settings()
    split = SPLITS.get(kind.name)
    if split is None or settings.fanout_chunks < 2:
        return False
    inputs = PlanInputs(settings.fanout_chunks, settings.fanout_min_blocks,
                        settings.fanout_min_work.get(kind.name, split.min_work), dataset_rows(kind.dataset_ids(spec)))
    specs = split.plan(spec, ctx.xp, inputs)
    if specs is None:
        return False
    ctx.progress(0.0, f"lead block of {len(specs) + 1} chunks")
    started = time.perf_counter()
    lead_spec, lead_output, specs = split.lead(spec, ctx, specs)
    # The lead's stages (a Monte Carlo's first block) count in the job's timings as every chunk's do.
    lead_timings = {**ctx.timer.as_dict(), "run": time.perf_counter() - started}
    group_id = str(uuid.uuid4())
    queue = queue or settings.queue
    plans = [chunk_store.ChunkPlan(lead_spec, lead_output, lead_timings),
             *(chunk_store.ChunkPlan(item) for item in specs)]

    def record() -> tuple[list[str] | None, JobPriority]:
        with session_scope() as session:
            ids = chunk_store.fan_out(session, job_id, worker=worker, group_id=group_id, device=worker_device(ctx.xp),
                                      queue=queue, chunks=plans)
            return ids, job_store.priority_of(session, job_id)

    ids, priority = retry_infrastructure(record, what="record the chunks", budget_seconds=settings.worker_retry_seconds,
                                         job_id=job_id)
    if ids is None:
        raise JobCancelled(f"job {job_id} was cancelled before its chunks were sent")
    try:
        send_chord(job_id, group_id, ids[1:], queue, priority)
    except Exception as exc:  # the chunks are queued with their send time: the reapers send them again
        log.error("could not send a fanned-out job's chord; the reapers re-send its chunks", job_id=job_id,
                  error=describe(exc))
    log.info("job fanned out", job_id=job_id, chunks=len(ids), group_id=group_id)
    return True


def _callback(job_id: str, queue: str) -> Any:
    return core.queue.get_celery_app().signature(REDUCE_TASK, args=(job_id,), immutable=True,
                                                 options={"queue": queue})


def send_chord(job_id: str, group_id: str, chunk_ids: Sequence[str], queue: str, priority: JobPriority) -> None:
    """The chord of a fanned-out job: one ``run_chunk`` per chunk, its task id the chunk's, group id ours."""
    from celery import chord

    app = core.queue.get_celery_app()
    header = [
        app.signature(RUN_CHUNK_TASK, args=(job_id, chunk_id),
                      options={"task_id": chunk_id, "queue": queue,
                               "priority": core.queue.MESSAGE_PRIORITY[priority]})
        for chunk_id in chunk_ids
    ]  # fmt: skip
    # The chord's own task id becomes its group's id (chord.apply_async), which the chunks' rows hold so
    # that a re-sent chunk joins the same group; the callback gets an id of its own.
    # interval: where the result backend cannot count parts (SQLite), celery.chord_unlock polls the parts'
    # results this often (Celery's default, 1 s, would add up to a second to every fanned-out job).
    chord(header, _callback(job_id, queue)).set(task_id=group_id).apply_async(
        task_id=str(uuid.uuid4()), interval=CHORD_UNLOCK_INTERVAL_SECONDS)


def resend_chunk(chunk: JobChunk, priority: JobPriority = JobPriority.NORMAL) -> None:
    """Send a chunk's message again as the chord part it is: same task id, group id, place and callback."""
    queue = chunk.queue or get_settings().queue
    core.queue.get_celery_app().send_task(
        RUN_CHUNK_TASK, args=[chunk.job_id, chunk.id], task_id=chunk.id, group_id=chunk.group_id,
        group_index=chunk.chunk_index - 1, chord=_callback(chunk.job_id, queue), queue=queue,
        priority=core.queue.MESSAGE_PRIORITY[priority], ignore_result=False,
    )  # fmt: skip


# --- a chunk ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimedChunk:
    job_id: str
    index: int
    kind: JobKind
    params: dict[str, Any]
    dataset_ids: dict[str, str]
    spec: dict[str, Any]
    xp: ModuleType


def execute_chunk(chunk_id: str, worker: str, end_process: Callable[[], None] = end_worker_process) -> JobStatus | None:
    """Claim and run one chunk; returns its terminal status, ``queued`` when handed back, None when it was not
    ours to run. A chunk has its job's time limits: past the hard one, it is recorded as failed (which fails its
    job) and ``end_process`` ends the worker process (worker/time_limit.py)."""
    settings = get_settings()
    if worker_stopping.is_set():
        resend_queued(chunk_id)
        return None
    try:
        claimed = retry_infrastructure(lambda: _claim_chunk(chunk_id, worker), what="claim a chunk",
                                       budget_seconds=settings.worker_retry_seconds, job_id=chunk_id)
    except InfrastructureUnavailable:
        return None  # still queued: a reaper sends it again
    if claimed is None:
        return None
    log.info("chunk started", job_id=claimed.job_id, chunk=claimed.index, worker=worker)
    try:
        spec: JobParams | ValidationError = claimed.kind.params_model.model_validate(claimed.params)
    except ValidationError as exc:
        spec = exc
    limit = limit_for(claimed.kind, spec, claimed.dataset_ids) if isinstance(spec, JobParams) else None
    started = time.perf_counter()
    status, output, error = JobStatus.SUCCEEDED, None, None
    with supervised(JobChunk, chunk_id, worker, limit, lambda limit, seconds: _chunk_hard_time_limit(
            chunk_id, worker, claimed, limit, seconds, end_process)) as run:
        # The job's cache stays after the chunk: this worker may claim the job's finish next (same inputs).
        ctx = RunContext(claimed.xp, run.progress, dataset_loader(claimed.dataset_ids),
                         dataset_fields=tuple(claimed.dataset_ids), cache=job_cache.enter(claimed.job_id))
        try:
            if isinstance(spec, ValidationError):
                raise spec
            output = SPLITS[claimed.kind.name].run(spec, ctx, claimed.spec)
        except WorkerStopping:
            return _hand_back_chunk(chunk_id, worker)
        except JobCancelled:
            status = JobStatus.CANCELLED
        except Exception as exc:
            if is_infrastructure_error(exc):  # left running: the reaper re-queues it once its heartbeat is stale
                log.error("chunk stopped by a database or broker error", chunk_id=chunk_id, error=describe(exc))
                return None
            status, error = JobStatus.FAILED, _chunk_error(claimed, exc)
    timings = {**ctx.timer.as_dict(), "run": time.perf_counter() - started}

    def finish() -> bool:
        with session_scope() as session:
            return work.finish_once(session, JobChunk, chunk_id, worker=worker, status=status, result=output,
                                    error=error, timings=timings)

    try:
        recorded = retry_infrastructure(finish, what="store a chunk", job_id=chunk_id,
                                        budget_seconds=settings.worker_result_retry_seconds)
    except InfrastructureUnavailable:
        return None  # the reaper re-runs it
    log.info("chunk finished", job_id=claimed.job_id, chunk=claimed.index, status=status, recorded=recorded,
             run_seconds=round(timings["run"], 3))
    if status != JobStatus.SUCCEEDED:
        job_cache.clear()  # no finish follows a failed or cancelled chunk
    if recorded:
        # A failed chunk fails its job now (the others stop at their next checkpoint); the last chunk to succeed
        # ends its job or hands it over to be finished without waiting for the chord's callback (which then
        # finds it done): where the result backend cannot count parts, celery.chord_unlock polls them, and the
        # callback comes late. Each worker reads after storing its own chunk, so of two chunks ending together the
        # later sees both.
        settle_quietly(claimed.job_id)
    return status if recorded else None


def _chunk_hard_time_limit(chunk_id: str, worker: str, claimed: ClaimedChunk, limit: TimeLimit, run_seconds: float,
                           end_process: Callable[[], None]) -> None:
    """The watchdog's action for a chunk past its hard time limit (its heartbeat has stopped): it is recorded as
    failed (its job fails with it) and the worker process ends."""
    error = {**limit.error(hard=True), "correlation_id": uuid.uuid4().hex}
    error["message"] = f"chunk {claimed.index}: {error['message']}"[:MAX_MESSAGE_CHARS]
    log.error("chunk ran past its hard time limit", job_id=claimed.job_id, chunk=claimed.index,
              correlation_id=error["correlation_id"])

    def finish() -> bool:
        with session_scope() as session:
            return work.finish(session, JobChunk, chunk_id, worker=worker, status=JobStatus.FAILED, error=error,
                               timings={"run": run_seconds})

    try:
        if retry_infrastructure(finish, what="store a chunk", job_id=chunk_id,
                                budget_seconds=get_settings().worker_result_retry_seconds):
            settle_quietly(claimed.job_id)
    except InfrastructureUnavailable:
        log.error("chunk's time limit not recorded: the database is unavailable; the reaper takes it",
                  chunk_id=chunk_id)
    finally:
        end_process()


def settle_quietly(job_id: str) -> None:
    """:func:`settle` where the chord's callback and the reapers stand behind it: a database or broker error is
    logged, not raised (the chunk's own outcome is stored already)."""
    try:
        settle(job_id)
    except Exception as exc:
        if not is_infrastructure_error(exc):
            raise
        log.error("could not settle a fanned-out job after its chunk; the chord's callback or a reaper will",
                  job_id=job_id, error=describe(exc))


def chunk_ended(chunk_id: str) -> bool:
    """Whether the chunk is gone or has ended; False when the database cannot say (the reaper decides)."""
    def read() -> bool:
        with session_scope() as session:
            chunk = session.get(JobChunk, chunk_id)
            return chunk is None or chunk.status in TERMINAL_STATUSES

    try:
        return retry_infrastructure(read, what="read a chunk", budget_seconds=5.0, job_id=chunk_id)
    except InfrastructureUnavailable:
        return False


def _claim_chunk(chunk_id: str, worker: str) -> ClaimedChunk | None:
    with session_scope() as session:
        chunk = session.get(JobChunk, chunk_id)
        if chunk is None or chunk.status != JobStatus.QUEUED:
            return None  # a duplicate message, or the chunk was re-run meanwhile
        job = session.get(Job, chunk.job_id)
        if job is None or job.status != JobStatus.RUNNING or job.cancel_requested:
            chunk_store.cancel_open_chunks(session, chunk.job_id)
            return None
        kind = get_kind(job.kind)
        try:
            xp = namespace_for(kind)
        except (GPUUnavailableError, ValueError):
            return None  # this worker cannot compute it (refused at start anyway): left for another
        if not work.claim(session, JobChunk, chunk_id, worker=worker, device=worker_device(xp)):
            return None
        return ClaimedChunk(job.id, chunk.chunk_index, kind, dict(job.params), dict(job.dataset_ids or {}),
                            dict(chunk.spec), xp)


def _chunk_error(claimed: ClaimedChunk, exc: Exception) -> dict[str, Any]:
    correlation_id = uuid.uuid4().hex
    if isinstance(exc, TimeLimitExceeded):
        code, message = TIME_LIMIT_CODE, f"chunk {claimed.index}: {exc}"
    elif isinstance(exc, (ValueError, KeyError)):
        code, message = "kernel_error", f"chunk {claimed.index}: {exc}"
    else:
        log.error("chunk raised an unexpected error", job_id=claimed.job_id, chunk=claimed.index,
                  correlation_id=correlation_id, error=describe(exc), traceback=traceback.format_exc())
        code = "internal_error"
        message = (f"chunk {claimed.index} stopped on an unexpected error ({type(exc).__name__}); the worker's "
                   f"log has the details under correlation id {correlation_id}")
    return {"type": type(exc).__name__, "code": code, "message": message[:MAX_MESSAGE_CHARS],
            "correlation_id": correlation_id}


def _hand_back_chunk(chunk_id: str, worker: str) -> JobStatus | None:
    with session_scope() as session:
        released = work.release(session, JobChunk, chunk_id, worker=worker, stage="")
    if released:
        resend_queued(chunk_id)
        return JobStatus.QUEUED
    return None


def resend_queued(chunk_id: str) -> None:
    with session_scope() as session:
        chunk = session.get(JobChunk, chunk_id)
        if chunk is None or chunk.status != JobStatus.QUEUED:
            return
        session.expunge(chunk)
        priority = job_store.priority_of(session, chunk.job_id)
    try:
        resend_chunk(chunk, priority)
    except Exception as exc:  # its send time is in the row: a reaper sends it later
        log.error("could not re-send a chunk", chunk_id=chunk_id, error=describe(exc))


# --- the reduction --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Settled:
    """What one settle set in its transaction, and what follows its commit: the finish's message (``queued``) or
    the release of the chord's parts that never returned (an ended job)."""

    status: JobStatus
    chunks: int
    queue: str = ""
    priority: JobPriority = JobPriority.NORMAL
    unfinished: tuple[str, ...] = ()
    run_seconds: float = 0.0


def settle(job_id: str) -> JobStatus | None:
    """End a fanned-out job whose chunks allow it (the last chunk's worker, the chord's callback, a failed
    chunk, or a reaper): failed as soon as one chunk failed, else once every chunk ended: succeeded with the
    reduction of the chunks' outputs in order, or ``queued`` for a worker to finish it (a split with a finish:
    its message is sent), or cancelled. One read of the job and its chunks and one conditional UPDATE, so callers
    racing have one winner and each decides on what it read (chunks that end together each settle the job: the
    later one sees both); returns the status it set, or None."""
    with session_scope() as session:
        settled = _settle_in(session, job_id)
    if settled is None:
        return None
    if settled.status == JobStatus.QUEUED:
        _send_to_finish(job_id, settled.queue, settled.priority, settled.chunks)
    else:
        log.info("job finished", job_id=job_id, status=settled.status, chunks=settled.chunks,
                 run_seconds=round(settled.run_seconds, 3))
        _release_chord(settled.unfinished)
    return settled.status


def _settle_in(session: Session, job_id: str) -> _Settled | None:
    """:func:`settle`'s read and conditional UPDATE, in ``session``."""
    job = session.get(Job, job_id)
    if job is None or job.status != JobStatus.RUNNING or not (job.worker or "").startswith(
            chunk_store.FANOUT_WORKER_PREFIX):
        return None
    chunks = chunk_store.chunks_of(session, job_id, outputs=False)  # only a reduction reads them
    failed = [chunk for chunk in chunks if chunk.status == JobStatus.FAILED]
    if not failed and any(chunk.status not in TERMINAL_STATUSES for chunk in chunks):
        return None  # chunks still to run
    split = SPLITS.get(job.kind)
    finishes = split is not None and split.finish is not None
    succeeded = all(chunk.status == JobStatus.SUCCEEDED for chunk in chunks)
    if not failed and succeeded and finishes and not job.cancel_requested:
        if not chunk_store.hand_to_finish(session, job_id, worker=job.worker or "", chunks=len(chunks)):
            return None  # another party came first, or a cancel came since the read
        return _Settled(JobStatus.QUEUED, len(chunks), queue=job.queue or get_settings().queue,
                        priority=job_store.priority_of(session, job_id))
    result, error = None, None
    if failed:
        status, error = JobStatus.FAILED, dict(failed[0].error or {})
    elif succeeded and not finishes:
        chunks = chunk_store.chunks_of(session, job_id)  # now with their outputs, in one read
        status, result, error = _reduced(job, chunks)
    else:  # a chunk cancelled, or a job to finish whose cancel was requested
        status = JobStatus.CANCELLED
    run_seconds = _seconds(job.started_at, utcnow()) or 0.0
    timings = {"queue_wait": _seconds(job.created_at, job.started_at), "run": run_seconds, "chunks": len(chunks)}
    if not job_store.finish(session, job_id, worker=job.worker or "", status=status, result=result, error=error,
                            timings=timings):
        return None
    chunk_store.cancel_open_chunks(session, job_id)
    unfinished = tuple(chunk.id for chunk in chunks[1:] if chunk.status != JobStatus.SUCCEEDED)
    return _Settled(status, len(chunks), unfinished=unfinished, run_seconds=run_seconds)


def _send_to_finish(job_id: str, queue: str, priority: JobPriority, chunks: int) -> None:
    """The message of a job handed over to be finished (its row says it is queued and when it was sent: if the
    send fails, a reaper sends it again)."""
    log.info("fanned-out job's chunks succeeded; queued to be finished", job_id=job_id, chunks=chunks)
    try:
        core.queue.send(job_id, queue=queue, priority=priority)
    except Exception as exc:
        log.error("could not send a fanned-out job to be finished", job_id=job_id, error=describe(exc))


def kind_to_run(job_id: str, kind: JobKind) -> tuple[JobKind, bool]:
    """The kind to run a claimed job with, and whether it may fan out. A job whose chunks all succeeded (sent
    back by :func:`settle`) runs its split's finish with their outputs, their stage seconds added to
    its own; any other job that has chunks runs whole (the same result by construction) without fanning out
    again; a job without chunks runs as it is."""
    split = SPLITS.get(kind.name)
    if split is None:
        return kind, True

    def read() -> list[JobChunk]:
        with session_scope() as session:
            rows = chunk_store.chunks_of(session, job_id)
            for row in rows:
                session.expunge(row)
            return rows

    chunks = retry_infrastructure(read, what="read a job's chunks", budget_seconds=get_settings().worker_retry_seconds,
                                  job_id=job_id)
    if not chunks:
        return kind, True
    finish = split.finish
    if finish is None or any(chunk.status != JobStatus.SUCCEEDED for chunk in chunks):
        return kind, False
    specs = [dict(chunk.spec) for chunk in chunks]
    outputs = [dict(chunk.output or {}) for chunk in chunks]
    stages = _stage_seconds(chunks)

    def run_finish(params: Any, ctx: RunContext) -> ResultModel:
        result = finish(params, ctx, specs, outputs)
        for stage, seconds in stages.items():  # the chunks' work is the job's: its timings count it
            if stage != "total":  # the timer adds up its own
                ctx.timer.seconds[stage] = ctx.timer.seconds.get(stage, 0.0) + seconds
        return result

    return dataclasses.replace(kind, run=run_finish), False


def _stage_seconds(chunks: Sequence[JobChunk]) -> dict[str, float]:
    """The chunks' stage seconds summed per stage (their "run" aside)."""
    stages: dict[str, float] = {}
    for chunk in chunks:
        for stage, seconds in (chunk.timings or {}).items():
            if stage != "run" and isinstance(seconds, int | float):
                stages[stage] = stages.get(stage, 0.0) + float(seconds)
    return stages


def _release_chord(chunk_ids: Sequence[str]) -> None:
    """Where the result backend cannot count parts (SQLite), ``celery.chord_unlock`` polls the parts' results
    until every one is stored, without end: a job that ended with chunks that never returned (failed by the
    reaper, cancelled before a message came) stores their results, so the poll ends (its callback finds the
    job ended). Redis counts parts and its chord's keys expire: nothing to do there."""
    backend = core.queue.get_celery_app().backend
    if not chunk_ids or backend.supports_native_join:
        return
    try:
        for chunk_id in chunk_ids:
            backend.store_result(chunk_id, chunk_id, "SUCCESS")
    except Exception as exc:  # the poll goes on; nothing else depends on it
        log.warning("could not release a chord's poll", error=describe(exc))


def _reduced(job: Job, chunks: Sequence[JobChunk]) -> tuple[JobStatus, dict[str, Any] | None,
                                                             dict[str, Any] | None]:
    """The reduction as the job's outcome: succeeded with the result, or failed with what stopped it (a
    reduction that raises would otherwise be retried by every reaper pass and never end the job)."""
    try:
        return JobStatus.SUCCEEDED, _reduce(job, chunks), None
    except Exception as exc:
        correlation_id = uuid.uuid4().hex
        log.error("the reduction of a fanned-out job failed", job_id=job.id, correlation_id=correlation_id,
                  error=describe(exc), traceback=traceback.format_exc())
        message = (f"the reduction of the job's chunks stopped on an unexpected error ({type(exc).__name__}); the "
                   f"worker's log has the details under correlation id {correlation_id}")
        return JobStatus.FAILED, None, {"type": type(exc).__name__, "code": "internal_error", "message": message,
                                        "correlation_id": correlation_id}


def _reduce(job: Job, chunks: Sequence[JobChunk]) -> dict[str, Any]:
    """The job's result JSON from its chunks, in chunk order (the order of their blocks), with the device and
    the stage timings summed over the chunks stamped as :func:`kernels.context.run_kind` would."""
    kind = get_kind(job.kind)
    spec: JobParams = kind.params_model.model_validate(job.params)
    reduce = SPLITS[kind.name].reduce
    if reduce is None:
        raise TypeError(f"{kind.name}: its split has no reduction (a worker finishes it)")
    result = reduce(spec, [chunk.spec for chunk in chunks], [chunk.output or {} for chunk in chunks])
    stages = _stage_seconds(chunks)
    devices = sorted({chunk.device for chunk in chunks if chunk.device})
    stamped = result.model_copy(update={"device": " + ".join(devices), "timings": stages})
    return json.loads(stamped.model_dump_json())


def _seconds(start: Any, end: Any) -> float | None:
    if start is None or end is None:
        return None
    return (end.replace(tzinfo=None) - start.replace(tzinfo=None)).total_seconds()


# --- the reapers' part ------------------------------------------------------------------------------------


CALLBACK_GRACE_STALE_LIMITS = 3  # how many stale limits a fanned-out job's chord callback may take


def reduce_lost_callbacks(stale_after: timedelta) -> int:
    """Reduce the fanned-out jobs whose chunks all ended CALLBACK_GRACE_STALE_LIMITS stale limits ago without a
    reduction (their chord's callback was lost); returns how many. The reaper's part (worker/reaper.py)."""
    with session_scope() as session:
        # The chord's own callback reduces a job as soon as its last part is counted, but only once a worker is
        # free to run Celery's unlock task, which polls (and can wait behind a chunk): the reaper steps in only
        # after several stale limits, so that it reduces the jobs whose callback is lost, not late.
        settled = chunk_store.settled_fanouts(session, settled_for=stale_after * CALLBACK_GRACE_STALE_LIMITS)
    reduced = 0
    for job_id in settled:
        if settle(job_id) is not None:
            log.warning("reduced a fanned-out job whose chord callback did not come", job_id=job_id)
            reduced += 1
    return reduced
