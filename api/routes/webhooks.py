"""/v1/webhooks: the caller's webhook signing secret (the submission check of a callback_url is
api/callbacks.py). The scheme is described in store/webhooks.py."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import OwnerDep
from api.schemas import WebhookSecretOut
from store import webhooks as webhook_store

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


@router.get("/secret", response_model=WebhookSecretOut, summary="Your webhook signing secret")
def webhook_secret(owner: OwnerDep) -> WebhookSecretOut:
    """The key your deliveries are signed with: recompute ``sha256=`` + hex(HMAC-SHA256(secret, timestamp + "." +
    raw body)) with the ``X-Gpuest-Timestamp`` header and compare it to ``X-Gpuest-Signature`` in constant time;
    refuse timestamps older than a few minutes (replays). Derived from the server's secret and your owner name:
    the same for all your keys, different for every owner."""
    return WebhookSecretOut(secret=webhook_store.owner_secret(owner))
