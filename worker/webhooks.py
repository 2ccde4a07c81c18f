"""Webhook delivery, run by every worker in a thread beside the reaper: each pass fixes the body of
deliveries whose job or group has finished, then claims due deliveries for the free slots of a pool of
``webhook_concurrency`` threads and POSTs each once, signed (store/webhooks.py has the scheme). A failed attempt
is retried with exponential backoff up to ``webhook_max_attempts``; every attempt is recorded on the row and in
the job's event log. The rows are the truth, so a worker restart loses nothing: a delivery a dead worker held
is due again once its lease ends.

Fairness: one owner's deliveries hold at most ``webhook_owner_concurrency`` of a worker's slots, and each
attempt ends at its deadline, so a receiver that answers slowly (or not at all) delays another owner's
delivery by at most one attempt deadline. A row is claimed right before its attempt starts, with a lease of
one attempt deadline plus a margin: no other worker takes it while the attempt can still be running.

Each attempt: the target is checked again against the server's settings and its host resolved and vetted
(store/webhook_targets.py; the connection goes to the vetted addresses), then one POST under a total deadline
of ``webhook_timeout_seconds`` (worker/webhook_transport.py): redirects never followed (a 3xx is a failure),
no proxy or .netrc from the environment, the response body never read. The log shows a status code or one of
a few fixed phrases: every failure without an HTTP status reads the same, so the log tells nothing of what
listens at an address.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpcore
import httpx
import structlog

from core.settings import Settings, get_settings
from store import webhook_targets
from store import webhooks as webhook_store
from store.db import session_scope
from store.webhooks import AttemptOutcome, ClaimedDelivery
from worker import webhook_transport
from worker.infra import describe, forget_dead_connections, is_infrastructure_error

log = structlog.get_logger("gpuest.webhooks")

USER_AGENT = "gpuest-webhook/1"
# A claimed attempt is the worker's for its deadline plus this margin; then another worker may take it.
LEASE_MARGIN_SECONDS = 30.0
NO_RESPONSE = "no HTTP response"
NOT_ALLOWED = "target not allowed by this server's webhook settings"
TRANSPORT_ERRORS = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
                    httpcore.UnsupportedProtocol, httpcore.ProxyError, httpcore.ConnectionNotAvailable, OSError)
STATUS_COUNTS = {"delivered": "delivered", "failed": "failed", "pending": "retrying"}


def signed_headers(claimed: ClaimedDelivery, timestamp: int) -> dict[str, str]:
    body = claimed.body.encode()
    return {
        "Content-Type": "application/json",
        webhook_store.TIMESTAMP_HEADER: str(timestamp),
        webhook_store.SIGNATURE_HEADER: webhook_store.signature(webhook_store.owner_secret(claimed.owner), timestamp,
                                                                body),
        webhook_store.DELIVERY_HEADER: str(claimed.id),
        webhook_store.EVENT_HEADER: f"{claimed.subject_type.value}.finished",
    }


def attempt_delivery(claimed: ClaimedDelivery, settings: Settings) -> AttemptOutcome:
    """POST the body once. The outcome says what the delivery log may show: a status code or a fixed phrase."""
    if webhook_store.callback_url_problem(claimed.url, settings) is not None:
        return AttemptOutcome(False, None, NOT_ALLOWED, 0.0, final=True)
    started = time.perf_counter()
    host, port = webhook_store.host_and_port(claimed.url)
    try:
        addresses = webhook_targets.vetted_addresses(host, port, settings)
    except webhook_targets.TargetRefused:
        return AttemptOutcome(False, None, NOT_ALLOWED, 0.0, final=True)
    except OSError:  # the name does not resolve now: perhaps later
        return AttemptOutcome(False, None, NO_RESPONSE, time.perf_counter() - started)
    left = settings.webhook_timeout_seconds - (time.perf_counter() - started)
    try:
        if left <= 0:
            raise httpcore.ConnectTimeout("the attempt's deadline passed while resolving its host")
        response = webhook_transport.post(claimed.url, claimed.body.encode(),
                                          signed_headers(claimed, int(time.time())), addresses, left)
    except httpx.InvalidURL:  # a URL the submission check let through but the client cannot send to
        return AttemptOutcome(False, None, "not a valid URL", 0.0, final=True)
    except TRANSPORT_ERRORS:
        return AttemptOutcome(False, None, NO_RESPONSE, time.perf_counter() - started)
    seconds = time.perf_counter() - started
    code = response.status_code
    if 200 <= code < 300:
        return AttemptOutcome(True, code, None, seconds)
    if 300 <= code < 400:
        return AttemptOutcome(False, code, f"redirect not followed (HTTP {code})", seconds)
    return AttemptOutcome(False, code, f"HTTP {code}", seconds)


def lease_for(settings: Settings) -> timedelta:
    return timedelta(seconds=settings.webhook_timeout_seconds + LEASE_MARGIN_SECONDS)


class Dispatcher:
    """A worker's delivery attempts in flight on a pool of ``webhook_concurrency`` threads, at most
    ``webhook_owner_concurrency`` of them one owner's. Only one thread calls :meth:`fill`."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="gpuest-webhook")
        self._lock = threading.Lock()
        self._owners: Counter[str] = Counter()
        self._in_flight = 0
        self.finished = threading.Event()  # set each time an attempt ends (a slot is free)
        self.counts = {"delivered": 0, "retrying": 0, "failed": 0}

    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def fill(self, settings: Settings, exclude_ids: Iterable[int] = ()) -> list[int]:
        """Claim due deliveries for the free slots and start each at once. Returns the ids started."""
        with self._lock:
            free = self.concurrency - self._in_flight
            busy = dict(self._owners)
        if free <= 0:
            return []
        with session_scope() as session:
            claimed = webhook_store.claim_due(session, lease=lease_for(settings), limit=free, owners_busy=busy,
                                              owner_limit=settings.webhook_owner_concurrency,
                                              exclude_ids=exclude_ids)
        for delivery in claimed:
            with self._lock:
                self._in_flight += 1
                self._owners[delivery.owner] += 1
            self._pool.submit(self._run, delivery, settings)
        return [delivery.id for delivery in claimed]

    def _run(self, delivery: ClaimedDelivery, settings: Settings) -> None:
        try:
            outcome = attempt_delivery(delivery, settings)
            with session_scope() as session:
                status = webhook_store.record_attempt(session, delivery, outcome, settings)
            log.info("webhook attempt", delivery_id=delivery.id, subject=delivery.subject_type.value,
                     subject_id=delivery.subject_id, attempt=delivery.attempt, status=status,
                     status_code=outcome.status_code, error=outcome.error)
            with self._lock:
                if status in STATUS_COUNTS:
                    self.counts[STATUS_COUNTS[status]] += 1
        except Exception as exc:  # the row is due again once its lease is over
            if is_infrastructure_error(exc):
                forget_dead_connections(exc)
                log.warning("webhook attempt not recorded: database unavailable", delivery_id=delivery.id,
                            error=describe(exc))
            else:
                log.error("webhook attempt failed", delivery_id=delivery.id, traceback=traceback.format_exc())
        finally:
            with self._lock:
                self._in_flight -= 1
                self._owners[delivery.owner] -= 1
                if self._owners[delivery.owner] <= 0:
                    del self._owners[delivery.owner]
            self.finished.set()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def activate(settings: Settings) -> int:
    with session_scope() as session:
        return len(webhook_store.activate_finished(session, settings))


