"""Webhooks: a job or job group submitted with a ``callback_url`` is announced to that URL once it
finishes, with a signed JSON body; the rows of ``webhook_deliveries`` are the truth, so a worker restart loses
no delivery.

Signing. Each owner has a signing secret derived from the server's webhook secret:
``whsec_`` + hex(HMAC-SHA256(server secret, "gpuest-webhook-v1:" + owner)); the owner reads it at
``GET /v1/webhooks/secret``. Derived, not stored: nothing to migrate, and one owner's secret tells nothing of
another's (a shared secret would let any receiver forge deliveries to every other). A delivery carries
``X-Gpuest-Timestamp: <unix seconds>`` and
``X-Gpuest-Signature: sha256=<hex of HMAC-SHA256(owner secret, timestamp + "." + body)>``; a receiver
recomputes it over the raw body and refuses old timestamps (replays). The server secret is
``GPUEST_WEBHOOK_SECRET``, or one generated once into ``<data_dir>/webhook_secret`` (mode 0600), like the
API keys' secret; changing it changes every owner's signing secret.

Lifecycle of a row: ``waiting`` (its subject is not finished) -> ``pending`` (the body is fixed; attempts due
at ``next_attempt_at``, backing off exponentially after failures) -> ``delivered`` or ``failed``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from core.settings import Settings, get_settings
from core.status import TERMINAL_STATUSES, JobStatus
from store import webhook_targets
from store.db import storable_text
from store.events import EventLevel, EventType, add_event
from store.group_summary import summarize
from store.keys import read_or_create_secret_file
from store.models import Job, JobGroup, WebhookDelivery, utcnow

SECRET_FILE_NAME = "webhook_secret"
SIGNATURE_HEADER = "X-Gpuest-Signature"
TIMESTAMP_HEADER = "X-Gpuest-Timestamp"
DELIVERY_HEADER = "X-Gpuest-Delivery"
EVENT_HEADER = "X-Gpuest-Event"
OWNER_SECRET_PREFIX = "whsec_"
MAX_URL_CHARS = 2000
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})

_secret_lock = threading.Lock()
_secret_cache: dict[str, bytes] = {}


class SubjectType(StrEnum):
    JOB = "job"
    GROUP = "group"


class DeliveryStatus(StrEnum):
    WAITING = "waiting"
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


# -- the target ----------------------------------------------------------------------------------------

def is_loopback_host(host: str) -> bool:
    if host.lower().rstrip(".") in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def callback_url_problem(url: str, settings: Settings) -> str | None:
    """Why this server does not call ``url`` (None when it does): https to any host; http only to a loopback
    address, a host in ``webhook_http_hosts``, or anywhere with ``webhook_allow_http``; no credentials in the
    URL (they would be logged and shown on the job)."""
    if len(url) > MAX_URL_CHARS:
        return f"at most {MAX_URL_CHARS} characters"
    if not storable_text(url) or any(ord(char) <= 0x20 or ord(char) == 0x7F for char in url):
        return "must not contain spaces or control characters (percent-encode them)"
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError:
        return "not a valid URL"
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http") or not host:
        return "must be an absolute https:// URL (or http:// to a loopback address)"
    if parts.username is not None or parts.password is not None:
        return "must not hold credentials (user:password@); authenticate the delivery by its signature"
    if parts.fragment:
        return "must not have a #fragment"
    if scheme == "http" and not (
        settings.webhook_allow_http or is_loopback_host(host) or host.lower() in _lowered(settings.webhook_http_hosts)
    ):
        return ("plain http is accepted only for loopback addresses (127.0.0.1, ::1, localhost); use https, or ask "
                "the operator to allow this host (GPUEST_WEBHOOK_HTTP_HOSTS) or http (GPUEST_WEBHOOK_ALLOW_HTTP)")
    return None


def host_and_port(url: str) -> tuple[str, int]:
    """The host and port a checked ``url`` connects to (the scheme's port when it names none)."""
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme.lower() == "https" else 80)


