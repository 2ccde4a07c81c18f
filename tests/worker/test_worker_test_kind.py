"""A kind registered in one line (``add_kind_modules``; ``GPUEST_EXTRA_KIND_MODULES`` in a worker process) is run
by the worker with nothing else changed: executed whole, capped by its own work measure on a CPU worker, and
fanned out by the generic fan-out over its own split (its planner handed its threshold), the reduction giving
the single run's result exactly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import numpy as np
import pytest

from core.queue import send
from core.settings import get_settings
from core.status import JobStatus
from kernels import registry
from kernels.context import RunContext, local_context, run_kind
from store import chunks as chunk_store
from store import jobs as job_store
from store.db import session_scope
from store.models import JobChunk
from tests.kinds import echo
from tests.worker.conftest import WorkerProcess, comparable, load, submit, wait_for
from worker import fanout, reaper
from worker.execute import execute_job
from worker.progress import JobProgress

ECHO_MODULE = "tests.kinds.echo"
WORKER = "host:1:parent"


@pytest.fixture
def echo_registered() -> Iterator[None]:
    registry.add_kind_modules(ECHO_MODULE)
    yield
    registry.remove_kind_modules(ECHO_MODULE)


def single_run(size: int) -> dict[str, object]:
    return comparable(run_kind(registry.get_kind(echo.KIND), {"size": size}, local_context(device="cpu")))


def test_the_worker_runs_the_registered_kind(echo_registered: None, stack_env: dict[str, str]) -> None:
    job_id = submit({"size": 2_500}, kind=echo.KIND)
    assert execute_job(job_id, worker="w1") == JobStatus.SUCCEEDED
    job = load(job_id)
    assert comparable(job.result) == single_run(2_500)
    assert job.result["sum_of_squares"] == sum(value * value for value in range(2_500))


def test_the_cpu_cap_measures_the_registered_kind(
    echo_registered: None, stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUEST_CPU_MAX_WORK", f'{{"{echo.KIND}": 2000}}')
    get_settings.cache_clear()
    within, over = submit({"size": 2_000}, kind=echo.KIND), submit({"size": 2_001}, kind=echo.KIND)
    assert execute_job(within, worker="w1") == JobStatus.SUCCEEDED
    assert execute_job(over, worker="w1") == JobStatus.FAILED
    error = load(over).error
    assert error["code"] == "cpu_work_cap" and error["message"].startswith("params.size: echo work size = 2e+03")


def fan_out(job_id: str, size: int) -> bool:
    with session_scope() as session:
        assert job_store.claim(session, job_id, worker=WORKER, device="cpu")
    ctx = RunContext(np, JobProgress(job_id, WORKER), lambda field: None)
    kind = registry.get_kind(echo.KIND)
    spec = kind.params_model.model_validate({"size": size})
    return fanout.try_fan_out(job_id, WORKER, kind, spec, ctx, get_settings().queue)


def test_the_generic_fan_out_splits_the_registered_kind_and_reduces_it_exactly(
    echo_registered: None, in_process: None, chunk_workers_die_after_storing: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The kind's own threshold, below its default (echo.MIN_SIZE): a job of 6,000 values is fanned out.
    monkeypatch.setenv("GPUEST_FANOUT_MIN_WORK", f'{{"{echo.KIND}": 5000}}')
    get_settings.cache_clear()
    small = submit({"size": 4_999}, kind=echo.KIND)
    assert not fan_out(small, 4_999)  # below it: run whole
    job_id = submit({"size": 6_000}, kind=echo.KIND)
    assert fan_out(job_id, 6_000)
    with session_scope() as session:
        rows = chunk_store.chunks_of(session, job_id)
        chunk_ids = [row.id for row in rows[1:]]
        assert [row.spec["blocks"] for row in rows] == [[0, 1], [1, 3], [3, 5], [5, 6]]
    for chunk_id in reversed(chunk_ids):
        assert fanout.execute_chunk(chunk_id, "host:2:chunk") == JobStatus.SUCCEEDED
    counts = reaper.reap_work(timedelta(seconds=0), max_attempts=3, idle=False, queue=get_settings().queue,
                              models=(JobChunk,))
    assert counts["reduced"] == 1
    job = load(job_id)
    assert job.status == JobStatus.SUCCEEDED and job.timings["chunks"] == 4
    assert comparable(job.result) == single_run(6_000)


@pytest.mark.slow
def test_a_worker_process_runs_the_kinds_of_gpuest_extra_kind_modules(
    stack_env: dict[str, str], start_worker: Callable[[], WorkerProcess]
) -> None:
    stack_env.update(GPUEST_EXTRA_KIND_MODULES=f'["{ECHO_MODULE}"]')  # the worker's environment
    worker = start_worker()
    wait_for(lambda: "worker ready" in worker.output() or worker.process.poll() is not None, 120, "the worker")
    job_id = submit({"size": 2_500}, kind=echo.KIND, queue=stack_env["GPUEST_QUEUE"])
    send(job_id, queue=stack_env["GPUEST_QUEUE"])
    wait_for(lambda: load(job_id).status in (JobStatus.SUCCEEDED, JobStatus.FAILED), 120, "the job to end")
    job = load(job_id)
    assert job.status == JobStatus.SUCCEEDED, (job.error, worker.output()[-3000:])
    assert job.result["sum_of_squares"] == sum(value * value for value in range(2_500))
