"""An sccs_fit job fanned out over workers (issue 19): its chunks read the job's datasets, and once they all
succeeded the job goes back to its queue for a worker to finish it from their outputs (the final fit, profiles,
artifacts): the result and the artifacts are the single run's exactly. End to end with two real worker
processes (cross-validation), and in-process through the bookkeeping (bootstrap, the chord's callback lost)."""

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
from store.events import list_events
from store.models import JobChunk
from tests.kernels.sccs.test_sccs_chunks import comparable, frames
from tests.worker.conftest import WorkerProcess, load, wait_for
from tests.worker.test_worker_fanout import chunks_of, finished, start_workers
from worker import fanout, reaper
from worker.dataset_loader import dataset_loader
from worker.device import job_cache
from worker.execute import execute_job
from worker.progress import JobProgress

pytestmark = pytest.mark.slow

KIND = "sccs_fit"
# 20,000 cases: each of the two chunks fits 2 folds over 8 variances (about a second of NumPy here).
CROSS_VALIDATION = {"prior": {"type": "laplace", "variance": 0.5}, "convergence": "gradient", "tolerance": 1e-8,
                    "cross_validation": {"folds": 4, "grid": [0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30], "seed": 2},
                    "profile": {"covariates": [1, 2]}}  # fmt: skip
BOOTSTRAP = {"prior": {"type": "normal", "variance": 0.8, "exclude": [3]}, "bootstrap": {"replicates": 43, "seed": 5},
             "profile": {"covariates": [2]}}  # fmt: skip
WORKER = "host:1:parent"


def stored_tables(tables: dict[str, pd.DataFrame], tmp_path: Path) -> dict[str, str]:
    """The tables uploaded as Parquet datasets: params field -> dataset id."""
    ids = {}
    for field, frame in tables.items():
        upload = tmp_path / f"{field}.parquet"
        frame.to_parquet(upload, index=False)
        with session_scope() as session:
            ids[field] = ingest(session, owner="tester", name=upload.name, upload=upload, source_format="parquet").id
    return ids


def submit_fit(params: dict[str, Any], dataset_ids: dict[str, str], queue: str, kind: str = KIND) -> str:
    with session_scope() as session:
        job, _ = job_store.create_job(
            session, owner="tester", kind=kind, params={**params, **dataset_ids}, dataset_ids=dataset_ids, queue=queue
        )
        return job.id


def single_run(
    params: dict[str, Any], tables: dict[str, pd.DataFrame], kind: str = KIND
) -> tuple[dict[str, Any], LocalProgress]:
    progress = LocalProgress()
    spec = {**params, **{field: field for field in tables}}
    result = run_kind(get_kind(kind), spec, local_context(device="cpu", datasets=tables, progress=progress))
    return comparable(result), progress


def finished_on_both_workers(
    job_id: str, single: dict[str, Any], single_progress: LocalProgress, workers: list[WorkerProcess]
) -> tuple[Any, list[JobChunk]]:
    """The fanned-out job and its chunks, once it ended: it succeeded with the single run's result and artifacts;
    each chunk succeeded at its first attempt, both workers computed one, and a worker process (not the marker)
    finished the job."""
    job = finished(job_id)
    assert job.status == JobStatus.SUCCEEDED, (job.error, [w.output()[-3000:] for w in workers])
    assert comparable(job.result) == single
    assert_stored_artifacts_equal(job_id, job.artifacts, single_progress)
    rows = chunks_of(job_id)
    assert all(row.status == JobStatus.SUCCEEDED and row.attempts == 1 and row.device == "cpu" for row in rows)
    assert {int(row.worker.split(":")[1]) for row in rows[1:]} == {worker.process.pid for worker in workers}
    assert not job.worker.startswith(chunk_store.FANOUT_WORKER_PREFIX)
    return job, rows


