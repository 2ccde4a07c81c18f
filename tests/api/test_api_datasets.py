"""Dataset uploads over HTTP: CSV and Parquet stored as Parquet with their schema; malformed, empty,
mistyped and over-limit uploads are clear 4xx problems that leave neither a file nor a row."""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from api_helpers import MAX_UPLOAD_BYTES, assert_problem
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from core.settings import get_settings
from store.db import session_scope
from store.decoded import decoded_path, load_frame, prune_decoded_copies, wait_for_decoded_copies
from store.models import Dataset

GOOD_CSV = b"y,x,label\n1.5,1,a\n2.5,2,b\n3.0,3,c\n"


def upload(client: TestClient, headers: dict[str, str], name: str, content: bytes, media_type: str = "text/csv"):
    return client.post("/v1/datasets", files={"file": (name, content, media_type)}, headers=headers)


def assert_nothing_stored() -> None:
    """No dataset row, no stored file, no upload left behind."""
    with session_scope() as session:
        assert session.scalar(select(func.count()).select_from(Dataset)) == 0
    data_dir = Path(get_settings().data_dir)
    leftovers = [path for folder in ("datasets", "uploads") for path in (data_dir / folder).glob("*")]
    assert leftovers == []


@pytest.mark.both_backends
def test_csv_upload_returns_schema_and_location(client, alice) -> None:
    response = upload(client, alice, "prices.csv", GOOD_CSV)
    assert response.status_code == 201, response.text
    dataset = response.json()
    assert response.headers["location"] == f"/v1/datasets/{dataset['id']}"
    assert dataset["name"] == "prices.csv" and dataset["n_rows"] == 3 and dataset["source_format"] == "csv"
    assert dataset["columns"] == [{"name": "y", "dtype": "double"}, {"name": "x", "dtype": "int64"},
                                  {"name": "label", "dtype": "string"}]
    stored = Path(get_settings().datasets_dir) / f"{dataset['id']}.parquet"
    assert dataset["size_bytes"] == stored.stat().st_size > 0
    assert dataset["created_at"].endswith(("Z", "+00:00"))

    assert client.get(response.headers["location"], headers=alice).json() == dataset
    listing = client.get("/v1/datasets", headers=alice).json()
    assert listing["total"] == 1 and listing["items"] == [dataset] and listing["next"] is None
    assert list((Path(get_settings().data_dir) / "uploads").glob("*")) == []  # the temp upload is gone


def test_parquet_round_trip(client, alice) -> None:
    frame = pd.DataFrame({"id": [1, 2, 3, 4], "value": [0.25, -1.0, 3.5, 1e-9], "flag": [True, False, True, True]})
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buffer)
    response = upload(client, alice, "frame.parquet", buffer.getvalue(), "application/vnd.apache.parquet")
    assert response.status_code == 201, response.text
    dataset = response.json()
    assert dataset["source_format"] == "parquet" and dataset["n_rows"] == 4
    assert [column["dtype"] for column in dataset["columns"]] == ["int64", "double", "bool"]
    with session_scope() as session:
        stored = load_frame(session.get(Dataset, dataset["id"]))
    pd.testing.assert_frame_equal(stored, frame)


def test_gzipped_csv_upload(client, alice) -> None:
    response = upload(client, alice, "prices.csv.gz", gzip.compress(GOOD_CSV), "application/gzip")
    assert response.status_code == 201, response.text
    assert response.json()["n_rows"] == 3 and response.json()["columns"][0] == {"name": "y", "dtype": "double"}
    assert list((Path(get_settings().data_dir) / "uploads").glob("*")) == []


def _numbers_with(stray: dict[int, str], rows: int = 40) -> bytes:
    """A CSV with columns y (all numbers) and x1 (numbers, except ``stray``: 1-based data row -> text)."""
    lines = ["y,x1"] + [f"{row * 0.5},{stray.get(row, str(row * 1.25))}" for row in range(1, rows + 1)]
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize(
    ("content", "column", "row", "value"),
    [
        pytest.param(b"y,x\n1.0,1\n2.0,two\n3.0,3\n", "x", 2, "two", id="one-of-three"),
        pytest.param(_numbers_with({17: "abc"}), "x1", 17, "abc", id="one-stray-value"),
        pytest.param(_numbers_with({5: "n/a?", 30: "oops"}), "x1", 5, "n/a?", id="first-of-two"),
        pytest.param(_numbers_with({row: "-" for row in range(3, 40, 10)}, rows=200), "x1", 3, "-",
                     id="four-in-two-hundred"),
    ],
)
def test_a_stray_value_in_a_numeric_csv_column_is_a_422_naming_column_row_and_value(
    client, alice, content, column, row, value
) -> None:
    problem = assert_problem(upload(client, alice, "mixed.csv", content), 422)
    assert f"column {column}: value {value!r} in row {row} is not a number" in problem["detail"]
    assert (problem["column"], problem["row"], problem["value"]) == (column, row, value)
    assert problem["errors"][0]["field"] == "file" and problem["errors"][0]["type"] == "column_type"
    assert_nothing_stored()


