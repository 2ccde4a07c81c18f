"""RFC 9457 problem details: one exception type for the routes, and handlers that turn every error into
``application/problem+json`` (validation errors name the field and the constraint it broke)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute

from store.db import is_database_unavailable

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_PREFIX = "urn:gpuest:problem:"
# Seconds a client is told to wait while the database is unreachable (a restart or failover takes a few).
DATABASE_RETRY_AFTER_SECONDS = 5

log = structlog.get_logger("gpuest.api")


def problem_type(slug: str) -> str:
    return PROBLEM_TYPE_PREFIX + slug


class ProblemError(StarletteHTTPException):
    """Raise from a route (or a request-body reader) to answer with a problem+json document.

    An HTTPException subclass so that FastAPI's body reader passes it through instead of turning it into
    a generic 400; its own handler (more specific than the HTTPException one) renders it.
    """

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        slug: str | None = None,
        title: str | None = None,
        errors: Sequence[Mapping[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(status, detail, dict(headers or {}))
        self.status = status
        self.detail = detail
        self.type = problem_type(slug) if slug else "about:blank"
        self.title = title or HTTPStatus(status).phrase
        self.errors = list(errors) if errors is not None else None
        self.headers = dict(headers or {})
        self.extensions = dict(extensions or {})


def field_error(
    field: str, message: str, *, type_: str, location: str = "body", constraint: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    error: dict[str, Any] = {"field": field, "location": location, "message": message, "type": type_}
    if constraint:
        error["constraint"] = dict(constraint)
    return error


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by its text and every lone surrogate (JSON's "\\ud800")
    by its escape: JSON has no such numbers, UTF-8 no such characters, and a problem about one
    (``{"replications": NaN}``) must still be a valid document."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


class ProblemJSONResponse(JSONResponse):
    media_type = PROBLEM_MEDIA_TYPE

    def render(self, content: Any) -> bytes:
        return json.dumps(_finite(content), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def request_id_of(request: Request) -> str | None:
    """The request's correlation id (set by ``api.metrics.RequestMiddleware``), also in every log line."""
    return getattr(request.state, "request_id", None)


def problem_response(
    status: int,
    detail: str | None,
    *,
    type_: str = "about:blank",
    title: str | None = None,
    instance: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
    extensions: Mapping[str, Any] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"type": type_, "title": title or HTTPStatus(status).phrase, "status": status}
    if detail is not None:
        body["detail"] = detail
    if instance is not None:
        body["instance"] = instance
    if errors is not None:
        body["errors"] = errors
    body.update(extensions or {})
    all_headers = dict(headers or {})
    if status == 500:
        # The server closes the connection after an unexpected error (uvicorn does once the exception reaches
        # it): say so, so a keep-alive client does not send its next request into a closed socket.
        all_headers["Connection"] = "close"
    return ProblemJSONResponse(body, status_code=status, headers=all_headers)


# -- validation errors -------------------------------------------------------------------------------

MAX_ECHOED_CHARS = 200


def _json_safe(value: Any) -> Any:
    """A JSON scalar safe to echo back: non-scalars as text, long text cut (inputs can be huge)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf": JSON has no such numbers
    if value is None or isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= MAX_ECHOED_CHARS else text[:MAX_ECHOED_CHARS] + "..."


def _field_path(location: Sequence[Any], kind_tags: Iterable[str]) -> tuple[str, str]:
    """``('body', 'crve_montecarlo', 'params', 'replications')`` -> ``('body', 'params.replications')``.

    The discriminated union puts the kind's tag into the location; the user wrote no such key, so it goes.
    """
    parts = list(location)
    where = str(parts.pop(0)) if parts and parts[0] in ("body", "query", "path", "header", "cookie") else "body"
    tags = set(kind_tags)
    if where == "body" and parts and parts[0] in tags:
        parts.pop(0)
    # A union's alternatives appear in the location as pydantic's type tags (``list[constrained-float]``,
    # ``literal['auto']``, ``function-after[...]``): no user wrote such a key, and fields are identifiers.
    # (Body only: header names such as Idempotency-Key are no identifiers.)
    if where == "body":
        parts = [part for part in parts if not _is_union_branch(part)]
    return where, ".".join(str(part) for part in parts)


def _is_union_branch(part: Any) -> bool:
    return isinstance(part, str) and not part.isidentifier()


def _union_branch(location: Sequence[Any]) -> tuple[tuple[Any, ...], str, bool] | None:
    """(the location before the union, the alternative's tag, whether the error lies inside the alternative's
    value) for an error of one alternative of a union in the body; None otherwise."""
    if not location or location[0] != "body":
        return None
    for index, part in enumerate(location):
        if index and _is_union_branch(part):
            return tuple(location[:index]), str(part), index + 1 < len(location)
    return None


def _drop_other_alternatives(raw_errors: Sequence[Any]) -> list[Any]:
    """Where a value matched one alternative of a union in shape (its errors lie inside the value, e.g. an
    element of a list), the other alternatives' errors (``Input should be 'auto'``) are noise: dropped."""
    matched = {branch[:2] for raw in raw_errors if (branch := _union_branch(raw.get("loc", ()))) and branch[2]}
    matched_bases = {base for base, _ in matched}
    kept = []
    for raw in raw_errors:
        branch = _union_branch(raw.get("loc", ()))
        if branch is not None and branch[0] in matched_bases and branch[:2] not in matched:
            continue
        kept.append(raw)
    return kept


