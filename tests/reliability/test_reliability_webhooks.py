"""Webhook delivery under attack, on a PostgreSQL cluster of this module's own: two delivery threads (as two
workers run them, each one pass of ``deliver_once`` after another) share the ``webhook_deliveries`` rows.

- Fairness: one owner's tarpit receivers (a status line trickled one byte at a time, each byte well within
  any per-read timeout) must not hold another owner's delivery longer than one attempt deadline.
- Exactly once: deliveries to a receiver that answers late, but within the deadline, are POSTed once each,
  with no fault at all (the lease covers each attempt, not a queue of them). The lease margin is scaled down
  with the deadline so that the test stays short.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import delete, select

from core.settings import get_settings
from store import db
from store.db import session_scope
from store.migrate import upgrade_to_head
from store.models import WebhookDelivery, utcnow
from tests.reliability import figures
from tests.reliability.conftest import Servers
from tests.webhook_receiver import Receiver
from worker import webhooks as worker_webhooks

pytestmark = pytest.mark.reliability

DEADLINE_SECONDS = 1.5
TRICKLE_SECONDS_PER_BYTE = 0.05  # 30 s for the whole tarpit reply
WORKERS = 2


def clear_cached_settings() -> None:
    get_settings.cache_clear()
    db.engine_for.cache_clear()
    db._session_factory.cache_clear()


@pytest.fixture(scope="module")
def database_url(servers: Servers) -> str:
    url = servers.postgres.create_database("gpuest_webhooks")
    upgrade_to_head(url)
    return url


@pytest.fixture
def webhook_env(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    values = {
        "DATABASE_URL": database_url,
        "GPUEST_DATA_DIR": str(tmp_path / "var"),
        "GPUEST_WEBHOOK_TIMEOUT_SECONDS": str(DEADLINE_SECONDS),
        "GPUEST_WEBHOOK_INTERVAL_SECONDS": "0.05",
        "GPUEST_WEBHOOK_MAX_ATTEMPTS": "1",
        "GPUEST_WEBHOOK_ALLOWED_NETWORKS": '["127.0.0.0/8"]',
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    clear_cached_settings()
    with session_scope() as session:
        session.execute(delete(WebhookDelivery))
    yield
    clear_cached_settings()


def add_pending(owner: str, url: str) -> int:
    """A delivery due now, as activation leaves it (its job need not exist for the attempt)."""
    with session_scope() as session:
        row = WebhookDelivery(
            subject_type="job",
            subject_id=f"job-of-{owner}-{time.monotonic_ns()}",
            owner=owner,
            url=url,
            status="pending",
            attempts=0,
            attempt_log=[],
            body='{"event":"job.finished"}',
            next_attempt_at=utcnow(),
        )
        session.add(row)
        session.flush()
        return row.id


def status_of(delivery_id: int) -> str:
    with session_scope() as session:
        return session.scalar(select(WebhookDelivery.status).where(WebhookDelivery.id == delivery_id)) or "gone"


def wait_until(predicate, timeout: float, interval: float = 0.02) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


@contextmanager
def delivery_threads(count: int) -> Iterator[None]:
    """``count`` workers' delivery threads: each one pass after another until the block ends."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            worker_webhooks.deliver_once()
            stop.wait(get_settings().webhook_interval_seconds)

    threads = [threading.Thread(target=run, daemon=True, name=f"delivery-{index}") for index in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=DEADLINE_SECONDS + 5)


def test_a_tarpit_target_delays_another_owners_delivery_by_at_most_one_attempt_deadline(webhook_env) -> None:
    tarpits = [Receiver([], default=("trickle", TRICKLE_SECONDS_PER_BYTE)) for _ in range(2)]
    fast = Receiver([], default=204)
    try:
        with delivery_threads(WORKERS):
            # one tarpit delivery, then another once the first is in flight (each worker takes one, as when
            # they come due apart), then more than the attacker's slots on both workers together
            for index in range(8):
                add_pending("mallory", tarpits[index % 2].url)
                if index < WORKERS:
                    assert wait_until(lambda n=index + 1: sum(len(t.requests) for t in tarpits) >= n, 10), (
                        "the tarpit attempts did not start"
                    )
            time.sleep(0.3)  # every delivery thread has had its pass
            started = time.monotonic()
            victim = add_pending("alice", fast.url)
            delivered = wait_until(lambda: status_of(victim) == "delivered", 4 * DEADLINE_SECONDS)
            delay = time.monotonic() - started
            tarpit_attempts = sum(len(tarpit.requests) for tarpit in tarpits)
    finally:
        for receiver in (*tarpits, fast):
            receiver.close()
    figures.record(
        "webhook_fairness",
        other_owner_delay_seconds=round(delay, 3),
        deadline_seconds=DEADLINE_SECONDS,
        tarpit_deliveries=8,
        tarpit_attempts_started=tarpit_attempts,
        workers=WORKERS,
    )
    assert delivered, f"another owner's delivery still pending after {delay:.1f} s behind the tarpits"
    assert delay <= DEADLINE_SECONDS, f"delayed {delay:.2f} s (deadline {DEADLINE_SECONDS} s)"


def test_deliveries_to_a_slow_receiver_are_posted_once_each_without_faults(webhook_env, monkeypatch) -> None:
    monkeypatch.setattr(worker_webhooks, "LEASE_MARGIN_SECONDS", 0.5)  # scaled with the deadline
    # an attempt the loaded machine lets run past the deadline is retried: a second POST it accounts for
    monkeypatch.setenv("GPUEST_WEBHOOK_MAX_ATTEMPTS", "3")
    monkeypatch.setenv("GPUEST_WEBHOOK_BACKOFF_SECONDS", "0.1")
    clear_cached_settings()
    answer_after = 0.3  # well within the deadline
    count = 25
    receiver = Receiver([], default=("sleep", answer_after))
    try:
        ids = [add_pending(f"owner-{index % 5}", receiver.url) for index in range(count)]
        started = time.monotonic()
        with delivery_threads(WORKERS):
            settled = wait_until(lambda: all(status_of(delivery) != "pending" for delivery in ids), 60, interval=0.1)
            seconds = time.monotonic() - started
            time.sleep(DEADLINE_SECONDS)  # any late second attempt would arrive by now
        posts = Counter(int(headers["x-gpuest-delivery"]) for _, headers, _ in receiver.requests)
    finally:
        receiver.close()
    with session_scope() as session:
        rows = {row.id: row for row in session.scalars(select(WebhookDelivery).where(WebhookDelivery.id.in_(ids)))}
        statuses = Counter(row.status for row in rows.values())
        attempts = {delivery: (row.attempts, len(row.attempt_log)) for delivery, row in rows.items()}
    # a duplicate: a POST that no recorded attempt accounts for
    duplicates = sum(max(0, posts[delivery] - attempts[delivery][0]) for delivery in ids)
    figures.record(
        "webhook_exactly_once",
        deliveries=count,
        posts=sum(posts.values()),
        duplicates=duplicates,
        retried=sum(1 for made, _ in attempts.values() if made > 1),
        receiver_answer_seconds=answer_after,
        deadline_seconds=DEADLINE_SECONDS,
        workers=WORKERS,
        seconds_to_deliver_all=round(seconds, 2),
    )
    assert settled, "deliveries still pending after 60 s"
    assert statuses == {"delivered": count}, statuses
    assert duplicates == 0, posts
    assert all(made == logged for made, logged in attempts.values())