def target_problem(url: str, settings: Settings) -> str | None:
    """Why this server does not call the host of a well-formed ``url`` (None when it does): the addresses its
    host resolves to (store/webhook_targets.py). One answer for a name that does not resolve and one that
    resolves to a refused address, so the check tells nothing of a private network's names."""
    host, port = host_and_port(url)
    try:
        webhook_targets.vetted_addresses(host, port, settings)
    except (webhook_targets.TargetRefused, OSError):
        return webhook_targets.REFUSED_TARGET
    return None


def _lowered(hosts: Sequence[str]) -> set[str]:
    return {host.lower() for host in hosts}


def target_host(url: str) -> str:
    """The host (and port) a log line names: never the path or query, which may carry a receiver's token."""
    parts = urlsplit(url)
    return parts.netloc.rsplit("@", 1)[-1] or "?"


# -- signing -------------------------------------------------------------------------------------------

def server_secret() -> bytes:
    settings = get_settings()
    if settings.webhook_secret is not None:
        return settings.webhook_secret.get_secret_value().encode()
    path = (settings.data_dir / SECRET_FILE_NAME).resolve()
    with _secret_lock:
        if str(path) not in _secret_cache:
            _secret_cache[str(path)] = read_or_create_secret_file(path)
        return _secret_cache[str(path)]


def owner_secret(owner: str) -> str:
    """The signing secret of ``owner``'s deliveries (what the receiver checks the signature with)."""
    digest = hmac.new(server_secret(), f"gpuest-webhook-v1:{owner}".encode(), hashlib.sha256).hexdigest()
    return OWNER_SECRET_PREFIX + digest


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256(secret, "<timestamp>." + body)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


# -- rows ----------------------------------------------------------------------------------------------

def register(session: Session, subject_type: SubjectType, subject_id: str, owner: str, url: str) -> WebhookDelivery:
    """The delivery of a new job or group (part of the caller's transaction), waiting for it to finish."""
    delivery = WebhookDelivery(subject_type=subject_type.value, subject_id=subject_id, owner=owner, url=url,
                               status=DeliveryStatus.WAITING.value, attempts=0, attempt_log=[])
    session.add(delivery)
    session.flush()
    return delivery


def deliveries_for(session: Session, subject_type: SubjectType, ids: Sequence[str]) -> dict[str, WebhookDelivery]:
    """The deliveries of these subjects, by subject id (one query for a page of jobs)."""
    if not ids:
        return {}
    rows = session.scalars(select(WebhookDelivery).where(
        WebhookDelivery.subject_type == subject_type.value, WebhookDelivery.subject_id.in_(list(ids)))).all()
    return {row.subject_id: row for row in rows}


def delete_deliveries(session: Session, subject_type: SubjectType, ids: Sequence[str]) -> None:
    """The deliveries of jobs or groups being deleted (no foreign key: a row names a job or a group)."""
    if ids:
        session.execute(delete(WebhookDelivery).where(
            WebhookDelivery.subject_type == subject_type.value, WebhookDelivery.subject_id.in_(list(ids)),
        ).execution_options(synchronize_session=False))


def _link(path: str, settings: Settings) -> str:
    return f"{settings.public_url.rstrip('/')}{path}" if settings.public_url else path


def _isoformat(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=utcnow().tzinfo)).isoformat()


def job_body(job: Job, delivery_id: int, settings: Settings) -> dict[str, Any]:
    base = f"/v1/jobs/{job.id}"
    return {
        "event": "job.finished", "delivery_id": delivery_id, "type": "job", "id": job.id, "kind": job.kind,
        "status": str(job.status), "finished_at": _isoformat(job.finished_at),
        "error_code": (job.error or {}).get("code") if isinstance(job.error, dict) else None,
        "url": _link(base, settings),
        "result_url": _link(f"{base}/result", settings) if job.status == JobStatus.SUCCEEDED else None,
    }


def group_body(group: JobGroup, status: JobStatus, counts: Mapping[str, int], finished_at: datetime | None,
               delivery_id: int, settings: Settings) -> dict[str, Any]:
    base = f"/v1/job-groups/{group.id}"
    return {
        "event": "group.finished", "delivery_id": delivery_id, "type": "group", "id": group.id, "kind": "job_group",
        "status": status.value, "finished_at": _isoformat(finished_at), "counts": dict(counts),
        "url": _link(base, settings), "result_url": _link(f"{base}/results", settings),
    }


