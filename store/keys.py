"""API keys: random secrets shown once, stored as SHA-256 digests (the secrets are high-entropy)."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from store.models import ApiKey

KEY_PREFIX = "gpe_"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(session: Session, owner: str) -> str:
    """Create a key for ``owner`` and return its secret (the only time it is visible)."""
    if not owner.strip():
        raise ValueError("owner must not be empty")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiKey(owner=owner, prefix=secret[: len(KEY_PREFIX) + 6], key_hash=_digest(secret)))
    session.flush()
    return secret


def owner_for_key(session: Session, key: str) -> str | None:
    """The owner of an active key, or None."""
    row = session.scalars(select(ApiKey).where(ApiKey.key_hash == _digest(key), ApiKey.revoked_at.is_(None))).first()
    return row.owner if row else None
