"""``gpuest keys create | list | revoke`` as an operator runs them (in this process, each command reading its
environment afresh as a new process does), and the key-hash secret file that every process of one data
directory shares (real processes starting together)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.cli_helpers import environment, gpuest_in_process, sqlite_env


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    environment = sqlite_env(tmp_path / "var")
    migrated = gpuest_in_process("db", "upgrade", env=environment)
    assert migrated.returncode == 0, migrated.stderr
    return environment


def create(owner: str, env: dict[str, str]) -> str:
    created = gpuest_in_process("keys", "create", owner, env=env)
    assert created.returncode == 0, created.stderr
    return created.stdout.strip()


def listed(env: dict[str, str], *options: str) -> list[dict[str, object]]:
    done = gpuest_in_process("keys", "list", "--json", *options, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def owner_of(key: str, env: dict[str, str]) -> str:
    """What the API's key check answers for ``key``, with settings and key secret read afresh (as an API
    process of that environment reads them)."""
    from store.db import session_scope
    from store.keys import owner_for_key

    with environment(env), session_scope() as session:
        return str(owner_for_key(session, key))


def test_keys_list_shows_ids_owners_and_prefixes_never_a_secret_or_hash(env) -> None:
    alice, bob = create("alice", env), create("bob", env)
    rows = listed(env)
    assert [(row["owner"], row["prefix"], row["revoked_at"]) for row in rows] == [
        ("alice", alice[:10], None), ("bob", bob[:10], None)]
    assert set(rows[0]) == {"id", "owner", "prefix", "created_at", "revoked_at"}
    table = gpuest_in_process("keys", "list", env=env)
    secret = (Path(env["GPUEST_DATA_DIR"]) / "key_secret").read_text().strip()
    for text in (table.stdout + table.stderr, json.dumps(rows)):
        assert alice not in text and bob not in text and "hmac" not in text and secret not in text
    assert "alice" in table.stdout and bob[:10] in table.stdout and "2 keys, 2 active" in table.stdout
    assert [row["owner"] for row in listed(env, "--owner", "bob")] == ["bob"]


def test_keys_revoke_by_prefix_or_id_and_the_key_stops_working(env) -> None:
    alice, spare = create("alice", env), create("alice", env)
    assert owner_of(alice, env) == "alice"

    revoked = gpuest_in_process("keys", "revoke", alice[:10], env=env)
    assert revoked.returncode == 0 and "revoked" in revoked.stderr, revoked.stderr
    assert owner_of(alice, env) == "None" and owner_of(spare, env) == "alice"
    assert [row["prefix"] for row in listed(env, "--active")] == [spare[:10]]

    spare_id = next(row["id"] for row in listed(env) if row["prefix"] == spare[:10])
    assert gpuest_in_process("keys", "revoke", str(spare_id), env=env).returncode == 0
    assert owner_of(spare, env) == "None"
    again = gpuest_in_process("keys", "revoke", str(spare_id), env=env)
    assert again.returncode == 0 and "already revoked" in again.stderr

    unknown = gpuest_in_process("keys", "revoke", "gpe_nothing", env=env)
    assert unknown.returncode == 1 and "no API key" in unknown.stderr


@pytest.mark.slow
def test_the_key_secret_file_is_one_secret_for_processes_starting_together(tmp_path) -> None:
    """Several processes creating the secret at once must agree on one (else keys made by one process would
    not verify in another)."""
    env = {**os.environ, "GPUEST_DATA_DIR": str(tmp_path / "var")}
    env.pop("GPUEST_KEY_SECRET", None)
    probe = "from store.keys import key_secret; print(key_secret().decode())"
    processes = [subprocess.Popen([sys.executable, "-c", probe], env=env, stdout=subprocess.PIPE, text=True)
                 for _ in range(6)]
    secrets = {process.communicate(timeout=60)[0].strip() for process in processes}
    assert len(secrets) == 1 and (tmp_path / "var" / "key_secret").read_text().strip() in secrets
    assert not [path.name for path in (tmp_path / "var").iterdir() if path.name != "key_secret"]  # no leftovers


def test_keys_data_dir_writes_to_that_servers_database_and_secret(env, tmp_path: Path) -> None:
    # `gpuest serve --data-dir X` with auth on prints `gpuest keys --data-dir X create OWNER`: the key must land in
    # that server's database, under its key secret, not in ./var
    server_dir = tmp_path / "server-data"
    server_env = sqlite_env(server_dir)
    assert gpuest_in_process("db", "upgrade", env=server_env).returncode == 0
    # run from another data directory's environment, with no DATABASE_URL (set, it names the database, as for
    # `gpuest serve`): --data-dir alone must find the server's database and key secret
    elsewhere = {**env, "DATABASE_URL": "", "BROKER_URL": ""}
    created = gpuest_in_process("keys", "--data-dir", str(server_dir), "create", "carol", env=elsewhere)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert owner_of(key, server_env) == "carol"  # the server's database and key secret accept it
    assert [row["owner"] for row in listed(server_env)] == ["carol"]
    assert "carol" not in [row["owner"] for row in listed(env)]
    shown = gpuest_in_process("keys", "--data-dir", str(server_dir), "list", "--json", env=elsewhere)
    assert [row["owner"] for row in json.loads(shown.stdout)] == ["carol"]


def test_the_first_admin_key_comes_from_the_environment_once(env, tmp_path: Path) -> None:
    # the compose stack's first key without `docker compose exec` (its migrate service registers it)
    key = "gpe_" + "0123456789abcdef" * 3
    with_key = {**env, "GPUEST_ADMIN_KEY": key}
    first = gpuest_in_process("db", "upgrade", env=with_key)
    assert first.returncode == 0, first.stderr
    assert f"admin API key {key[:8]}... for 'admin' registered" in first.stderr
    assert owner_of(key, env) == "admin"
    again = gpuest_in_process("db", "upgrade", env=with_key)
    assert again.returncode == 0 and "already registered" in again.stderr
    assert [row["owner"] for row in listed(env)] == ["admin"]
    # revoked stays revoked across restarts of the migrate service
    assert gpuest_in_process("keys", "revoke", key[:10], env=env).returncode == 0
    assert gpuest_in_process("db", "upgrade", env=with_key).returncode == 0
    assert owner_of(key, env) == "None"
    # from a secret file, for another owner
    secret_file = tmp_path / "admin_key"
    other = "gpe_" + "f" * 40
    secret_file.write_text(other + "\n")
    from_file = gpuest_in_process("db", "upgrade", env={**env, "GPUEST_ADMIN_KEY_FILE": str(secret_file),
                                                 "GPUEST_ADMIN_OWNER": "ops"})
    assert from_file.returncode == 0, from_file.stderr
    assert owner_of(other, env) == "ops"


def test_a_malformed_admin_key_fails_the_upgrade_in_one_line(env) -> None:
    done = gpuest_in_process("db", "upgrade", env={**env, "GPUEST_ADMIN_KEY": "gpe_short"})
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert lines == ["error: GPUEST_ADMIN_KEY: an API key is 'gpe_' and at least 32 more printable ASCII characters, "
                     "no spaces"]
    assert "gpe_short" not in done.stderr and "Traceback" not in done.stderr
