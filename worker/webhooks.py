"""Webhook delivery, run by every worker in a thread beside the reaper: each pass fixes the body of
deliveries whose job or group has finished, claims the due ones and POSTs each once, signed
(store/webhooks.py has the scheme). A failed attempt is retried with exponential backoff up to
``webhook_max_attempts``; every attempt is recorded on the row and in the job's event log. The rows are the
truth, so a worker restart loses nothing: a delivery a dead worker held is due again once its lease ends.

Each attempt: redirects never followed (a 3xx is a failure), connect and read timeouts of
``webhook_timeout_seconds``, no proxy or .netrc from the environment, the response body never read. The
target is checked again against the server's settings (they may have changed since the submission).
"""

from __future__ import annotations

import time
import traceback
from datetime import timedelta

import httpx
import structlog

from core.settings import Settings, get_settings
from store import webhooks as webhook_store
from store.db import session_scope
from store.webhooks import AttemptOutcome, ClaimedDelivery
from worker.infra import describe, forget_dead_connections, is_infrastructure_error

log = structlog.get_logger("gpuest.webhooks")

USER_AGENT = "gpuest-webhook/1"
# A claimed attempt is the worker's for its timeout plus this margin; then another worker may take it.
LEASE_MARGIN_SECONDS = 30.0
DELIVERIES_PER_PASS = 20


def http_client(settings: Settings) -> httpx.Client:
    return httpx.Client(follow_redirects=False, trust_env=False, headers={"User-Agent": USER_AGENT},
                        timeout=httpx.Timeout(settings.webhook_timeout_seconds))


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


def attempt_delivery(claimed: ClaimedDelivery, client: httpx.Client, settings: Settings) -> AttemptOutcome:
    """POST the body once. The outcome says what the delivery log may show: a status code or a fixed phrase."""
    refused = webhook_store.callback_url_problem(claimed.url, settings)
    if refused is not None:
        return AttemptOutcome(False, None, "target not allowed by this server's webhook settings", 0.0, final=True)
    started = time.perf_counter()
    try:
        request = client.build_request("POST", claimed.url, content=claimed.body.encode(),
                                       headers=signed_headers(claimed, int(time.time())))
        response = client.send(request, stream=True)  # the receiver's body is never read
        response.close()
    except httpx.TimeoutException:
        return AttemptOutcome(False, None, "timeout", time.perf_counter() - started)
    except httpx.ConnectError:
        return AttemptOutcome(False, None, "connection failed", time.perf_counter() - started)
    except httpx.HTTPError:
        return AttemptOutcome(False, None, "request failed", time.perf_counter() - started)
    except httpx.InvalidURL:  # a URL the submission check let through but the client cannot send to
        return AttemptOutcome(False, None, "not a valid URL", 0.0, final=True)
    seconds = time.perf_counter() - started
    code = response.status_code
    if 200 <= code < 300:
        return AttemptOutcome(True, code, None, seconds)
    if 300 <= code < 400:
        return AttemptOutcome(False, code, f"redirect not followed (HTTP {code})", seconds)
    return AttemptOutcome(False, code, f"HTTP {code}", seconds)


def deliver_once(settings: Settings | None = None) -> dict[str, int]:
    """One pass: activate finished subjects' deliveries, then attempt the due ones. Returns counts."""
    settings = settings or get_settings()
    with session_scope() as session:
        activated = webhook_store.activate_finished(session, settings)
    lease = timedelta(seconds=settings.webhook_timeout_seconds + LEASE_MARGIN_SECONDS)
    with session_scope() as session:
        claimed = webhook_store.claim_due(session, lease=lease, limit=DELIVERIES_PER_PASS)
    counts = {"activated": len(activated), "delivered": 0, "retrying": 0, "failed": 0}
    if not claimed:
        return counts
    with http_client(settings) as client:
        for delivery in claimed:
            outcome = attempt_delivery(delivery, client, settings)
            with session_scope() as session:
                status = webhook_store.record_attempt(session, delivery, outcome, settings)
            key = {"delivered": "delivered", "failed": "failed", "pending": "retrying"}.get(status)
            if key:
                counts[key] += 1
            log.info("webhook attempt", delivery_id=delivery.id, subject=delivery.subject_type.value,
                     subject_id=delivery.subject_id, attempt=delivery.attempt, status=status,
                     status_code=outcome.status_code, error=outcome.error)
    return counts


def webhook_loop(interval: float) -> None:
    """The worker's delivery thread (started with the reaper)."""
    while True:
        time.sleep(interval)
        try:
            deliver_once()
        except Exception as exc:
            if is_infrastructure_error(exc):
                forget_dead_connections(exc)
                log.warning("webhook pass skipped: database unavailable", error=describe(exc))
            else:
                log.error("webhook pass failed", traceback=traceback.format_exc())
