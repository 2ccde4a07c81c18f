"""Per-owner quotas (issue 16): queued plus running jobs (429 with Retry-After, a replayed POST never refused)
and stored dataset bytes (429 before or after the upload is read, nothing stored)."""

from __future__ import annotations

import pytest
from api_helpers import assert_problem, montecarlo_spec
from conftest import clear_cached_settings


@pytest.fixture
def quotas(api_env, monkeypatch: pytest.MonkeyPatch):
    def set_quotas(**values: int) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"GPUEST_{name.upper()}", str(value))
        clear_cached_settings()

    yield set_quotas
    clear_cached_settings()


@pytest.mark.both_backends
def test_the_running_jobs_quota_answers_429_with_retry_after(client, alice, bob, quotas) -> None:
    quotas(max_active_jobs_per_owner=2, quota_retry_after_seconds=45)
    first = client.post("/v1/jobs", json=montecarlo_spec(seed=1), headers={**alice, "Idempotency-Key": "k1"})
    assert first.status_code == 202
    assert client.post("/v1/jobs", json=montecarlo_spec(seed=2), headers=alice).status_code == 202
    refused = client.post("/v1/jobs", json=montecarlo_spec(seed=3), headers=alice)
    problem = assert_problem(refused, 429)
    assert refused.headers["retry-after"] == "45" and problem["limit"] == 2 and problem["active"] == 2
    # a retried POST of an existing job is a replay, not a new job
    replay = client.post("/v1/jobs", json=montecarlo_spec(seed=1), headers={**alice, "Idempotency-Key": "k1"})
    assert replay.status_code == 202 and replay.json()["id"] == first.json()["id"]
    assert client.post("/v1/jobs", json=montecarlo_spec(seed=4), headers=bob).status_code == 202  # per owner
    # a cancelled job frees its place
    assert client.post(f"/v1/jobs/{first.json()['id']}/cancel", headers=alice).status_code == 200
    assert client.post("/v1/jobs", json=montecarlo_spec(seed=5), headers=alice).status_code == 202


def _upload(client, headers, rows: int):
    csv = b"y,x\n" + b"".join(f"{i},{i * 0.5}\n".encode() for i in range(rows))
    return client.post("/v1/datasets", files={"file": ("d.csv", csv, "text/csv")}, headers=headers)


@pytest.mark.both_backends
def test_the_storage_quota_counts_stored_bytes_and_stores_nothing_beyond(client, alice, bob, quotas) -> None:
    first = _upload(client, alice, 50)
    assert first.status_code == 201
    size = first.json()["size_bytes"]
    quotas(max_stored_bytes_per_owner=size + size // 2)  # room for half of another such file
    refused = _upload(client, alice, 50)
    problem = assert_problem(refused, 429)
    assert problem["used"] == size and "beyond" in problem["detail"] and refused.headers["retry-after"]
    assert [d["id"] for d in client.get("/v1/datasets", headers=alice).json()["items"]] == [first.json()["id"]]
    assert _upload(client, bob, 50).status_code == 201  # bob's own quota
    assert client.delete(f"/v1/datasets/{first.json()['id']}", headers=alice).status_code == 204
    assert _upload(client, alice, 50).status_code == 201
    quotas(max_stored_bytes_per_owner=size)  # full: refused before the body is read
    assert "your datasets take" in assert_problem(_upload(client, alice, 5), 429)["detail"]
