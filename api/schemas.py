"""Request and response bodies of the REST API. The job-create body is a discriminated union on ``kind``
built from the job registry, so every kind's params schema appears in the OpenAPI document; the result is
documented as the union of the kinds' result models, so a client generator can type it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Union

from fastapi import Body
from pydantic import BaseModel, ConfigDict, Field, create_model

from core.status import JobPriority, JobStatus
from kernels.registry import JobKind
from kernels.spec import ResultModel
from store.events import EventType
from store.models import Dataset, Job, JobEvent, WebhookDelivery


def as_utc(moment: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


# -- job create ----------------------------------------------------------------------------------------

def _model_name(kind_name: str) -> str:
    return "".join(part.capitalize() for part in kind_name.split("_")) + "JobRequest"


PRIORITY_DESCRIPTION = ("high runs before normal, normal before low: a queued job of higher priority is claimed "
                        "first (a job already running is not interrupted)")


CALLBACK_URL_DESCRIPTION = (
    "Optional webhook: POSTed a signed JSON body once the job (or group) finishes: {event, delivery_id, type, id, "
    "kind, status, finished_at, url, result_url, ...}. Headers X-Gpuest-Timestamp (unix seconds) and "
    "X-Gpuest-Signature: sha256=<hex of HMAC-SHA256(your signing secret, timestamp + '.' + raw body)>; the secret "
    "is at GET /v1/webhooks/secret. https, or http to a loopback address unless the operator allows more; the "
    "host must resolve to public addresses only (no private, loopback, link-local or metadata addresses unless the "
    "operator allows their network); no redirects followed; retried with exponential backoff on failure (any "
    "non-2xx answer)"
)


def job_request_model(kind: JobKind) -> type[BaseModel]:
    # The kind's runnable example is the documented one (dataset fields may hold placeholder ids).
    example = {"kind": kind.name, "params": dict(kind.example.params)}
    return create_model(
        _model_name(kind.name),
        __config__=ConfigDict(
            extra="forbid",
            title=_model_name(kind.name),
            json_schema_extra={"examples": [example]},
        ),
        __doc__=kind.summary or f"Create a {kind.name} job.",
        kind=(Literal[kind.name], Field(description=kind.summary or kind.name)),  # type: ignore[valid-type]
        params=(kind.params_model, Field(description=f"Parameters of {kind.name}")),
        priority=(JobPriority, Field(JobPriority.NORMAL, description=PRIORITY_DESCRIPTION)),
        callback_url=(str | None, Field(None, min_length=1, max_length=2000, description=CALLBACK_URL_DESCRIPTION)),
    )


def job_request_union(kinds: Mapping[str, JobKind]) -> Any:
    """``Annotated[Union[<one model per kind>], Body(discriminator="kind")]`` for the create-job route."""
    if not kinds:
        raise RuntimeError("the job registry is empty: no job kind can be submitted")
    models = tuple(job_request_model(kind) for kind in kinds.values())
    return Annotated[Union[models], Body(discriminator="kind")]  # noqa: UP007 (a runtime tuple of types)


def job_result_union(result_models: Sequence[type[ResultModel]]) -> Any:
    """``Union[<every kind's result model>]``: the documented body of ``GET /v1/jobs/{id}/result`` (the route
    sends the stored JSON as it is, without validating it against the union)."""
    if not result_models:
        raise RuntimeError("the job registry is empty: no kind has a result model")
    return Union[tuple(result_models)]  # noqa: UP007 (a runtime tuple of types)


# -- job -------------------------------------------------------------------------------------------------

class JobErrorOut(BaseModel):
    """Why a job failed: a short stable code and message; details (tracebacks, SQL, hosts) stay in the
    worker's log under ``correlation_id``."""

    type: str = Field(description="the error's class, e.g. ValueError (kept for older clients)")
    message: str
    code: str | None = Field(default=None, description="stable machine-readable code, e.g. kernel_error")
    correlation_id: str | None = Field(default=None, description="quote it to the operator: it finds the log lines")


class JobLinks(BaseModel):
    self: str
    cancel: str
    result: str
    artifacts: str


ETA_MIN_PROGRESS = 0.02  # below this the rate is mostly start-up cost: no estimate


def eta_seconds(job: Job, now: datetime | None = None) -> float | None:
    """Seconds left for a running job at its average rate so far (None before 2 % or when not running)."""
    progress = float(job.progress or 0.0)
    started = as_utc(job.started_at)
    if job.status != JobStatus.RUNNING or started is None or progress < ETA_MIN_PROGRESS or progress >= 1.0:
        return None
    elapsed = ((now or datetime.now(UTC)) - started).total_seconds()
    return round(max(elapsed, 0.0) * (1.0 - progress) / progress, 1)


class CallbackAttemptOut(BaseModel):
    """One delivery attempt: what the receiver answered, or a short reason (never a host or an address)."""

    attempt: int
    at: datetime
    status_code: int | None = Field(None, description="the receiver's HTTP status, when it answered")
    error: str | None = Field(None, description="e.g. HTTP 500, timeout, connection failed, redirect not followed "
                              "(HTTP 302); null when delivered")
    seconds: float
    next_attempt_at: datetime | None = Field(None, description="when the next attempt was scheduled (backoff)")