def _encode(body: Mapping[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def activate_finished(session: Session, settings: Settings, limit: int = 200) -> list[int]:
    """Waiting deliveries whose job or group has finished: fix their body and make them due now. Conditional
    on the row still waiting, so of several workers one activates it. Returns the ids activated."""
    now = utcnow()
    activated: list[int] = []
    job_rows = session.execute(
        select(WebhookDelivery, Job)
        .join(Job, Job.id == WebhookDelivery.subject_id)
        .where(WebhookDelivery.subject_type == SubjectType.JOB.value,
               WebhookDelivery.status == DeliveryStatus.WAITING.value, Job.status.in_(TERMINAL_STATUSES))
        .limit(limit)
    ).all()
    for delivery, job in job_rows:
        if _activate(session, delivery, _encode(job_body(job, delivery.id, settings)), now):
            activated.append(delivery.id)
            add_event(session, job.id, EventType.WEBHOOK,
                      f"callback to {target_host(delivery.url)} scheduled (job {job.status})",
                      data={"delivery_id": delivery.id})
    group_rows = session.execute(
        select(WebhookDelivery, JobGroup)
        .join(JobGroup, JobGroup.id == WebhookDelivery.subject_id)
        .where(WebhookDelivery.subject_type == SubjectType.GROUP.value,
               WebhookDelivery.status == DeliveryStatus.WAITING.value)
        # least recently checked first (a waiting row's next_attempt_at is when it was last checked), so every
        # group gets its turn however many are waiting
        .order_by(func.coalesce(WebhookDelivery.next_attempt_at, WebhookDelivery.created_at), WebhookDelivery.id)
        .limit(limit)
    ).all()
    for delivery, group in group_rows:
        body = _finished_group_body(session, group, delivery.id, settings)
        if body is None:
            session.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery.id)
                            .values(next_attempt_at=now).execution_options(synchronize_session=False))
        elif _activate(session, delivery, _encode(body), now):
            activated.append(delivery.id)
    return activated


def _finished_group_body(session: Session, group: JobGroup, delivery_id: int,
                         settings: Settings) -> dict[str, Any] | None:
    summary = summarize(session, group)
    if summary.present == 0 or summary.status not in TERMINAL_STATUSES:
        return None
    finished_at = session.scalar(select(Job.finished_at).where(Job.group_id == group.id)
                                 .order_by(Job.finished_at.desc()).limit(1))
    return group_body(group, summary.status, summary.counts, finished_at, delivery_id, settings)


def _activate(session: Session, delivery: WebhookDelivery, body: str, now: datetime) -> bool:
    return session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == delivery.id, WebhookDelivery.status == DeliveryStatus.WAITING.value)
        .values(status=DeliveryStatus.PENDING.value, body=body, next_attempt_at=now)
        .execution_options(synchronize_session=False)
    ).rowcount == 1


@dataclass(frozen=True)
class ClaimedDelivery:
    """A due delivery one worker holds for one attempt (until ``lease`` passes, then it is due again)."""

    id: int
    subject_type: SubjectType
    subject_id: str
    owner: str
    url: str
    body: str
    attempt: int


