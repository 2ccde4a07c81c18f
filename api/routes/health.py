"""/healthz (the process answers), /readyz (database, schema and broker), /metrics (Prometheus)."""

from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.deps import SettingsDep, details_allowed
from api.problems import DATABASE_RETRY_AFTER_SECONDS, ProblemError
from api.schemas import Health, Readiness
from core.queue import broker_reachable
from store.db import get_engine
from store.migrate import SchemaNotMigratedError, ensure_migrated

router = APIRouter(tags=["service"])


def _check(probe: Any) -> tuple[str, str] | None:
    """None when the probe passes, else why it failed: (public reason, detailed reason). The detail (a
    driver's message: hosts, ports, paths) is for operators only; a schema behind head says what to run."""
    try:
        probe()
    except SchemaNotMigratedError as exc:
        return str(exc), str(exc)
    except Exception as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        return "unreachable", f"{type(exc).__name__}: {first_line}".strip(": ")
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
    summary="Readiness: database reachable, schema at head, broker reachable (reasons need the metrics token)",
)
def readyz(request: Request, settings: SettingsDep) -> Readiness:
    failures: dict[str, str] = {}
    which = 1 if details_allowed(request, settings) else 0
    database_error = _check(_database)
    if database_error:
        failures["database"] = database_error[which]
    else:
        schema_error = _check(ensure_migrated)
        if schema_error:
            failures["schema"] = schema_error[which]
    broker_error = _check(_broker)
    if broker_error:
        failures["broker"] = broker_error[which]
    checks = {name: failures.get(name, "ok") for name in ("database", "schema", "broker")}
    if "database" in failures:
        checks["schema"] = "unknown (database unreachable)"
    if failures:
        raise ProblemError(
            503, "not ready: " + "; ".join(f"{name} {reason}" for name, reason in failures.items()),
            slug="not-ready", extensions={"checks": checks},
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
        )
    return Readiness(checks=checks)


@router.get("/metrics", response_class=Response, summary="Prometheus metrics",
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(request: Request, settings: SettingsDep) -> Response:
    """Job counts by kind and status, queue depth and run times (every owner's) only with the metrics token
    (or ``GPUEST_EXPOSE_DETAILS``, or with auth off); HTTP request counts and latencies always."""
    state = request.app.state
    registry = state.metrics_registry if details_allowed(request, settings) else state.public_metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
