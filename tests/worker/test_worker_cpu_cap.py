"""The CPU work cap in the worker (issue 16): a job placed on NumPy whose work passes its kind's
GPUEST_CPU_MAX_WORK entry fails before computing, with the code cpu_work_cap and the API's message (the API
refuses it at submission only where it knows jobs run on CPU); a job within the cap runs."""

from __future__ import annotations

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
