"""A crve_bootstrap job fanned out over workers (issue 19): a heteroskedastic bootstrap on an uploaded dataset,
its draws in parts that each set the test up from the dataset, then finished by a worker from the parts' sums:
the result and the ``bootstrap_t`` artifact are the single run's exactly. End to end with two real worker
processes (one of them SIGKILLed in its part: that part re-runs alone), and in-process through the bookkeeping
(the chord's callback lost; a job too small to split)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from core.queue import send
from core.settings import get_settings
from core.status import JobStatus
from kernels.context import RunContext, local_context, run_kind
from kernels.progress import LocalProgress
from kernels.registry import get_kind
from store import chunks as chunk_store
from store import jobs as job_store
from store.artifacts import job_artifact_dir
from store.dataset_ingest import ingest
from store.db import session_scope
from store.models import JobChunk
from tests.worker.conftest import WorkerProcess, comparable, load, wait_for
from tests.worker.test_worker_fanout import chunks_of, finished, start_workers
from worker import fanout, reaper
from worker.dataset_loader import dataset_loader
from worker.execute import execute_job
from worker.progress import JobProgress

KIND = "crve_bootstrap"
# 20,000 rows without clusters: 20,000 bootstrap clusters; a NumPy worker computes chunks of
# 4e6 // 20,000 = 200 draws, so B = 1,999 is 10 chunks: 5 a part in two parts.
N_OBS = 20_000
PARAMS = {"formula": "y ~ x1 + x2", "cluster": None, "weights": "w", "param": "x1", "reps": 1_999, "seed": 9}
MIN_WEIGHTS = "1e6"  # fan out any job of these sizes (the default waits for 3 x 10^10 weights)
WORKER = "host:1:parent"

pytestmark = pytest.mark.slow


def heteroskedastic_frame(n_obs: int = N_OBS, seed: int = 4) -> pd.DataFrame:
    rs = np.random.default_rng(seed)
    x1, x2 = rs.standard_normal(n_obs), rs.standard_normal(n_obs)
    y = 1.0 + 0.5 * x2 + rs.standard_normal(n_obs) * np.sqrt(1.0 + x1**2)
    return pd.DataFrame({"y": y, "x1": x1, "x2": x2, "w": 0.5 + rs.random(n_obs)})


def upload(data: pd.DataFrame, tmp_path: Path) -> str:
    path = tmp_path / "rows.parquet"
    data.to_parquet(path, index=False)
    with session_scope() as session:
        return ingest(session, owner="tester", name=path.name, upload=path, source_format="parquet").id


def submit_test(dataset_id: str, queue: str, params: dict[str, Any] = PARAMS) -> str:
    with session_scope() as session:
        job, _ = job_store.create_job(session, owner="tester", kind=KIND, params={**params, "dataset_id": dataset_id},
                                      dataset_ids={"dataset_id": dataset_id}, queue=queue)  # fmt: skip
        return job.id


def single_run(data: pd.DataFrame, params: dict[str, Any] = PARAMS) -> tuple[dict[str, Any], np.ndarray]:
    progress = LocalProgress()
    ctx = local_context(device="cpu", datasets={"dataset_id": data}, progress=progress)
    result = run_kind(get_kind(KIND), {**params, "dataset_id": "dataset_id"}, ctx)
    return comparable(result), np.asarray(progress.artifacts["bootstrap_t"])


def assert_stored_draws(job_id: str, expected: np.ndarray) -> None:
    job = load(job_id)
    stored = np.load(job_artifact_dir(job_id) / job.artifacts["bootstrap_t"]["file"], allow_pickle=False)
    assert stored.dtype == expected.dtype and stored.tobytes() == expected.tobytes()


@pytest.fixture(scope="module")
def reference() -> tuple[pd.DataFrame, dict[str, Any], np.ndarray]:
    """The data, and the single run's result and draws (computed once for the module's stack tests)."""
    data = heteroskedastic_frame()
    return data, *single_run(data)


def fanned_out_job(
    data: pd.DataFrame, stack_env: dict[str, str], start_worker: Callable[[], WorkerProcess], tmp_path: Path
) -> tuple[list[WorkerProcess], str]:
    """Two worker processes splitting every bootstrap of these sizes in two parts, and the job sent to them."""
    stack_env.update(GPUEST_FANOUT_MIN_BOOTSTRAP_WEIGHTS=MIN_WEIGHTS)
    workers = start_workers(stack_env, start_worker, 2, chunks=2)
    job_id = submit_test(upload(data, tmp_path), stack_env["GPUEST_QUEUE"])
    send(job_id, queue=stack_env["GPUEST_QUEUE"])
    return workers, job_id


def test_a_fanned_out_bootstrap_gives_the_single_run_exactly(
    reference: tuple[pd.DataFrame, dict[str, Any], np.ndarray], stack_env: dict[str, str],
    start_worker: Callable[[], WorkerProcess], tmp_path: Path,
) -> None:
    data, single, draws = reference
    workers, job_id = fanned_out_job(data, stack_env, start_worker, tmp_path)
    job = finished(job_id)
    assert job.status == JobStatus.SUCCEEDED, (job.error, [w.output()[-3000:] for w in workers])
    assert comparable(job.result) == single
    assert_stored_draws(job_id, draws)
    rows = chunks_of(job_id)
    assert [row.spec["part"] for row in rows] == [[0, 0], [0, 2], [1, 2]] and rows[0].output == {}
    assert [row.output["draws"] for row in rows[1:]] == [[0, 1_000], [1_000, 1_999]]
    assert all(row.status == JobStatus.SUCCEEDED and row.attempts == 1 and row.device == "cpu" for row in rows)
    # Both workers computed a part; then a worker process, not the marker, finished the job (attempts 1: the
    # hand-over gave its attempt back), the parts' stages counted in its timings.
    assert {int(row.worker.split(":")[1]) for row in rows[1:]} == {worker.process.pid for worker in workers}
    assert not job.worker.startswith(chunk_store.FANOUT_WORKER_PREFIX) and job.attempts == 1
    timings = job.result["timings"]
    assert timings["bootstrap"] > 0 and timings["demean"] > 0 and "inference" in timings and "artifacts" in timings


def test_a_part_whose_worker_is_killed_reruns_alone_and_the_test_is_unchanged(
    reference: tuple[pd.DataFrame, dict[str, Any], np.ndarray], stack_env: dict[str, str],
    start_worker: Callable[[], WorkerProcess], tmp_path: Path,
) -> None:
    # The sizes above: each part computes 5 draw chunks of about 0.6 s on NumPy and reports its progress after
    # each (at most every 0.5 s: 0.23, 0.41, 0.59, ...). A part seen below half done has at least 3 chunks, over
    # a second and a half, still to compute when its worker is killed (SIGKILL).
    data, single, draws = reference
    workers, job_id = fanned_out_job(data, stack_env, start_worker, tmp_path)

    def running_part() -> Any:
        rows = [row for row in chunks_of(job_id) if row.status == JobStatus.RUNNING and 0 < row.progress < 0.5]
        return rows[0] if rows else None

    wait_for(lambda: running_part() is not None, 120, "a part to be under way")
    victim_part = running_part()
    assert victim_part is not None
    pid = int(str(victim_part.worker).split(":")[1])
    (victim,) = [worker for worker in workers if worker.process.pid == pid]
    victim.kill_hard()
    job = finished(job_id)
    survivor = next(worker for worker in workers if worker is not victim)
    assert job.status == JobStatus.SUCCEEDED, (job.error, survivor.output()[-3000:])
    assert comparable(job.result) == single
    assert_stored_draws(job_id, draws)
    rows = {row.chunk_index: row for row in chunks_of(job_id)}
    assert rows[victim_part.chunk_index].attempts == 2  # the lost part ran again, on the survivor ...
    assert rows[victim_part.chunk_index].worker.split(":")[1] == str(survivor.process.pid)
    assert all(row.attempts == 1 for index, row in rows.items() if index != victim_part.chunk_index)  # ... alone
    assert all(row.status == JobStatus.SUCCEEDED for row in rows.values())
    assert "reaped a chunk of a lost worker" in survivor.output()
    # Finished by the survivor as a job, never re-queued as one (the hand-over gave its attempt back).
    assert job.worker.split(":")[1] == str(survivor.process.pid) and job.attempts == 1


@pytest.fixture
def bootstrap_in_process(in_process: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared in-process fan-out (tests/worker/conftest.py), splitting bootstraps of these sizes."""
    monkeypatch.setenv("GPUEST_FANOUT_MIN_BOOTSTRAP_WEIGHTS", MIN_WEIGHTS)
    get_settings.cache_clear()


