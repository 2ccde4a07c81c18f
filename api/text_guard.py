"""Refuse, before any route runs, request paths and query parameters that no database can compare: a NUL
character (PostgreSQL refuses it in every text parameter, SQLite would just not find it). One place for
every route, so a new route cannot forget it. Bodies are checked where their fields are read."""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from api.problems import field_error, problem_response, problem_type
from store.db import storable_text


class StorableTextGuard:
    """A path with such a character names nothing (404); a query parameter with one is invalid (422)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if not storable_text(path):
            response = problem_response(
                404, "no resource at this path (it holds a character no id can contain)",
                type_=problem_type("not-found"), title="Not Found",
            )
            await response(scope, receive, send)
            return
        query = bytes(scope.get("query_string", b"")).decode("latin-1")
        bad = sorted({name for name, value in parse_qsl(query, keep_blank_values=True)
                      if not (storable_text(name) and storable_text(value))})
        if bad:
            errors = [
                field_error(name if storable_text(name) else repr(name), "must not contain NUL characters",
                            type_="string_unstorable", location="query")
                for name in bad
            ]
            response = problem_response(
                422, "; ".join(f"{error['field']}: {error['message']}" for error in errors),
                type_=problem_type("validation-error"), title="Invalid request", instance=path, errors=errors,
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
