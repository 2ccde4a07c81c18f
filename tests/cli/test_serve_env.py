"""The environment the embedded stack gives its two processes (no processes started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.serve import api_argv, banner, stack_environment, worker_argv


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DATABASE_URL", "BROKER_URL", "REDIS_URL", "GPUEST_DATABASE_URL", "GPUEST_BROKER_URL",
                 "GPUEST_AUTH_ENABLED", "GPUEST_DATA_DIR", "GPUEST_QUEUE"):
        monkeypatch.delenv(name, raising=False)


def test_embedded_defaults_are_sqlite_under_the_data_dir_and_auth_off(tmp_path: Path) -> None:
    env = stack_environment(tmp_path / "data")
    data_dir = (tmp_path / "data").resolve()
    assert env["GPUEST_DATA_DIR"] == str(data_dir)
    assert env["DATABASE_URL"] == f"sqlite:///{data_dir / 'gpuest.sqlite3'}"
    assert env["BROKER_URL"] == f"sqla+sqlite:///{data_dir / 'broker.sqlite3'}"
    assert env["GPUEST_AUTH_ENABLED"] == "false"


def test_server_urls_and_auth_from_the_environment_are_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://u:secret@db/gpuest")
    monkeypatch.setenv("REDIS_URL", "redis://cache:6379/0")
    monkeypatch.setenv("GPUEST_AUTH_ENABLED", "true")
    env = stack_environment(tmp_path)
    assert env["DATABASE_URL"] == "postgresql+psycopg://u:secret@db/gpuest"
    assert env["BROKER_URL"] == "redis://cache:6379/0"
    assert env["GPUEST_AUTH_ENABLED"] == "true"


def test_overrides_win_and_the_worker_consumes_the_configured_queue(tmp_path: Path) -> None:
    env = stack_environment(tmp_path, {"BROKER_URL": "redis://other:6379/1", "GPUEST_QUEUE": "cpu"})
    assert env["BROKER_URL"] == "redis://other:6379/1"
    argv = worker_argv("cpu")
    assert argv[argv.index("-Q") + 1] == "cpu" and argv[argv.index("--pool") + 1] == "solo"
    assert api_argv("127.0.0.1", 8123)[1:] == [
        "-m", "uvicorn", "api.app:app", "--host", "127.0.0.1", "--port", "8123", "--no-access-log"
    ]
    assert api_argv("127.0.0.1", 8123, workers=2)[-2:] == ["--workers", "2"]


def test_the_banner_hides_database_passwords(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cli.serve import EmbeddedStack, ManagedProcess

    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://u:secret@db/gpuest")
    env = stack_environment(tmp_path)
    idle = ManagedProcess("API", [], env, tmp_path, None)
    stack = EmbeddedStack("http://127.0.0.1:8000", tmp_path, env, idle, idle, say=print)
    text = "\n".join(banner(stack))
    assert "secret" not in text and "postgresql+psycopg://u:***@db/gpuest" in text
    assert "auth: OFF" in text and "curl -s -X POST http://127.0.0.1:8000/v1/jobs" in text
