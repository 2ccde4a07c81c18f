"""The execute path of a job: claim it (a conditional UPDATE, queued -> running, in the database's priority
order), place it on a device, run it under its heartbeat, progress, cancel and time limit, and store its outcome
(or hand it back to the queue on a warm shutdown or an outage). The message carries only the job id, so a
redelivered or duplicated message for a job already claimed or finished does nothing. The worker makes the job's
run context (array namespace, progress and cancel, dataset loading, artifacts) and hands it to
:func:`kernels.context.run_kind`, which stamps the device and the stage timings on the result; a job of a kind
that splits may fan out into chunks instead (worker/fanout.py).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import structlog
from pydantic import ValidationError

from core.queue import send
from core.settings import get_settings
from core.status import JobStatus
from kernels import backend
from kernels.backend import GPUUnavailableError
from kernels.context import RunContext, namespace_for, run_kind
from kernels.progress import JobCancelled
from kernels.registry import JobKind, get_kind
from kernels.spec import JobParams
from kernels.work import MEMORY_CAP_CODE, CapProblem, cap_problem
from store import jobs as job_store
from store import work
from store.artifacts import discard_pending_outcome, load_pending_outcome, save_pending_outcome
from store.db import session_scope
from store.models import Job, utcnow
from worker import fanout
from worker.dataset_loader import dataset_loader, dataset_rows
from worker.device import job_cache, worker_device
from worker.infra import (
    InfrastructureUnavailable,
    describe,
    is_infrastructure_error,
    retry_infrastructure,
)
from worker.progress import JobProgress, WorkerStopping, worker_stopping
from worker.supervision import supervised
from worker.time_limit import (
    TIME_LIMIT_CODE,
    TIME_LIMIT_ERROR_TYPE,
    TimeLimit,
    TimeLimitExceeded,
    end_worker_process,
    limit_for,
)

log = structlog.get_logger("gpuest.worker")

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
REQUEUED_STAGE = "requeued: worker stopped"
UNAVAILABLE_STAGE = "requeued: database or broker unavailable"
# A user-facing error message is a sentence or a paragraph, not a dump.
MAX_MESSAGE_CHARS = 2000


def _seconds_between(start: Any, end: Any) -> float | None:
    if start is None or end is None:
        return None
    return (end.replace(tzinfo=None) - start.replace(tzinfo=None)).total_seconds()


@dataclass(frozen=True)
class Placement:
    """Where a job runs, chosen before its claim so that the device its row records is the one it runs on.

    ``kind`` is None for an unknown kind name and ``xp`` None for an unusable device; ``error`` then says
    why the job fails instead of running."""

    kind: JobKind | None = None
    xp: ModuleType | None = None
    error: Exception | None = None

    @property
    def device(self) -> str:
        return "unavailable" if self.xp is None else worker_device(self.xp)


def place(kind_name: str) -> Placement:
    try:
        kind: JobKind | None = get_kind(kind_name)
        kind_error: KeyError | None = None
    except KeyError as exc:  # the job fails with it; its row records the worker's default device
        kind, kind_error = None, exc
    try:
        xp = namespace_for(kind) if kind is not None else backend.get_namespace()
    except (GPUUnavailableError, ValueError) as exc:  # GPUEST_DEVICE=gpu without a GPU, or a bad value
        # An unknown kind is the job's own error: report it rather than the device's.
        return Placement(kind, None, kind_error or exc)
    return Placement(kind, xp, kind_error)


@dataclass(frozen=True)
class ClaimedJob:
    """What the worker needs of a job row it claimed (read in the claim's transaction)."""

    kind_name: str
    queue: str | None
    params: dict[str, Any]
    dataset_ids: dict[str, str]
    queue_wait: float | None
    placement: Placement


@dataclass(frozen=True)
class Outcome:
    """How a run ended: ``status`` None means the database or broker stayed out of reach and the job is
    left to the reaper (neither failed nor finished)."""

    status: JobStatus | None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    artifacts: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {"status": None if self.status is None else self.status.value, "result": self.result,
                "error": self.error, "timings": self.timings, "artifacts": self.artifacts}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Outcome:
        return cls(JobStatus(data["status"]), data.get("result"), data.get("error"), data.get("timings"),
                   data.get("artifacts"))


# Outcomes worth keeping on disk until stored: a re-run would compute the same (the seed is in the params).
KEPT_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED)
# A warm shutdown has a grace period: a hand-back waits this long at most for the database.
HAND_BACK_RETRY_SECONDS = 5.0