def claim_due(session: Session, *, lease: timedelta, limit: int = 1, owners_busy: Mapping[str, int] | None = None,
              owner_limit: int | None = None, exclude_ids: Iterable[int] = ()) -> list[ClaimedDelivery]:
    """Up to ``limit`` pending deliveries whose next attempt is due, oldest first, each claimed by moving that
    time past the lease (a conditional UPDATE: another worker's claim of the same row fails). Rows are taken
    one by one, skipping owners that already hold ``owner_limit`` attempts (``owners_busy`` counts those the
    caller has in flight), so one owner's backlog never keeps another owner's due row waiting. The caller
    starts each attempt as soon as it has the row: the lease covers one attempt, not a queue. A worker that
    dies mid-attempt leaves the row due again once the lease is over."""
    busy: Counter[str] = Counter(owners_busy or {})
    skipped = set(exclude_ids)
    claimed: list[ClaimedDelivery] = []
    while len(claimed) < limit:
        now = utcnow()
        query = select(WebhookDelivery).where(WebhookDelivery.status == DeliveryStatus.PENDING.value,
                                              WebhookDelivery.next_attempt_at <= now,
                                              WebhookDelivery.body.is_not(None))
        full = sorted(owner for owner, count in busy.items() if owner_limit is not None and count >= owner_limit)
        if full:
            query = query.where(WebhookDelivery.owner.not_in(full))
        if skipped:
            query = query.where(WebhookDelivery.id.not_in(sorted(skipped)))
        row = session.scalars(query.order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id).limit(1)).first()
        if row is None:
            break
        skipped.add(row.id)
        taken = session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == row.id, WebhookDelivery.status == DeliveryStatus.PENDING.value,
                   WebhookDelivery.next_attempt_at <= now)
            .values(next_attempt_at=now + lease)
            .execution_options(synchronize_session=False)
        ).rowcount
        if taken == 1 and row.body is not None:
            busy[row.owner] += 1
            claimed.append(ClaimedDelivery(row.id, SubjectType(row.subject_type), row.subject_id, row.owner, row.url,
                                           row.body, row.attempts + 1))
    return claimed


@dataclass(frozen=True)
class AttemptOutcome:
    """One attempt as the delivery log shows it: no exception text, host names or addresses (``error`` is
    one of a few fixed phrases or ``HTTP <code>``)."""

    delivered: bool
    status_code: int | None
    error: str | None
    seconds: float
    final: bool = False  # no further attempt makes sense (the target is refused by this server's settings)


def backoff_seconds(failed_attempts: int, settings: Settings) -> float:
    """Wait after the ``failed_attempts``-th failure: base, 2 base, 4 base, ... capped."""
    return min(settings.webhook_backoff_seconds * 2.0 ** (failed_attempts - 1), settings.webhook_backoff_max_seconds)


def record_attempt(session: Session, claimed: ClaimedDelivery, outcome: AttemptOutcome, settings: Settings) -> str:
    """Append the attempt to the delivery's log, schedule the next one or settle the row, and write the job's
    event. Returns the new status."""
    row = session.get(WebhookDelivery, claimed.id)
    if row is None or row.status != DeliveryStatus.PENDING.value:
        return "gone"  # deleted with its job meanwhile
    now = utcnow()
    attempt = row.attempts + 1
    entry: dict[str, Any] = {"attempt": attempt, "at": now.isoformat(), "status_code": outcome.status_code,
                             "error": outcome.error, "seconds": round(outcome.seconds, 3)}
    values: dict[str, Any] = {"attempts": attempt}
    host = target_host(row.url)
    if outcome.delivered:
        values.update(status=DeliveryStatus.DELIVERED.value, delivered_at=now, next_attempt_at=None)
        message = f"callback delivered to {host} (HTTP {outcome.status_code}, attempt {attempt})"
        level = EventLevel.INFO
    elif outcome.final or attempt >= settings.webhook_max_attempts:
        values.update(status=DeliveryStatus.FAILED.value, next_attempt_at=None)
        message = f"callback to {host} given up after attempt {attempt}: {outcome.error}"
        level = EventLevel.ERROR
    else:
        wait = backoff_seconds(attempt, settings)
        next_at = now + timedelta(seconds=wait)
        entry["next_attempt_at"] = next_at.isoformat()
        values.update(next_attempt_at=next_at)
        message = f"callback attempt {attempt} to {host} failed: {outcome.error}; next in {wait:g} s"
        level = EventLevel.WARNING
    values["attempt_log"] = [*(row.attempt_log or []), entry]
    session.execute(update(WebhookDelivery).where(WebhookDelivery.id == row.id).values(**values)
                    .execution_options(synchronize_session=False))
    if row.subject_type == SubjectType.JOB.value and session.get(Job, row.subject_id) is not None:
        add_event(session, row.subject_id, EventType.WEBHOOK, message, level=level,
                  data={"delivery_id": row.id, "attempt": attempt, "status_code": outcome.status_code})
    return str(values.get("status", DeliveryStatus.PENDING.value))