class CallbackOut(BaseModel):
    """The webhook of a job or group (its ``callback_url``) and how delivering it went."""

    url: str
    status: Literal["waiting", "pending", "delivered", "failed"] = Field(
        description="waiting (not finished yet), pending (attempts due), delivered, or failed (attempts spent or "
        "the target refused by the server's settings)")
    attempts: int
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    attempt_log: list[CallbackAttemptOut] = Field(description="every attempt, oldest first")

    @classmethod
    def from_row(cls, row: WebhookDelivery | None) -> CallbackOut | None:
        if row is None:
            return None
        return cls(
            url=row.url, status=row.status, attempts=row.attempts or 0,  # type: ignore[arg-type]
            next_attempt_at=as_utc(row.next_attempt_at) if row.status == "pending" else None,
            delivered_at=as_utc(row.delivered_at),
            attempt_log=[CallbackAttemptOut.model_validate(entry) for entry in row.attempt_log or []],
        )


class JobOut(BaseModel):
    id: str
    kind: str
    status: JobStatus
    params: dict[str, Any]
    priority: JobPriority = Field(description=PRIORITY_DESCRIPTION)
    group_id: str | None = Field(None, description="the job group (sweep) this job is a member of")
    progress: float = Field(ge=0, le=1)
    eta_seconds: float | None = Field(
        None, description="running jobs: seconds left at the average rate so far, elapsed (1 - progress) / "
        "progress, once progress reaches 2 %; null otherwise (an estimate: stages differ in speed)",
    )
    stage: str | None
    device: str | None
    attempts: int
    error: JobErrorOut | None
    timings: dict[str, Any]
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    artifacts: list[str] = Field(description="names accepted by /v1/jobs/{id}/artifacts/{name}")
    callback: CallbackOut | None = Field(None, description="the job's webhook (callback_url) and its delivery log; "
                                         "null without one")
    links: JobLinks

    @classmethod
    def from_row(cls, job: Job, delivery: WebhookDelivery | None = None) -> JobOut:
        base = f"/v1/jobs/{job.id}"
        error = job.error if isinstance(job.error, dict) else None
        return cls(
            id=job.id,
            kind=job.kind,
            status=JobStatus(job.status),
            params=dict(job.params or {}),
            priority=_priority(job.priority),
            group_id=job.group_id,
            progress=float(job.progress or 0.0),
            eta_seconds=eta_seconds(job),
            stage=job.stage,
            device=job.device,
            attempts=job.attempts or 0,
            error=JobErrorOut(
                type=str(error.get("type", "Error")), message=str(error.get("message", "")),
                code=_optional_text(error.get("code")), correlation_id=_optional_text(error.get("correlation_id")),
            ) if error else None,
            timings=dict(job.timings or {}),
            cancel_requested=bool(job.cancel_requested),
            created_at=as_utc(job.created_at),  # type: ignore[arg-type]
            started_at=as_utc(job.started_at),
            finished_at=as_utc(job.finished_at),
            artifacts=sorted((job.artifacts or {}).keys()),
            callback=CallbackOut.from_row(delivery),
            links=JobLinks(self=base, cancel=f"{base}/cancel", result=f"{base}/result", artifacts=f"{base}/artifacts"),
        )


def _priority(value: str | None) -> JobPriority:
    try:
        return JobPriority(value or JobPriority.NORMAL)
    except ValueError:
        return JobPriority.NORMAL


def _optional_text(value: Any) -> str | None:
    return None if value is None else str(value)


class Page(BaseModel):
    total: int = Field(description="rows matching the filters")
    limit: int
    offset: int
    next: str | None = Field(description="URL of the next page, or null on the last one")


class JobPage(Page):
    items: list[JobOut]


class JobEventOut(BaseModel):
    """One line of a job's log."""

    id: int = Field(description="increasing in the order the events happened")
    at: datetime
    level: Literal["info", "warning", "error"]
    type: EventType = Field(description="submitted, started, stage, succeeded, failed, cancelled, cancel_requested, "
                            "requeued, resent, retry, warning or webhook")
    message: str
    data: dict[str, Any] | None = None

    @classmethod
    def from_row(cls, event: JobEvent) -> JobEventOut:
        return cls(id=event.id, at=as_utc(event.at), level=event.level, type=EventType(event.type),  # type: ignore[arg-type]
                   message=event.message, data=event.data)


class JobEventPage(Page):
    items: list[JobEventOut]


class ArtifactOut(BaseModel):
    name: str
    file: str
    media_type: str
    bytes: int
    href: str


# -- datasets ----------------------------------------------------------------------------------------------

class ColumnOut(BaseModel):
    name: str
    dtype: str