def execute_job(job_id: str, worker: str = WORKER_ID,
                end_process: Callable[[], None] = end_worker_process) -> JobStatus | None:
    """Claim and run one job to a terminal status; returns that status, ``queued`` when a warm shutdown of
    this worker handed the job back to the queue, or None if it was not ours to run or the database stayed
    out of reach (the job is then left to the reaper, never failed for it). A job past its hard time limit
    is recorded as failed and ``end_process`` is called (worker/time_limit.py)."""
    settings = get_settings()
    if worker_stopping.is_set():
        pass_on(job_id)
        return None
    message_job_id = job_id
    try:
        job_id, claimed = retry_infrastructure(lambda: _claim_in_priority_order(message_job_id, worker),
                                               what="claim", budget_seconds=settings.worker_retry_seconds,
                                               job_id=message_job_id)
    except InfrastructureUnavailable:
        return None  # not claimed: the job is still queued, and the reaper sends its message again
    if claimed is None:
        log.info("job not claimed", job_id=job_id)
        return None
    log.info("job started", job_id=job_id, kind=claimed.kind_name, worker=worker)
    pending = load_pending_outcome(job_id)
    if pending is not None:
        # An earlier run computed this outcome but could not store it: store it rather than compute again.
        log.info("storing the outcome an earlier run of this job computed", job_id=job_id)
        return _store_outcome(job_id, worker, Outcome.from_json(pending))

    spec = _validated(claimed.placement, claimed.params)
    limit = limit_for(claimed.placement.kind, spec, claimed.dataset_ids) if isinstance(spec, JobParams) else None
    started = time.perf_counter()
    with supervised(Job, job_id, worker, limit, lambda limit, seconds: _hard_time_limit(
            job_id, worker, limit, seconds, claimed, end_process)) as run:
        outcome = _run(job_id, claimed.placement, spec, claimed.dataset_ids, run.progress, claimed.queue)
    run_seconds = time.perf_counter() - started
    if outcome.status == JobStatus.RUNNING:  # fanned out: its chunks run on, the chord's callback ends it
        return JobStatus.RUNNING
    job_cache.clear()  # the job ended or goes back to the queue: its inputs are not needed here any more
    if outcome.status is None or outcome.status == JobStatus.QUEUED:
        return _give_back(job_id, worker, claimed.queue, outcome, run_seconds)
    # Worker-side seconds only: the kernel's per-stage timings are in the result (result["timings"]).
    timings = {"queue_wait": claimed.queue_wait, "run": run_seconds}
    return _store_outcome(job_id, worker, dataclasses.replace(outcome, timings=timings,
                                                                artifacts=run.progress.artifacts))


def _hard_time_limit(job_id: str, worker: str, limit: TimeLimit, run_seconds: float, claimed: ClaimedJob,
                     end_process: Callable[[], None]) -> None:
    """The watchdog's action: the job ran past its hard time limit without reaching a checkpoint (its heartbeat
    has stopped). It is recorded as failed (not re-queued: it would hang again) and the worker process ends."""
    outcome = _failed(job_id, TIME_LIMIT_CODE, TIME_LIMIT_ERROR_TYPE, limit.message(hard=True))
    timings = {"queue_wait": claimed.queue_wait, "run": run_seconds}
    try:
        _store_outcome(job_id, worker, dataclasses.replace(outcome, timings=timings))
    finally:
        end_process()


