"""Refuse oversized request bodies with a 413 problem, before and while they arrive.

FastAPI reads a JSON body whole before validating it; without a limit one request could fill memory.
(Starlette's own body limit answers text/plain, not problem+json.)
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import ProblemError, problem_response

MAX_JSON_BODY_BYTES = 1024 * 1024


def body_too_large(max_bytes: int) -> ProblemError:
    return ProblemError(413, f"the request body is larger than {max_bytes} bytes", slug="body-too-large",
                        extensions={"max_body_bytes": max_bytes})


class BodyLimitMiddleware:
    """Checks Content-Length up front and counts streamed (chunked) bytes; paths under
    ``exempt_prefixes`` enforce their own limits."""

    def __init__(self, app: ASGIApp, max_bytes: int, exempt_prefixes: Sequence[str] = ()) -> None:
        self.app, self.max_bytes, self.exempt_prefixes = app, max_bytes, tuple(exempt_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or str(scope.get("path", "")).startswith(self.exempt_prefixes):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            error = body_too_large(self.max_bytes)
            response = problem_response(error.status, error.detail, type_=error.type, instance=scope.get("path"),
                                        extensions=error.extensions)
            await response(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the route's body read: the exception handlers turn it into the problem.
                    raise body_too_large(self.max_bytes)
            return message

        await self.app(scope, counting_receive, send)
