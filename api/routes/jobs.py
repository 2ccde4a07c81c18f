"""/v1/jobs: create (202 + Location, Idempotency-Key), read, list, cancel, result, artifacts.

The create body and the result are typed by the job registry: the body is the discriminated union of every
kind's request model, the result the union of every kind's result model (documentation only: the route
sends the stored JSON).
"""

from pathlib import Path
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, JSONResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.callbacks import check_callback_url, register_callback
from api.deps import JobIdPath, OwnerDep, SessionDep, SettingsDep
from api.job_checks import check_active_jobs_quota, check_dataset_columns, check_datasets
from api.pagination import LimitQuery, OffsetQuery, next_page
from api.problems import ProblemError, field_error
from api.schemas import (
    ArtifactOut,
    JobEventOut,
    JobEventPage,
    JobOut,
    JobPage,
    job_request_union,
    job_result_union,
)
from api.work_cap import check_cpu_work_cap
from core.queue import send
from core.status import JobPriority, JobStatus
from kernels.registry import get_kind, registry, result_models
from kernels.spec import JobParams
from store import events as event_store
from store import jobs as job_store
from store import webhooks as webhook_store
from store.artifacts import ARTIFACT_NAME_CHARS, job_artifact_dir
from store.db import session_scope, storable_text
from store.models import Job
from store.webhooks import SubjectType

log = structlog.get_logger("gpuest.api")

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobRequest = job_request_union(registry())
JobResult = job_result_union(result_models())

IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key", min_length=1, max_length=200, pattern=r"^[\x20-\x7e]+$",
        description="Retrying a POST with the same key returns the job the first POST created "
        "(printable ASCII)",
    ),
]

NOT_FOUND_RESPONSES: dict[int | str, dict[str, Any]] = {404: {"description": "No such job for this API key"}}


def job_not_found(job_id: str) -> ProblemError:
    # Another owner's job answers exactly like a missing one.
    return ProblemError(404, f"no job with id {job_id!r}", slug="job-not-found")


def find_owned_job(session: Session, job_id: str, owner: str) -> Job:
    """The owner's job ``job_id``, or the 404 problem."""
    if not storable_text(job_id):  # no job has such an id, and PostgreSQL would refuse the query
        raise job_not_found(job_id)
    job = job_store.get_job(session, job_id, owner)
    if job is None:
        raise job_not_found(job_id)
    return job


def owned_job(job_id: JobIdPath, owner: OwnerDep, session: SessionDep) -> Job:
    return find_owned_job(session, job_id, owner)


OwnedJobDep = Annotated[Job, Depends(owned_job)]


def job_out(job_id: str, owner: str) -> JobOut:
    with session_scope() as session:
        return job_with_callback(session, find_owned_job(session, job_id, owner))


def job_with_callback(session: Session, job: Job) -> JobOut:
    """The job as the API shows it, with its webhook's delivery log when it has one."""
    return JobOut.from_row(job, webhook_store.deliveries_for(session, SubjectType.JOB, [job.id]).get(job.id))


def ring_worker_queue(job: Job) -> None:
    # The database is the truth and the broker a doorbell: if it is down the job stays queued and the
    # worker's reaper re-sends it (its row says when the send was tried), so the client still gets its 202.
    try:
        send(job.id, queue=job.queue, priority=JobPriority(job.priority))
    except Exception:
        log.exception("could not enqueue job; it stays queued for the reaper to re-send", job_id=job.id)


def idempotency_key_reused() -> ProblemError:
    return ProblemError(
        422, "this Idempotency-Key was already used for a different job spec",
        slug="idempotency-key-reused",
        errors=[field_error("Idempotency-Key", "already used with another spec", type_="idempotency_key_reused",
                            location="header")],
    )