def _claim_in_priority_order(job_id: str, worker: str) -> tuple[str, ClaimedJob | None]:
    """Claim the job the message names, unless a queued job of higher priority waits on its queue: then
    claim that one and send the message on (its job keeps its place and runs later). The database, not the
    broker, orders the queue: kombu's SQLAlchemy transport has no priorities, and Redis's priority lists
    hold messages already fetched by other workers. Returns the id of the job claimed (or tried)."""
    with session_scope() as session:
        job = session.get(Job, job_id)
        before = None
        if job is not None and job.status == JobStatus.QUEUED:
            before = job_store.queued_job_before(session, job_id, queue=job.queue or get_settings().queue)
    if before is not None:
        claimed = _claim(before, worker)
        if claimed is not None:
            pass_on(job_id, reason="a job of higher priority runs first")
            return before, claimed
    return job_id, _claim(job_id, worker)


def _claim(job_id: str, worker: str) -> ClaimedJob | None:
    """One unit of work, retried whole: read the job and claim it (queued -> running). A retry after the
    connection dropped under a committed claim finds the job running for this worker: that claim was ours
    (as is a job this worker had to leave running when the database went away)."""
    with session_scope() as session:
        job = session.get(Job, job_id)
        if job is None:
            return None
        ours = job.status == JobStatus.RUNNING and job.worker == worker
        if job.status != JobStatus.QUEUED and not ours:
            return None
        placement = place(job.kind)
        started_at = job.started_at if ours else utcnow()
        # The conditional UPDATE is the real guard: another claim or a cancel may have come since the read.
        if not ours and not job_store.claim(session, job_id, worker=worker, device=placement.device, now=started_at):
            return None
        return ClaimedJob(job.kind, job.queue, dict(job.params), dict(job.dataset_ids),
                          _seconds_between(job.created_at, started_at), placement)


def _give_back(job_id: str, worker: str, queue: str | None, outcome: Outcome, run_seconds: float) -> JobStatus | None:
    """A run that stopped without an outcome: a warm shutdown (``queued``) or a database that stayed out of
    reach (None). Hand the job back to the queue; where even that fails, the reaper re-queues it."""
    stopping = outcome.status == JobStatus.QUEUED
    stage = REQUEUED_STAGE if stopping else UNAVAILABLE_STAGE
    try:
        released = retry_infrastructure(lambda: hand_back(job_id, worker, queue, stage), what="hand back",
                                        budget_seconds=HAND_BACK_RETRY_SECONDS, job_id=job_id)
    except InfrastructureUnavailable:
        log.error("job left to the reaper: the database is unavailable", job_id=job_id)
        return None
    if released:
        log.info("job handed back to the queue", job_id=job_id, stage=stage, run_seconds=round(run_seconds, 3))
        return JobStatus.QUEUED if stopping else None
    # Not released: its cancel was requested meanwhile (or it is no longer ours).
    return _store_outcome(job_id, worker, Outcome(JobStatus.CANCELLED, timings={"run": run_seconds}))


def _store_outcome(job_id: str, worker: str, outcome: Outcome) -> JobStatus | None:
    """Record the outcome (running -> terminal), retried for ``worker_result_retry_seconds``. It is kept on
    disk until the update is committed: if the database stays out of reach, the job is left running for the
    reaper and its next run stores this outcome (:func:`execute_job`), so the computed result is not lost."""
    assert outcome.status is not None
    if outcome.status in KEPT_STATUSES:
        save_pending_outcome(job_id, outcome.as_json())
    try:
        recorded = retry_infrastructure(
            lambda: _finish(job_id, worker, outcome), what="store the outcome",
            budget_seconds=get_settings().worker_result_retry_seconds, job_id=job_id,
        )
    except InfrastructureUnavailable:
        log.error("job outcome not stored: the database is unavailable; kept on disk for the job's next run",
                  job_id=job_id, status=outcome.status)
        return None
    if recorded or _settled(job_id):
        discard_pending_outcome(job_id)
    log.info("job finished", job_id=job_id, status=outcome.status, recorded=recorded,
             run_seconds=round((outcome.timings or {}).get("run") or 0.0, 3))
    return outcome.status if recorded else None


