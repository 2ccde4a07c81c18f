"""The embedded stack as real processes: ``gpuest serve`` starts, answers and stops cleanly on Ctrl-C; a
worker killed with SIGKILL is restarted and its job succeeds once; API keys from ``gpuest keys create``
gate the API; the same stack on Postgres + Redis."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from cli.client import ApiError, GpuestClient
from cli.serve import embedded_stack, free_port
from kernels.context import local_context, run_kind
from kernels.registry import get_kind
from tests import servers
from tests.cli.cli_helpers import LONG_PARAMS, TINY_PARAMS, gpuest_in_process, run_gpuest, sqlite_env

# Two blocks of replications, a few seconds on NumPy: killed while running, it must be re-run from the start.
KILL_PARAMS = {**LONG_PARAMS, "replications": 2000}


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0): read its state.
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(") ", 1)[1].startswith("Z")


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_a_worker_killed_mid_job_is_restarted_and_the_job_succeeds_once(tmp_path: Path) -> None:
    env = sqlite_env(
        tmp_path,
        GPUEST_HEARTBEAT_SECONDS="0.5",
        GPUEST_STALE_AFTER_SECONDS="3",
        GPUEST_REAPER_INTERVAL_SECONDS="0.5",
    )
    messages: list[str] = []
    with embedded_stack(tmp_path, env=env, log_dir=tmp_path / "logs", say=messages.append) as stack, GpuestClient(
        stack.base_url
    ) as client:
        job_id = client.submit("crve_montecarlo", KILL_PARAMS)["id"]
        client.wait(job_id, timeout=120, poll_interval=0.05, until=lambda job: job["status"] != "queued")
        killed = stack.worker_pid
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: stack.worker_pid != killed and stack.worker.exit_code() is None, 30, "a new worker")
        job = client.wait(job_id, timeout=180, poll_interval=0.2)
        result = client.result(job_id)
    assert any("exited with code -9" in message for message in messages), messages
    assert stack.worker.restarts == 1
    assert (job["status"], job["attempts"], job["error"]) == ("succeeded", 2, None), job
    undisturbed = run_kind(get_kind("crve_montecarlo"), KILL_PARAMS, local_context(device="cpu"))
    ignore = {"timings", "device"}
    assert {k: v for k, v in result.items() if k not in ignore} == {
        k: v for k, v in undisturbed.items() if k not in ignore
    }


@pytest.mark.slow
def test_gpuest_serve_prints_how_to_use_it_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, **sqlite_env(tmp_path)}
    env.pop("GPUEST_AUTH_ENABLED", None)
    serve = subprocess.Popen(
        [str(Path(sys.executable).with_name("gpuest")), "serve", "--port", str(port), "--data-dir", str(tmp_path)],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )
    lines: list[str] = []
    try:
        assert serve.stderr is not None
        for line in serve.stderr:
            lines.append(line)
            if "Ctrl-C stops" in line:
                break
        banner = "".join(lines)
        assert f"gpuest is running at http://127.0.0.1:{port}" in banner, banner
        assert "auth: OFF" in banner and f"curl -s -X POST http://127.0.0.1:{port}/v1/jobs" in banner
        pids = [int(pid) for pid in re.findall(r"(?:worker|API) pid (\d+)", banner)]
        assert len(pids) == 2
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").json() == {"status": "ok"}
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz")
        assert ready.status_code == 200, ready.text
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=60) == 0
        rest = serve.stderr.read()
    finally:
        if serve.poll() is None:
            serve.kill()
    assert "stopping the API and the worker" in rest and "gpuest: stopped" in rest
    assert all(process_gone(pid) for pid in pids)
    assert not port_open(port)
    assert (tmp_path / "gpuest.sqlite3").exists() and (tmp_path / "broker.sqlite3").exists()


def test_gpuest_serve_refuses_a_busy_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        refused = gpuest_in_process("serve", "--port", str(port), "--data-dir", str(tmp_path),
                                    env=sqlite_env(tmp_path))
    assert refused.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.slow
def test_keys_create_needs_a_migrated_database(tmp_path: Path) -> None:
    env = sqlite_env(tmp_path)
    refused = run_gpuest("keys", "create", "alice", env=env)
    assert refused.returncode == 1 and "gpuest db upgrade" in refused.stderr
    upgraded = run_gpuest("db", "upgrade", env=env)
    assert upgraded.returncode == 0, upgraded.stderr
    created = run_gpuest("keys", "create", "alice", env=env)
    assert created.returncode == 0, created.stderr
    assert re.fullmatch(r"gpe_[\w-]{20,}", created.stdout.strip())
    assert "shown only this once" in created.stderr


@pytest.mark.slow
def test_api_keys_from_the_cli_gate_the_api_per_owner(tmp_path: Path) -> None:
    env = sqlite_env(tmp_path, GPUEST_AUTH_ENABLED="true")
    with embedded_stack(tmp_path, env=env, log_dir=tmp_path / "logs") as stack:
        assert stack.auth_enabled
        alice, bob = (gpuest_in_process("keys", "create", owner, env=env).stdout.strip() for owner in ("alice", "bob"))
        anonymous = gpuest_in_process("jobs", "list", "--url", stack.base_url, env={"GPUEST_API_KEY": ""})
        assert anonymous.returncode == 1 and "HTTP 401" in anonymous.stderr
        with GpuestClient(stack.base_url, bob) as bob_client, GpuestClient(stack.base_url, alice) as alice_client:
            bobs_job = bob_client.submit("crve_montecarlo", TINY_PARAMS)["id"]
            with pytest.raises(ApiError) as hidden:
                alice_client.get_job(bobs_job)
            assert hidden.value.status_code == 404
        listed = gpuest_in_process("jobs", "list", "--json", "--url", stack.base_url, env={"GPUEST_API_KEY": bob})
        assert listed.returncode == 0 and bobs_job in listed.stdout


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """A throwaway database beside the one DATABASE_URL names."""
    url, drop = servers.fresh_postgres_database(os.environ["DATABASE_URL"])
    yield url
    drop()


@pytest.mark.servers
def test_the_stack_runs_on_postgres_and_redis(tmp_path: Path, postgres_database: str) -> None:
    env = {
        "GPUEST_DATA_DIR": str(tmp_path),
        "DATABASE_URL": postgres_database,
        "BROKER_URL": os.environ["REDIS_URL"],
        "GPUEST_QUEUE": f"test-{uuid.uuid4().hex[:8]}",
        "GPUEST_DEVICE": "cpu",
    }
    with embedded_stack(tmp_path, env=env, log_dir=tmp_path / "logs") as stack, GpuestClient(
        stack.base_url
    ) as client:
        assert client.ready()["status"] == "ready"
        job = client.wait(client.submit("crve_montecarlo", TINY_PARAMS)["id"], timeout=120, poll_interval=0.1)
        assert (job["status"], job["device"]) == ("succeeded", "cpu")
        assert set(client.result(job["id"])["rejection_rate"]) == {"0.01", "0.05", "0.10"}
    assert not (tmp_path / "gpuest.sqlite3").exists()
