"""Datasets: an uploaded CSV or Parquet file, validated and stored as Parquet, with its schema in the DB.

A run reads a dataset through :func:`load_frame`: from a decoded copy (Arrow IPC, one record batch, beside the
other copies in ``Settings.resolved_decoded_dir``) memory-mapped, so a table of gigabytes is read without
decoding or copying it (at the SCCS paper's largest size 2.8 s of Parquet decoding becomes milliseconds,
bench/RESULTS.md); the first run to read a dataset on a host decodes the Parquet file and writes the copy in a
thread while it runs on."""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import structlog
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from core.settings import get_settings
from store.artifacts import atomic_target, dataset_path
from store.models import Dataset, new_id

SOURCE_FORMATS = ("csv", "parquet")
DECODED_SUFFIX = ".arrow"
# A decoded copy's temporary file older than this was left by a writer that died: eviction removes it.
ABANDONED_WRITE_SECONDS = 3600.0

log = structlog.get_logger(__name__)


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


class UploadLimitError(DatasetError):
    """The upload passes one of the limits of :class:`UploadLimits`; ``setting`` names it."""

    def __init__(self, setting: str, limit: int, what: str) -> None:
        self.setting, self.limit = setting, limit
        super().__init__(f"the upload holds more than {limit} {what} (the {setting} limit)")


@dataclass(frozen=True)
class UploadLimits:
    """Bounds on one upload, checked while it is read, so a small compressed file cannot expand into a
    table that fills the memory: its decompressed bytes, its data rows and its columns."""

    max_bytes: int
    max_rows: int
    max_columns: int

    def check_columns(self, count: int) -> None:
        if count > self.max_columns:
            raise UploadLimitError("max_upload_columns", self.max_columns, "columns")

    def check_rows(self, count: int) -> None:
        if count > self.max_rows:
            raise UploadLimitError("max_upload_rows", self.max_rows, "rows")

    def check_bytes(self, count: int) -> None:
        if count > self.max_bytes:
            raise UploadLimitError("max_upload_bytes", self.max_bytes, "bytes once decompressed")


@dataclass(frozen=True)
class StoredTable:
    """What ingesting an upload wrote: the Parquet file's schema and row count."""

    schema: pa.Schema
    n_rows: int


def detect_format(filename: str, content_type: str | None) -> str:
    lowered = filename.lower()
    if lowered.endswith((".parquet", ".pq")) or (content_type or "").endswith("parquet"):
        return "parquet"
    if lowered.endswith((".csv", ".csv.gz", ".txt")) or (content_type or "").startswith("text/"):
        return "csv"
    raise DatasetError(f"cannot tell the format of {filename!r}: upload a .csv or .parquet file")


# Decompressed bytes the CSV reader takes per block (each block becomes one record batch), and how much of
# the converted table is held before it is written out as one Parquet row group: what bounds the memory.
CSV_BLOCK_BYTES = 1 << 20
ROW_GROUP_BYTES = 32 << 20
PARQUET_BATCH_ROWS = 64 * 1024
GZIP_MAGIC = b"\x1f\x8b"


class _LateTypeChange(Exception):
    """A CSV column's values after the first block do not fit the type inferred from that block."""


class _CountingReader(io.RawIOBase):
    """The upload's bytes (decompressed when gzip), refusing to read past the byte limit."""

    def __init__(self, source: pa.NativeFile, limits: UploadLimits) -> None:
        super().__init__()
        self._source, self._limits, self.count = source, limits, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._source.read(len(buffer))
        self.count += len(data)
        self._limits.check_bytes(self.count)
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._source.close()
        super().close()


@contextmanager
def _decompressed(path: Path, limits: UploadLimits) -> Iterator[_CountingReader]:
    """The upload's content, gunzipped when it starts with the gzip magic (whatever its name says)."""
    with path.open("rb") as handle:
        compressed = handle.read(len(GZIP_MAGIC)) == GZIP_MAGIC
    raw = pa.OSFile(str(path))
    reader = _CountingReader(pa.CompressedInputStream(raw, "gzip") if compressed else raw, limits)
    try:
        yield reader
    finally:
        reader.close()


