"""/v1/datasets: upload (CSV or Parquet, streamed to disk, stored as Parquet), register a job's table artifact,
read, list, delete."""

from pathlib import Path
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Request, Response
from fastapi import Path as PathParam
from starlette.concurrency import run_in_threadpool

from api.deps import OwnerDep, SessionDep, SettingsDep
from api.pagination import LimitQuery, OffsetQuery, next_page
from api.problems import ProblemError, field_error
from api.schemas import DatasetFromArtifact, DatasetOut, DatasetPage
from api.uploads import ReceivedFile, receive_file
from core.settings import Settings
from core.status import JobStatus
from store import jobs as job_store
from store.artifact_datasets import ArtifactNotUsableError, register_artifact, table_artifacts
from store.dataset_ingest import (
    ColumnTypeError,
    DatasetError,
    UploadLimitError,
    UploadLimits,
    detect_format,
    ingest,
    upload_limits,
)
from store.datasets import delete_dataset, get_dataset, list_datasets, remove_dataset_files, stored_bytes
from store.db import session_scope, storable_text
from store.jobs import jobs_using_dataset

log = structlog.get_logger("gpuest.api")

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])

DatasetIdPath = Annotated[str, PathParam(min_length=1, max_length=64, description="dataset id")]
UPLOAD_FIELD = "file"

UPLOAD_BODY_SCHEMA: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": [UPLOAD_FIELD],
                    "properties": {
                        UPLOAD_FIELD: {"type": "string", "format": "binary", "description": "a .csv or .parquet file"}
                    },
                }
            }
        },
    }
}


def dataset_not_found(dataset_id: str) -> ProblemError:
    return ProblemError(404, f"no dataset with id {dataset_id!r}", slug="dataset-not-found")


def _invalid_upload(error: DatasetError) -> ProblemError:
    message = str(error)
    if isinstance(error, UploadLimitError):
        # The same problem as an upload too large as sent: 413, naming the setting and its value.
        return ProblemError(413, message, slug="upload-too-large", title="Upload too large",
                            extensions={"limit": error.setting, error.setting: error.limit})
    if isinstance(error, ColumnTypeError):
        # Machine-readable too: a client can point at the cell.
        return ProblemError(
            422, f"{UPLOAD_FIELD}: {message}", slug="invalid-dataset", title="Invalid dataset",
            errors=[field_error(UPLOAD_FIELD, message, type_="column_type")],
            extensions={"column": error.column, "row": error.row, "value": error.value},
        )
    return ProblemError(
        422, f"{UPLOAD_FIELD}: {message}", slug="invalid-dataset", title="Invalid dataset",
        errors=[field_error(UPLOAD_FIELD, message, type_="invalid_dataset")],
    )


def _check_storage_quota(owner: str, quota: int, adding: int) -> None:
    with session_scope() as session:
        used = stored_bytes(session, owner)
    if used + adding > quota or used >= quota:
        raise ProblemError(
            429, f"your datasets take {used:,} bytes" + (f" and this one {adding:,} more" if adding else "")
            + f", beyond the {quota:,} bytes this service keeps per owner; delete datasets you no longer need "
            "(DELETE /v1/datasets/{id})", slug="storage-quota", headers={"Retry-After": "3600"},
            extensions={"limit": quota, "used": used},
        )


def _store(received: ReceivedFile, owner: str, limits: UploadLimits, quota: int = 0) -> DatasetOut:
    """Parse, convert and record the upload; a failure at any step leaves neither a file nor a row."""
    source_format = detect_format(received.filename, received.content_type)
    with session_scope() as session:
        dataset = ingest(session, owner=owner, name=received.filename, upload=received.path,
                         source_format=source_format, limits=limits)
        try:
            if quota:  # the stored (Parquet) size counts: known only now
                _check_storage_quota(owner, quota, int(dataset.size_bytes))
            session.commit()
        except BaseException:
            remove_dataset_files(dataset.path)
            raise
        return DatasetOut.from_row(dataset)


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    openapi_extra=UPLOAD_BODY_SCHEMA,
    responses={
        413: {"description": "Larger than max_upload_bytes (as sent or decompressed), or more rows or columns "
                            "than max_upload_rows or max_upload_columns; the problem's `limit` names the setting"},
        415: {"description": "Not a multipart/form-data body"},
        400: {"description": "A malformed multipart body, or one cut off before its closing boundary"},
        422: {"description": "Not a readable CSV or Parquet file (malformed, empty, no rows), a CSV column of "
                            "numbers with a stray non-numeric value (the problem names column, row and value), "
                            "or a file name with control characters"},
    },
    summary="Upload a dataset",
)
async def upload_dataset(request: Request, response: Response, owner: OwnerDep, settings: SettingsDep) -> DatasetOut:
    """Multipart field `file`: a CSV or Parquet file (a CSV may be gzipped), stored as Parquet; answers with
    its schema. The file is streamed to disk and then converted a block at a time, within the upload limits
    (bytes as sent and decompressed, rows, columns), so memory stays flat whatever the file."""
    quota = settings.max_stored_bytes_per_owner
    if quota:  # full already: refuse before reading the body
        await run_in_threadpool(_check_storage_quota, owner, quota, 0)
    received = await receive_file(
        request, field_name=UPLOAD_FIELD, directory=upload_dir(settings), max_bytes=settings.max_upload_bytes
    )
    limits = upload_limits(settings)
    try:
        dataset = await run_in_threadpool(_store, received, owner, limits, quota)
    except DatasetError as exc:
        raise _invalid_upload(exc) from exc
    finally:
        received.path.unlink(missing_ok=True)
    log.info("dataset stored", dataset_id=dataset.id, owner=owner, rows=dataset.n_rows, upload_bytes=received.size)
    response.headers["Location"] = f"/v1/datasets/{dataset.id}"
    return dataset


