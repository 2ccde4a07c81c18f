"""An upload becoming a dataset: the CSV or Parquet file parsed and validated, streamed, within the upload
limits, written as Parquet, and its row (with its schema) added to the database."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from sqlalchemy.orm import Session

from core.settings import Settings, get_settings
from store.artifacts import atomic_target, dataset_path
from store.datasets import column_schema
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


class UploadLimitError(DatasetError):
    """The upload passes one of the limits of :class:`UploadLimits`; ``setting`` names it."""

    def __init__(self, setting: str, limit: int, what: str) -> None:
        self.setting, self.limit = setting, limit
        super().__init__(f"the upload holds more than {limit} {what} (the {setting} limit)")


class UploadMemoryError(UploadLimitError):
    """Converting the upload would hold more than ``max_upload_memory_bytes`` at once."""

    def __init__(self, limit: int, what: str) -> None:
        DatasetError.__init__(self, f"converting the upload would take more than {limit} bytes of memory at once "
                                    f"({what}; the max_upload_memory_bytes limit)")
        self.setting, self.limit = "max_upload_memory_bytes", limit


@dataclass(frozen=True)
class UploadLimits:
    """Bounds on one upload, checked while it is read, so a small compressed file cannot expand into a
    table that fills the memory: its decompressed bytes, its data rows and its columns; and the memory its
    conversion may hold at once (a part of it for any one page, dictionary or row)."""

    max_bytes: int
    max_rows: int
    max_columns: int
    max_memory: int = 256 * 1024 * 1024

    def check_memory(self, count: int, what: str) -> None:
        if count > self.max_memory:
            raise UploadMemoryError(self.max_memory, what)

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
# Bytes of decoded strings converted and handed to the Parquet writer at a time.
DECODED_SLICE_BYTES = 16 << 20
GZIP_MAGIC = b"\x1f\x8b"
HEADER_SCAN_BYTES = 64 * 1024


class _LateTypeChange(Exception):
    """A CSV column's values after the first block do not fit the type inferred from that block."""

    def __init__(self, first_block: pa.Schema, message: str) -> None:
        super().__init__(message)
        self.first_block, self.message = first_block, message


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
    """Writes record batches to a Parquet file, a row group per ``row_group_bytes`` of table."""

    def __init__(self, target: Path, schema: pa.Schema, row_group_bytes: int = ROW_GROUP_BYTES) -> None:
        self._writer = pq.ParquetWriter(target, schema)
        self._row_group_bytes = row_group_bytes
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= self._row_group_bytes:
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


HEADER_TOKENS = re.compile(rb'[",\r\n]')


def header_columns(source: BinaryIO, limit: int) -> int:
    """The columns of a CSV's header record, counted on its bytes before any parser sees them (a parser
    allocates a builder per column of its first block), stopping as soon as they pass ``limit``.

    Read as pyarrow's parser reads it: a quote opens a quoted field only as the field's first byte (elsewhere
    it is a literal), a doubled quote inside one is a quote, and leading empty lines are skipped. Only the
    delimiters, quotes and line ends are visited, so the work stops with the count."""
    columns, quoted, field_start, closing_quote, offset = 1, False, 0, -2, 0
    while chunk := source.read(HEADER_SCAN_BYTES):
        for match in HEADER_TOKENS.finditer(chunk):
            position, token = offset + match.start(), match.group()
            if quoted:
                if token == b'"':
                    quoted, closing_quote = False, position
                continue
            if token == b'"':
                # A field's first byte opens a quoted field; right after a closing quote, a doubled quote.
                quoted = position in (field_start, closing_quote + 1)
            elif token == b",":
                columns += 1
                field_start = position + 1
            elif columns == 1 and position == field_start:  # an empty line before the header
                field_start = position + 1
            else:
                return columns
            if columns > limit:
                return columns
        offset += len(chunk)
    return columns