def assert_stored_artifacts_equal(job_id: str, artifacts: dict[str, Any], expected: LocalProgress) -> None:
    """The job's artifact files hold exactly the single run's arrays and tables."""
    assert set(artifacts) == set(expected.artifacts)
    folder = job_artifact_dir(job_id)
    for name, value in expected.artifacts.items():
        path = folder / artifacts[name]["file"]
        if isinstance(value, pd.DataFrame):
            pd.testing.assert_frame_equal(pd.read_parquet(path), value, check_exact=True)
            continue
        with np.load(path, allow_pickle=False) as stored:
            assert set(stored.files) == set(value)
            for key, array in value.items():
                assert stored[key].tobytes() == np.asarray(array).tobytes() and stored[key].dtype == array.dtype


def test_a_fanned_out_sccs_cross_validation_gives_the_single_run_exactly(
    in_process: None, stack_env: dict[str, str], start_worker: Callable[[], WorkerProcess], tmp_path: Path
) -> None:
    tables = frames(n_cases=20_000, n_drugs=40)
    single, single_progress = single_run(CROSS_VALIDATION, tables)
    workers = start_workers(stack_env, start_worker, 2, chunks=2)
    job_id = submit_fit(CROSS_VALIDATION, stored_tables(tables, tmp_path), stack_env["GPUEST_QUEUE"])
    send(job_id, queue=stack_env["GPUEST_QUEUE"])
    job, rows = finished_on_both_workers(job_id, single, single_progress, workers)
    assert [row.spec["folds"] for row in rows] == [[0, 0], [0, 2], [2, 4]]
    # A worker finished it as a job (attempts 1: the hand-over gave its attempt back), the chunks' stages counted in
    # its timings.
    assert job.attempts == 1
    assert job.result["timings"]["cross_validation"] > 0 and "fit" in job.result["timings"]
    with session_scope() as session:
        messages = [event.message for event in list_events(session, job_id, limit=200, offset=0)[0]]
    assert any("queued to be finished" in message for message in messages), messages


def test_a_chunk_whose_worker_is_killed_reruns_alone_and_the_fit_is_unchanged(
    in_process: None, stack_env: dict[str, str], start_worker: Callable[[], WorkerProcess], tmp_path: Path
) -> None:
    # Larger than the test above, so that a chunk is still running when its worker is killed (SIGKILL).
    tables = frames(n_cases=60_000, n_drugs=40)
    params = {**CROSS_VALIDATION, "profile": None}
    single, _ = single_run(params, tables)
    workers = start_workers(stack_env, start_worker, 2, chunks=2)
    job_id = submit_fit(params, stored_tables(tables, tmp_path), stack_env["GPUEST_QUEUE"])
    send(job_id, queue=stack_env["GPUEST_QUEUE"])

    def running_chunk() -> Any:
        rows = [row for row in chunks_of(job_id) if row.status == JobStatus.RUNNING and row.progress > 0]
        return rows[0] if rows else None

    wait_for(lambda: running_chunk() is not None, 120, "a chunk to be part done")
    victim_chunk = running_chunk()
    assert victim_chunk is not None
    pid = int(str(victim_chunk.worker).split(":")[1])
    (victim,) = [worker for worker in workers if worker.process.pid == pid]
    victim.kill_hard()
    job = finished(job_id, timeout=240)
    survivor = next(worker for worker in workers if worker is not victim)
    assert job.status == JobStatus.SUCCEEDED, (job.error, survivor.output()[-3000:])
    assert comparable(job.result) == single
    rows = {row.chunk_index: row for row in chunks_of(job_id)}
    assert rows[victim_chunk.chunk_index].attempts == 2  # the lost chunk ran again ...
    assert all(row.attempts == 1 for index, row in rows.items() if index != victim_chunk.chunk_index)  # ... alone
    assert "reaped a chunk of a lost worker" in survivor.output()