def fan_out_here(job_id: str, dataset_id: str) -> bool:
    with session_scope() as session:
        assert job_store.claim(session, job_id, worker=WORKER, device="cpu")
    dataset_ids = {"dataset_id": dataset_id}
    ctx = RunContext(np, JobProgress(job_id, WORKER), dataset_loader(dataset_ids), dataset_fields=tuple(dataset_ids))
    kind = get_kind(KIND)
    params = kind.params_model.model_validate(load(job_id).params)
    return fanout.try_fan_out(job_id, WORKER, kind, params, ctx, get_settings().queue)


def test_a_bootstrap_whose_callback_is_lost_is_finished_by_a_worker_exactly(
    bootstrap_in_process: None, stack_env: dict[str, str], tmp_path: Path, chunk_workers_die_after_storing: None
) -> None:
    data = heteroskedastic_frame(n_obs=8_000)  # chunks of 500 draws: 6 chunks, 3 parts of 2
    params = {**PARAMS, "reps": 2_999, "conf_int": False}
    single, draws = single_run(data, params)
    job_id = submit_test(upload(data, tmp_path), stack_env["GPUEST_QUEUE"], params)
    assert fan_out_here(job_id, load(job_id).dataset_ids["dataset_id"])
    rows = chunks_of(job_id)
    assert [row.status for row in rows] == ["succeeded", "queued", "queued", "queued"]
    for row in reversed(rows[1:]):  # any order; each reads the dataset itself
        assert fanout.execute_chunk(row.id, f"host:2:{row.chunk_index}") == JobStatus.SUCCEEDED
    assert [row.output["draws"] for row in chunks_of(job_id)[1:]] == [[0, 1_000], [1_000, 2_000], [2_000, 2_999]]
    assert load(job_id).status == JobStatus.RUNNING  # no callback came (nobody consumes the chord)
    counts = reaper.reap_work(timedelta(seconds=0), max_attempts=3, idle=False, queue=get_settings().queue,
                              models=[JobChunk])
    assert counts["reduced"] == 1 and load(job_id).status == JobStatus.QUEUED
    assert execute_job(job_id, worker="host:3:finisher") == JobStatus.SUCCEEDED
    job = load(job_id)
    assert comparable(job.result) == single and job.attempts == 1 and job.worker == "host:3:finisher"
    assert_stored_draws(job_id, draws)


def test_a_bootstrap_too_small_to_split_runs_whole(
    bootstrap_in_process: None, stack_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = heteroskedastic_frame(n_obs=2_000)
    monkeypatch.setenv("GPUEST_FANOUT_MIN_BOOTSTRAP_WEIGHTS", "5e6")  # 2,000 x 1,999 weights: fewer
    get_settings.cache_clear()
    job_id = submit_test(upload(data, tmp_path), stack_env["GPUEST_QUEUE"])
    assert execute_job(job_id, worker="host:4:whole") == JobStatus.SUCCEEDED
    assert chunks_of(job_id) == [] and comparable(load(job_id).result) == single_run(data)[0]