def upload_dir(settings: Settings) -> Path:
    # Under the data directory, so the final rename into datasets/ stays on one filesystem.
    return settings.data_dir / "uploads"


@router.post(
    "/from-artifact",
    status_code=201,
    response_model=DatasetOut,
    responses={
        409: {"description": "The job has not succeeded (yet): the problem's `errors` name the field `job`"},
        422: {"description": "No such job for this API key (`job`), or no table artifact of that name "
                            "(`artifact`): the problem's `errors` name the field"},
        429: {"description": "The owner's datasets would pass max_stored_bytes_per_owner"},
    },
    summary="Register a job's table artifact as a dataset",
)
def dataset_from_artifact(
    body: DatasetFromArtifact, response: Response, owner: OwnerDep, session: SessionDep, settings: SettingsDep
) -> DatasetOut:
    """One of your succeeded jobs' table artifacts (e.g. `outcomes` and `covariates` of `sccs_eras`) as a new
    dataset, usable wherever a dataset id is: nothing to download and upload again. Its schema is stored like
    an upload's, so a job naming it has its columns checked at submission. The dataset keeps its own file:
    deleting the job later does not remove it."""
    job = job_store.get_job(session, body.job, owner) if storable_text(body.job) else None
    if job is None:  # another owner's job reads as missing, as everywhere
        raise _invalid_field("job", f"no job with id {body.job!r}", "job_not_found")
    if job.status != JobStatus.SUCCEEDED:
        message = f"job {job.id} is {job.status}: its artifacts can be registered once it has succeeded"
        raise ProblemError(409, f"job: {message}", slug="job-not-succeeded",
                           errors=[field_error("job", message, type_="job_not_succeeded")],
                           extensions={"job_status": job.status, "tables": table_artifacts(job)})
    try:
        dataset = register_artifact(session, owner=owner, job=job, artifact=body.artifact, name=body.name)
    except ArtifactNotUsableError as error:
        raise _invalid_field("artifact", str(error), "artifact_not_table") from error
    try:
        if settings.max_stored_bytes_per_owner:
            _check_storage_quota(owner, settings.max_stored_bytes_per_owner, int(dataset.size_bytes))
        session.commit()
    except BaseException:
        session.rollback()
        remove_dataset_files(dataset.path)
        raise
    log.info("dataset registered from an artifact", dataset_id=dataset.id, owner=owner, job_id=job.id,
             artifact=body.artifact)
    response.headers["Location"] = f"/v1/datasets/{dataset.id}"
    return DatasetOut.from_row(dataset)


def _invalid_field(field: str, message: str, type_: str) -> ProblemError:
    return ProblemError(422, f"{field}: {message}", slug="validation-error", title="Invalid request",
                        errors=[field_error(field, message, type_=type_)])


@router.get("", response_model=DatasetPage, summary="List datasets")
def list_owner_datasets(
    request: Request, owner: OwnerDep, session: SessionDep, limit: LimitQuery = 50, offset: OffsetQuery = 0
) -> DatasetPage:
    rows, total = list_datasets(session, owner=owner, limit=limit, offset=offset)
    return DatasetPage(
        items=[DatasetOut.from_row(row) for row in rows], total=total, limit=limit, offset=offset,
        next=next_page(request, limit=limit, offset=offset, returned=len(rows), total=total),
    )


@router.get("/{dataset_id}", response_model=DatasetOut, responses={404: {"description": "No such dataset"}},
            summary="Get a dataset")
def get_owner_dataset(dataset_id: DatasetIdPath, owner: OwnerDep, session: SessionDep) -> DatasetOut:
    dataset = get_dataset(session, dataset_id, owner)
    if dataset is None:
        raise dataset_not_found(dataset_id)
    return DatasetOut.from_row(dataset)


@router.delete(
    "/{dataset_id}",
    status_code=204,
    responses={404: {"description": "No such dataset"}, 409: {"description": "A queued or running job uses it"}},
    summary="Delete a dataset",
)
def delete_owner_dataset(dataset_id: DatasetIdPath, owner: OwnerDep, session: SessionDep) -> Response:
    dataset = get_dataset(session, dataset_id, owner)
    if dataset is None:
        raise dataset_not_found(dataset_id)
    users = jobs_using_dataset(session, owner, dataset_id)
    if users:
        raise ProblemError(409, f"dataset {dataset_id} is used by {len(users)} queued or running job(s)",
                           slug="dataset-in-use", extensions={"jobs": users})
    delete_dataset(session, dataset)
    session.commit()
    log.info("dataset deleted", dataset_id=dataset_id, owner=owner)
    return Response(status_code=204)