def test_text_columns_stay_text(client, alice) -> None:
    regions = "\n".join(f"{i},{'abc'[i % 3]},{'abcdefgh'[i % 8]}{i}" for i in range(30))
    content = f"y,region,code\n{regions}\n5,7,z\n".encode()  # one numeric-looking region among 31 letters
    response = upload(client, alice, "regions.csv", content)
    assert response.status_code == 201, response.text
    assert response.json()["columns"] == [{"name": "y", "dtype": "int64"}, {"name": "region", "dtype": "string"},
                                          {"name": "code", "dtype": "string"}]


def test_empty_cells_in_a_numeric_column_are_missing_values_not_text(client, alice) -> None:
    response = upload(client, alice, "gaps.csv", b"y,x\n1.0,1.5\n2.0,\n3.0,NA\n4.0,2.5\n")
    assert response.status_code == 201, response.text
    assert response.json()["columns"] == [{"name": "y", "dtype": "double"}, {"name": "x", "dtype": "double"}]


def test_a_parquet_text_column_of_digits_keeps_the_type_its_writer_chose(client, alice) -> None:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"zip": ["02139", "10001", "x"]}), buffer)
    response = upload(client, alice, "zips.parquet", buffer.getvalue(), "application/vnd.apache.parquet")
    assert response.status_code == 201, response.text
    assert response.json()["columns"] == [{"name": "zip", "dtype": "string"}]


@pytest.mark.parametrize(
    ("name", "content", "media_type", "needle"),
    [
        pytest.param("bad.csv", b"a,b\n1,2\n3,4,5\n", "text/csv", "parse", id="ragged-csv"),
        pytest.param("empty.csv", b"", "text/csv", "empty", id="empty-file"),
        pytest.param("header.csv", b"a,b\n", "text/csv", "no rows", id="header-only"),
        pytest.param("dupes.csv", b"a,a\n1,2\n", "text/csv", "unique", id="duplicate-columns"),
        pytest.param("junk.parquet", b"PAR1 this is not parquet", "application/octet-stream", "parse",
                     id="corrupt-parquet"),
        pytest.param("sheet.xlsx", b"PK\x03\x04", "application/octet-stream", "format", id="unknown-format"),
    ],
)
def test_unreadable_uploads_are_422_and_store_nothing(client, alice, name, content, media_type, needle) -> None:
    problem = assert_problem(upload(client, alice, name, content, media_type), 422)
    assert problem["errors"][0]["field"] == "file"
    assert needle in problem["detail"]
    assert_nothing_stored()


