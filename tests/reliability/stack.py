"""The real service stack on throwaway servers: uvicorn serving ``api.app:app`` and Celery worker processes,
started with the same command lines and environment as ``gpuest serve`` (cli.serve), with auth on.

Unlike ``gpuest serve`` nothing supervises the children: a fault test kills a worker and starts its
replacement itself, so it knows exactly which process ran what. ``finished_runs`` reads the workers' logs:
a job counts as run once per ``job finished ... status=succeeded recorded=True`` line, the worker's own
record of the conditional UPDATE it won.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cli.serve import ManagedProcess, api_argv, free_port, stack_environment, wait_until_healthy, worker_argv
from store.migrate import upgrade_to_head

REPO_ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"succeeded", "failed", "cancelled"}
WORKER_READY_SECONDS = 60
STOP_GRACE_SECONDS = 5  # then SIGKILL: a test stack has nothing to hand back


@dataclass
class ServiceStack:
    base_url: str
    env: dict[str, str]
    log_dir: Path
    api: ManagedProcess
    workers: list[ManagedProcess] = field(default_factory=list)
    _started: int = 0

    # -- processes ----------------------------------------------------------------------------------

    def start_worker(self, wait_ready: bool = True) -> ManagedProcess:
        queue = self.env["GPUEST_QUEUE"]
        worker = ManagedProcess(
            f"worker-{self._started}", worker_argv(queue), self.env, REPO_ROOT,
            self.log_dir / f"worker-{self._started}.log",
        )
        self._started += 1
        worker.start()
        self.workers.append(worker)
        if wait_ready:
            self.wait_worker_ready(worker)
        return worker

    def wait_worker_ready(self, worker: ManagedProcess) -> None:
        deadline = time.monotonic() + WORKER_READY_SECONDS
        while time.monotonic() < deadline:
            if "worker ready" in worker.log_tail(200_000):
                return
            if worker.exit_code() is not None:
                raise RuntimeError(f"{worker.name} exited with {worker.exit_code()}:\n{worker.log_tail()}")
            time.sleep(0.1)
        raise RuntimeError(f"{worker.name} not ready within {WORKER_READY_SECONDS} s:\n{worker.log_tail()}")

    def kill_worker(self, worker: ManagedProcess) -> None:
        """SIGKILL, as the OOM killer or a lost machine does: no warm shutdown, no hand-back."""
        assert worker.process is not None
        os.killpg(worker.process.pid, signal.SIGKILL)
        worker.process.wait(timeout=10)
        worker.stop()  # closes its log

    def worker_running(self, job_id: str) -> ManagedProcess:
        """The live worker whose log says it started ``job_id`` last."""
        for worker in reversed(self.workers):
            if worker.exit_code() is None and re.search(rf"job started\s+job_id={job_id}", worker.log_tail(10**7)):
                return worker
        raise AssertionError(f"no live worker has started job {job_id}")

    def stop(self) -> None:
        for child in (self.api, *self.workers):
            child.stop(grace=STOP_GRACE_SECONDS)

    # -- records ------------------------------------------------------------------------------------

    def worker_logs(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in sorted(self.log_dir.glob("worker-*.log")))

    def finished_runs(self, job_ids: Iterable[str]) -> dict[str, int]:
        """How many times each job was recorded as succeeded by a worker (exactly once is the goal)."""
        counts = dict.fromkeys(job_ids, 0)
        for line in self.worker_logs().splitlines():
            found = re.search(r"job finished\s.*\bjob_id=([0-9a-f-]{36})\b", line)
            if found and found[1] in counts and "status=succeeded" in line and "recorded=True" in line:
                counts[found[1]] += 1
        return counts

    def create_api_key(self, owner: str) -> str:
        """Through the admin command, in the stack's environment (so with its key-hashing settings)."""
        completed = subprocess.run(
            [sys.executable, "-m", "cli.main", "keys", "create", owner],
            env=self.env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True,
        )
        return completed.stdout.strip().splitlines()[-1]

    def client(self, api_key: str | None, timeout: float = 30.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)


@contextmanager
def service_stack(
    data_dir: Path,
    database_url: str,
    broker_url: str,
    *,
    workers: int = 1,
    api_workers: int = 1,
    settings: Mapping[str, str] | None = None,
) -> Iterator[ServiceStack]:
    """API + ``workers`` Celery workers on the given (throwaway) database and broker; auth on, CPU only."""
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    overrides = {
        "DATABASE_URL": database_url,
        "BROKER_URL": broker_url,
        "GPUEST_AUTH_ENABLED": "true",
        "GPUEST_DEVICE": "cpu",
        "GPUEST_QUEUE": f"reliability-{uuid.uuid4().hex[:8]}",
        # The API keys' HMAC secret, the same for the API, the workers and `gpuest keys create`.
        "GPUEST_KEY_SECRET": f"reliability-{uuid.uuid4().hex}",
        **(settings or {}),
    }
    env = stack_environment(data_dir, overrides)
    # The test process's own test-tier variables must not leak into the children.
    env.pop("GPUEST_DATABASE_URL", None)
    env.pop("GPUEST_BROKER_URL", None)
    env.pop("REDIS_URL", None)
    upgrade_to_head(database_url)
    port = free_port()
    stack = ServiceStack(
        base_url=f"http://127.0.0.1:{port}",
        env=env,
        log_dir=log_dir,
        api=ManagedProcess("API", api_argv("127.0.0.1", port, api_workers), env, REPO_ROOT, log_dir / "api.log"),
    )
    try:
        stack.api.start()
        for _ in range(workers):
            stack.start_worker(wait_ready=False)
        wait_until_healthy(stack.base_url, stack.api)
        for worker in stack.workers:
            stack.wait_worker_ready(worker)
        yield stack
    finally:
        stack.stop()


# -- job helpers ------------------------------------------------------------------------------------

def submit(client: httpx.Client, kind: str, params: Mapping[str, Any]) -> str:
    response = client.post("/v1/jobs", json={"kind": kind, "params": dict(params)})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def wait_terminal(client: httpx.Client, job_ids: Iterable[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Poll until every job is terminal; the last state of each (a job still running at the deadline stays)."""
    pending = list(job_ids)
    states: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for job_id in list(pending):
            response = client.get(f"/v1/jobs/{job_id}")
            if response.status_code != 200:
                continue  # e.g. 503 just after an outage; polled again
            states[job_id] = response.json()
            if states[job_id]["status"] in TERMINAL:
                pending.remove(job_id)
        time.sleep(0.2)
    return states


def comparable(result: Mapping[str, Any]) -> dict[str, Any]:
    """A result without what legitimately differs between two runs of the same spec (timings, device)."""
    return {key: value for key, value in result.items() if key not in ("timings", "device")}
