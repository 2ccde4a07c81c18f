"""Helpers shared by the API tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import sqlite3
from typing import Any

import httpx

# Small, so the over-limit tests send little.
MAX_UPLOAD_BYTES = 64 * 1024


def broker_message_count(env: dict[str, str]) -> int:
    """Messages waiting in the test's queue on the broker (what a worker would consume)."""
    url = env["GPUEST_BROKER_URL"]
    if url.startswith("redis"):
        import redis

        # kombu keeps one list per priority step: the queue's name, then "<queue>\x06\x16<step>" (core.queue)
        from core.queue import REDIS_PRIORITY_STEPS

        client = redis.Redis.from_url(url)
        queue = env["GPUEST_QUEUE"]
        return sum(int(client.llen(f"{queue}\x06\x16{step}" if step else queue)) for step in REDIS_PRIORITY_STEPS)
    path = url.removeprefix("sqla+sqlite:///")
    with sqlite3.connect(path) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "kombu_message" not in tables:  # kombu creates its tables with the first message
            return 0
        return int(connection.execute("SELECT count(*) FROM kombu_message").fetchone()[0])


MONTECARLO = {"n_clusters": 10, "cluster_size": 5, "n_regressors": 2, "replications": 20, "seed": 7}


def montecarlo_spec(**overrides: object) -> dict[str, object]:
    return {"kind": "crve_montecarlo", "params": {**MONTECARLO, **overrides}}


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """The response is an RFC 9457 problem with this status; returns its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert {"type", "title", "status", "detail"} <= set(body), body
    assert body["status"] == status
    assert "Traceback" not in response.text
    return body
