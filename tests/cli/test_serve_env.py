"""The environment the embedded stack gives its two processes (no processes started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.serve import api_argv, banner, settings_from_env, stack_environment, worker_argv


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DATABASE_URL", "BROKER_URL", "REDIS_URL", "GPUEST_DATABASE_URL", "GPUEST_BROKER_URL",
                 "GPUEST_AUTH_ENABLED", "GPUEST_DATA_DIR", "GPUEST_QUEUE", "GPUEST_WEBHOOK_ALLOWED_NETWORKS",
                 "GPUEST_WEBHOOK_HTTP_HOSTS"):
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
        "-m", "uvicorn", "api.app:app", "--host", "127.0.0.1", "--port", "8123", "--no-access-log",
        "--http", "api.http_protocol:ProblemHttpToolsProtocol",
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


def test_stop_says_when_a_child_had_to_be_killed_after_the_grace_period(tmp_path: Path) -> None:
    import os
    import sys
    import time

    from cli.serve import EmbeddedStack, ManagedProcess

    # Stand-ins: an API that stops on SIGTERM, and a worker that ignores it (a kernel deaf to checkpoints).
    polite = "import time; print('up', flush=True); time.sleep(60)"
    stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + polite
    env = dict(os.environ)
    api = ManagedProcess("API", [sys.executable, "-c", polite], env, tmp_path, tmp_path / "api.log")
    worker = ManagedProcess("worker", [sys.executable, "-c", stubborn], env, tmp_path, tmp_path / "worker.log")
    messages: list[str] = []
    stack = EmbeddedStack(base_url="", data_dir=tmp_path, env={}, api=api, worker=worker, say=messages.append)
    api.start()
    worker.start()
    deadline = time.monotonic() + 30
    while "up" not in worker.log_tail() or "up" not in api.log_tail():  # the worker ignores SIGTERM from here on
        assert time.monotonic() < deadline, "the stand-in children did not start"
        time.sleep(0.05)
    stack.stop(grace=0.5)
    assert api.exit_code() == -15 and worker.exit_code() == -9
    assert messages == [
        f"gpuest: the worker process (pid {worker.pid}) did not stop within 0.5 s; killed it (a job it was running "
        "stays 'running' until a worker's reaper re-queues it)"
    ]


def test_without_auth_webhooks_may_reach_loopback_unless_the_operator_says_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = stack_environment(tmp_path)
    assert settings_from_env(env).webhook_allowed_networks == ["127.0.0.0/8", "::1/128"]
    assert "GPUEST_WEBHOOK_ALLOWED_NETWORKS" not in stack_environment(tmp_path, {"GPUEST_AUTH_ENABLED": "true"})
    monkeypatch.setenv("GPUEST_WEBHOOK_ALLOWED_NETWORKS", '["10.0.0.0/8"]')
    settings = settings_from_env(stack_environment(tmp_path))
    assert settings.webhook_allowed_networks == ["10.0.0.0/8"]


def test_json_valued_settings_are_read_as_the_children_read_them(tmp_path: Path) -> None:
    # `gpuest serve` with GPUEST_CPU_MAX_WORK (a JSON object) in its environment refused to start
    env = stack_environment(tmp_path, {"GPUEST_CPU_MAX_WORK": '{"ks_solve": 0}',
                                       "GPUEST_WEBHOOK_HTTP_HOSTS": '["receiver.internal"]'})
    settings = settings_from_env(env)
    assert settings.cpu_max_work == {"ks_solve": 0.0}
    assert settings.webhook_http_hosts == ["receiver.internal"]
