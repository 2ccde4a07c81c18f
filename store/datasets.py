"""The datasets' repository: a dataset's row (an upload's or a registered artifact's, with its schema) found,
listed, counted against the storage quota and deleted with its files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from store.decoded import remove_decoded_copy
from store.models import Dataset


def column_schema(schema: pa.Schema) -> list[dict[str, Any]]:
    """A table's columns as a dataset's row records them: each one's name and Arrow type."""
    return [{"name": field.name, "dtype": str(field.type)} for field in schema]


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


def stored_bytes(session: Session, owner: str) -> int:
    """Bytes of the owner's stored datasets (what the storage quota counts)."""
    return int(session.scalar(select(func.coalesce(func.sum(Dataset.size_bytes), 0)).where(Dataset.owner == owner))
               or 0)


def delete_dataset(session: Session, dataset: Dataset) -> None:
    """Delete the row, then the files once the deletion is committed (a failed commit keeps them)."""
    path = Path(dataset.path)
    session.delete(dataset)
    session.flush()
    event.listen(session, "after_commit", lambda _session: remove_dataset_files(path), once=True)


def remove_dataset_files(path: str | os.PathLike[str]) -> None:
    """The stored file and this host's decoded copy of it."""
    Path(path).unlink(missing_ok=True)
    remove_decoded_copy(path)