@router.post(
    "",
    status_code=202,
    response_model=JobOut,
    summary="Submit a job",
    responses={422: {"description": "Invalid spec: the problem's `errors` name each field"},
               429: {"description": "The owner's queued and running jobs are at max_active_jobs_per_owner"}},
)
def create_job(
    body: JobRequest,  # type: ignore[valid-type]
    response: Response,
    owner: OwnerDep,
    session: SessionDep,
    settings: SettingsDep,
    idempotency_key: IdempotencyKeyHeader = None,
) -> JobOut:
    """Validate the spec against its kind, store the job as `queued` and ring the worker queue."""
    kind = get_kind(body.kind)  # the registry the request union was built from
    params: JobParams = body.params  # validated once, with the body: what is stored is its dump
    dataset_ids = kind.dataset_ids(params)
    check_datasets(session, owner, dataset_ids)
    check_dataset_columns(session, owner, params, dataset_ids)
    check_cpu_work_cap(session, owner, kind, params, dataset_ids, settings)
    stored_params = params.model_dump(mode="json")
    check_callback_url(body.callback_url, settings)
    check_active_jobs_quota(session, owner, settings, idempotency_key)
    job, created = job_store.create_job(
        session, owner=owner, kind=kind.name, params=stored_params, dataset_ids=dataset_ids,
        idempotency_key=idempotency_key, queue=settings.queue, priority=body.priority,
    )
    if created:
        register_callback(session, SubjectType.JOB, job.id, owner, body.callback_url)
    elif job.kind != kind.name or job.params != stored_params or _callback_url(session, job) != body.callback_url:
        raise idempotency_key_reused()
    if not created and job.status == JobStatus.QUEUED:
        # A retried POST re-rings the doorbell (the first message may be what got lost); the new send time
        # keeps the reaper from sending yet another.
        job_store.mark_enqueued(session, job.id)
    session.commit()
    if job.status == JobStatus.QUEUED:
        ring_worker_queue(job)
    if created:
        log.info("job created", job_id=job.id, kind=job.kind, owner=owner)
    else:
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job_with_callback(session, job)


def _callback_url(session: Session, job: Job) -> str | None:
    delivery = webhook_store.deliveries_for(session, SubjectType.JOB, [job.id]).get(job.id)
    return None if delivery is None else delivery.url


@router.get("", response_model=JobPage, summary="List jobs")
def list_jobs(
    request: Request,
    owner: OwnerDep,
    session: SessionDep,
    kind: Annotated[str | None, Query(max_length=64, description="only this job kind")] = None,
    status: Annotated[JobStatus | None, Query(description="only this status")] = None,
    group_id: Annotated[str | None, Query(max_length=36, description="only the members of this job group")] = None,
    limit: LimitQuery = 50,
    offset: OffsetQuery = 0,
) -> JobPage:
    """The caller's jobs, newest first."""
    rows, total = job_store.list_jobs(session, owner=owner, kind=kind, status=status, group_id=group_id,
                                      limit=limit, offset=offset)
    callbacks = webhook_store.deliveries_for(session, SubjectType.JOB, [job.id for job in rows])
    return JobPage(
        items=[JobOut.from_row(job, callbacks.get(job.id)) for job in rows], total=total, limit=limit, offset=offset,
        next=next_page(request, limit=limit, offset=offset, returned=len(rows), total=total),
    )


@router.get("/{job_id}", response_model=JobOut, responses=NOT_FOUND_RESPONSES, summary="Get a job")
async def get_job(job_id: JobIdPath, owner: OwnerDep) -> JobOut:
    # The status poll, the most frequent request: session, query and serialisation in one worker-thread
    # hop (a sync route with a session dependency takes three).
    return await run_in_threadpool(job_out, job_id, owner)


@router.post(
    "/{job_id}/cancel",
    response_model=JobOut,
    responses={**NOT_FOUND_RESPONSES, 202: {"description": "Running: the worker stops at its next checkpoint"},
               409: {"description": "The job already finished"}},
    summary="Cancel a job",
)
def cancel_job(job_id: JobIdPath, owner: OwnerDep, session: SessionDep, response: Response) -> JobOut:
    """A queued job is cancelled at once and never runs; a running one is flagged and the worker stops
    it at its next progress checkpoint (202)."""
    job = job_store.request_cancel(session, job_id, owner) if storable_text(job_id) else None
    if job is None:
        raise job_not_found(job_id)
    session.commit()
    if job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        raise ProblemError(409, f"job {job_id} already {job.status}; there is nothing to cancel",
                           slug="job-finished", extensions={"job_status": job.status})
    if job.status == JobStatus.RUNNING:
        response.status_code = 202
    log.info("job cancel requested", job_id=job_id, status=job.status)
    return job_with_callback(session, job)


@router.delete(
    "/{job_id}",
    status_code=204,
    responses={**NOT_FOUND_RESPONSES, 204: {"description": "Deleted: the job, its result and its artifacts"},
               409: {"description": "The job is queued or running: cancel it first"}},
    summary="Delete a finished job",
)
def delete_job(job_id: JobIdPath, owner: OwnerDep, session: SessionDep) -> Response:
    """Delete a succeeded, failed or cancelled job with its result and artifacts (the datasets it read stay).
    A queued or running job is refused (409): cancel it first, so no worker is writing what is deleted."""
    try:
        deleted = job_store.delete_finished_job(session, job_id, owner) if storable_text(job_id) else False
    except job_store.JobNotFinishedError as error:
        raise ProblemError(409, f"job {job_id} is {error.status}: cancel it first (POST /v1/jobs/{job_id}/cancel), "
                           "then delete it once it has stopped", slug="job-not-finished",
                           extensions={"job_status": error.status}) from None
    if not deleted:
        raise job_not_found(job_id)
    session.commit()
    log.info("job deleted", job_id=job_id, owner=owner)
    return Response(status_code=204)


