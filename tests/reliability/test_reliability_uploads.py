"""Upload bombs, scaled for CI: each file is converted in a fresh process (tests/reliability/upload_probe.py)
that reports its peak RSS growth over the conversion and its seconds, so the bounds are on the memory the
conversion took, not on surviving it. The full-size attacks against a real API process are
bench/upload_bomb_rss.py's."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.reliability import figures

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's resettable peak RSS"),
]

REPO_ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


def convert_in_probe(upload: Path, source_format: str, **limits: int) -> dict[str, Any]:
    """Convert ``upload`` in a fresh process; its outcome (stored rows and types, or the error's class,
    setting and message), peak RSS growth in MiB and seconds."""
    command = [sys.executable, "-m", "tests.reliability.upload_probe", str(upload), source_format, json.dumps(limits)]
    probe = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert probe.returncode == 0, probe.stderr[-3000:]
    return json.loads(probe.stdout.strip().splitlines()[-1])


def test_a_gzipped_header_of_100000_columns_is_refused_before_the_parser_allocates(tmp_path: Path) -> None:
    """100,000 empty-named columns in 200 bytes of gzip: the parser's builders for them took about 1 GB
    before the column limit was checked; counted on the bytes, it is refused at once."""
    columns = 100_000
    upload = tmp_path / "wide.csv.gz"
    upload.write_bytes(gzip.compress(b"," * (columns - 1) + b"\n" + b"1" + b"," * (columns - 1) + b"\n"))
    outcome = convert_in_probe(upload, "csv")
    figures.record("upload_wide_header", columns=columns, bytes_sent=upload.stat().st_size, **outcome)
    assert (outcome["error"], outcome["setting"]) == ("UploadLimitError", "max_upload_columns"), outcome
    assert outcome["peak_growth_mib"] < 64, outcome
    assert outcome["seconds"] < 5, outcome


def dictionary_bomb(path: Path, rows: int, value_bytes: int) -> Path:
    """The issue's file: one string in a dictionary page, every row pointing at it (293 bytes as sent)."""
    column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["z" * value_bytes]))
    pq.write_table(
        pa.table({"s": column}), path, store_schema=False, compression="zstd", dictionary_pagesize_limit=2 * value_bytes
    )
    return path


def test_a_parquet_dictionary_bomb_is_refused_before_a_row_is_decoded(tmp_path: Path) -> None:
    """1,500 rows of one 1 MiB string (1.5 GB once decoded, under the footer's 1 MiB): the reader decoded
    a batch of every row (2.8 GB) before the byte limit was checked."""
    upload = dictionary_bomb(tmp_path / "bomb.parquet", 1500, MIB)
    outcome = convert_in_probe(upload, "parquet")
    figures.record("upload_parquet_dictionary_bomb", rows_sent=1500, bytes_sent=upload.stat().st_size, **outcome)
    assert (outcome["error"], outcome["setting"]) == ("UploadLimitError", "max_upload_bytes"), outcome
    assert outcome["peak_growth_mib"] < 64, outcome
    assert outcome["seconds"] < 5, outcome


def test_a_parquet_dictionary_file_within_the_byte_limit_is_decoded_within_the_memory_limit(tmp_path: Path) -> None:
    """400 rows of one 1 MiB string: within the byte limit, so stored, yet decoded a slice at a time."""
    upload = dictionary_bomb(tmp_path / "bomb.parquet", 400, MIB)
    outcome = convert_in_probe(upload, "parquet", max_memory=64 * MIB)
    figures.record("upload_parquet_dictionary_400_rows", max_memory_mib=64, **outcome)
    assert (outcome.get("rows"), outcome.get("types")) == (400, ["string"]), outcome
    assert outcome["peak_growth_mib"] < 64, outcome
    assert outcome["seconds"] < 30, outcome