class _ParquetSink:
    """Writes record batches to a Parquet file, a row group per ``ROW_GROUP_BYTES`` of table."""

    def __init__(self, target: Path, schema: pa.Schema) -> None:
        self._writer = pq.ParquetWriter(target, schema)
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._writer.write_table(pa.Table.from_batches(self._pending))
        self._pending, self._pending_bytes = [], 0

    def close(self) -> None:
        self._flush()
        self._writer.close()


class _TextColumnCheck:
    """Counts, batch by batch, the values of a text column that are numbers, and keeps the first that is
    not: at the end, a column of numbers with a few stray values is refused (:class:`ColumnTypeError`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.numeric = self.values = self.rows = 0
        self.first_other: tuple[int, str] | None = None

    def add(self, column: pa.Array | pa.ChunkedArray) -> None:
        is_number = pc.match_substring_regex(column, NUMBER_PATTERN, ignore_case=True)  # null where the cell is
        self.numeric += int(pc.sum(is_number).as_py() or 0)
        self.values += len(column) - column.null_count
        if self.first_other is None:
            index = int(pc.index(is_number, False).as_py())
            if index >= 0:
                self.first_other = (self.rows + index + 1, str(column[index].as_py()))
        self.rows += len(column)

    def verify(self) -> None:
        other = self.values - self.numeric
        if other == 0 or self.numeric <= other or self.first_other is None:
            return  # all numbers (kept as pyarrow read them), or a genuine text column
        if other > STRAY_VALUES_LIMIT and self.numeric < MOSTLY_NUMERIC_SHARE * self.values:
            return
        row, value = self.first_other
        raise ColumnTypeError(self.name, row=row, value=value, numeric=self.numeric, values=self.values)


def _text_checks(schema: pa.Schema) -> list[_TextColumnCheck]:
    # Only CSV: its types are guessed from the text, so one stray value silently turns a numeric column
    # into text; Parquet columns carry the type their writer chose.
    return [_TextColumnCheck(field.name) for field in schema
            if pa.types.is_string(field.type) or pa.types.is_large_string(field.type)]


def _check_schema(schema: pa.Schema, limits: UploadLimits) -> None:
    if len(schema) == 0:
        raise DatasetError("the file has no columns")
    limits.check_columns(len(schema))
    if len(set(schema.names)) != len(schema.names):
        raise DatasetError("column names must be unique")


def _check_rows(n_rows: int) -> None:
    if n_rows == 0:
        raise DatasetError("the file has a header but no rows")


def _csv_streamed(path: Path, target: Path, limits: UploadLimits) -> StoredTable:
    """CSV -> Parquet a block at a time (memory flat whatever the size): types inferred from the first block.

    Raises :class:`_LateTypeChange` when a later block does not fit those types."""
    with _decompressed(path, limits) as source:
        reader = pa_csv.open_csv(source, read_options=pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES))
        schema = reader.schema
        _check_schema(schema, limits)
        checks = _text_checks(schema)
        sink = _ParquetSink(target, schema)
        n_rows = 0
        try:
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                except pa.ArrowInvalid as exc:
                    if n_rows > 0 and "conversion error" in str(exc):
                        raise _LateTypeChange(str(exc)) from exc
                    raise
                n_rows += batch.num_rows
                limits.check_rows(n_rows)
                for check in checks:
                    check.add(batch.column(check.name))
                sink.write(batch)
        finally:
            sink.close()
    _check_rows(n_rows)
    for check in checks:
        check.verify()
    return StoredTable(schema, n_rows)


def _csv_whole(path: Path, target: Path, limits: UploadLimits, names: Sequence[str]) -> StoredTable:
    """CSV -> Parquet for a file whose column types change after the first block: pyarrow's whole-file
    reader promotes such a column (integers, then a decimal -> double). A streamed pass reading every column
    as text checks the limits first, so the whole table held here is bounded by them."""
    as_text = pa_csv.ConvertOptions(column_types={name: pa.string() for name in names})
    n_rows = 0
    with _decompressed(path, limits) as source:
        for batch in pa_csv.open_csv(source, read_options=pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                                     convert_options=as_text):
            n_rows += batch.num_rows
            limits.check_rows(n_rows)
    with _decompressed(path, limits) as source:
        table = pa_csv.read_csv(source)
    _check_schema(table.schema, limits)
    _check_rows(table.num_rows)
    checks = _text_checks(table.schema)
    for check in checks:
        check.add(table.column(check.name))
        check.verify()
    sink = _ParquetSink(target, table.schema)
    try:
        for batch in table.to_batches(max_chunksize=PARQUET_BATCH_ROWS):
            sink.write(batch)
    finally:
        sink.close()
    return StoredTable(table.schema, table.num_rows)


def _csv_to_parquet(path: Path, target: Path, limits: UploadLimits) -> StoredTable:
    try:
        return _csv_streamed(path, target, limits)
    except _LateTypeChange:
        with _decompressed(path, limits) as source:
            names = pa_csv.open_csv(source, read_options=pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES)).schema.names
        return _csv_whole(path, target, limits, names)


def _parquet_to_parquet(path: Path, target: Path, limits: UploadLimits) -> StoredTable:
    """Parquet -> Parquet a batch at a time. The footer's row count and uncompressed size are checked
    before any data is read, and the batches are counted too (a footer can understate them)."""
    with pq.ParquetFile(pa.OSFile(str(path))) as parquet:
        schema = parquet.schema_arrow
        _check_schema(schema, limits)
        metadata = parquet.metadata
        limits.check_rows(metadata.num_rows)
        limits.check_bytes(sum(metadata.row_group(index).total_byte_size for index in range(metadata.num_row_groups)))
        sink = _ParquetSink(target, schema)
        n_rows = n_bytes = 0
        try:
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
                n_rows, n_bytes = n_rows + batch.num_rows, n_bytes + batch.nbytes
                limits.check_rows(n_rows)
                limits.check_bytes(n_bytes)
                sink.write(batch)
        finally:
            sink.close()
    _check_rows(n_rows)
    return StoredTable(schema, n_rows)


def convert_upload(upload: Path, source_format: str, target: Path, limits: UploadLimits) -> StoredTable:
    """Parse the upload and write it to ``target`` as Parquet, streamed, within ``limits``; refuses empty
    files, files without columns or rows, duplicate column names and (CSV) mostly-numeric text columns.

    Errors name the upload's content, never its temporary path on the server."""
    if source_format not in SOURCE_FORMATS:
        raise DatasetError(f"unsupported format {source_format!r}; use one of {SOURCE_FORMATS}")
    if upload.stat().st_size == 0:
        raise DatasetError("the uploaded file is empty")
    try:
        if source_format == "csv":
            return _csv_to_parquet(upload, target, limits)
        return _parquet_to_parquet(upload, target, limits)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        message = str(exc)
        for server_path in (str(upload), str(target), upload.name, target.name):  # no server paths to the user
            message = message.replace(server_path, "<upload>")
        raise DatasetError(f"could not parse the {source_format} file: {message}") from exc