def _check_header_width(path: Path, limits: UploadLimits) -> None:
    with _decompressed(path, limits) as source:
        limits.check_columns(header_columns(source, limits.max_columns))


def _csv_streamed(path: Path, target: Path, limits: UploadLimits,
                  column_types: dict[str, pa.DataType] | None = None) -> StoredTable:
    """CSV -> Parquet a block at a time (memory flat whatever the size): types inferred from the first block,
    or ``column_types``.

    Raises :class:`_LateTypeChange` when a later block does not fit those types."""
    _check_header_width(path, limits)
    convert = pa_csv.ConvertOptions(column_types=column_types or {})
    with _decompressed(path, limits) as source:
        reader = pa_csv.open_csv(source, read_options=pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                                 convert_options=convert)
        schema = reader.schema
        _check_schema(schema, limits)
        checks = _text_checks(schema)
        sink = _ParquetSink(target, schema, min(ROW_GROUP_BYTES, limits.max_memory // 8))
        n_rows = 0
        try:
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                except pa.ArrowInvalid as exc:
                    if n_rows > 0 and "conversion error" in str(exc):
                        raise _LateTypeChange(schema, str(exc)) from exc
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


# The kinds pyarrow's CSV type inference tries, in its order: a column gets the first that converts all of its
# values (Arrow's csv/inference_internal.h).
INFERENCE_ORDER = ("null", "int64", "bool", "date32", "time32", "timestamp_s", "timestamp_ns", "float64", "string",
                   "binary")
_DEFAULT_CONVERT = pa_csv.ConvertOptions()
NULL_TOKENS = pa.array(_DEFAULT_CONVERT.null_values, pa.string())
BOOL_TOKENS = pa.array(_DEFAULT_CONVERT.true_values + _DEFAULT_CONVERT.false_values, pa.string())
TIME_PATTERN = r"^\s*\d{1,2}:\d{2}(:\d{2})?\s*$"


def _inference_kind(data_type: pa.DataType) -> str:
    if pa.types.is_timestamp(data_type):
        return "timestamp_s" if data_type.unit == "s" else "timestamp_ns"
    kinds = {pa.null(): "null", pa.int64(): "int64", pa.bool_(): "bool", pa.date32(): "date32",
             pa.time32("s"): "time32", pa.float64(): "float64", pa.binary(): "binary"}
    return kinds.get(data_type, "string")


def _kind_type(kind: str, timezone: str | None) -> pa.DataType:
    types = {"null": pa.null(), "int64": pa.int64(), "bool": pa.bool_(), "date32": pa.date32(),
             "time32": pa.time32("s"), "timestamp_s": pa.timestamp("s", timezone),
             "timestamp_ns": pa.timestamp("ns", timezone), "float64": pa.float64(), "string": pa.string(),
             "binary": pa.binary()}
    return types[kind]


def _converts(kind: str, values: pa.Array, timezone: str | None) -> bool:
    """Whether CSV text ``values`` (null tokens left out) all read as ``kind``, as pyarrow's converter would
    read them (numbers with surrounding blanks)."""
    if kind == "null":
        return len(values) == 0
    if kind == "bool":
        return bool(pc.all(pc.is_in(values, BOOL_TOKENS)).as_py() is not False)
    if kind == "time32":
        return bool(pc.all(pc.match_substring_regex(values, TIME_PATTERN)).as_py() is not False)
    if kind in ("string", "binary"):
        return True
    text = pc.utf8_trim_whitespace(values) if kind in ("int64", "float64") else values
    try:
        pc.cast(text, _kind_type(kind, timezone))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


class _ColumnKinds:
    """The kinds still open to one CSV column, narrowed block by block: its type is the first left."""

    def __init__(self, first_block_type: pa.DataType) -> None:
        self.timezone = getattr(first_block_type, "tz", None)
        self.kinds = list(INFERENCE_ORDER[INFERENCE_ORDER.index(_inference_kind(first_block_type)):])

    def add(self, column: pa.Array) -> None:
        try:
            text = pc.cast(column, pa.string())
        except pa.ArrowInvalid:  # not UTF-8: bytes only
            self.kinds = ["binary"]
            return
        present = pc.filter(text, pc.invert(pc.is_in(text, NULL_TOKENS)))
        self.kinds = [kind for kind in self.kinds if _converts(kind, present, self.timezone)]

    def type(self) -> pa.DataType:
        return _kind_type(self.kinds[0], self.timezone)


def _csv_column_types(path: Path, limits: UploadLimits, first_block: pa.Schema) -> dict[str, pa.DataType]:
    """Every column's type as pyarrow's whole-file reader would infer it, found in a streamed pass that
    reads each column as bytes and narrows its kinds block by block (memory flat)."""
    columns = {field.name: _ColumnKinds(field.type) for field in first_block}
    as_bytes = pa_csv.ConvertOptions(column_types={name: pa.binary() for name in columns})
    n_rows = 0
    with _decompressed(path, limits) as source:
        for batch in pa_csv.open_csv(source, read_options=pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                                     convert_options=as_bytes):
            n_rows += batch.num_rows
            limits.check_rows(n_rows)
            for name, kinds in columns.items():
                if kinds.kinds[0] != "binary":
                    kinds.add(batch.column(name))
    return {name: kinds.type() for name, kinds in columns.items()}


def _csv_to_parquet(path: Path, target: Path, limits: UploadLimits) -> StoredTable:
    """Streamed with the first block's types; a file whose types change later is streamed again with the
    types a whole-file read would have given (integers, then a decimal: double), never held whole."""
    try:
        return _csv_streamed(path, target, limits)
    except _LateTypeChange as change:
        column_types = _csv_column_types(path, limits, change.first_block)
    try:
        return _csv_streamed(path, target, limits, column_types)
    except _LateTypeChange as change:
        raise DatasetError(f"could not parse the csv file: {change.message}") from change


# Thrift compact protocol: the field types of a Parquet page header's first fields, and the page type of a
# dictionary page (parquet.thrift's PageHeader and PageType).
THRIFT_I32 = 5
DICTIONARY_PAGE = 2
PAGE_HEADER_PROBE_BYTES = 64


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position, shift = position + 1, shift + 7
        if not byte & 0x80:
            return value, position


def page_header_sizes(data: bytes) -> tuple[int, int]:
    """A Parquet page header's page type and uncompressed size, read from its first bytes (Thrift compact
    protocol: fields 1 and 2, both i32), before the page itself is read."""
    fields: dict[int, int] = {}
    position = field = 0
    while len(fields) < 2:
        header = data[position]
        position += 1
        if header == 0 or header & 0x0F != THRIFT_I32:
            raise ValueError("not a page header")
        if header >> 4:
            field += header >> 4
        else:  # a long-form field id: zigzag varint
            raw, position = _varint(data, position)
            field = (raw >> 1) ^ -(raw & 1)
        raw, position = _varint(data, position)
        fields[field] = (raw >> 1) ^ -(raw & 1)
    if set(fields) != {1, 2} or fields[2] < 0:
        raise ValueError("not a page header")
    return fields[1], fields[2]


def _dictionary_page_bytes(handle: BinaryIO, chunk: pq.ColumnChunkMetaData) -> int:
    """The uncompressed size of a column chunk's dictionary page (0 without one), from its page header: the
    footer's sizes count a dictionary once, yet every row that points at a value decodes to a copy of it."""
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    handle.seek(start)
    try:
        page_type, uncompressed = page_header_sizes(handle.read(PAGE_HEADER_PROBE_BYTES))
    except (ValueError, IndexError):
        return chunk.total_uncompressed_size  # an unreadable header: assume the whole chunk is dictionary
    return uncompressed if page_type == DICTIONARY_PAGE else 0


def _check_parquet_metadata(path: Path, metadata: pq.FileMetaData, limits: UploadLimits) -> None:
    """What the footer and the page headers tell before any page is decoded: rows, decompressed bytes, and
    the memory of the largest page and of a row group's dictionaries (held together while it is read)."""
    limits.check_rows(metadata.num_rows)
    limits.check_bytes(sum(metadata.row_group(index).total_byte_size for index in range(metadata.num_row_groups)))
    pages, dictionaries, nested, total = [], [], [], 0
    with path.open("rb") as handle:
        for index in range(metadata.num_row_groups):
            group = metadata.row_group(index)
            group_dictionaries = group_nested = 0
            for column in range(group.num_columns):
                chunk = group.column(column)
                dictionary = _dictionary_page_bytes(handle, chunk)
                group_dictionaries += dictionary
                total += chunk.total_uncompressed_size
                pages.append(max(dictionary, chunk.total_uncompressed_size - dictionary))
                if "." in chunk.path_in_schema and dictionary:
                    # Strings inside a list or struct are decoded as they are read: each value at most the
                    # whole dictionary.
                    group_nested += dictionary * chunk.num_values
            dictionaries.append(group_dictionaries)
            nested.append(group_nested)
    limits.check_bytes(total + sum(nested))
    limits.check_memory(4 * max(nested, default=0), "four times a row group's strings in lists or structs at "
                        "most, once decoded")
    limits.check_memory(2 * max(pages, default=0), "twice a column chunk's largest page or its dictionary once "
                        "decompressed")
    limits.check_memory(2 * max(dictionaries, default=0), "twice a row group's dictionaries once decompressed")


def _is_binary_like(data_type: pa.DataType) -> bool:
    return (pa.types.is_string(data_type) or pa.types.is_large_string(data_type) or pa.types.is_binary(data_type)
            or pa.types.is_large_binary(data_type))


def _decoded_schema(schema: pa.Schema) -> pa.Schema:
    """The schema stored: a column its writer kept dictionary-encoded is stored decoded, as any other."""
    return pa.schema([field.with_type(field.type.value_type) if pa.types.is_dictionary(field.type) else field
                      for field in schema], metadata=schema.metadata)


def _dictionary_read_columns(schema: pa.Schema) -> list[str]:
    # Strings and bytes are read dictionary-encoded, as stored: their decoded size is known from the
    # dictionary's value lengths before any row is decoded into a copy of its value.
    return [field.name for field in schema if _is_binary_like(field.type) or pa.types.is_dictionary(field.type)]


def _decoded_row_bytes(batch: pa.RecordBatch, columns: Sequence[str]) -> np.ndarray:
    """Each row's bytes once the dictionary-encoded ``columns`` are decoded (values, offsets), the other
    columns' buffers shared out per row."""
    rows = np.zeros(batch.num_rows, dtype=np.int64)
    encoded = 0
    for name in columns:
        column = batch.column(name)
        rows += 8  # an offset, and room for the validity bit
        if not _is_binary_like(column.dictionary.type):
            rows += max(column.dictionary.type.bit_width // 8, 1)
        elif len(column.dictionary):
            lengths = pc.binary_length(column.dictionary).to_numpy(zero_copy_only=False).astype(np.int64)
            values = lengths[pc.fill_null(column.indices, 0).to_numpy(zero_copy_only=False)]
            if column.null_count:
                values = np.where(column.is_valid().to_numpy(zero_copy_only=False), values, 0)
            rows += values
        encoded += column.nbytes
    if batch.num_rows:
        rows += (batch.nbytes - encoded) // batch.num_rows + 1
    return rows


def _checked_decoded_bytes(batch: pa.RecordBatch, columns: Sequence[str], limits: UploadLimits,
                           counted: int) -> tuple[np.ndarray, int]:
    """Each row's decoded bytes and the total with the ``counted`` before this batch, checked against the
    limits before anything is decoded."""
    row_bytes = _decoded_row_bytes(batch, columns)
    total = counted + int(row_bytes.sum())
    limits.check_bytes(total)
    if len(row_bytes):
        limits.check_memory(4 * int(row_bytes.max()), "four times one row's bytes once decoded")
    return row_bytes, total


def _decoded_slices(batch: pa.RecordBatch, columns: Sequence[str], row_bytes: np.ndarray, slice_bytes: int,
                    schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The batch a slice of at most ``slice_bytes`` decoded bytes (or one row) at a time, its
    dictionary-encoded ``columns`` decoded to ``schema``'s types: one slice decoded at a time."""
    ends = np.cumsum(row_bytes)
    start = 0
    while start < batch.num_rows:
        base = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + slice_bytes, side="right")))
        part = batch.slice(start, stop - start)
        yield pa.RecordBatch.from_arrays(
            [part.column(name).dictionary_decode().cast(schema.field(name).type) if name in columns
             else part.column(name) for name in part.schema.names], schema=schema)
        start = stop


def _fixed_row_bytes(schema: pa.Schema) -> int:
    """A row's bytes in the columns of fixed width once decoded (a dictionary-encoded one decodes to them)."""
    total = 0
    for field in schema:
        data_type = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
        if pa.types.is_primitive(data_type) and not pa.types.is_boolean(data_type):
            total += data_type.bit_width // 8
    return total


def _parquet_batch_rows(schema: pa.Schema, metadata: pq.FileMetaData, limits: UploadLimits) -> int:
    """Rows per read batch: its columns as read (strings as dictionary indices) within a part of the memory."""
    rows = max(metadata.num_rows, 1)
    stored = sum(metadata.row_group(index).total_byte_size for index in range(metadata.num_row_groups)) // rows
    width = max(stored, _fixed_row_bytes(schema)) + 8 * len(schema)
    return max(1, min(PARQUET_BATCH_ROWS, limits.max_memory // (8 * width)))


def _parquet_to_parquet(path: Path, target: Path, limits: UploadLimits) -> StoredTable:
    """Parquet -> Parquet a batch at a time. The footer's row count and sizes and the pages' headers are
    checked before any page is decoded; strings are read dictionary-encoded and each batch's decoded size
    is checked before it is decoded, a slice at a time (a footer can understate them)."""
    stored = pq.read_schema(pa.OSFile(str(path)))
    _check_schema(stored, limits)
    columns = _dictionary_read_columns(stored)
    schema = _decoded_schema(stored)
    with pq.ParquetFile(pa.OSFile(str(path)), read_dictionary=columns) as parquet:
        metadata = parquet.metadata
        _check_parquet_metadata(path, metadata, limits)
        limits.check_bytes(metadata.num_rows * _fixed_row_bytes(schema))
        sink = _ParquetSink(target, schema, min(ROW_GROUP_BYTES, limits.max_memory // 16))
        slice_bytes = min(DECODED_SLICE_BYTES, limits.max_memory // 32)
        n_rows = n_bytes = 0
        try:
            for batch in parquet.iter_batches(batch_size=_parquet_batch_rows(schema, metadata, limits)):
                n_rows += batch.num_rows
                limits.check_rows(n_rows)
                row_bytes, n_bytes = _checked_decoded_bytes(batch, columns, limits, n_bytes)
                for part in _decoded_slices(batch, columns, row_bytes, slice_bytes, schema):
                    sink.write(part)
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
    finally:
        pa.default_memory_pool().release_unused()  # the allocator keeps freed blocks for reuse otherwise


def upload_limits(settings: Settings) -> UploadLimits:
    return UploadLimits(settings.max_upload_bytes, settings.max_upload_rows, settings.max_upload_columns,
                        settings.max_upload_memory_bytes)


def default_limits() -> UploadLimits:
    return upload_limits(get_settings())


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