class DatasetOut(BaseModel):
    id: str
    name: str
    source_format: str
    columns: list[ColumnOut]
    n_rows: int
    size_bytes: int = Field(description="bytes of the stored Parquet file")
    created_at: datetime
    links: dict[str, str]

    @classmethod
    def from_row(cls, dataset: Dataset) -> DatasetOut:
        return cls(
            id=dataset.id,
            name=dataset.name,
            source_format=dataset.source_format,
            columns=[ColumnOut(name=str(column["name"]), dtype=str(column["dtype"])) for column in dataset.columns],
            n_rows=dataset.n_rows,
            size_bytes=dataset.size_bytes,
            created_at=as_utc(dataset.created_at),  # type: ignore[arg-type]
            links={"self": f"/v1/datasets/{dataset.id}"},
        )


class DatasetPage(Page):
    items: list[DatasetOut]


class DatasetFromArtifact(BaseModel):
    """``POST /v1/datasets/from-artifact``: one of your succeeded jobs' table artifacts as a new dataset."""

    model_config = ConfigDict(extra="forbid", strict=True)

    job: str = Field(min_length=1, max_length=64, description="id of one of your jobs that has succeeded")
    artifact: str = Field(min_length=1, max_length=200,
                          description="name of one of its table artifacts, e.g. outcomes or covariates of sccs_eras")
    name: str | None = Field(default=None, min_length=1, max_length=500,
                             description="the dataset's name (default: the artifact, the kind and the job id)")


# -- service ---------------------------------------------------------------------------------------------

class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ready"] = "ready"
    checks: dict[str, str]


class FieldErrorOut(BaseModel):
    field: str = Field(description="dotted path of the offending field, e.g. params.replications")
    location: str = Field(description="body, query, path or header")
    message: str
    type: str = Field(description="machine-readable error type, e.g. greater_than_equal, missing, extra_forbidden")
    constraint: dict[str, Any] | None = Field(default=None, description="the bound broken, e.g. {'ge': 1}")
    input: Any = None


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``)."""

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[FieldErrorOut] | None = Field(default=None, description="validation errors, one per field")


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": Problem, "description": "Problem details (RFC 9457)"},
    "5XX": {"model": Problem, "description": "Problem details (RFC 9457)"},
}


# -- job groups (sweeps) -------------------------------------------------------------------------------------

class BaseSpec(BaseModel):
    """The spec every member starts from: a job kind and (some of) its params."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1, max_length=64)
    params: dict[str, Any] = Field(default_factory=dict)


class JobGroupRequest(BaseModel):
    """A sweep: ``base`` plus a ``grid`` (every combination of the listed values) or a list of ``specs``
    (each merged over ``base``, params key by key). Each member is checked like a single job."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{
            "name": "CGM size sweep",
            "base": {"kind": "crve_montecarlo",
                     "params": {"cluster_size": 10, "n_regressors": 2, "replications": 200, "seed": 1}},
            "grid": {"params.n_clusters": [10, 20, 40], "params.seed": [1, 2]},
        }]},
    )

    name: str | None = Field(None, max_length=200, description="a label of your choosing")
    base: BaseSpec | None = Field(None, description="required with grid; with specs, optional defaults")
    grid: dict[str, list[Any]] | None = Field(
        None, description='dotted params paths to the values each takes, e.g. {"params.n_clusters": [10, 20]}: one '
        "member per combination (cartesian product, the first path varying slowest)"
    )
    specs: list[dict[str, Any]] | None = Field(
        None, description="one member per item: {kind?, params?} merged over base (a full spec without base)"
    )
    priority: JobPriority = Field(JobPriority.LOW, description="the members' priority (default low: a single job "
                                  "submitted meanwhile runs before them)")
    callback_url: str | None = Field(None, min_length=1, max_length=2000, description=CALLBACK_URL_DESCRIPTION
                                     + "; for a group: called once, when every member has finished")


class JobGroupLinks(BaseModel):
    self: str
    cancel: str
    results: str
    jobs: str


class JobGroupOut(BaseModel):
    id: str
    name: str | None
    status: JobStatus = Field(description="queued while every member is; running while any is queued or running "
                              "and some started; then succeeded (all did), failed (any failed) or cancelled")
    progress: float = Field(ge=0, le=1, description="mean of the members' progress (finished members count 1)")
    member_count: int
    counts: dict[str, int] = Field(description="members per status (deleted members are not counted)")
    priority: JobPriority
    varying: list[str] = Field(description="the dotted params paths that differ between members")
    spec: dict[str, Any] = Field(description="the request's base and grid or specs")
    cancel_requested: bool
    created_at: datetime
    callback: CallbackOut | None = Field(None, description="the group's webhook and its delivery log; null without one")
    links: JobGroupLinks


class JobGroupPage(Page):
    items: list[JobGroupOut]


class WebhookSecretOut(BaseModel):
    """The caller's webhook signing secret: verify X-Gpuest-Signature with it."""

    secret: str = Field(description="whsec_...: the HMAC-SHA256 key of your deliveries' signatures")
    signature_header: str = "X-Gpuest-Signature"
    timestamp_header: str = "X-Gpuest-Timestamp"
    scheme: str = Field("sha256=<hex of HMAC-SHA256(secret, timestamp + '.' + raw body)>",
                        description="how the signature is computed")
