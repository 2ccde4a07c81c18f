"""A finished job's table artifact registered as a dataset: a pipeline of jobs without round trips.

``sccs_eras`` writes the ``outcomes`` and ``covariates`` tables that ``sccs_fit`` reads; registering them
makes datasets any job can name, with their schema in the database like an upload's, so the columns a spec
names are checked at submission exactly as for uploaded data. Nothing is downloaded or parsed again: the
dataset's file is a hard link to the artifact's Parquet file (a copy where the filesystem cannot link), so
deleting the job later leaves the dataset whole, and deleting the dataset leaves the job's artifact.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from sqlalchemy.orm import Session

from store.artifacts import atomic_target, dataset_path, job_artifact_dir
from store.datasets import column_schema
from store.models import Dataset, Job, new_id

TABLE_SUFFIX = ".parquet"
SOURCE_FORMAT = "artifact"


class ArtifactNotUsableError(ValueError):
    """The named artifact does not exist or is not a table; the message says which tables the job has."""


def table_artifacts(job: Job) -> list[str]:
    """Names of the job's artifacts that are tables (Parquet files), sorted."""
    return sorted(name for name, reference in (job.artifacts or {}).items()
                  if isinstance(reference, dict) and str(reference.get("file", "")).endswith(TABLE_SUFFIX))


def artifact_table_path(job: Job, artifact: str) -> Path:
    """The Parquet file of the job's table artifact ``artifact`` (proven to lie in the job's folder)."""
    tables = table_artifacts(job)
    listed = ", ".join(tables) if tables else "none"
    reference = (job.artifacts or {}).get(artifact)
    if not isinstance(reference, dict):
        raise ArtifactNotUsableError(f"job {job.id} has no artifact named {artifact!r} (its tables: {listed})")
    if artifact not in tables:
        raise ArtifactNotUsableError(f"artifact {artifact!r} of job {job.id} is an array, not a table "
                                     f"(its tables: {listed})")
    directory = job_artifact_dir(job.id).resolve()
    path = (directory / str(reference["file"])).resolve()
    if not path.is_relative_to(directory) or not path.is_file():
        raise ArtifactNotUsableError(f"the file of artifact {artifact!r} of job {job.id} is gone")
    return path


def _place(source: Path, final: Path) -> None:
    """``final`` becomes the same file as ``source``: a hard link, else an atomic copy."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, final)
    except OSError:  # another filesystem, or one without hard links
        temporary = atomic_target(final)
        try:
            shutil.copyfile(source, temporary)
            os.replace(temporary, final)
        finally:
            temporary.unlink(missing_ok=True)


def register_artifact(session: Session, *, owner: str, job: Job, artifact: str, name: str | None = None) -> Dataset:
    """Record the (already owner-checked, succeeded) job's table artifact as a new dataset of ``owner``;
    nothing is left behind if a step fails. Raises :class:`ArtifactNotUsableError`."""
    source = artifact_table_path(job, artifact)
    metadata: Any = pq.read_metadata(source)
    if metadata.num_rows == 0:
        raise ArtifactNotUsableError(f"artifact {artifact!r} of job {job.id} has no rows")
    dataset_id = new_id()
    final = dataset_path(dataset_id)
    _place(source, final)
    try:
        dataset = Dataset(
            id=dataset_id,
            owner=owner,
            name=(name or f"{artifact} of {job.kind} job {job.id}")[:500],
            source_format=SOURCE_FORMAT,
            path=str(final),
            n_rows=int(metadata.num_rows),
            size_bytes=final.stat().st_size,
            columns=column_schema(pq.read_schema(final)),
        )
        session.add(dataset)
        session.flush()
    except BaseException:
        final.unlink(missing_ok=True)
        raise
    return dataset
