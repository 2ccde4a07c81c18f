"""The CPU caps in the worker: a job placed on NumPy whose work passes its kind's
GPUEST_CPU_MAX_WORK entry (else its kind's default), or whose memory estimate passes GPUEST_CPU_MAX_JOB_BYTES,
fails before computing, with the code cpu_work_cap and the API's message (the API
refuses it at submission only where it knows jobs run on CPU); a job within the cap runs."""

from __future__ import annotations

import time

import pytest
from conftest import SMALL, _clear_caches, load, submit

from worker.execute import execute_job

SMALL_WORK = SMALL["replications"] * SMALL["n_clusters"] * SMALL["cluster_size"]


@pytest.fixture
def cap(stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUEST_CPU_MAX_WORK", f'{{"crve_montecarlo": {SMALL_WORK}}}')
    _clear_caches()


def test_a_job_over_the_cap_fails_before_computing_and_one_within_runs(cap: None) -> None:
    within = submit(SMALL)
    over = submit({**SMALL, "replications": SMALL["replications"] + 1})
    assert execute_job(within, worker="w1") == "succeeded"
    assert execute_job(over, worker="w1") == "failed"
    job = load(over)
    assert job.error["code"] == "cpu_work_cap" and job.result is None
    assert job.error["message"].startswith("params.replications: crve_montecarlo work")
    assert "GPUEST_CPU_MAX_WORK" in job.error["message"]


def test_default_caps_fail_gpu_sized_jobs_on_a_cpu_worker_fast(stack_env: dict[str, str]) -> None:
    # no GPUEST_CPU_MAX_WORK: the kinds' default work caps and the default memory cap (8 GiB); the panel of
    # 2e8 agents would take this worker past 20 GB, the 64^3 dual-control default most of an hour
    memory = submit({"n_agents": 200_000_000}, kind="ks_solve")
    work = submit({}, kind="dualcontrol_solve")
    started = time.monotonic()
    assert execute_job(memory, worker="w1") == "failed"
    error = load(memory).error
    assert error["code"] == "cpu_memory_cap" and error["type"] == "CpuMemoryCap"
    assert error["message"].startswith("params.n_agents: ks_solve needs about")
    assert "GPUEST_CPU_MAX_JOB_BYTES" in error["message"] and "GPU worker" in error["message"]
    assert execute_job(work, worker="w1") == "failed"
    error = load(work).error
    assert error["code"] == "cpu_work_cap" and error["message"].startswith("params.grid: ")
    assert time.monotonic() - started < 30
