"""/v1/job-groups: sweeps. One POST with a base spec and a parameter grid (or a list of specs)
creates the group and its member jobs in one transaction; the group's status, progress and counts come from
its members; cancel reaches every member; ``/results`` is one table (CSV or Parquet) with a row per member:
its grid values and the result fields asked for."""

from __future__ import annotations

import io
import json
import math
from typing import Annotated, Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import structlog
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi import Path as PathParam
from pydantic import TypeAdapter
from sqlalchemy.orm import Session

from api.callbacks import check_callback_url, register_callback
from api.deps import OwnerDep, SessionDep, SettingsDep
from api.job_checks import check_active_jobs_quota, invalid
from api.pagination import LimitQuery, OffsetQuery, next_page
from api.problems import ProblemError, field_error
from api.result_fields import lookup, parse_fields
from api.schemas import (
    CallbackOut,
    JobGroupLinks,
    JobGroupOut,
    JobGroupPage,
    JobGroupRequest,
    as_utc,
    job_request_union,
)
from api.sweeps import MemberChecker, check_members, planned_members
from core.queue import send_many
from core.status import JobPriority
from kernels.registry import registry
from store import groups as group_store
from store import webhooks as webhook_store
from store.db import storable_text
from store.models import JobGroup
from store.webhooks import SubjectType

log = structlog.get_logger("gpuest.api")

router = APIRouter(prefix="/v1/job-groups", tags=["job groups"])

GroupIdPath = Annotated[str, PathParam(min_length=1, max_length=64, description="job group id")]
NOT_FOUND_RESPONSES: dict[int | str, dict[str, Any]] = {404: {"description": "No such job group for this API key"}}
MEDIA_TYPES = {"csv": "text/csv", "parquet": "application/vnd.apache.parquet"}
FIXED_COLUMNS = ("member", "job_id", "status")

_member_adapter: TypeAdapter[Any] | None = None


def member_adapter() -> TypeAdapter[Any]:
    """Validates one member exactly as ``POST /v1/jobs`` validates its body (built once)."""
    global _member_adapter
    if _member_adapter is None:
        _member_adapter = TypeAdapter(job_request_union(registry()))
    return _member_adapter


def group_not_found(group_id: str) -> ProblemError:
    return ProblemError(404, f"no job group with id {group_id!r}", slug="job-group-not-found")


def owned_group(group_id: GroupIdPath, owner: OwnerDep, session: SessionDep) -> JobGroup:
    group = group_store.get_group(session, group_id, owner) if storable_text(group_id) else None
    if group is None:
        raise group_not_found(group_id)
    return group


OwnedGroupDep = Annotated[JobGroup, Depends(owned_group)]


def group_out(session: Session, group: JobGroup) -> JobGroupOut:
    summary = group_store.summarize(session, group)
    base = f"/v1/job-groups/{group.id}"
    return JobGroupOut(
        id=group.id,
        name=group.name,
        status=summary.status,
        progress=round(summary.progress, 6),
        member_count=group.member_count,
        counts=summary.counts,
        priority=JobPriority(group.priority),
        varying=list(group.varying or []),
        spec=dict(group.spec or {}),
        cancel_requested=bool(group.cancel_requested),
        created_at=as_utc(group.created_at),
        callback=CallbackOut.from_row(
            webhook_store.deliveries_for(session, SubjectType.GROUP, [group.id]).get(group.id)
        ),
        links=JobGroupLinks(
            self=base, cancel=f"{base}/cancel", results=f"{base}/results", jobs=f"/v1/jobs?group_id={group.id}"
        ),
    )


