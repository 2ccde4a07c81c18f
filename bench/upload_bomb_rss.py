"""Upload attacks at full size against a real API process, and that process's peak RSS under each.

    python bench/upload_bomb_rss.py [--attacks NAME ...] [--json figures.json]

Starts one uvicorn process serving ``api.app:app`` (auth on, embedded SQLite under a temporary data
directory, the settings' default upload limits unless GPUEST_MAX_UPLOAD_* are exported), uploads each attack's
file as an owner would, and reads the process's peak RSS (Linux's VmHWM, reset before each attack through
/proc/<pid>/clear_refs). Prints a Markdown table for bench/RESULTS.md. Everything goes to 127.0.0.1.

Attacks (the files are made here, streamed through zlib or written dictionary-encoded, never held decoded):
- header-1e6, header-4e5: a gzipped CSV header of 10^6 (4x10^5) empty-named columns, then one row;
- parquet-dict-1500, parquet-dict-400, parquet-dict-65536: a 293-byte Parquet file whose rows all point at one
  dictionary-encoded 1 MiB string;
- csv-late-type: 10^7 rows of 25 integer zeros (500 MB of text, about 0.5 MB gzipped), 0.5 in the last row;
- gzip-rows: 104,857,600 rows of "1" gzipped (past the row limit).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


def gzip_stream(path: Path, head: bytes, chunk: bytes, repeats: int, tail: bytes) -> Path:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    with path.open("wb") as handle:
        handle.write(compressor.compress(head))
        for _ in range(repeats):
            handle.write(compressor.compress(chunk))
        handle.write(compressor.compress(tail) + compressor.flush())
    return path


def wide_header(columns: int) -> Callable[[Path], Path]:
    return lambda path: gzip_stream(
        path.with_suffix(".csv.gz"), b"," * (columns - 1) + b"\n", b"", 0, b"1" + b"," * (columns - 1) + b"\n"
    )


def dictionary_bomb(rows: int) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["z" * MIB]))
        target = path.with_suffix(".parquet")
        pq.write_table(
            pa.table({"s": column}), target, store_schema=False, compression="zstd", dictionary_pagesize_limit=2 * MIB
        )
        return target

    return make


def late_type(path: Path) -> Path:
    row = b"0," * 24 + b"0\n"
    return gzip_stream(
        path.with_suffix(".csv.gz"),
        b",".join(b"c%d" % index for index in range(25)) + b"\n",
        row * 100_000,
        100,
        b"0.5," + b"0," * 23 + b"0\n",
    )


def many_rows(path: Path) -> Path:
    return gzip_stream(path.with_suffix(".csv.gz"), b"x\n", b"1\n" * MIB, 100, b"")


ATTACKS: dict[str, Callable[[Path], Path]] = {
    "header-1e6": wide_header(1_000_000),
    "header-4e5": wide_header(400_000),
    "parquet-dict-1500": dictionary_bomb(1500),
    "parquet-dict-400": dictionary_bomb(400),
    "parquet-dict-65536": dictionary_bomb(65_536),
    "csv-late-type": late_type,
    "gzip-rows": many_rows,
}


def kib(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split(f"{field}:")[1].split()[0])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def create_key(env: dict[str, str]) -> str:
    script = (
        "from store.migrate import upgrade_to_head\nfrom store.db import session_scope\n"
        "from store.keys import create_key\nupgrade_to_head()\n"
        "with session_scope() as session:\n    print(create_key(session, 'attacker'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def run(attacks: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpuest-upload-bombs-") as directory:
        root = Path(directory)
        env = {
            **os.environ,
            "GPUEST_DATA_DIR": str(root / "data"),
            "GPUEST_AUTH_ENABLED": "true",
            "GPUEST_KEY_SECRET": "upload-bomb-bench",
            "PYTHONPATH": str(REPO_ROOT),
        }
        for name in ("DATABASE_URL", "GPUEST_DATABASE_URL", "REDIS_URL", "BROKER_URL", "GPUEST_BROKER_URL"):
            env.pop(name, None)
        key = create_key(env)
        port = free_port()
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "api.app:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-access-log",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=900) as client:
                for _ in range(300):
                    try:
                        if client.get("/healthz").status_code == 200:
                            break
                    except httpx.TransportError:
                        time.sleep(0.1)
                idle_kib = kib(server.pid, "VmRSS")
                rows = [attack(client, server.pid, name, ATTACKS[name](root / name)) for name in attacks]
                alive = server.poll() is None
        finally:
            server.terminate()
            server.wait(30)
    return {"idle_rss_mib": round(idle_kib / 1024, 1), "api_alive_after": alive, "attacks": rows}


def attack(client: httpx.Client, pid: int, name: str, upload: Path) -> dict[str, Any]:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM from here
    started = time.perf_counter()
    with upload.open("rb") as handle:
        response = client.post("/v1/datasets", files={"file": (upload.name, handle, "application/octet-stream")})
    seconds = time.perf_counter() - started
    body = response.json()
    outcome = (
        (body.get("limit") or body.get("detail", "")[:80])
        if response.status_code >= 400
        else (f"{body['n_rows']} rows, {[column['dtype'] for column in body['columns']][:3]}")
    )
    if response.status_code == 201:
        client.delete(f"/v1/datasets/{body['id']}")
    row = {
        "attack": name,
        "bytes_sent": upload.stat().st_size,
        "status": response.status_code,
        "outcome": outcome,
        "seconds": round(seconds, 2),
        "peak_rss_mib": round(kib(pid, "VmHWM") / 1024, 1),
        "rss_after_mib": round(kib(pid, "VmRSS") / 1024, 1),
    }
    print(json.dumps(row), file=sys.stderr, flush=True)
    upload.unlink()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attacks", nargs="+", choices=sorted(ATTACKS), default=list(ATTACKS))
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    arguments = parser.parse_args()
    figures = run(arguments.attacks)
    figures.update(
        date=datetime.now(UTC).isoformat(timespec="minutes"),
        machine=f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}",
    )
    if arguments.json:
        arguments.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(
        f"API process idle: {figures['idle_rss_mib']} MiB RSS; alive after every attack: "
        f"{figures['api_alive_after']} ({figures['machine']}, {figures['date']})\n"
    )
    print("| attack | sent | answer | seconds | peak API RSS | RSS after |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in figures["attacks"]:
        print(
            f"| {row['attack']} | {row['bytes_sent']:,} B | {row['status']} {row['outcome']} | {row['seconds']} | "
            f"{row['peak_rss_mib']} MiB | {row['rss_after_mib']} MiB |"
        )


if __name__ == "__main__":
    main()
