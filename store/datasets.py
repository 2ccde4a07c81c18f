"""Datasets: an uploaded CSV or Parquet file, validated and stored as Parquet, with its schema in the DB."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from store.artifacts import atomic_target, dataset_path
from store.models import Dataset, new_id

SOURCE_FORMATS = ("csv", "parquet")


# A CSV column counts as "mostly numeric" when its numbers outnumber its other values and those are either
# a few (a typo or a stray marker in a numeric column) or under a tenth of the column.
STRAY_VALUES_LIMIT = 3
MOSTLY_NUMERIC_SHARE = 0.9
# What pyarrow's CSV reader would have read as a number (sign, decimals, exponent, inf, nan), matched
# case-insensitively; surrounding blanks tolerated.
NUMBER_PATTERN = r"^\s*[+-]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?|inf|infinity|nan)\s*$"


class DatasetError(ValueError):
    """The uploaded file cannot become a dataset; the message says why."""


class ColumnTypeError(DatasetError):
    """A CSV column of numbers with a few values that are not numbers (read as text, it would break jobs)."""

    def __init__(self, column: str, row: int, value: str, numeric: int, values: int) -> None:
        self.column, self.row, self.value = column, row, value
        shown = value if len(value) <= 40 else value[:40] + "..."
        super().__init__(
            f"column {column}: value {shown!r} in row {row} is not a number, but the column's other values are "
            f"numeric ({numeric} of its {values} values are numbers); correct it, leave the cell empty for a "
            "missing value, or upload Parquet to keep the column as text"
        )


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
    if source_format == "csv":
        # Only CSV: its types are guessed from the text, so one stray value silently turns a numeric
        # column into text; Parquet columns carry the type their writer chose.
        refuse_mostly_numeric_text(table)
    return table


def refuse_mostly_numeric_text(table: pa.Table) -> None:
    """Raise :class:`ColumnTypeError` for the first text column whose values are mostly, not all, numbers."""
    for field in table.schema:
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            _check_text_column(field.name, table.column(field.name))


def _check_text_column(name: str, column: pa.ChunkedArray) -> None:
    is_number = pc.match_substring_regex(column, NUMBER_PATTERN, ignore_case=True)  # null where the cell is
    numeric = int(pc.sum(is_number).as_py() or 0)
    values = len(column) - column.null_count
    other = values - numeric
    if other == 0 or numeric <= other:
        return  # all numbers (kept as pyarrow read them), or a genuine text column
    if other > STRAY_VALUES_LIMIT and numeric < MOSTLY_NUMERIC_SHARE * values:
        return
    first = int(pc.index(is_number, False).as_py())
    raise ColumnTypeError(name, row=first + 1, value=str(column[first].as_py()), numeric=numeric, values=values)


def column_schema(table: pa.Table) -> list[dict[str, Any]]:
    return [{"name": field.name, "dtype": str(field.type)} for field in table.schema]


def ingest(session: Session, *, owner: str, name: str, upload: Path, source_format: str) -> Dataset:
    """Store ``upload`` as this owner's Parquet dataset; nothing is left behind if any step fails."""
    table = read_table(upload, source_format)
    dataset_id = new_id()
    final = dataset_path(dataset_id)
    temporary = atomic_target(final)
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


def load_frame(dataset: Dataset | str | os.PathLike[str]) -> Any:
    """The dataset (its row, or the path of its file) as a pandas DataFrame (what runners receive)."""
    path = dataset.path if isinstance(dataset, Dataset) else dataset
    return pq.read_table(path).to_pandas()