def deliver_once(settings: Settings | None = None) -> dict[str, int]:
    """One pass: activate finished subjects' deliveries, then attempt every delivery due during the pass once,
    as the worker's thread does (concurrently, within the owners' limits). Returns counts."""
    settings = settings or get_settings()
    activated = activate(settings)
    dispatcher = Dispatcher(settings.webhook_concurrency)
    attempted: set[int] = set()
    try:
        while True:
            dispatcher.finished.clear()
            attempted.update(dispatcher.fill(settings, exclude_ids=attempted))
            if dispatcher.in_flight() == 0:
                break
            dispatcher.finished.wait(timeout=min(settings.webhook_interval_seconds, 1.0))  # or newly due rows
    finally:
        dispatcher.close()
    return {"activated": activated, **dispatcher.counts}


def webhook_loop(interval: float) -> None:
    """The worker's delivery thread (started with the reaper): activates finished subjects' deliveries every
    ``interval`` and fills free slots as soon as an attempt ends."""
    dispatcher = Dispatcher(get_settings().webhook_concurrency)
    last_activation = float("-inf")
    while True:
        dispatcher.finished.wait(timeout=interval)
        dispatcher.finished.clear()
        try:
            settings = get_settings()
            if time.monotonic() - last_activation >= interval:
                last_activation = time.monotonic()
                activate(settings)
            dispatcher.fill(settings)
        except Exception as exc:
            if is_infrastructure_error(exc):
                forget_dead_connections(exc)
                log.warning("webhook pass skipped: database unavailable", error=describe(exc))
            else:
                log.error("webhook pass failed", traceback=traceback.format_exc())
