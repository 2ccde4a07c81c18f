"""Webhooks through real worker processes (issue 16): the worker's delivery thread announces a finished job;
a delivery whose first attempt failed survives the worker being killed with SIGKILL, and the next worker
sends it once its backoff is over (the row in the database, not the process, holds the state)."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterator
from datetime import datetime

import pytest
from conftest import SMALL, WorkerProcess, load, submit, wait_for

from core.status import JobStatus
from store import webhooks as webhook_store
from store.db import session_scope
from store.models import WebhookDelivery
from tests.webhook_receiver import Receiver

BACKOFF_SECONDS = 3.0


@pytest.fixture
def webhook_env(stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {"GPUEST_WEBHOOK_INTERVAL_SECONDS": "0.2", "GPUEST_WEBHOOK_BACKOFF_SECONDS": str(BACKOFF_SECONDS),
              "GPUEST_WEBHOOK_ALLOWED_NETWORKS": '["127.0.0.0/8"]'}  # the receiver is on loopback
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    stack_env.update(values)
    return stack_env


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver([500, 200])
    yield made
    made.close()


def delivery_of(job_id: str) -> WebhookDelivery:
    with session_scope() as session:
        rows = webhook_store.deliveries_for(session, webhook_store.SubjectType.JOB, [job_id])
        return rows[job_id]


@pytest.mark.slow
def test_a_delivery_outlives_a_killed_worker_and_keeps_its_backoff(
    webhook_env: dict[str, str], start_worker: Callable[[], WorkerProcess], receiver: Receiver
) -> None:
    job_id = submit(SMALL)
    with session_scope() as session:
        webhook_store.register(session, webhook_store.SubjectType.JOB, job_id, "tester", receiver.url)
    first = start_worker()
    wait_for(lambda: len(receiver.requests) == 1 and delivery_of(job_id).attempts == 1, 60,
             "the first (failing) delivery attempt")
    first.kill_hard()
    assert load(job_id).status == JobStatus.SUCCEEDED
    assert delivery_of(job_id).status == "pending"

    start_worker()
    wait_for(lambda: delivery_of(job_id).status == "delivered", 60, "the delivery by the second worker")
    row = delivery_of(job_id)
    assert [entry["status_code"] for entry in row.attempt_log] == [500, 200] and row.attempts == 2
    first_at, second_at = (datetime.fromisoformat(entry["at"]) for entry in row.attempt_log)
    assert (second_at - first_at).total_seconds() >= BACKOFF_SECONDS - 0.05
    assert len(receiver.requests) == 2

    _, headers, raw = receiver.requests[1]
    secret = webhook_store.owner_secret("tester")
    expected = "sha256=" + hmac.new(secret.encode(), headers["x-gpuest-timestamp"].encode() + b"." + raw,
                                    hashlib.sha256).hexdigest()
    assert headers["x-gpuest-signature"] == expected
    assert json.loads(raw)["id"] == job_id and json.loads(raw)["status"] == "succeeded"
