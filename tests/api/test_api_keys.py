"""API keys at rest (issue 11): a keyed hash (HMAC-SHA256 under a server secret), so the api_keys table is
neither a list of keys nor a way to mint one; legacy SHA-256 rows keep working and are rehashed on use;
revoked keys are refused."""

from __future__ import annotations

import hashlib
import hmac
import stat
from pathlib import Path

import pytest
from api_helpers import assert_problem
from sqlalchemy import select

from core.settings import get_settings
from store import keys as key_store
from store.db import session_scope
from store.models import ApiKey

SECRET = "a-server-secret-of-enough-length"


def stored_hashes() -> dict[str, str]:
    with session_scope() as session:
        return {row.prefix: row.key_hash for row in session.scalars(select(ApiKey))}


def key_header(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.both_backends
def test_keys_are_stored_as_an_hmac_under_the_data_dirs_secret_file(client, make_key, api_env) -> None:
    key = make_key("alice")
    secret_file = Path(api_env["GPUEST_DATA_DIR"]) / key_store.SECRET_FILE_NAME
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    secret = secret_file.read_text().strip()
    assert len(secret) >= 32

    stored = stored_hashes()[key[: key_store.PREFIX_LENGTH]]
    assert stored == "hmac-sha256:" + hmac.new(secret.encode(), key.encode(), hashlib.sha256).hexdigest()
    assert hashlib.sha256(key.encode()).hexdigest() not in stored  # the table alone does not verify a key
    assert client.get("/v1/jobs", headers=key_header(key)).status_code == 200


def test_the_secret_file_is_made_once_and_reused(api_env) -> None:
    first = key_store.key_secret()
    key_store.forget_secret()  # as a new process
    assert key_store.key_secret() == first


def test_a_configured_secret_wins_and_a_key_does_not_verify_under_another(client, make_key, monkeypatch) -> None:
    monkeypatch.setenv("GPUEST_KEY_SECRET", SECRET)
    get_settings.cache_clear()
    key = make_key("alice")
    stored = stored_hashes()[key[: key_store.PREFIX_LENGTH]]
    assert stored == "hmac-sha256:" + hmac.new(SECRET.encode(), key.encode(), hashlib.sha256).hexdigest()
    assert client.get("/v1/jobs", headers=key_header(key)).status_code == 200

    monkeypatch.setenv("GPUEST_KEY_SECRET", SECRET + "-rotated")
    get_settings.cache_clear()
    client.app.state.owner_cache.clear()
    assert_problem(client.get("/v1/jobs", headers=key_header(key)), 401)


@pytest.mark.both_backends
def test_a_legacy_sha256_row_still_verifies_and_is_rehashed_on_first_use(client, api_env) -> None:
    legacy_key = key_store.KEY_PREFIX + "legacy-key-made-before-the-keyed-hash-0123"
    with session_scope() as session:
        session.add(ApiKey(owner="carol", prefix=legacy_key[: key_store.PREFIX_LENGTH],
                           key_hash=hashlib.sha256(legacy_key.encode()).hexdigest()))
    response = client.post("/v1/jobs", json={"kind": "crve_montecarlo", "params": {
        "n_clusters": 10, "cluster_size": 5, "n_regressors": 2, "replications": 20, "seed": 7}},
        headers=key_header(legacy_key))
    assert response.status_code == 202, response.text
    stored = stored_hashes()[legacy_key[: key_store.PREFIX_LENGTH]]
    assert stored == key_store.keyed_digest(legacy_key)
    client.app.state.owner_cache.clear()
    assert client.get(response.headers["location"], headers=key_header(legacy_key)).status_code == 200


@pytest.mark.both_backends
def test_a_revoked_key_is_refused_once_the_cache_lets_go(client, make_key) -> None:
    key = make_key("alice")
    assert client.get("/v1/jobs", headers=key_header(key)).status_code == 200
    with session_scope() as session:
        row, revoked_now = key_store.revoke_key(session, key[: key_store.PREFIX_LENGTH])
    assert revoked_now and row.owner == "alice"
    client.app.state.owner_cache.clear()  # what KEY_CACHE_SECONDS does in production
    assert_problem(client.get("/v1/jobs", headers=key_header(key)), 401)
    with session_scope() as session:
        assert key_store.revoke_key(session, row.id)[1] is False  # already revoked: unchanged


@pytest.mark.both_backends
def test_find_key_refuses_an_ambiguous_or_unknown_prefix(api_env) -> None:
    import pytest

    with session_scope() as session:
        session.add_all([ApiKey(owner="a", prefix="gpe_same00", key_hash="x1"),
                         ApiKey(owner="b", prefix="gpe_same00", key_hash="x2")])
    with session_scope() as session, pytest.raises(key_store.KeyNotFoundError, match="2 API keys"):
        key_store.find_key(session, "gpe_same00")
    with session_scope() as session, pytest.raises(key_store.KeyNotFoundError, match="no API key"):
        key_store.find_key(session, "gpe_nothing")
    with session_scope() as session, pytest.raises(key_store.KeyNotFoundError):
        key_store.find_key(session, "gpe_\x00")
