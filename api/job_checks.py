"""Checks a job spec passes before it is stored, beyond its params model (validated once, with the request
body), shared by ``POST /v1/jobs`` and ``POST /v1/job-groups`` (a sweep's every member is checked like a single
job): datasets that exist and belong to the caller, the columns the spec names, and the owner's quota of active
jobs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from api.problems import ProblemError, field_error
from kernels.spec import JobParams
from store import jobs as job_store
from store.datasets import get_dataset
from store.db import storable_text


def dataset_errors(session: Session, owner: str, dataset_ids: Mapping[str, str]) -> list[dict[str, Any]]:
    """An error for each dataset a spec names that does not exist or is another owner's (reads as missing)."""
    return [
        field_error(f"params.{field}", f"no dataset with id {dataset_id!r}", type_="dataset_not_found")
        for field, dataset_id in dataset_ids.items()
        # An id PostgreSQL cannot even compare (a NUL character) names no dataset either.
        if not storable_text(dataset_id) or get_dataset(session, dataset_id, owner) is None
    ]


def check_datasets(session: Session, owner: str, dataset_ids: Mapping[str, str]) -> None:
    """Every dataset a job names must exist and belong to the caller (another owner's id reads as missing)."""
    errors = dataset_errors(session, owner, dataset_ids)
    if errors:
        raise invalid(errors)


def dataset_columns(session: Session, owner: str, dataset_ids: Mapping[str, str]) -> dict[str, list[str]]:
    """The stored column names of each (already verified) dataset a spec names, by params field."""
    columns = {}
    for field, dataset_id in dataset_ids.items():
        dataset = get_dataset(session, dataset_id, owner)
        if dataset is not None:
            columns[field] = [str(column.get("name")) for column in dataset.columns or [] if isinstance(column, dict)]
    return columns


def dataset_column_errors(params: JobParams, columns: Mapping[str, list[str]]) -> list[dict[str, Any]]:
    return [
        field_error(f"params.{field}", message, type_="dataset_column")
        for field, message in params.dataset_column_problems(dict(columns))
    ]


def check_dataset_columns(session: Session, owner: str, params: JobParams, dataset_ids: Mapping[str, str]) -> None:
    """The columns the params name (``JobParams.dataset_column_problems``, e.g. crve_bootstrap's formula and
    cluster columns) are checked against the stored schema of the (already verified) datasets."""
    if not dataset_ids:
        return
    errors = dataset_column_errors(params, dataset_columns(session, owner, dataset_ids))
    if errors:
        raise invalid(errors)


def invalid(errors: list[dict[str, Any]]) -> ProblemError:
    """The 422 validation problem listing ``errors``."""
    return ProblemError(
        422,
        "; ".join(f"{error['field']}: {error['message']}" for error in errors),
        slug="validation-error",
        title="Invalid request",
        errors=errors,
    )


def check_active_jobs_quota(
    session: Session, owner: str, settings: Any, idempotency_key: str | None, new_jobs: int = 1
) -> None:
    """429 with Retry-After when ``new_jobs`` more would take the owner past max_active_jobs_per_owner queued
    or running jobs (a retried POST of a job that exists is a replay, not a new job: never refused)."""
    limit = settings.max_active_jobs_per_owner
    if not limit or (idempotency_key and job_store.find_by_idempotency_key(session, owner, idempotency_key)):
        return
    active = job_store.count_active(session, owner)
    if active + new_jobs > limit:
        detail = (
            (
                f"{active} of your jobs are queued or running, the most this service allows at once ({limit}); "
                "submit again when one has finished, or cancel one"
            )
            if new_jobs == 1
            else (
                f"these {new_jobs} jobs and the {active} of yours already queued or running exceed the most this "
                f"service allows at once ({limit}); submit a smaller sweep, or again when jobs have finished"
            )
        )
        raise ProblemError(
            429,
            detail,
            slug="too-many-active-jobs",
            headers={"Retry-After": str(settings.quota_retry_after_seconds)},
            extensions={"limit": limit, "active": active},
        )
