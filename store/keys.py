"""API keys: random secrets shown once, stored as a keyed hash, HMAC-SHA256 under a server secret, so a
copy of the table is neither a list of keys nor a way to mint one.

The stored value names its scheme (``hmac-sha256:<hex>``). Rows written before the keyed hash hold a bare
SHA-256 hex digest: such a key still verifies, and its row is rewritten to the keyed hash on first use
(a key cannot be rehashed before it is presented: only its digest is stored).

The server secret is ``GPUEST_KEY_SECRET``, or else a random one generated once into
``<data_dir>/key_secret`` (mode 0600), shared by every process that uses that data directory. It is never
logged. Losing or changing it invalidates every key.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import threading
from pathlib import Path

import structlog
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from core.settings import get_settings
from store.db import storable_text
from store.models import ApiKey, utcnow

log = structlog.get_logger("gpuest.keys")

KEY_PREFIX = "gpe_"
PREFIX_LENGTH = len(KEY_PREFIX) + 6
KEYED_SCHEME = "hmac-sha256:"
SECRET_FILE_NAME = "key_secret"

_secret_lock = threading.Lock()
_secret_cache: dict[str, bytes] = {}


def key_secret() -> bytes:
    """The server secret of the keyed hash (``GPUEST_KEY_SECRET``, else the data directory's file)."""
    settings = get_settings()
    if settings.key_secret is not None:
        return settings.key_secret.get_secret_value().encode()
    path = (settings.data_dir / SECRET_FILE_NAME).resolve()
    with _secret_lock:
        if str(path) not in _secret_cache:
            _secret_cache[str(path)] = read_or_create_secret_file(path)
        return _secret_cache[str(path)]


def forget_secret() -> None:
    """Drop the cached secret file contents (the next use reads the file again, as a new process does)."""
    with _secret_lock:
        _secret_cache.clear()


def read_or_create_secret_file(path: Path) -> bytes:
    """Create the file once, atomically (written under a temporary name, then linked into place, so two
    processes starting together agree on one secret and never read a half-written file)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(secrets.token_urlsafe(48) + "\n")
            # Fails if another process linked its secret first: then that one is used. (Not logged:
            # `gpuest keys create` prints nothing but the key on stdout.)
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
    secret = path.read_text().strip()
    if len(secret) < 16:
        raise RuntimeError(f"the API-key hash secret in {path} is shorter than 16 characters")
    return secret.encode()


def keyed_digest(key: str) -> str:
    return KEYED_SCHEME + hmac.new(key_secret(), key.encode(), hashlib.sha256).hexdigest()


def legacy_digest(key: str) -> str:
    """The unkeyed SHA-256 digest rows from before the keyed hash hold."""
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(session: Session, owner: str) -> str:
    """Create a key for ``owner`` and return its secret (the only time it is visible)."""
    if not owner.strip():
        raise ValueError("owner must not be empty")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiKey(owner=owner, prefix=secret[:PREFIX_LENGTH], key_hash=keyed_digest(secret)))
    session.flush()
    return secret


def register_key(session: Session, owner: str, secret: str) -> bool:
    """Register a key whose secret the operator chose (the first admin key from the environment or a secret
    file): True if it was added, False if a row with that secret exists already, revoked or not (a revoked
    key is never brought back by a restart)."""
    if not owner.strip():
        raise ValueError("owner must not be empty")
    if not (secret.startswith(KEY_PREFIX) and len(secret) >= len(KEY_PREFIX) + 32 and secret.isascii()
            and secret.isprintable() and not any(c.isspace() for c in secret)):
        raise ValueError(f"an API key is {KEY_PREFIX!r} and at least 32 more printable ASCII characters, no spaces")
    digest = keyed_digest(secret)
    if session.scalars(select(ApiKey).where(ApiKey.key_hash == digest)).first() is not None:
        return False
    session.add(ApiKey(owner=owner, prefix=secret[:PREFIX_LENGTH], key_hash=digest))
    session.flush()
    return True


def owner_for_key(session: Session, key: str) -> str | None:
    """The owner of an active key, or None. A legacy (unkeyed) row is rehashed when its key is used."""
    if not key.isascii() or not key.isprintable():  # no key holds such characters (and keys are ASCII)
        return None
    keyed, legacy = keyed_digest(key), legacy_digest(key)
    row = session.scalars(
        select(ApiKey).where(or_(ApiKey.key_hash == keyed, ApiKey.key_hash == legacy), ApiKey.revoked_at.is_(None))
    ).first()
    if row is None:
        return None
    if row.key_hash == legacy:
        row.key_hash = keyed
        log.info("API key rehashed with the keyed hash", key_id=row.id, prefix=row.prefix)
    return row.owner


def list_keys(session: Session, owner: str | None = None, include_revoked: bool = True) -> list[ApiKey]:
    """Keys, oldest first (their rows: id, owner, prefix, times; never a secret)."""
    query = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
    if owner is not None:
        query = query.where(ApiKey.owner == owner)
    if not include_revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    return list(session.scalars(query))


class KeyNotFoundError(LookupError):
    """No key, or more than one, matches the id or prefix given."""


def find_key(session: Session, id_or_prefix: str) -> ApiKey:
    """The key whose id or prefix (``gpe_`` and 6 characters, as ``gpuest keys list`` shows) is given."""
    if not storable_text(id_or_prefix):
        raise KeyNotFoundError(f"no API key has the id or prefix {id_or_prefix!r}")
    by_id = session.get(ApiKey, id_or_prefix)
    if by_id is not None:
        return by_id
    matches = list(session.scalars(select(ApiKey).where(ApiKey.prefix == id_or_prefix)))
    if not matches:
        raise KeyNotFoundError(f"no API key has the id or prefix {id_or_prefix!r}")
    if len(matches) > 1:
        ids = ", ".join(sorted(row.id for row in matches))
        raise KeyNotFoundError(f"{len(matches)} API keys have the prefix {id_or_prefix!r}; give the id: {ids}")
    return matches[0]


def revoke_key(session: Session, id_or_prefix: str) -> tuple[ApiKey, bool]:
    """Revoke a key; returns it and whether this call revoked it (False: it was revoked already)."""
    row = find_key(session, id_or_prefix)
    if row.revoked_at is not None:
        return row, False
    row.revoked_at = utcnow()
    session.flush()
    return row, True