def _finish(job_id: str, worker: str, outcome: Outcome) -> bool:
    assert outcome.status is not None
    with session_scope() as session:
        return work.finish_once(session, Job, job_id, worker=worker, status=outcome.status, result=outcome.result,
                                error=outcome.error, timings=outcome.timings, artifacts=outcome.artifacts)


def _settled(job_id: str) -> bool:
    """Whether nothing will run the job again (so an outcome kept for it can go); False when unknown."""
    def read() -> bool:
        with session_scope() as session:
            return job_store.is_settled(session, job_id)

    try:
        return retry_infrastructure(read, what="read the job", budget_seconds=HAND_BACK_RETRY_SECONDS, job_id=job_id)
    except InfrastructureUnavailable:
        return False


def _validated(placement: Placement, params: dict[str, Any]) -> JobParams | ValidationError | None:
    """The run's one validation of the stored params: the kind's params model, the error that refused them,
    or None for a job that cannot be placed (its placement error fails it)."""
    if placement.kind is None or placement.error is not None:
        return None
    try:
        return placement.kind.params_model.model_validate(params)
    except ValidationError as exc:
        return exc


def _run(
    job_id: str,
    placement: Placement,
    spec: JobParams | ValidationError | None,
    dataset_ids: dict[str, str],
    progress: JobProgress,
    queue: str | None = None,
) -> Outcome:
    """Run the claimed job. The outcome's status is ``queued`` when this worker began a warm shutdown (the
    job is to be handed back), None when the database or broker stayed out of reach, and ``running`` when
    the job was fanned out into chunks (worker/fanout.py)."""
    if placement.error is not None:
        return _placement_failure(job_id, placement.error)
    assert placement.kind is not None and placement.xp is not None
    try:
        if worker_stopping.is_set():  # the shutdown began between the message and the claim
            raise WorkerStopping(f"worker stopping; job {job_id} goes back to the queue")
        if isinstance(spec, ValidationError):
            raise spec
        assert spec is not None
        over_cap = cpu_cap_problem(placement, spec, dataset_ids)
        if over_cap is not None:
            error_type = "CpuMemoryCap" if over_cap.code == MEMORY_CAP_CODE else "CpuWorkCap"
            return _failed(job_id, over_cap.code, error_type, f"{over_cap.field}: {over_cap.message}")
        ctx = RunContext(placement.xp, progress, dataset_loader(dataset_ids), dataset_fields=tuple(dataset_ids),
                         cache=job_cache.enter(job_id))
        # A fanned-out job whose chunks succeeded comes back to be finished from their outputs.
        kind, may_fan_out = fanout.kind_to_run(job_id, placement.kind)
        if may_fan_out and fanout.try_fan_out(job_id, progress.worker, kind, spec, ctx, queue):
            return Outcome(JobStatus.RUNNING)
        return Outcome(JobStatus.SUCCEEDED, result=run_kind(kind, spec, ctx))
    except WorkerStopping:
        return Outcome(JobStatus.QUEUED)
    except JobCancelled:
        return Outcome(JobStatus.CANCELLED)
    except TimeLimitExceeded as exc:
        return _failed(job_id, TIME_LIMIT_CODE, TIME_LIMIT_ERROR_TYPE, str(exc))
    except ValidationError as exc:
        return _failed(job_id, "invalid_params", type(exc).__name__, str(exc))
    except (ValueError, KeyError) as exc:
        # The kernel's own account of what it refused (bad input, no convergence and its remedy): for the user.
        return _failed(job_id, "kernel_error", type(exc).__name__, str(exc))
    except GPUUnavailableError as exc:
        return _failed(job_id, "gpu_unavailable", type(exc).__name__, str(exc))
    except MemoryError:
        return _failed(job_id, "out_of_memory", "OutOfMemory", "the job needed more memory than the worker has")
    except Exception as exc:
        if is_infrastructure_error(exc):  # not the kernel's fault: the job runs again
            log.error("job stopped by a database or broker error; handing it back", job_id=job_id,
                      error=describe(exc))
            return Outcome(None)
        return _internal_failure(job_id, exc)