def test_a_bootstrap_split_whose_callback_is_lost_is_finished_by_a_worker_exactly(
    in_process: None, stack_env: dict[str, str], tmp_path: Path, chunk_workers_die_after_storing: None
) -> None:
    tables = frames(n_cases=600, n_drugs=8)
    single, single_progress = single_run(BOOTSTRAP, tables)
    dataset_ids = stored_tables(tables, tmp_path)
    job_id = submit_fit(BOOTSTRAP, dataset_ids, stack_env["GPUEST_QUEUE"])
    with session_scope() as session:
        assert job_store.claim(session, job_id, worker=WORKER, device="cpu")
    ctx = RunContext(np, JobProgress(job_id, WORKER), dataset_loader(dataset_ids), dataset_fields=tuple(dataset_ids))
    params = get_kind(KIND).params_model.model_validate(load(job_id).params)
    assert fanout.try_fan_out(job_id, WORKER, get_kind(KIND), params, ctx, stack_env["GPUEST_QUEUE"])
    rows = chunks_of(job_id)
    assert [row.status for row in rows] == ["succeeded", "queued", "queued", "queued"]
    assert rows[0].output == {} and [row.spec["replicates"] for row in rows[1:]] == [
        [0, 15],
        [15, 29],
        [29, 43],
    ]
    job_cache.clear()
    for row in reversed(rows[1:]):  # any order; each reads the tables itself
        assert fanout.execute_chunk(row.id, f"host:2:{row.chunk_index}") == JobStatus.SUCCEEDED
    assert len(job_cache) == 1  # this process keeps the job's built tables for its finish
    assert load(job_id).status == JobStatus.RUNNING  # no callback came (nobody consumes the chord)
    counts = reaper.reap_work(timedelta(seconds=0), max_attempts=3, idle=False, queue=get_settings().queue,
                              models=[JobChunk])
    assert counts["reduced"] == 1
    job = load(job_id)
    assert job.status == JobStatus.QUEUED and job.attempts == 0 and job.worker is None
    assert fanout.settle(job_id) is None  # handed over once
    assert execute_job(job_id, worker="host:3:finisher") == JobStatus.SUCCEEDED  # reads no table
    assert len(job_cache) == 0  # dropped when the job ended
    job = load(job_id)
    assert comparable(job.result) == single and job.attempts == 1 and job.worker == "host:3:finisher"
    # The result's stages add the finish's to the chunks' (the lead read and fitted nothing; the first chunk
    # read the tables, which this process then kept; every chunk fitted the final model): the finish read no
    # table and fitted nothing
    rows = chunks_of(job_id)
    assert "tables" not in rows[0].timings and "fit" not in rows[0].timings
    read = [row.timings["tables"] for row in rows if "tables" in (row.timings or {})]
    fitted = [row.timings["fit"] for row in rows if "fit" in (row.timings or {})]
    assert len(read) == 1 and job.result["timings"]["tables"] == pytest.approx(sum(read), rel=1e-9)
    assert len(fitted) == 3 and job.result["timings"]["fit"] == pytest.approx(sum(fitted), rel=1e-9)
    assert_stored_artifacts_equal(job_id, job.artifacts, single_progress)


def test_a_small_sccs_job_is_not_fanned_out(in_process: None, stack_env: dict[str, str], tmp_path: Path) -> None:
    tables = frames(n_cases=300, n_drugs=6)
    small = {**BOOTSTRAP, "bootstrap": {"replicates": 12, "seed": 5}}  # 2 batches of 10: below the threshold
    job_id = submit_fit(small, stored_tables(tables, tmp_path), stack_env["GPUEST_QUEUE"])
    assert execute_job(job_id, worker="host:4:whole") == JobStatus.SUCCEEDED
    assert chunks_of(job_id) == [] and comparable(load(job_id).result) == single_run(small, tables)[0]


