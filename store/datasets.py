"""Datasets: an uploaded CSV or Parquet file, validated and stored as Parquet, with its schema in the DB."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from store.artifacts import _atomic_target, dataset_path
from store.models import Dataset, new_id

SOURCE_FORMATS = ("csv", "parquet")


class DatasetError(ValueError):
    """The uploaded file cannot become a dataset; the message says why."""


def detect_format(filename: str, content_type: str | None) -> str:
    lowered = filename.lower()
    if lowered.endswith((".parquet", ".pq")) or (content_type or "").endswith("parquet"):
        return "parquet"
    if lowered.endswith((".csv", ".csv.gz", ".txt")) or (content_type or "").startswith("text/"):
        return "csv"
    raise DatasetError(f"cannot tell the format of {filename!r}: upload a .csv or .parquet file")


def read_table(path: Path, source_format: str) -> pa.Table:
    """Parse the upload, refusing empty files and files without columns."""
    if path.stat().st_size == 0:
        raise DatasetError("the uploaded file is empty")
    try:
        if source_format == "csv":
            table = pa_csv.read_csv(path)
        elif source_format == "parquet":
            table = pq.read_table(path)
        else:
            raise DatasetError(f"unsupported format {source_format!r}; use one of {SOURCE_FORMATS}")
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise DatasetError(f"could not parse the {source_format} file: {exc}") from exc
    if table.num_columns == 0:
        raise DatasetError("the file has no columns")
    if table.num_rows == 0:
        raise DatasetError("the file has a header but no rows")
    names = table.column_names
    if len(set(names)) != len(names):
        raise DatasetError("column names must be unique")
    return table


def column_schema(table: pa.Table) -> list[dict[str, Any]]:
    return [{"name": field.name, "dtype": str(field.type)} for field in table.schema]


def ingest(session: Session, *, owner: str, name: str, upload: Path, source_format: str) -> Dataset:
    """Store ``upload`` as this owner's Parquet dataset; nothing is left behind if any step fails."""
    table = read_table(upload, source_format)
    dataset_id = new_id()
    final = dataset_path(dataset_id)
    temporary = _atomic_target(final)
    try:
        pq.write_table(table, temporary)
        os.replace(temporary, final)
        dataset = Dataset(
            id=dataset_id,
            owner=owner,
            name=name[:500],
            source_format=source_format,
            path=str(final),
            n_rows=table.num_rows,
            size_bytes=final.stat().st_size,
            columns=column_schema(table),
        )
        session.add(dataset)
        session.flush()
    except BaseException:
        temporary.unlink(missing_ok=True)
        final.unlink(missing_ok=True)
        raise
    return dataset


def get_dataset(session: Session, dataset_id: str, owner: str | None = None) -> Dataset | None:
    dataset = session.get(Dataset, dataset_id)
    if dataset is None or (owner is not None and dataset.owner != owner):
        return None
    return dataset


def list_datasets(session: Session, *, owner: str, limit: int = 50, offset: int = 0) -> tuple[Sequence[Dataset], int]:
    total = session.scalar(select(func.count()).select_from(Dataset).where(Dataset.owner == owner)) or 0
    rows = session.scalars(
        select(Dataset)
        .where(Dataset.owner == owner)
        .order_by(Dataset.created_at.desc(), Dataset.id)
        .limit(limit)
        .offset(offset)
    ).all()
    return rows, total


def delete_dataset(session: Session, dataset: Dataset) -> None:
    """Delete the row, then the file once the deletion is committed (a failed commit keeps both)."""
    path = Path(dataset.path)
    session.delete(dataset)
    session.flush()
    event.listen(session, "after_commit", lambda _session: path.unlink(missing_ok=True), once=True)


def load_frame(dataset: Dataset) -> Any:
    """The dataset as a pandas DataFrame (what runners receive)."""
    return pq.read_table(dataset.path).to_pandas()