def cpu_cap_problem(placement: Placement, spec: JobParams, dataset_ids: Mapping[str, str]) -> CapProblem | None:
    """The CPU caps, for a job placed on NumPy: the problem when its work (its kind's measure, ``JobKind.work``)
    passes its kind's work cap (``cpu_max_work``, else the kind's default) or its memory estimate passes
    ``cpu_max_job_bytes``. The API refuses such jobs at submission where it knows they run on CPU; this is the
    worker's own check for the rest (GPUEST_DEVICE=auto with servers). A GPU worker keeps its kinds' own
    bounds (the params' limits on grids and panels)."""
    assert placement.kind is not None and placement.xp is not None
    if placement.kind.work is None or not backend.is_numpy(placement.xp):
        return None
    settings = get_settings()
    return cap_problem(placement.kind.name, spec, dataset_rows(dataset_ids), settings.cpu_max_work,
                       settings.cpu_max_job_bytes)


def _placement_failure(job_id: str, error: Exception) -> Outcome:
    if isinstance(error, KeyError):
        return _failed(job_id, "unknown_kind", "KeyError", str(error))
    return _failed(job_id, "gpu_unavailable", type(error).__name__, str(error))


def _failed(job_id: str, code: str, error_type: str, message: str) -> Outcome:
    """What the user sees: a stable code and type, a short message and the id of the log line with the rest."""
    correlation_id = uuid.uuid4().hex
    log.info("job failed", job_id=job_id, code=code, error_type=error_type, correlation_id=correlation_id)
    return Outcome(JobStatus.FAILED, error={"type": error_type, "code": code, "message": message[:MAX_MESSAGE_CHARS],
                                            "correlation_id": correlation_id})


def _internal_failure(job_id: str, error: Exception) -> Outcome:
    """An unexpected error: its text may hold anything (paths, hosts, SQL), so it goes to the log only, under
    a correlation id the user's message quotes."""
    correlation_id = uuid.uuid4().hex
    error_type = type(error).__name__
    log.error("job raised an unexpected error", job_id=job_id, correlation_id=correlation_id, error=describe(error),
              traceback=traceback.format_exc())
    message = (f"the job stopped on an unexpected error ({error_type}) in the kernel; the worker's log has the "
               f"details under correlation id {correlation_id}")
    return Outcome(JobStatus.FAILED, error={"type": error_type, "code": "internal_error", "message": message,
                                            "correlation_id": correlation_id})


def hand_back(job_id: str, worker: str, queue: str | None, stage: str = REQUEUED_STAGE) -> bool:
    """Release a job this stopping worker holds (running -> queued, the attempt given back) and send it
    again at once to ``queue`` (the job's), so the next worker on it runs the job without waiting for the
    reaper."""
    with session_scope() as session:
        released = job_store.release(session, job_id, worker=worker, stage=stage)
        priority = job_store.priority_of(session, job_id)
    if not released:
        return False
    try:
        send(job_id, queue=queue, priority=priority)
    except Exception:  # the row says it is queued and when it was sent: a reaper pass re-sends it later
        log.error("could not re-send a released job", job_id=job_id, traceback=traceback.format_exc())
    return True


def pass_on(job_id: str, reason: str = "worker stopping") -> None:
    """Send a queued job's message on, unclaimed, for the next worker: a stopping worker can still be handed
    a message (often the one its own hand-back just sent), and a worker that ran a job of higher priority
    instead of the message's job passes the message on."""
    with session_scope() as session:
        job = session.get(Job, job_id)
        if job is None or job.status != JobStatus.QUEUED:
            return  # nothing to run here: a claim would have failed too
        queue, priority = job.queue, job_store.priority_of(session, job_id)
        job_store.mark_enqueued(session, job_id)
    try:
        send(job_id, queue=queue, priority=priority)
    except Exception as exc:  # the row says it was just sent: a reaper pass sends it again later
        log.error("could not pass a job's message on", job_id=job_id, error=describe(exc))
        return
    log.info("passed a job's message on unclaimed", job_id=job_id, reason=reason)