def test_a_csv_whose_type_changes_in_its_last_row_is_streamed(tmp_path: Path) -> None:
    """10^7 rows of four integer columns and a 0.5 in the last (80 MB of text, 160 kB gzipped): the
    whole-file read that gives the column its type (double) held the 320 MB table; streamed twice, memory
    stays flat."""
    rows = 10_000_000
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    parts = [compressor.compress(b"x,a,b,c\n")]
    parts += [compressor.compress(b"0,1,2,3\n" * 1_000_000) for _ in range(rows // 1_000_000)]
    parts += [compressor.compress(b"0.5,1,2,3\n"), compressor.flush()]
    upload = tmp_path / "late.csv.gz"
    upload.write_bytes(b"".join(parts))
    outcome = convert_in_probe(upload, "csv")
    figures.record("upload_csv_late_type_change", bytes_sent=upload.stat().st_size, **outcome)
    assert (outcome.get("rows"), outcome.get("types")) == (rows + 1, ["double"] + ["int64"] * 3), outcome
    assert outcome["peak_growth_mib"] < 200, outcome
    assert outcome["seconds"] < 90, outcome


def start_api(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "api.app:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.1)
    server.kill()
    raise AssertionError("the API did not start")


def test_temporary_files_of_an_api_killed_mid_upload_are_removed_at_its_next_start(tmp_path: Path) -> None:
    """SIGKILL while an upload streams in leaves its .part file; the next start removes it once stale."""
    env = {
        **os.environ,
        "GPUEST_DATA_DIR": str(tmp_path / "data"),
        "GPUEST_AUTH_ENABLED": "false",
        "GPUEST_STALE_PART_SECONDS": "1",
        "PYTHONPATH": str(REPO_ROOT),
    }
    for name in ("DATABASE_URL", "GPUEST_DATABASE_URL", "REDIS_URL", "BROKER_URL", "GPUEST_BROKER_URL"):
        env.pop(name, None)
    subprocess.run(
        [sys.executable, "-c", "from store.migrate import upgrade_to_head; upgrade_to_head()"],
        cwd=REPO_ROOT,
        env=env,
        check=True,
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uploads = tmp_path / "data" / "uploads"
    server = start_api(env, port)
    try:
        head = (
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="big.csv"\r\n'
            b"Content-Type: text/csv\r\n\r\nx\n" + b"1\n" * 512 * 1024
        )
        with socket.create_connection(("127.0.0.1", port)) as connection:
            connection.sendall(
                b"POST /v1/datasets HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; "
                b"boundary=b\r\nContent-Length: %d\r\n\r\n" % (len(head) * 4) + head
            )
            deadline = time.monotonic() + 30
            while not [path for path in uploads.glob(".upload-*.part") if path.stat().st_size > 0]:
                assert time.monotonic() < deadline, "no upload file appeared"
                time.sleep(0.05)
            server.kill()
            server.wait(10)
    finally:
        server.kill()
    left = list(uploads.glob(".*.part"))
    assert left, "the killed process left no temporary file"
    time.sleep(1.5)
    server = start_api(env, port)
    try:
        assert list(uploads.glob(".*.part")) == []
    finally:
        server.terminate()
        server.wait(30)


def test_a_dictionary_bomb_inside_a_list_column_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    """Two rows of 300 list elements each pointing at one 1 MiB dictionary value (600 MB once decoded)."""
    leaf = pa.DictionaryArray.from_arrays(pa.array([0] * 600, pa.int32()), pa.array(["z" * MIB]))
    column = pa.ListArray.from_arrays(pa.array([0, 300, 600], pa.int32()), leaf)
    upload = tmp_path / "nested.parquet"
    pq.write_table(
        pa.table({"l": column}), upload, store_schema=False, compression="zstd", dictionary_pagesize_limit=2 * MIB
    )
    outcome = convert_in_probe(upload, "parquet")
    figures.record("upload_parquet_nested_dictionary_bomb", bytes_sent=upload.stat().st_size, **outcome)
    assert (outcome["error"], outcome["setting"]) == ("UploadLimitError", "max_upload_bytes"), outcome
    assert outcome["peak_growth_mib"] < 64, outcome


def test_dictionary_encoded_numbers_are_counted_at_their_decoded_width(tmp_path: Path) -> None:
    """400 columns of 500,000 rows of one dictionary-encoded int64 (1.6 GB once decoded, under 1 MB sent):
    refused from the footer's row count and the columns' widths, before a batch of them is decoded."""
    rows = 500_000
    indices = pa.array(np.zeros(rows, dtype=np.int32))
    column = pa.DictionaryArray.from_arrays(indices, pa.array([7], pa.int64()))
    upload = tmp_path / "numbers.parquet"
    pq.write_table(
        pa.table({f"c{index}": column for index in range(400)}), upload, store_schema=False, compression="zstd"
    )
    outcome = convert_in_probe(upload, "parquet")
    figures.record("upload_parquet_dictionary_numbers", bytes_sent=upload.stat().st_size, **outcome)
    assert (outcome["error"], outcome["setting"]) == ("UploadLimitError", "max_upload_bytes"), outcome
    assert outcome["peak_growth_mib"] < 64, outcome
