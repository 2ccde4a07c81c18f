"""/healthz (the process answers), /readyz (database, schema and broker), /metrics (Prometheus)."""

from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.problems import ProblemError
from api.schemas import Health, Readiness
from core.queue import broker_reachable
from store.db import get_engine
from store.migrate import ensure_migrated

router = APIRouter(tags=["service"])


def _check(probe: Any) -> str | None:
    """None when the probe passes, else why it failed (one line)."""
    try:
        probe()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".strip(": ")
    return None


def _database() -> None:
    with get_engine().connect() as connection:
        connection.execute(text("SELECT 1"))


def _broker() -> None:
    if not broker_reachable():
        raise ConnectionError("the Celery broker did not accept a connection")


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:  # async: no worker-thread hop for a probe
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"description": "A dependency is down; the problem's `checks` says which"}},
    summary="Readiness: database reachable, schema at head, broker reachable",
)
def readyz() -> Readiness:
    failures: dict[str, str] = {}
    database_error = _check(_database)
    if database_error:
        failures["database"] = database_error
    else:
        schema_error = _check(ensure_migrated)
        if schema_error:
            failures["schema"] = schema_error
    broker_error = _check(_broker)
    if broker_error:
        failures["broker"] = broker_error
    checks = {name: failures.get(name, "ok") for name in ("database", "schema", "broker")}
    if "database" in failures:
        checks["schema"] = "unknown (database unreachable)"
    if failures:
        raise ProblemError(
            503, "not ready: " + "; ".join(f"{name} {reason}" for name, reason in failures.items()),
            slug="not-ready", extensions={"checks": checks},
        )
    return Readiness(checks=checks)


@router.get("/metrics", response_class=Response, summary="Prometheus metrics",
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST)