@router.post(
    "",
    status_code=202,
    response_model=JobGroupOut,
    summary="Submit a sweep (job group)",
    responses={
        422: {
            "description": "Invalid grid or member: `errors` name grid.<path>, members.<i>.<field> or specs.<i>.<field>"
        },
        429: {"description": "The members would take the owner past max_active_jobs_per_owner"},
    },
)
def create_group(
    body: JobGroupRequest,
    response: Response,
    owner: OwnerDep,
    session: SessionDep,
    settings: SettingsDep,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200, pattern=r"^[\x20-\x7e]+$")
    ] = None,
) -> JobGroupOut:
    """Expand the grid (or the specs), check every member like a single job, store the group and its members
    as queued in one transaction (all or none) and ring the worker queue for each."""
    planned, varying = planned_members(body, settings.max_group_jobs, settings.max_group_params_bytes)
    check_callback_url(body.callback_url, settings)
    existing = group_store.find_by_idempotency_key(session, owner, idempotency_key) if idempotency_key else None
    spec = body.model_dump(mode="json", include={"base", "grid", "specs"}, exclude_none=True)
    if existing is not None:
        existing_callback = webhook_store.deliveries_for(session, SubjectType.GROUP, [existing.id]).get(existing.id)
        if existing.spec != spec or (existing_callback.url if existing_callback else None) != body.callback_url:
            raise ProblemError(
                422, "this Idempotency-Key was already used for a different job group", slug="idempotency-key-reused"
            )
        response.headers["Idempotent-Replayed"] = "true"
        response.headers["Location"] = f"/v1/job-groups/{existing.id}"
        return group_out(session, existing)
    members = check_members(MemberChecker(session, owner, member_adapter(), sorted(registry()), settings), planned)
    check_active_jobs_quota(session, owner, settings, None, new_jobs=len(members))
    group, job_ids, created = group_store.create_group(
        session,
        owner=owner,
        name=body.name,
        spec=spec,
        varying=varying,
        members=members,
        priority=body.priority,
        queue=settings.queue,
        idempotency_key=idempotency_key,
    )
    if created:
        register_callback(session, SubjectType.GROUP, group.id, owner, body.callback_url)
    session.commit()
    if created:
        ring_members(job_ids, settings.queue, body.priority)
        log.info("job group created", group_id=group.id, members=len(job_ids), owner=owner)
    else:
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/v1/job-groups/{group.id}"
    return group_out(session, group)


def ring_members(job_ids: list[str], queue: str, priority: JobPriority) -> None:
    # The database is the truth: members whose message did not go stay queued and the reaper sends them.
    try:
        send_many(job_ids, queue=queue, priority=priority)
    except Exception:
        log.exception("could not enqueue every member; the rest stay queued for the reaper to re-send")


@router.get("", response_model=JobGroupPage, summary="List job groups")
def list_groups(
    request: Request, owner: OwnerDep, session: SessionDep, limit: LimitQuery = 50, offset: OffsetQuery = 0
) -> JobGroupPage:
    """The caller's job groups, newest first."""
    rows, total = group_store.list_groups(session, owner=owner, limit=limit, offset=offset)
    return JobGroupPage(
        items=[group_out(session, group) for group in rows],
        total=total,
        limit=limit,
        offset=offset,
        next=next_page(request, limit=limit, offset=offset, returned=len(rows), total=total),
    )


@router.get("/{group_id}", response_model=JobGroupOut, responses=NOT_FOUND_RESPONSES, summary="Get a job group")
def get_group(group: OwnedGroupDep, session: SessionDep) -> JobGroupOut:
    """Status, progress and members per status (the members themselves: ``GET /v1/jobs?group_id=...``)."""
    return group_out(session, group)


@router.post(
    "/{group_id}/cancel", response_model=JobGroupOut, responses=NOT_FOUND_RESPONSES, summary="Cancel a job group"
)
def cancel_group(group: OwnedGroupDep, session: SessionDep) -> JobGroupOut:
    """Queued members are cancelled at once; running ones stop at their next checkpoint; finished members
    keep their results."""
    cancelled, flagged = group_store.cancel_group(session, group)
    session.commit()
    log.info("job group cancel requested", group_id=group.id, cancelled=cancelled, flagged=flagged)
    return group_out(session, group)


@router.delete(
    "/{group_id}",
    status_code=204,
    responses={
        **NOT_FOUND_RESPONSES,
        204: {"description": "Deleted: the group, its members, their results and artifacts"},
        409: {"description": "Members are queued or running: cancel the group first"},
    },
    summary="Delete a finished job group",
)
def delete_group(group: OwnedGroupDep, session: SessionDep) -> Response:
    """Delete a group whose members have all ended, with every member (its result, artifacts and log) and the
    webhooks; the datasets they read stay. While a member is queued or running: 409, cancel the group first."""
    try:
        deleted = group_store.delete_finished_group(session, group)
    except group_store.GroupNotFinishedError as error:
        raise ProblemError(
            409,
            f"{error.active} member(s) of job group {group.id} are queued or running: cancel the group "
            f"(POST /v1/job-groups/{group.id}/cancel), then delete it once they have stopped",
            slug="job-group-not-finished",
            extensions={"active_members": error.active},
        ) from None
    session.commit()
    log.info("job group deleted", group_id=group.id, members=deleted)
    return Response(status_code=204)


