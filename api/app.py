"""The FastAPI application: ``create_app()`` builds it from the job registry; ``app`` serves uvicorn
(``uvicorn api.app:app``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from fastapi import APIRouter, FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from api.body_limit import MAX_JSON_BODY_BYTES, BodyLimitMiddleware
from api.deps import OwnerCache
from api.metrics import RequestMiddleware, build_registry
from api.problems import PROBLEM_MEDIA_TYPE, install_problem_handlers, route_methods
from api.routes import datasets, groups, health, jobs, pages, plots, webhooks
from api.schemas import PROBLEM_RESPONSES
from api.security_headers import SecurityHeaders
from api.text_guard import StorableTextGuard
from core.logging import configure_logging
from core.settings import get_settings
from kernels.registry import registry
from store.artifacts import remove_stale_parts
from store.migrate import SchemaNotMigratedError, ensure_migrated

log = structlog.get_logger("gpuest.api")

# Every router the app serves, in matching order: the app includes these and nothing else, and the 405 answer's
# Allow header is derived from the app's routes (api.problems.route_methods).
ROUTERS: tuple[APIRouter, ...] = (
    health.router, jobs.router, datasets.router, groups.router, webhooks.router, plots.router, pages.router,
)

DESCRIPTION = """Heavy estimation jobs on NVIDIA GPUs.

Submit a job with `POST /v1/jobs` (`{"kind": ..., "params": {...}}`; each kind's params are documented
below), poll `GET /v1/jobs/{id}` and read `GET /v1/jobs/{id}/result`. Errors are RFC 9457
`application/problem+json`; validation errors list each field and the constraint it broke.
Authenticate with `Authorization: Bearer <api key>`.
"""


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = get_settings()
    try:
        await run_in_threadpool(ensure_migrated)
    except SchemaNotMigratedError as exc:
        log.error("refusing to start: database not migrated", reason=str(exc))
        raise
    removed = await run_in_threadpool(
        remove_stale_parts, (datasets.upload_dir(settings), settings.datasets_dir), settings.stale_part_seconds
    )
    if removed:
        log.info("stale temporary files removed", files=len(removed), bytes=sum(size for size in removed.values()))
    if not settings.auth_enabled:
        log.warning(
            "AUTH IS DISABLED: every request acts as one owner, without an API key. "
            "Set GPUEST_AUTH_ENABLED=true for anything reachable by others.",
            owner=settings.local_owner,
        )
    log.info("gpuest API ready", kinds=sorted(registry()), database=_redacted(settings.resolved_database_url()))
    yield


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def create_app() -> FastAPI:
    configure_logging()
    kinds = registry()
    app = FastAPI(
        title="gpuest",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        responses=PROBLEM_RESPONSES,
        docs_url=None,  # /docs is the pages router's: Swagger UI from the package, not a CDN
    )
    app.state.owner_cache = OwnerCache()
    metrics_registry, public_metrics_registry, http_metrics = build_registry(sorted(kinds))
    app.state.metrics_registry = metrics_registry
    app.state.public_metrics_registry = public_metrics_registry
    install_problem_handlers(app, sorted(kinds))
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/static/swagger", StaticFiles(directory=pages.swagger_dir()), name="swagger")
    app.mount("/static", StaticFiles(directory=pages.STATIC_DIR), name="static")
    app.state.route_methods = route_methods(app.routes)
    # Uploads stream under their own limit (api.uploads); every other body is a small JSON document.
    app.add_middleware(BodyLimitMiddleware, max_bytes=MAX_JSON_BODY_BYTES,
                       exempt_prefixes=(datasets.router.prefix, pages.UPLOAD_PATH))
    app.add_middleware(StorableTextGuard)
    app.add_middleware(RequestMiddleware, metrics=http_metrics)
    app.add_middleware(SecurityHeaders)  # outermost of ours: every answer of the app carries them
    _document_problems_as_problem_json(app)
    return app


def _document_problems_as_problem_json(app: FastAPI) -> None:
    """FastAPI documents a response ``model`` under application/json; errors are application/problem+json."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for operation in (op for path in schema.get("paths", {}).values() for op in path.values()):
                for status, response in operation.get("responses", {}).items():
                    content = response.get("content", {})
                    if str(status)[0] in "45" and "application/json" in content:
                        content[PROBLEM_MEDIA_TYPE] = content.pop("application/json")
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


app = create_app()
