"""Request dependencies (FastAPI ``Depends``), shared by the routers: the settings, a database session, the
caller's owner (from the API key, or the local owner with auth off) and the job id a path names."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi import Path as PathParam
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.problems import ProblemError
from core.settings import Settings, get_settings
from store.db import session_scope
from store.keys import owner_for_key

# auto_error=False: a missing or malformed header becomes our 401 problem, not FastAPI's plain 403.
bearer_scheme = HTTPBearer(auto_error=False, description="An API key created with `gpuest keys create OWNER`")

# How long a verified key is trusted without asking the database again: status polls then cost one query,
# not two. A revoked key keeps working for at most this long.
KEY_CACHE_SECONDS = 10.0
KEY_CACHE_MAX_ENTRIES = 10_000


class OwnerCache:
    """Verified keys (by SHA-256 digest, never the secret) -> owner, for ``KEY_CACHE_SECONDS``.
    Unknown keys are never cached, so a new key works at once."""

    def __init__(self, ttl_seconds: float = KEY_CACHE_SECONDS, max_entries: int = KEY_CACHE_MAX_ENTRIES) -> None:
        self.ttl_seconds, self.max_entries = ttl_seconds, max_entries
        self._entries: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _digest(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    def get(self, key: str) -> str | None:
        entry = self._entries.get(self._digest(key))
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def put(self, key: str, owner: str) -> None:
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[self._digest(key)] = (owner, time.monotonic() + self.ttl_seconds)


async def settings_dependency() -> Settings:
    # async: a cached lookup, not worth a threadpool hop per request.
    return get_settings()


SettingsDep = Annotated[Settings, Depends(settings_dependency)]


def session_dependency() -> Iterator[Session]:
    """A session committed after the route returns; routes that must commit before a side effect
    (enqueueing, answering 201) call ``session.commit()`` themselves."""
    with session_scope() as session:
        yield session


SessionDep = Annotated[Session, Depends(session_dependency)]


def _unauthorized(detail: str) -> ProblemError:
    return ProblemError(401, detail, slug="unauthorized", headers={"WWW-Authenticate": 'Bearer realm="gpuest"'})


def _lookup_owner(key: str) -> str | None:
    with session_scope() as session:
        return owner_for_key(session, key)


async def current_owner(
    request: Request,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> str:
    """The owner every job and dataset of this request belongs to."""
    if not settings.auth_enabled:
        return settings.local_owner
    if credentials is None or not credentials.credentials:
        raise _unauthorized("missing API key: send 'Authorization: Bearer <api key>'")
    key = credentials.credentials
    cache: OwnerCache = request.app.state.owner_cache
    owner = cache.get(key)
    if owner is None:
        owner = await run_in_threadpool(_lookup_owner, key)
        if owner is None:
            raise _unauthorized("the API key is not valid (unknown or revoked)")
        cache.put(key, owner)
    return owner


OwnerDep = Annotated[str, Depends(current_owner)]


def details_allowed(request: Request, settings: Settings) -> bool:
    """Whether this request may see operator details: every owner's job counts in /metrics, the driver's
    reason (host, port) in /readyz. Yes with ``Authorization: Bearer <GPUEST_METRICS_TOKEN>``, with
    ``GPUEST_EXPOSE_DETAILS=true``, or with auth off (one owner, nothing to hide from it)."""
    if settings.expose_details or not settings.auth_enabled:
        return True
    if settings.metrics_token is None:
        return False
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    expected = settings.metrics_token.get_secret_value()
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected.encode())


JobIdPath = Annotated[str, PathParam(min_length=1, max_length=64, description="job id")]
