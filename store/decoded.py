"""This host's decoded copies of the stored datasets, what a run reads a dataset through (:func:`load_frame`).

A decoded copy is the dataset's table as Arrow IPC, one record batch, in ``Settings.resolved_decoded_dir``,
memory-mapped when read, so a table of gigabytes is read without decoding or copying it. The first run to read
a dataset on a host decodes the Parquet file and writes the copy in a thread while it runs on. The copies are
kept within ``Settings.decoded_max_bytes``, the least recently read evicted first."""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import structlog
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.settings import get_settings
from store.artifacts import atomic_target
from store.models import Dataset

DECODED_SUFFIX = ".arrow"
# A decoded copy's temporary file older than this was left by a writer that died: eviction removes it.
ABANDONED_WRITE_SECONDS = 3600.0

log = structlog.get_logger(__name__)


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
    fits, on the GPU, leave the host's cores idle) and does not wait for the copy; the next reads map it.
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


def remove_decoded_copy(path: str | os.PathLike[str]) -> None:
    """Remove this host's decoded copy of the stored dataset file ``path`` (a run reading it keeps its mapping)."""
    _discard(decoded_path(path))


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