def bootstrap_with_chunks_stored_unsettled(stack_env: dict[str, str], tmp_path: Path) -> str:
    """A small bootstrap fanned out here, every chunk run and stored, and nothing settled since (with the fixture
    ``chunk_workers_die_after_storing``): the job's id."""
    dataset_ids = stored_tables(frames(n_cases=300, n_drugs=6), tmp_path)
    job_id = submit_fit(BOOTSTRAP, dataset_ids, stack_env["GPUEST_QUEUE"])
    with session_scope() as session:
        assert job_store.claim(session, job_id, worker=WORKER, device="cpu")
    ctx = RunContext(np, JobProgress(job_id, WORKER), dataset_loader(dataset_ids), dataset_fields=tuple(dataset_ids))
    params = get_kind(KIND).params_model.model_validate(load(job_id).params)
    assert fanout.try_fan_out(job_id, WORKER, get_kind(KIND), params, ctx, stack_env["GPUEST_QUEUE"])
    for row in chunks_of(job_id)[1:]:
        assert fanout.execute_chunk(row.id, "host:2:w") == JobStatus.SUCCEEDED
    return job_id


def test_chunks_ending_together_hand_the_job_over_once_and_never_cancel_it(
    in_process: None, stack_env: dict[str, str], tmp_path: Path, chunk_workers_die_after_storing: None
) -> None:
    """Each chunk's worker settles the job. A settle that reads a chunk still running leaves the job running (it
    once read twice, declined on the first read and ended the job cancelled on the second: "ended cancelled" at
    4 GPUs in the device run of 2026-11-26); the settle after that chunk is stored hands it over, once."""
    job_id = bootstrap_with_chunks_stored_unsettled(stack_env, tmp_path)
    last = chunks_of(job_id)[-1].id
    with session_scope() as session:  # as the worker of another chunk read it: still running
        session.get(JobChunk, last).status = JobStatus.RUNNING
    assert fanout.settle(job_id) is None and load(job_id).status == JobStatus.RUNNING
    with session_scope() as session:
        session.get(JobChunk, last).status = JobStatus.SUCCEEDED
    assert fanout.settle(job_id) == JobStatus.QUEUED and load(job_id).status == JobStatus.QUEUED
    assert fanout.settle(job_id) is None  # handed over once
    assert execute_job(job_id, worker="host:3:finisher") == JobStatus.SUCCEEDED


def test_a_job_cancelled_while_its_chunks_end_is_cancelled_not_finished(
    in_process: None, stack_env: dict[str, str], tmp_path: Path, chunk_workers_die_after_storing: None
) -> None:
    job_id = bootstrap_with_chunks_stored_unsettled(stack_env, tmp_path)
    with session_scope() as session:
        job_store.request_cancel(session, job_id, "tester")
    assert fanout.settle(job_id) == JobStatus.CANCELLED
    assert load(job_id).status == JobStatus.CANCELLED and load(job_id).result is None


def test_a_fanned_out_sccs_analyses_job_gives_the_single_run_exactly(
    in_process: None, stack_env: dict[str, str], start_worker: Callable[[], WorkerProcess], tmp_path: Path
) -> None:
    from tests.kernels.sccs.sccs_helpers import NEGATIVES, biased_study_tables

    tables = biased_study_tables(n_cases=1200, seed=4)
    params = {"negative_controls": NEGATIVES, "level": 0.9}
    single, single_progress = single_run(params, tables, kind="sccs_analyses")
    stack_env["GPUEST_FANOUT_MIN_ANALYSIS_ROWS"] = "1"  # these tables are far below the default
    workers = start_workers(stack_env, start_worker, 2, chunks=2)
    job_id = submit_fit(params, stored_tables(tables, tmp_path), stack_env["GPUEST_QUEUE"], kind="sccs_analyses")
    send(job_id, queue=stack_env["GPUEST_QUEUE"])
    job, rows = finished_on_both_workers(job_id, single, single_progress, workers)
    assert [row.spec["part"] for row in rows] == [[0, 0], [0, 2], [1, 2]]
    (first, middle), (middle_again, last) = (row.output["analyses"] for row in rows[1:])  # 15 exposures in two
    assert first == 0 and 0 < middle == middle_again < last == 15  # parts of near-equal work
    assert job.result["timings"]["analyses"] > 0
