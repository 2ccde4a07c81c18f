"""A request uvicorn's parser refuses (a control character in a header) gets a problem+json 400 when uvicorn
runs with ``--http api.http_protocol:...``; a real uvicorn process on a free loopback port, raw sockets."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


@pytest.fixture(params=["ProblemHttpToolsProtocol", "ProblemH11Protocol"])
def server(request: pytest.FixtureRequest, api_env: dict[str, str]) -> Iterator[int]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "api.app:app", "--host", "127.0.0.1", "--port", str(port),
         "--http", f"api.http_protocol:{request.param}", "--log-level", "warning"],
        cwd=ROOT, env={**os.environ, **api_env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if b" 200 " in exchange(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"):
                    break
            except OSError:
                pass
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.2)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.mark.slow
def test_a_control_character_in_a_header_is_a_problem_json_400(server) -> None:
    for value in (b"a\x00b", b"a\rb"):
        answer = exchange(server, b"GET /v1/jobs HTTP/1.1\r\nHost: t\r\nX-Bad: " + value + b"\r\n\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), answer
        assert b"content-type: application/problem+json" in head.lower() and b"connection: close" in head.lower()
        problem = json.loads(body)
        assert problem["status"] == 400 and problem["type"].endswith("malformed-request")

    # Valid requests are served as before (auth is on in api_env: the app itself answered).
    answer = exchange(server, b"GET /v1/jobs HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401"), answer
