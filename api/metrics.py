"""Prometheus metrics: job counts, queue depth and run-time histogram read from the database at scrape
time (so every API replica reports the same truth), plus HTTP request count and latency."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.status import TERMINAL_STATUSES, JobStatus
from store import chunks as chunk_store
from store import jobs as job_store
from store.db import session_scope
from store.models import Job

access_log = structlog.get_logger("gpuest.api.access")

RUN_SECONDS_BUCKETS: tuple[float, ...] = (
    0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 43200,
)


# Each worker advertises its device on the rows it runs (worker.device: the GPU's name and, on a
# worker pinned to one GPU of its host, its number), so the running work per device is read from them.
RUNNING_HELP = "Jobs and chunks of fanned-out jobs running now, by the device their worker advertises"


class JobStoreCollector(Collector):
    """Reads the jobs table on every scrape."""

    def __init__(self, known_kinds: Sequence[str]) -> None:
        self.known_kinds = tuple(known_kinds)

    def describe(self) -> Iterator[Metric]:
        # Without describe() the registry would call collect() (a DB query) at registration time.
        yield GaugeMetricFamily("gpuest_jobs", "Jobs by kind and status", labels=["kind", "status"])
        yield GaugeMetricFamily("gpuest_queue_depth", "Jobs waiting in status queued")
        yield HistogramMetricFamily("gpuest_job_run_seconds", "Run time of finished jobs (finished - started)",
                                    labels=["kind"])
        yield GaugeMetricFamily("gpuest_running", RUNNING_HELP, labels=["device"])

    def collect(self) -> Iterator[Metric]:
        with session_scope() as session:
            counts = job_store.count_by_kind_and_status(session)
            depth = job_store.queue_depth(session)
            run_times = _run_time_histogram(session)
            running = chunk_store.running_by_device(session)

        jobs = GaugeMetricFamily("gpuest_jobs", "Jobs by kind and status", labels=["kind", "status"])
        by_label = {(kind, status.value): 0 for kind in self.known_kinds for status in JobStatus}
        for kind, status, count in counts:
            by_label[(kind, status)] = count
        for (kind, status), count in sorted(by_label.items()):
            jobs.add_metric([kind, status], count)
        yield jobs

        queue = GaugeMetricFamily("gpuest_queue_depth", "Jobs waiting in status queued")
        queue.add_metric([], depth)
        yield queue

        histogram = HistogramMetricFamily(
            "gpuest_job_run_seconds", "Run time of finished jobs (finished - started)", labels=["kind"]
        )
        empty = ([0] * len(RUN_SECONDS_BUCKETS), 0, 0.0)
        for kind in sorted(set(self.known_kinds) | set(run_times)):
            cumulative, total, seconds = run_times.get(kind, empty)
            buckets = [(repr(float(edge)), count) for edge, count in zip(RUN_SECONDS_BUCKETS, cumulative, strict=True)]
            buckets.append(("+Inf", total))
            histogram.add_metric([kind], buckets, seconds)
        yield histogram

        by_device = GaugeMetricFamily("gpuest_running", RUNNING_HELP, labels=["device"])
        for device, count in sorted(running.items()):
            by_device.add_metric([device], count)
        yield by_device


def _run_seconds(session: Session) -> ColumnElement[float]:
    """finished_at - started_at in seconds, in the database's own dialect."""
    if session.get_bind().dialect.name == "sqlite":
        return (func.julianday(Job.finished_at) - func.julianday(Job.started_at)) * 86_400.0
    return func.extract("epoch", Job.finished_at - Job.started_at)


def _run_time_histogram(session: Session) -> dict[str, tuple[list[int], int, float]]:
    """Per kind: cumulative counts at each bucket edge, the count and the sum, aggregated in SQL (a scrape
    must not fetch every finished job)."""
    seconds = _run_seconds(session)
    columns = [func.sum(case((seconds <= edge, 1), else_=0)) for edge in RUN_SECONDS_BUCKETS]
    rows = session.execute(
        select(Job.kind, func.count(), func.coalesce(func.sum(seconds), 0.0), *columns)
        .where(Job.status.in_(TERMINAL_STATUSES), Job.started_at.is_not(None), Job.finished_at.is_not(None))
        .group_by(Job.kind)
    ).all()
    return {
        kind: ([int(value or 0) for value in cumulative], int(count), float(total))
        for kind, count, total, *cumulative in rows
    }


class HttpMetrics:
    """Request count and latency, labelled by the route template (not the raw path: ids would explode
    the label set)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "gpuest_http_requests", "HTTP requests answered", ["method", "route", "status"], registry=registry
        )
        self.latency = Histogram(
            "gpuest_http_request_duration_seconds", "HTTP request latency", ["method", "route"], registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )


def route_template(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return str(path) if path else "unmatched"


# Probes and scrapes arrive every few seconds: their access lines go to debug.
QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})


class RequestMiddleware:
    """Per request: a request id (the client's X-Request-ID or a new one) bound into every log line and
    echoed back, one structured access line, and the HTTP metrics. Pure ASGI, so streamed bodies (artifact
    downloads, uploads) pass through unbuffered."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        request_id = _client_request_id(scope) or uuid.uuid4().hex
        # Also on request.state: the 500 handler runs outside this middleware (in Starlette's
        # ServerErrorMiddleware) and names the id in its problem, so a user can quote it.
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"x-request-id" for name, _ in headers):
                    headers.append((b"x-request-id", request_id.encode()))
                message["headers"] = headers
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=request_id):
            try:
                await self.app(scope, receive, send_with_status)
            finally:
                seconds = time.perf_counter() - started
                route, method = route_template(scope), scope.get("method", "")
                self.metrics.requests.labels(method, route, str(status)).inc()
                self.metrics.latency.labels(method, route).observe(seconds)
                emit = access_log.debug if route in QUIET_ROUTES else access_log.info
                emit("request", method=method, path=scope.get("path", ""), route=route, status=status,
                     duration_ms=round(seconds * 1000, 2))


def _client_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            text = value.decode("latin-1")
            # Only a sane token is echoed into logs and headers.
            if 0 < len(text) <= 128 and text.replace("-", "").replace("_", "").replace(".", "").isalnum():
                return text
    return None


def build_registry(known_kinds: Sequence[str]) -> tuple[CollectorRegistry, CollectorRegistry, HttpMetrics]:
    """Registries per app (not the process-global one), so several apps in one process never collide: the
    full one (the jobs table's counts, every owner's, and the HTTP metrics) and the public one (HTTP only)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(JobStoreCollector(known_kinds))
    http_metrics = HttpMetrics(registry)
    public = CollectorRegistry(auto_describe=True)
    public.register(http_metrics.requests)
    public.register(http_metrics.latency)
    return registry, public, http_metrics