def _merge_alternatives(errors: list[tuple[dict[str, Any], bool]]) -> list[dict[str, Any]]:
    """One error per field for a union: a value that matches none of its alternatives gave one error per
    alternative (flagged True); their messages are joined ("Input should be a valid list, or Input should be
    'auto'"). Other errors are kept as they are."""
    merged: dict[Any, dict[str, Any]] = {}
    for index, (error, from_union) in enumerate(errors):
        key = (error["location"], error["field"]) if from_union else index
        if key not in merged:
            merged[key] = error
        elif error["message"] not in merged[key]["message"]:
            merged[key] = {**merged[key], "message": f"{merged[key]['message']}, or {error['message']}",
                           "type": "union"}
            merged[key].pop("constraint", None)
    return list(merged.values())


def validation_errors(raw_errors: Sequence[Any], kind_tags: Iterable[str]) -> list[dict[str, Any]]:
    tags = list(kind_tags)
    errors: list[tuple[dict[str, Any], bool]] = []
    for raw in _drop_other_alternatives(raw_errors):
        where, field = _field_path(raw.get("loc", ()), tags)
        error_type = str(raw.get("type", "value_error"))
        message = str(raw.get("msg", "invalid value"))
        context = {key: _json_safe(value) for key, value in (raw.get("ctx") or {}).items() if key != "error"}
        if where == "body" and not field and error_type in ("union_tag_invalid", "union_tag_not_found"):
            # The body's own discriminator is ``kind``: name it, and list what exists.
            field = "kind"
            known = ", ".join(repr(tag) for tag in tags)
            if error_type == "union_tag_not_found":
                error_type, message = "missing", f"Field required: 'kind' names the job kind, one of {known}"
            else:
                error_type = "unknown_kind"
                message = f"unknown job kind {_json_safe(context.get('tag'))!r}; known kinds: {known}"
            context = {"expected": tags}
        if error_type == "json_invalid":
            # pydantic puts the character offset into the location: it is not a field
            offset = next((part for part in raw.get("loc", ()) if isinstance(part, int)), None)
            field = ""
            detail = context.pop("error", None) or raw.get("ctx", {}).get("error")
            message = "invalid JSON" + (f" at character {offset}" if offset is not None else "")
            message += f": {detail}" if detail else ""
            context = {}
        error: dict[str, Any] = {"field": field or where, "location": where, "message": message, "type": error_type}
        if context:
            error["constraint"] = context
        if "input" in raw and not isinstance(raw["input"], dict | list) and error_type != "json_invalid":
            error["input"] = _json_safe(raw["input"])
        errors.append((error, _union_branch(raw.get("loc", ())) is not None))
    return _merge_alternatives(errors)


def summarize(errors: Sequence[Mapping[str, Any]]) -> str:
    first = "; ".join(f"{error['field']}: {error['message']}" for error in errors[:3])
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return f"{len(errors)} invalid field(s): {first}{more}"


# -- handlers ----------------------------------------------------------------------------------------

def install_problem_handlers(app: FastAPI, kind_tags: Sequence[str]) -> None:
    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProblemError)
        return problem_response(
            exc.status, exc.detail, type_=exc.type, title=exc.title, instance=request.url.path,
            errors=exc.errors, headers=exc.headers, extensions=exc.extensions,
        )

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = validation_errors(exc.errors(), kind_tags)
        return problem_response(
            422, summarize(errors), type_=problem_type("validation-error"), title="Invalid request",
            instance=request.url.path, errors=errors,
        )

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the one route it tried; the path may have others (GET and POST).
            headers["Allow"] = ", ".join(allowed_methods(request))
        return problem_response(exc.status_code, detail, instance=request.url.path, headers=headers)

    async def on_database_error(request: Request, exc: Exception) -> JSONResponse:
        if not is_database_unavailable(exc):
            return await on_unexpected(request, exc)
        # One line, no traceback: an outage makes every request fail the same way.
        log.warning("database unavailable", path=request.url.path, method=request.method,
                    error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return database_unavailable(request)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        if is_database_unavailable(exc):  # raised outside the routes' handler scope (a middleware)
            return await on_database_error(request, exc)
        # The traceback goes to the log with the request id, never to the client: it gets the id only.
        request_id = request_id_of(request)
        log.exception("unhandled error", path=request.url.path, method=request.method, request_id=request_id)
        return problem_response(
            500, "an unexpected error occurred; it has been logged"
            + (f" under request id {request_id}" if request_id else ""),
            type_=problem_type("internal-error"), instance=request.url.path,
            headers={"X-Request-ID": request_id} if request_id else None,
            extensions={"request_id": request_id} if request_id else None,
        )

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(SQLAlchemyError, on_database_error)
    app.add_exception_handler(Exception, on_unexpected)


def database_unavailable(request: Request) -> JSONResponse:
    """503 with Retry-After: the request was fine, the database is down (a restart, a failover)."""
    return problem_response(
        503, "the database is unavailable; retry later", type_=problem_type("database-unavailable"),
        title="Service Unavailable", instance=request.url.path,
        headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
    )


RouteMethods = list[tuple[re.Pattern[str], frozenset[str]]]


def route_methods(routes: Sequence[BaseRoute]) -> RouteMethods:
    """(path pattern, methods) of every route that has both, for :func:`allowed_methods` (kept on
    ``app.state.route_methods``). ``routes`` is an app's: the routers it includes are walked with FastAPI's
    ``iter_route_contexts``, which yields each included route with its prefix applied."""
    return [
        (route.path_regex, frozenset(route.methods))
        for route in iter_route_contexts(routes)
        if isinstance(getattr(route, "path_regex", None), re.Pattern) and getattr(route, "methods", None)
    ]


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this request's path."""
    table: RouteMethods = getattr(request.app.state, "route_methods", [])
    path = request.url.path
    return sorted({method for pattern, methods in table if pattern.match(path) for method in methods})
