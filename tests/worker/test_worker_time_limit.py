"""A time limit per job (worker/time_limit.py): the soft limit from the kind's work estimate, at which the next
progress checkpoint fails the job, and the hard limit behind it, at which the watchdog fails the job and ends the
worker process (injected here: the test counts the call). The kernels are the test kind tests/kinds/sleepy.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from core.queue import send
from core.settings import Settings, get_settings
from kernels import registry as kind_registry
from kernels.fanout import Split
from store import chunks as chunk_store
from store import jobs as job_store
from store.db import session_scope
from tests.kinds import sleepy
from tests.worker.conftest import SMALL, WorkerProcess, load, submit, wait_for
from worker import fanout
from worker.execute import execute_job
from worker.time_limit import (
    EXIT_TIME_LIMIT,
    TIME_LIMIT_CODE,
    Deadline,
    TimeLimit,
    TimeLimitExceeded,
    Watchdog,
    time_limit,
)

SLEEPY_MODULE = "tests.kinds.sleepy"


@pytest.fixture
def sleepy_kind(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The test kind registered in this process (the one place that registers it)."""
    kind_registry.add_kind_modules(SLEEPY_MODULE)
    yield sleepy.KIND
    kind_registry.remove_kind_modules(SLEEPY_MODULE)


@pytest.fixture
def short_limits(stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Limits of a second: the sleepy kind has no work estimate, so its soft limit is the maximum."""
    monkeypatch.setenv("GPUEST_TIME_LIMIT_MAX_SECONDS", "1")
    monkeypatch.setenv("GPUEST_TIME_LIMIT_GRACE_SECONDS", "1")
    get_settings.cache_clear()


def test_the_soft_limit_follows_the_work_estimate_within_floor_and_maximum() -> None:
    # 200 replications x (20 x 10) observations = 40,000 units
    params = kind_registry.get_kind("crve_montecarlo").params_model.model_validate(SMALL)
    settings = Settings(time_limit_factor=10, time_limit_default_work_per_second=100, time_limit_min_seconds=5,
                        time_limit_max_seconds=10_000, time_limit_grace_seconds=7)
    limit = time_limit("crve_montecarlo", params, {}, settings)
    assert limit is not None and limit.soft_seconds == pytest.approx(4000) and limit.hard_seconds == pytest.approx(4007)
    assert "GPUEST_TIME_LIMIT_WORK_PER_SECOND" in limit.message(hard=False) and "4000 s" in limit.message(hard=False)
    faster = settings.model_copy(update={"time_limit_work_per_second": {"crve_montecarlo": 1e6}})
    assert time_limit("crve_montecarlo", params, {}, faster).soft_seconds == 5  # type: ignore[union-attr]
    capped = settings.model_copy(update={"time_limit_max_seconds": 60})
    assert time_limit("crve_montecarlo", params, {}, capped).soft_seconds == 60  # type: ignore[union-attr]
    unmeasured = time_limit("sleepy", sleepy.SleepyParams(seconds=1), {}, settings)
    assert unmeasured is not None and unmeasured.soft_seconds == 10_000
    assert time_limit("crve_montecarlo", params, {}, settings.model_copy(update={"time_limit_factor": 0})) is None


def test_the_deadline_raises_past_the_soft_limit_only() -> None:
    limit = TimeLimit("sleepy", 0.2, 0.1, "a test limit")
    deadline = Deadline(limit, started=time.monotonic())
    deadline.check()
    Deadline(None, started=0.0).check()  # no limit: never raises
    time.sleep(0.25)
    with pytest.raises(TimeLimitExceeded, match="soft time limit of 0 s"):
        deadline.check()


def test_the_watchdog_acts_once_past_the_hard_limit_and_not_for_a_job_that_ended() -> None:
    fired = threading.Event()
    with Watchdog(Deadline(TimeLimit("sleepy", 0.1, 0.1, "a test limit")), fired.set) as watchdog:
        assert fired.wait(2.0) and watchdog.fired
    ended = threading.Event()
    with Watchdog(Deadline(TimeLimit("sleepy", 0.2, 0.1, "a test limit")), ended.set) as watchdog:
        pass
    time.sleep(0.5)
    assert not ended.is_set() and not watchdog.fired


def test_a_job_checking_progress_fails_at_its_soft_limit(sleepy_kind: str, short_limits: None) -> None:
    ended: list[bool] = []
    job_id = submit({"seconds": 10, "step_seconds": 0.05}, kind=sleepy_kind)
    started = time.monotonic()
    assert execute_job(job_id, worker="w1", end_process=lambda: ended.append(True)) == "failed"
    assert time.monotonic() - started < 5 and not ended  # stopped at a checkpoint: the process lives on
    job = load(job_id)
    assert (job.error["code"], job.error["type"]) == (TIME_LIMIT_CODE, "TimeLimitExceeded")
    assert "soft time limit of 1 s" in job.error["message"]
    assert "GPUEST_TIME_LIMIT_MAX_SECONDS" in job.error["message"]


def test_a_hung_job_is_failed_at_its_hard_limit_and_the_process_ends(sleepy_kind: str, short_limits: None) -> None:
    ended: list[float] = []
    job_id = submit({"seconds": 4}, kind=sleepy_kind)  # one sleep: no checkpoint to stop at
    started = time.monotonic()
    # The injected end of the process returns (a real worker exits there): the sleep then ends, and its late
    # result is not stored over the recorded failure.
    assert execute_job(job_id, worker="w1", end_process=lambda: ended.append(time.monotonic() - started)) is None
    assert len(ended) == 1 and 1.9 < ended[0] < 3.9
    job = load(job_id)
    assert (job.status, job.error["code"], job.attempts) == ("failed", TIME_LIMIT_CODE, 1)
    assert "hard time limit of 2 s" in job.error["message"] and job.result is None
    assert job.timings["run"] >= 2.0
    with session_scope() as session:  # not re-queued, and its heartbeat stopped with it
        assert chunk_store.chunks_of(session, job_id) == []


def test_a_hung_chunk_fails_its_job_at_the_hard_limit(sleepy_kind: str, short_limits: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A fanned-out job of the sleepy kind: its chunk sleeps without a checkpoint.
    split = Split(plan=lambda *args: [{"size": 1}], lead=lambda params, ctx, specs: ({}, {}, specs),
                         run=lambda params, ctx, spec: sleepy.run(params, ctx).model_dump(), reduce=None)
    monkeypatch.setattr(fanout, "SPLITS", {**fanout.SPLITS, sleepy_kind: split})
    job_id = submit({"seconds": 4}, kind=sleepy_kind)
    with session_scope() as session:
        assert job_store.claim(session, job_id, worker="w0", device="cpu")
        ids = chunk_store.fan_out(session, job_id, worker="w0", group_id="g", device="cpu", queue="q", chunks=[
            chunk_store.ChunkPlan({}, {}), chunk_store.ChunkPlan({"size": 1})])
    assert ids is not None
    ended: list[bool] = []
    fanout.execute_chunk(ids[1], "w1", end_process=lambda: ended.append(True))
    assert ended == [True]
    job = load(job_id)
    assert (job.status, job.error["code"]) == ("failed", TIME_LIMIT_CODE)
    assert job.error["message"].startswith("chunk 1: the job ran past its hard time limit")


@pytest.mark.slow
def test_a_worker_process_frees_its_device_at_a_hung_jobs_hard_limit(
    stack_env: dict[str, str], start_worker: Callable[[], WorkerProcess]
) -> None:
    """The real thing: a worker process serving the sleepy kind (GPUEST_EXTRA_KIND_MODULES) runs a kernel that
    hangs; at the hard limit the job is failed with the time-limit code and the process exits on its own."""
    stack_env.update(GPUEST_EXTRA_KIND_MODULES=f'["{SLEEPY_MODULE}"]', GPUEST_TIME_LIMIT_MAX_SECONDS="1",
                     GPUEST_TIME_LIMIT_GRACE_SECONDS="1")
    worker = start_worker()
    wait_for(lambda: "worker ready" in worker.output() or worker.process.poll() is not None, 120, "the worker")
    job_id = submit({"seconds": 60}, kind=sleepy.KIND, queue=stack_env["GPUEST_QUEUE"])
    send(job_id, queue=stack_env["GPUEST_QUEUE"])
    wait_for(lambda: worker.process.poll() is not None, 90, "the worker process to end at the hard limit")
    assert worker.process.returncode == EXIT_TIME_LIMIT, worker.output()[-3000:]
    job = load(job_id)
    assert (job.status, job.error["code"]) == ("failed", TIME_LIMIT_CODE), worker.output()[-3000:]
    assert "hard time limit of 2 s" in job.error["message"]