def _scalar_fields(results: list[dict[str, Any]]) -> list[str]:
    """Every top-level field that is a number, text, a boolean or null in some result (the default columns)."""
    names: dict[str, None] = {}
    for result in results:
        for name, value in result.items():
            if value is None or isinstance(value, bool | int | float | str):
                names.setdefault(name)
    return list(names)


def _column(values: list[Any]) -> pa.Array:
    """A typed column: booleans, integers or floats where every value is one (null allowed), else text (a list
    or an object as its JSON)."""
    present = [value for value in values if value is not None]
    if present and all(isinstance(value, bool) for value in present):
        return pa.array(values, pa.bool_())
    if present and all(isinstance(value, int) and not isinstance(value, bool) for value in present):
        return pa.array(values, pa.int64())
    if present and all(isinstance(value, int | float) and not isinstance(value, bool) for value in present):
        return pa.array(
            [None if value is None or not math.isfinite(value) else float(value) for value in values], pa.float64()
        )
    return pa.array(
        [None if value is None else value if isinstance(value, str) else json.dumps(value) for value in values],
        pa.string(),
    )


def results_table(group: JobGroup, rows: list[group_store.MemberRow], fields: list[str] | None) -> pa.Table:
    results = [row.result for row in rows if row.result is not None]
    chosen = fields if fields is not None else _scalar_fields(results)
    unknown = [name for name in chosen if results and not any(lookup(r, name.split("."))[0] for r in results)]
    if unknown:
        raise invalid(
            [
                field_error(
                    "fields", f"no succeeded member's result has {name!r}", type_="unknown_field", location="query"
                )
                for name in unknown
            ]
        )
    columns: dict[str, list[Any]] = {
        "member": [row.index for row in rows],
        "job_id": [row.job_id for row in rows],
        "status": [row.status for row in rows],
    }
    for path in group.varying or []:
        columns.setdefault(path, [row.values.get(path) for row in rows])
    for name in chosen:
        if name in columns:
            raise invalid(
                [
                    field_error(
                        "fields",
                        f"{name!r} is already a column of the table",
                        type_="duplicate_field",
                        location="query",
                    )
                ]
            )
        columns[name] = [lookup(row.result, name.split("."))[1] if row.result is not None else None for row in rows]
    return pa.table({name: _column(values) for name, values in columns.items()})


@router.get(
    "/{group_id}/results",
    responses={
        **NOT_FOUND_RESPONSES,
        200: {"content": {"text/csv": {}, "application/vnd.apache.parquet": {}}, "description": "One row per member"},
    },
    summary="The sweep's results table",
)
def group_results(
    group: OwnedGroupDep,
    session: SessionDep,
    fields: Annotated[
        str | None,
        Query(
            max_length=4000,
            description="comma-separated dotted result fields (printable ASCII; a number indexes a list), e.g. "
            "rejection_rate,timings.total,conf_int.0; default: every top-level scalar field",
        ),
    ] = None,
    format: Annotated[str, Query(pattern="^(csv|parquet)$", description="csv or parquet")] = "csv",
) -> Response:
    """One row per member in group order: ``member``, ``job_id``, ``status``, the varying params paths, then the
    chosen result fields (empty for members that have not succeeded). Available at any time: rows of members
    still running are empty until they succeed."""
    chosen = parse_fields(fields) if fields is not None else None
    table = results_table(group, group_store.member_rows(session, group.id), chosen)
    buffer = io.BytesIO()
    if format == "parquet":
        pq.write_table(table, buffer)
    else:
        pa_csv.write_csv(table, buffer, pa_csv.WriteOptions(quoting_style="needed"))
    return Response(
        buffer.getvalue(),
        media_type=MEDIA_TYPES[format],
        headers={"Content-Disposition": f'attachment; filename="group-{group.id}.{format}"'},
    )