def test_over_limit_upload_is_413_and_stores_nothing(client, alice) -> None:
    big = b"x\n" + b"1234567\n" * (MAX_UPLOAD_BYTES // 8 + 10)
    problem = assert_problem(upload(client, alice, "big.csv", big), 413)
    assert problem["max_upload_bytes"] == MAX_UPLOAD_BYTES
    assert_nothing_stored()


def test_over_limit_upload_without_content_length_is_cut_off_while_streaming(client, alice) -> None:
    boundary = "gpuest-test-boundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.csv\"\r\n"
            "Content-Type: text/csv\r\n\r\nx\n").encode()
    sent: list[int] = []

    def body() -> Iterator[bytes]:
        yield head
        for _ in range(4 * MAX_UPLOAD_BYTES // 4096):
            sent.append(4096)
            yield b"1234567\n" * 512
        yield f"\r\n--{boundary}--\r\n".encode()

    response = client.post("/v1/datasets", content=body(),
                           headers={**alice, "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert "content-length" not in {key.lower() for key in response.request.headers}
    assert_problem(response, 413)
    assert_nothing_stored()


def test_upload_exactly_at_the_limit_is_accepted(client, alice) -> None:
    content = b"x\n" + b"1\n" * ((MAX_UPLOAD_BYTES - 2) // 2)
    assert len(content) == MAX_UPLOAD_BYTES
    response = upload(client, alice, "edge.csv", content)
    assert response.status_code == 201, response.text
    assert response.json()["n_rows"] == (MAX_UPLOAD_BYTES - 2) // 2


def test_wrong_body_shapes(client, alice) -> None:
    assert_problem(client.post("/v1/datasets", json={"file": "a,b"}, headers=alice), 415)
    problem = assert_problem(
        client.post("/v1/datasets", files={"other": ("a.csv", GOOD_CSV, "text/csv")}, headers=alice), 422)
    assert problem["errors"][0]["field"] == "file"
    assert_nothing_stored()


@pytest.mark.both_backends
def test_owner_isolation_and_delete(client, alice, bob) -> None:
    dataset = upload(client, alice, "mine.csv", GOOD_CSV).json()
    stored = Path(get_settings().datasets_dir) / f"{dataset['id']}.parquet"
    assert_problem(client.get(f"/v1/datasets/{dataset['id']}", headers=bob), 404)
    assert_problem(client.delete(f"/v1/datasets/{dataset['id']}", headers=bob), 404)
    assert client.get("/v1/datasets", headers=bob).json()["total"] == 0
    assert stored.exists()
    load_frame(stored)  # a worker's read leaves this host's decoded copy
    wait_for_decoded_copies()
    assert decoded_path(stored).exists()

    assert client.delete(f"/v1/datasets/{dataset['id']}", headers=alice).status_code == 204
    assert not stored.exists()
    assert not decoded_path(stored).exists()
    assert_problem(client.get(f"/v1/datasets/{dataset['id']}", headers=alice), 404)
    assert_problem(client.delete(f"/v1/datasets/{dataset['id']}", headers=alice), 404)


@pytest.mark.both_backends
def test_decoded_copies_of_datasets_deleted_elsewhere_are_pruned(client, alice) -> None:
    kept = upload(client, alice, "kept.csv", GOOD_CSV).json()
    stored = Path(get_settings().datasets_dir) / f"{kept['id']}.parquet"
    load_frame(stored)
    wait_for_decoded_copies()
    orphan = decoded_path(stored).with_name("ds_deleted_on_another_host.arrow")
    orphan.write_bytes(decoded_path(stored).read_bytes())
    being_written = decoded_path(stored).with_name(".x.arrow.123.part")
    being_written.write_bytes(b"half")
    with session_scope() as session:
        assert prune_decoded_copies(session) == 1
        assert prune_decoded_copies(session) == 0
    assert not orphan.exists() and decoded_path(stored).exists() and being_written.exists()


@pytest.mark.both_backends
def test_delete_refuses_while_a_queued_job_uses_the_dataset(client, alice) -> None:
    from kernels.registry import registry

    if "crve_bootstrap" not in registry():
        pytest.skip("crve_bootstrap not registered")
    csv = b"y,x1,g\n" + b"".join(f"{i * 0.5},{i},{i % 4}\n".encode() for i in range(40))
    dataset = upload(client, alice, "panel.csv", csv).json()
    spec = {"kind": "crve_bootstrap",
            "params": {"dataset_id": dataset["id"], "formula": "y ~ x1", "cluster": "g", "param": "x1"}}
    job = client.post("/v1/jobs", json=spec, headers=alice).json()

    problem = assert_problem(client.delete(f"/v1/datasets/{dataset['id']}", headers=alice), 409)
    assert problem["jobs"] == [job["id"]]
    client.post(f"/v1/jobs/{job['id']}/cancel", headers=alice)
    assert client.delete(f"/v1/datasets/{dataset['id']}", headers=alice).status_code == 204


@pytest.mark.both_backends
def test_dataset_list_pages(client, alice) -> None:
    ids = [upload(client, alice, f"d{index}.csv", GOOD_CSV).json()["id"] for index in range(3)]
    first = client.get("/v1/datasets?limit=2", headers=alice).json()
    assert first["total"] == 3 and len(first["items"]) == 2 and first["next"] == "/v1/datasets?limit=2&offset=2"
    second = client.get(first["next"], headers=alice).json()
    assert second["next"] is None
    assert {item["id"] for item in first["items"] + second["items"]} == set(ids)