def column_schema(schema: pa.Schema) -> list[dict[str, Any]]:
    return [{"name": field.name, "dtype": str(field.type)} for field in schema]


def default_limits() -> UploadLimits:
    settings = get_settings()
    return UploadLimits(settings.max_upload_bytes, settings.max_upload_rows, settings.max_upload_columns)


def ingest(
    session: Session, *, owner: str, name: str, upload: Path, source_format: str, limits: UploadLimits | None = None
) -> Dataset:
    """Store ``upload`` as this owner's Parquet dataset (within ``limits``, by default the settings');
    nothing is left behind if any step fails."""
    dataset_id = new_id()
    final = dataset_path(dataset_id)
    temporary = atomic_target(final)
    try:
        stored = convert_upload(upload, source_format, temporary, limits or default_limits())
        os.replace(temporary, final)
        dataset = Dataset(
            id=dataset_id,
            owner=owner,
            name=name[:500],
            source_format=source_format,
            path=str(final),
            n_rows=stored.n_rows,
            size_bytes=final.stat().st_size,
            columns=column_schema(stored.schema),
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
    _discard(decoded_path(path))


def load_frame(dataset: Dataset | str | os.PathLike[str]) -> pd.DataFrame:
    """The dataset (its row, or the path of its file) as a pandas DataFrame (what runners receive): the frame
    of decoding the Parquet file, read from this host's decoded copy, or decoded (and the copy written in a
    thread) where there is none yet."""
    path = Path(dataset.path if isinstance(dataset, Dataset) else dataset)
    budget = get_settings().decoded_max_bytes
    if budget == 0:
        return pq.read_table(path).to_pandas()
    copy = decoded_path(path)
    frame = _read_decoded(copy)
    if frame is not None:
        return frame
    table = pq.read_table(path)
    _write_decoded_soon(table, copy, budget)
    return table.to_pandas()


def wait_for_decoded_copies(timeout: float | None = None) -> None:
    """Wait until the decoded copies this process is writing are written (or given up)."""
    with _writes_lock:
        writers = list(_writers.values())
    for writer in writers:
        writer.join(timeout)


# The decoded copies being written by this process, one writer per copy.
_writers: dict[Path, threading.Thread] = {}
_writes_lock = threading.Lock()


def _write_decoded_soon(table: pa.Table, copy: Path, budget: int) -> None:
    """Write the decoded copy in a thread: the run that read the Parquet file goes on with its frame (its
    fits, on the GPU, leave the host's cores idle) and pays nothing more than before; the next reads map it.
    A worker that exits meanwhile leaves a temporary file, which eviction removes later."""
    if table.nbytes > budget:
        return

    def write() -> None:
        try:
            _write_decoded(table, copy, budget)
        except Exception as exc:  # a cache: its failure must not reach the run, the next read tries again
            log.warning("could not write a decoded copy of a dataset", file=copy.name, error=type(exc).__name__)
        finally:
            with _writes_lock:
                _writers.pop(copy, None)

    with _writes_lock:
        if copy in _writers:
            return
        writer = _writers[copy] = threading.Thread(target=write, name=f"decode {copy.stem}", daemon=True)
    writer.start()


def prune_decoded_copies(session: Session) -> int:
    """Remove this host's decoded copies of datasets that no longer exist (deleted through an API on another
    host, which removed only its own copy): a deleted dataset's bytes do not stay on any disk. Returns how many."""
    try:
        copies = {entry.stem: entry for entry in get_settings().resolved_decoded_dir.iterdir()
                  if entry.suffix == DECODED_SUFFIX and not entry.name.startswith(".")}
    except (FileNotFoundError, NotADirectoryError):
        return 0
    if not copies:
        return 0
    present = set(session.scalars(select(Dataset.id).where(Dataset.id.in_(list(copies)))))
    gone = [entry for stem, entry in copies.items() if stem not in present]
    for entry in gone:
        _discard(entry)  # a run still reading it keeps its mapping
    return len(gone)


def decoded_path(path: str | os.PathLike[str]) -> Path:
    """Where this host keeps the decoded copy of the stored dataset file ``path``."""
    return get_settings().resolved_decoded_dir / f"{Path(path).stem}{DECODED_SUFFIX}"


def _read_decoded(copy: Path) -> pd.DataFrame | None:
    """The frame over a private (copy-on-write) mapping of ``copy``: its pages are the page cache's until a
    runner writes to the frame, which then changes its own copy of the page, never the file. None when there
    is no copy, or a damaged one (removed: the caller decodes the Parquet file again)."""
    try:
        with copy.open("rb") as handle:
            mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        _discard(copy)
        return None
    try:
        buffer = pa.py_buffer(mapping)
        table = pa.ipc.open_file(pa.BufferReader(buffer)).read_all()
    except (pa.ArrowInvalid, OSError):
        log.warning("removed a damaged decoded copy of a dataset", file=copy.name)
        _discard(copy)
        return None
    with contextlib.suppress(OSError):  # evicted meanwhile: the mapping stays valid
        os.utime(copy)  # the last read: eviction removes the least recently read copies first
    return _frame_over(table, mapping, buffer.address)


def _frame_over(table: pa.Table, mapping: mmap.mmap, base: int) -> pd.DataFrame:
    """``table.to_pandas()``, with every numeric column without nulls a view of ``mapping`` (writable, copy on
    write) rather than a copy. Arrow's own zero-copy conversion gives read-only arrays, which pandas refuses
    to assign into; other columns (text, booleans, dates, nulls) are converted by Arrow as ``to_pandas`` does."""
    names = table.column_names
    if (table.schema.metadata and b"pandas" in table.schema.metadata) or len(set(names)) != len(names):
        return table.to_pandas()  # a stored index or repeated names: Arrow's conversion handles them
    columns = {}
    for name, column in zip(names, table.columns, strict=True):
        view = _mapped_view(column, mapping, base)
        columns[name] = view if view is not None else column.to_pandas()
    return pd.DataFrame(columns, copy=False)


def _mapped_view(column: pa.ChunkedArray, mapping: mmap.mmap, base: int) -> np.ndarray | None:
    if column.num_chunks != 1:
        return None
    array = column.chunk(0)
    if array.null_count or not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
        return None
    dtype = np.dtype(array.type.to_pandas_dtype())
    values = array.buffers()[1]
    offset = values.address - base + array.offset * dtype.itemsize
    return np.frombuffer(mapping, dtype=dtype, count=len(array), offset=offset)


def _write_decoded(table: pa.Table, copy: Path, budget: int) -> bool:
    """Write ``table`` as one record batch to ``copy`` (atomically), after evicting the least recently read
    copies to keep all of them within ``budget`` bytes; False (nothing written) when it cannot be."""
    try:
        combined = table.combine_chunks()  # one chunk a column: what a zero-copy read needs
    except (pa.ArrowInvalid, pa.ArrowCapacityError):  # e.g. more than 2 GB of text in one column
        return False
    temporary = None
    try:
        copy.parent.mkdir(parents=True, exist_ok=True)
        _evict(copy.parent, budget - combined.nbytes, keep=copy)
        temporary = atomic_target(copy)
        with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, combined.schema) as writer:
            writer.write_table(combined, max_chunksize=max(combined.num_rows, 1))
        os.replace(temporary, copy)
    except OSError as exc:  # e.g. a full disk: this run reads the Parquet file's frame, the next one tries again
        if temporary is not None:
            _discard(temporary)
        log.warning("could not write a decoded copy of a dataset", file=copy.name, error=type(exc).__name__)
        return False
    return True


def _discard(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _evict(directory: Path, room: int, keep: Path) -> None:
    """Remove decoded copies, least recently read first, until the others take at most ``room`` bytes; and the
    temporary files of writers that died."""
    now = time.time()
    copies = []
    for entry in directory.iterdir():
        try:
            status = entry.stat()
        except FileNotFoundError:
            continue
        if entry.name.endswith(".part"):
            if now - status.st_mtime > ABANDONED_WRITE_SECONDS:
                _discard(entry)
        elif entry.suffix == DECODED_SUFFIX and entry != keep:
            copies.append((status.st_mtime, status.st_size, entry))
    total = sum(size for _, size, _ in copies)
    for _, size, entry in sorted(copies):
        if total <= room:
            break
        _discard(entry)  # a run reading it keeps its mapping
        total -= size