@router.get(
    "/{job_id}/result",
    response_model=JobResult,
    responses={**NOT_FOUND_RESPONSES, 409: {"description": "The job has not succeeded (yet)"}},
    summary="Get a job's result",
)
def get_result(job: OwnedJobDep) -> JSONResponse:
    """The result object of a succeeded job: its kind's result model (see the schemas)."""
    if job.status != JobStatus.SUCCEEDED:
        detail = f"job {job.id} is {job.status}; a result exists only once it has succeeded"
        extensions: dict[str, Any] = {"job_status": job.status}
        job_error = JobOut.from_row(job).error
        if job.status == JobStatus.FAILED and job_error:
            detail += f" (error: {job_error.code or job_error.type}: {job_error.message})"
            extensions["error"] = job_error.model_dump(exclude_none=True)
        raise ProblemError(409, detail, slug="result-not-ready", extensions=extensions)
    # The stored JSON as it is: the union above documents it, but validating against it could pick another
    # kind's model and drop fields.
    return JSONResponse(dict(job.result or {}))


@router.get("/{job_id}/events", response_model=JobEventPage, responses=NOT_FOUND_RESPONSES, summary="A job's log")
def list_events(
    request: Request, job: OwnedJobDep, session: SessionDep, limit: LimitQuery = 50, offset: OffsetQuery = 0,
) -> JobEventPage:
    """What happened to the job, oldest first: submitted, started (device, attempt), its stages, re-queues
    after a lost worker or a stopping one, lost messages sent again, cancel requests and how it ended."""
    rows, total = event_store.list_events(session, job.id, limit=limit, offset=offset)
    return JobEventPage(
        items=[JobEventOut.from_row(event) for event in rows], total=total, limit=limit, offset=offset,
        next=next_page(request, limit=limit, offset=offset, returned=len(rows), total=total),
    )


@router.get(
    "/{job_id}/artifacts", response_model=list[ArtifactOut], responses=NOT_FOUND_RESPONSES,
    summary="List a job's artifacts",
)
def list_artifacts(job: OwnedJobDep) -> list[ArtifactOut]:
    return [
        ArtifactOut(
            name=name, file=str(reference.get("file", "")), media_type=str(reference.get("media_type", "")),
            bytes=int(reference.get("bytes", 0)), href=f"/v1/jobs/{job.id}/artifacts/{name}",
        )
        for name, reference in sorted((job.artifacts or {}).items())
    ]


@router.get(
    "/{job_id}/artifacts/{name}",
    response_class=FileResponse,
    responses={**NOT_FOUND_RESPONSES, 200: {"content": {"application/octet-stream": {}}}},
    summary="Download one artifact",
)
def download_artifact(
    job_id: JobIdPath,
    name: Annotated[str, PathParam(min_length=1, max_length=200)],
    owner: OwnerDep,
    session: SessionDep,
) -> FileResponse:
    # The job by id here, not OwnedJobDep: the path's parameters keep their order (job_id, name) in OpenAPI.
    path, media_type = artifact_file(find_owned_job(session, job_id, owner), name)
    return FileResponse(path, media_type=media_type, filename=path.name)


def _safe_name(name: str) -> bool:
    return bool(name) and not set(name) - ARTIFACT_NAME_CHARS and not name.startswith(".")


def artifact_file(job: Job, name: str) -> tuple[Path, str]:
    """The file of artifact ``name``, proven to lie inside the job's artifact folder."""
    missing = ProblemError(404, f"job {job.id} has no artifact named {name!r}", slug="artifact-not-found")
    reference = (job.artifacts or {}).get(name) if _safe_name(name) else None
    if not isinstance(reference, dict) or not _safe_name(str(reference.get("file", ""))):
        raise missing
    directory = job_artifact_dir(job.id).resolve()
    path = (directory / str(reference["file"])).resolve()
    if not path.is_relative_to(directory) or not path.is_file():
        raise missing
    return path, str(reference.get("media_type") or "application/octet-stream")
