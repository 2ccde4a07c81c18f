"""A run's dataset read (``store.decoded.load_frame``) from this host's decoded copy: the frame of
decoding the Parquet file, column for column and dtype for dtype, for every kind of column an upload may hold;
a frame a runner may write into without touching the copy; damaged copies rebuilt; the copies' disk budget."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.settings import get_settings
from store.decoded import decoded_path, load_frame, wait_for_decoded_copies


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("GPUEST_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("GPUEST_DECODED_DIR", raising=False)
    monkeypatch.delenv("GPUEST_DECODED_MAX_BYTES", raising=False)
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


def set_budget(monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    monkeypatch.setenv("GPUEST_DECODED_MAX_BYTES", str(budget))
    get_settings.cache_clear()


def stored(directory: Path, name: str, table: pa.Table, row_group_size: int | None = None) -> Path:
    path = directory / "datasets" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def decoded_reference(path: Path) -> pd.DataFrame:
    return pq.read_table(path).to_pandas()


def first_read(path: Path) -> pd.DataFrame:
    """A host's first read of ``path``, once its decoded copy is written (in a thread)."""
    frame = load_frame(path)
    wait_for_decoded_copies()
    return frame


def every_column_kind(rows: int = 257) -> pa.Table:
    rng = np.random.default_rng(19)
    with_nulls = pa.array([None if i % 7 == 0 else int(i) for i in range(rows)], pa.int64())
    return pa.table({
        "i64": pa.array(rng.integers(-10**12, 10**12, rows), pa.int64()),
        "i32": pa.array(rng.integers(-1000, 1000, rows), pa.int32()),
        "u8": pa.array(rng.integers(0, 255, rows), pa.uint8()),
        "f64": pa.array(rng.standard_normal(rows)),
        "f32": pa.array(rng.standard_normal(rows).astype(np.float32)),
        "f64_nan": pa.array(np.where(np.arange(rows) % 5 == 0, np.nan, rng.standard_normal(rows))),
        "f64_null": pa.array([None if i % 3 == 0 else float(i) for i in range(rows)], pa.float64()),
        "i64_null": with_nulls,
        "text": pa.array([f"drug {i % 13}" if i % 11 else None for i in range(rows)]),
        "flag": pa.array([bool(i % 2) for i in range(rows)]),
        "when": pa.array(np.arange(rows).astype("datetime64[s]")),
        "day": pa.array(np.arange(rows).astype("datetime64[D]").astype(object), pa.date32()),
    })


@pytest.mark.parametrize("row_group_size", [None, 50])
def test_the_decoded_copy_gives_the_parquet_files_frame(data_dir: Path, row_group_size: int | None) -> None:
    path = stored(data_dir, "kinds", every_column_kind(), row_group_size)
    first = first_read(path)  # decodes the Parquet file and writes the copy
    assert decoded_path(path).exists()
    again = load_frame(path)  # from the copy
    for frame in (first, again):
        pd.testing.assert_frame_equal(frame, decoded_reference(path), check_exact=True)


def test_a_frame_is_read_from_the_copy_and_writable_without_changing_it(data_dir: Path) -> None:
    path = stored(data_dir, "xy", pa.table({"x": np.arange(6.0), "n": np.arange(6)}))
    first_read(path)
    reference = decoded_reference(path)
    path.unlink()  # the next reads cannot decode the Parquet file: they read the copy
    frame = load_frame(path)
    frame.loc[0, "x"] = 99.0
    frame["n"] *= 2
    frame.iloc[1, 0] = -1.0
    assert frame["x"].tolist()[:2] == [99.0, -1.0] and frame["n"].tolist() == [0, 2, 4, 6, 8, 10]
    pd.testing.assert_frame_equal(load_frame(path), reference)  # the copy and other readers see the file


def test_reads_at_once_while_the_copy_is_written(data_dir: Path) -> None:
    path = stored(data_dir, "busy", every_column_kind(20_000), row_group_size=3000)
    with ThreadPoolExecutor(4) as pool:
        frames = list(pool.map(lambda _: load_frame(path), range(8)))
    wait_for_decoded_copies()
    for frame in [*frames, load_frame(path)]:
        pd.testing.assert_frame_equal(frame, decoded_reference(path), check_exact=True)
    assert [entry.name for entry in decoded_path(path).parent.iterdir()] == ["busy.arrow"]  # no temporary left


def test_edge_tables(data_dir: Path) -> None:
    empty = stored(data_dir, "empty", pa.table({"x": pa.array([], pa.float64()), "t": pa.array([], pa.string())}))
    index = stored(data_dir, "index", pa.Table.from_pandas(pd.DataFrame({"x": [1.5, 2.5]}, index=[10, 20])))
    for path in (empty, index):
        first_read(path)
        pd.testing.assert_frame_equal(load_frame(path), decoded_reference(path))
    assert load_frame(index).index.tolist() == [10, 20]


@pytest.mark.parametrize("damage", [b"", b"not an arrow file", "truncated"])
def test_a_damaged_copy_is_rebuilt(data_dir: Path, damage: bytes | str) -> None:
    path = stored(data_dir, "d", pa.table({"x": np.arange(1000.0)}))
    first_read(path)
    copy = decoded_path(path)
    copy.write_bytes(copy.read_bytes()[: copy.stat().st_size // 2] if damage == "truncated" else damage)
    pd.testing.assert_frame_equal(first_read(path), decoded_reference(path))
    assert copy.stat().st_size > 8000  # rebuilt
    pd.testing.assert_frame_equal(load_frame(path), decoded_reference(path))  # and the rebuilt copy reads


def test_the_budget_evicts_the_least_recently_read(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tables = {name: stored(data_dir, name, pa.table({"x": np.arange(10_000.0)})) for name in "abc"}  # 80 KB each
    set_budget(monkeypatch, 200_000)  # room for two
    first_read(tables["a"])
    first_read(tables["b"])
    past = time.time() - 100
    os.utime(decoded_path(tables["b"]), (past, past))  # b read longest ago
    first_read(tables["c"])
    assert [decoded_path(tables[n]).exists() for n in "abc"] == [True, False, True]
    abandoned = decoded_path(tables["a"]).parent / ".x.arrow.1234.part"
    abandoned.write_bytes(b"half")
    os.utime(abandoned, (past - 3600, past - 3600))
    first_read(tables["b"])
    assert not abandoned.exists()
    assert sum(p.stat().st_size for p in decoded_path(tables["a"]).parent.glob("*.arrow")) <= 200_000


def test_no_copy_beyond_the_budget_or_with_budget_zero(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = stored(data_dir, "big", pa.table({"x": np.arange(10_000.0)}))
    set_budget(monkeypatch, 1000)
    pd.testing.assert_frame_equal(first_read(path), decoded_reference(path))
    assert not decoded_path(path).exists()
    set_budget(monkeypatch, 0)
    pd.testing.assert_frame_equal(first_read(path), decoded_reference(path))
    assert not decoded_path(path).parent.exists()


def test_a_copy_that_cannot_be_written_leaves_the_read_whole(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = stored(data_dir, "ro", pa.table({"x": np.arange(100.0)}))
    blocked = data_dir / "not-a-directory"
    blocked.write_text("a file where the copies' directory should be")
    monkeypatch.setenv("GPUEST_DECODED_DIR", str(blocked / "decoded"))
    get_settings.cache_clear()
    with pytest.raises(OSError):
        decoded_path(path).parent.mkdir(parents=True)
    pd.testing.assert_frame_equal(first_read(path), decoded_reference(path))
    pd.testing.assert_frame_equal(first_read(path), decoded_reference(path))
