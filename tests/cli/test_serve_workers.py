"""``gpuest serve --gpus N`` / ``--cpu-workers N``: one worker process per GPU pinned with
CUDA_VISIBLE_DEVICES, or N CPU workers; a clear one-line refusal where the GPUs are not there; and the
embedded stack with two CPU workers fanning one crve_montecarlo job out over both, surviving a worker
killed mid-chunk with the single run's result."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from cli.client import GpuestClient
from cli.serve import StackStartError, embedded_stack, visible_gpu_count, worker_argv, worker_environments
from kernels.context import local_context, run_kind
from kernels.registry import get_kind
from tests.cli.cli_helpers import gpuest_in_process, sqlite_env
from tests.cli.test_embedded_stack import wait_for

# 8 NumPy blocks (about 1.5 s each here): the lead and 7 blocks in 2 chunks, one per worker.
FANNED = {"n_clusters": 50, "cluster_size": 30, "n_regressors": 3, "replications": 8_000, "seed": 23}


def test_one_worker_per_gpu_pinned_with_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert worker_environments(2, gpu_count=lambda: 4) == [
        {"CUDA_VISIBLE_DEVICES": "0", "GPUEST_DEVICE": "gpu"}, {"CUDA_VISIBLE_DEVICES": "1", "GPUEST_DEVICE": "gpu"},
    ]
    # A host whose operator already narrowed the GPUs: the workers take from that list.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert [env["CUDA_VISIBLE_DEVICES"] for env in worker_environments(2, gpu_count=lambda: 2)] == ["2", "5"]
    assert worker_environments(cpu_workers=3) == [{"GPUEST_DEVICE": "cpu"}] * 3
    assert worker_environments() == [{}]  # one worker on the configured device, as before
    assert worker_argv("gpu", "worker-1")[-2:] == ["-n", "worker-1@%h"]


@pytest.mark.parametrize(
    ("gpus", "cpu_workers", "found", "message"),
    [(2, None, 0, "--gpus 2: no GPU is usable through CuPy on this machine"),
     (4, None, 2, "--gpus 4: this machine has 2 usable GPU(s)"),
     (1, 2, 1, "--gpus and --cpu-workers exclude each other")],
)
def test_missing_gpus_are_refused_in_one_line(gpus: int, cpu_workers: int | None, found: int, message: str) -> None:
    with pytest.raises(StackStartError) as refusal:
        worker_environments(gpus, cpu_workers, gpu_count=lambda: found)
    assert str(refusal.value).startswith(message) and "\n" not in str(refusal.value)


def test_gpuest_serve_gpus_on_a_machine_without_gpu_says_so_and_starts_nothing(tmp_path: Path) -> None:
    if visible_gpu_count() > 0:
        pytest.skip("this machine has a GPU: `gpuest serve --gpus 2` would start")
    completed = gpuest_in_process("serve", "--gpus", "2", "--data-dir", str(tmp_path / "data"),
                                  env=sqlite_env(tmp_path))
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert completed.returncode == 1, completed.stderr
    assert len(lines) == 1 and lines[0].startswith("error: --gpus 2: no GPU is usable through CuPy"), lines
    assert "--cpu-workers" in lines[0]
    assert not (tmp_path / "data").exists()  # refused before migrating or starting anything


def chunk_rows(database_url: str, job_id: str) -> list[tuple[int, str, int, str]]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(
                "SELECT chunk_index, status, attempts, worker FROM job_chunks WHERE job_id = :job ORDER BY chunk_index"
            ), {"job": job_id})]  # fmt: skip
    finally:
        engine.dispose()


@pytest.mark.slow
def test_two_cpu_workers_fan_a_job_out_and_survive_a_killed_chunk_worker(tmp_path: Path) -> None:
    env = sqlite_env(tmp_path, GPUEST_HEARTBEAT_SECONDS="0.5", GPUEST_STALE_AFTER_SECONDS="3",
                     GPUEST_REAPER_INTERVAL_SECONDS="0.5")
    messages: list[str] = []
    undisturbed = run_kind(get_kind("crve_montecarlo"), FANNED, local_context(device="cpu"))
    with embedded_stack(tmp_path, env=env, log_dir=tmp_path / "logs", say=messages.append,
                        cpu_workers=2) as stack, GpuestClient(stack.base_url) as client:
        assert len(stack.workers) == 2 and stack.env["GPUEST_FANOUT_CHUNKS"] == "2"
        database_url = stack.env["DATABASE_URL"]
        first = client.submit("crve_montecarlo", FANNED)["id"]
        job = client.wait(first, timeout=180, poll_interval=0.2)
        assert job["status"] == "succeeded", (job, stack.worker.log_tail())
        calm = client.result(first)
        rows = chunk_rows(database_url, first)
        assert [row[:3] for row in rows] == [(0, "succeeded", 1), (1, "succeeded", 1), (2, "succeeded", 1)]
        assert {int(row[3].split(":")[1]) for row in rows[1:]} == {worker.pid for worker in stack.workers}

        # The same job again; a chunk's worker is killed half-way: that chunk alone runs again.
        second = client.submit("crve_montecarlo", FANNED)["id"]
        wait_for(lambda: any(row[1] == "running" for row in chunk_rows(database_url, second)[1:]), 120,
                 "a chunk to run")
        index, _, _, holder = next(row for row in chunk_rows(database_url, second)[1:] if row[1] == "running")
        os.kill(int(holder.split(":")[1]), signal.SIGKILL)
        job = client.wait(second, timeout=180, poll_interval=0.2)
        disturbed = client.result(second)
        rows = chunk_rows(database_url, second)
    assert job["status"] == "succeeded" and job["attempts"] == 1, job
    assert [row[2] for row in rows] == [2 if row[0] == index else 1 for row in rows]
    assert any("exited with code -9" in message for message in messages), messages
    ignore = {"timings", "device"}
    expected = {key: value for key, value in undisturbed.items() if key not in ignore}
    assert {key: value for key, value in calm.items() if key not in ignore} == expected
    assert {key: value for key, value in disturbed.items() if key not in ignore} == expected
