"""The run context the worker makes for a job: the namespace its row records, datasets loaded on first use,
artifacts kept beside the result, device and timings stamped once. Stand-in kinds keep the kernels out."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.settings import get_settings
from kernels import backend
from kernels.backend import gpu_available
from kernels.context import RunContext
from kernels.registry import JobKind, KindExample
from kernels.spec import JobParams, ResultModel
from store import jobs as job_store
from store.dataset_ingest import ingest
from store.db import session_scope
from tests.worker.conftest import load
from worker.execute import execute_job


class TableParams(JobParams):
    dataset_id: str
    read: bool = True


class TableResult(ResultModel):
    rows: int | None
    on_gpu: bool


def count_rows(params: TableParams, ctx: RunContext) -> TableResult:
    with ctx.stage("read"):
        rows = len(ctx.dataset("dataset_id")) if params.read else None
    ctx.save_artifact("doubled", np.arange(3) * 2)
    ctx.progress(0.5, "counted")
    return TableResult(rows=rows, on_gpu=ctx.on_gpu)


TABLE_KIND = JobKind(
    name="test_table_rows",
    params_model=TableParams,
    result_model=TableResult,
    run=count_rows,
    example=KindExample({"dataset_id": "<dataset id>"}),
    dataset_fields=("dataset_id",),
    host_only=True,
)


@pytest.fixture
def kinds(monkeypatch: pytest.MonkeyPatch) -> dict[str, JobKind]:
    """The worker's kind lookup answers from this mapping (tests add to it)."""
    known = {TABLE_KIND.name: TABLE_KIND}

    def get_kind(name: str) -> JobKind:
        try:
            return known[name]
        except KeyError:
            raise KeyError(f"unknown job kind {name!r}") from None

    monkeypatch.setattr("worker.execute.get_kind", get_kind)
    return known


def submit(kind: str, params: dict[str, Any], dataset_ids: dict[str, str]) -> str:
    with session_scope() as session:
        job, _ = job_store.create_job(
            session, owner="tester", kind=kind, params=params, dataset_ids=dataset_ids, queue=get_settings().queue
        )
        return job.id


def stored_dataset(tmp_path: Path, rows: int) -> str:
    upload = tmp_path / "table.csv"
    upload.write_text("x\n" + "".join(f"{value}\n" for value in range(rows)))
    with session_scope() as session:
        return ingest(session, owner="tester", name="table.csv", upload=upload, source_format="csv").id


def test_a_runner_reads_its_dataset_and_keeps_artifacts_with_device_and_timings_stamped_once(
    stack_env: dict[str, str], kinds: dict[str, JobKind], tmp_path: Path
) -> None:
    dataset_id = stored_dataset(tmp_path, rows=7)
    job_id = submit(TABLE_KIND.name, {"dataset_id": dataset_id}, {"dataset_id": dataset_id})
    assert execute_job(job_id, worker="w1") == "succeeded"
    job = load(job_id)
    assert job.result is not None and (job.result["rows"], job.result["on_gpu"]) == (7, False)
    assert job.device == job.result["device"] == "cpu"
    assert set(job.result["timings"]) == {"read", "total"} and set(job.timings) == {"queue_wait", "run"}
    assert set(job.artifacts) == {"doubled"} and job.artifacts["doubled"]["file"] == "doubled.npy"
    assert (job.progress, job.stage) == (1.0, "done")


def test_a_missing_dataset_fails_the_job_once_the_runner_asks_for_it(
    stack_env: dict[str, str], kinds: dict[str, JobKind]
) -> None:
    reads = submit(TABLE_KIND.name, {"dataset_id": "gone"}, {"dataset_id": "gone"})
    assert execute_job(reads, worker="w1") == "failed"
    error = load(reads).error
    assert (error["type"], error["code"], error["message"]) == (
        "ValueError", "kernel_error", "dataset_id: dataset gone no longer exists")
    # Loaded on first use only: a run that never reads the table does not need it.
    skips = submit(TABLE_KIND.name, {"dataset_id": "gone", "read": False}, {"dataset_id": "gone"})
    assert execute_job(skips, worker="w1") == "succeeded" and load(skips).result["rows"] is None


def test_a_host_only_kind_runs_on_numpy_where_the_worker_demands_a_gpu(
    stack_env: dict[str, str], kinds: dict[str, JobKind], monkeypatch: pytest.MonkeyPatch
) -> None:
    if gpu_available():
        pytest.skip("a GPU is present")
    kinds["test_table_rows_gpu"] = dataclasses.replace(TABLE_KIND, name="test_table_rows_gpu", host_only=False)
    monkeypatch.setenv("GPUEST_DEVICE", "gpu")
    params = {"dataset_id": "unused", "read": False}
    host_only = submit(TABLE_KIND.name, params, {"dataset_id": "unused"})
    assert execute_job(host_only, worker="w1") == "succeeded"
    assert load(host_only).device == load(host_only).result["device"] == "cpu"

    on_device = submit("test_table_rows_gpu", params, {"dataset_id": "unused"})
    assert execute_job(on_device, worker="w1") == "failed"
    job = load(on_device)
    assert job.device == "unavailable" and job.error["type"] == "GPUUnavailableError"


def test_an_unknown_kind_fails_with_the_known_ones_named(stack_env: dict[str, str]) -> None:
    job_id = submit("no_such_kind", {}, {})
    assert execute_job(job_id, worker="w1") == "failed"
    job = load(job_id)
    assert job.error["type"] == "KeyError" and job.device == "cpu"
    assert "no_such_kind" in job.error["message"] and "crve_bootstrap" in job.error["message"]


def test_an_unknown_kind_is_reported_before_a_missing_gpu(
    stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(device: Any = None) -> Any:
        raise backend.GPUUnavailableError("GPUEST_DEVICE=gpu but no CUDA device is usable through CuPy")

    monkeypatch.setattr(backend, "get_namespace", missing)
    job_id = submit("no_such_kind", {}, {})
    assert execute_job(job_id, worker="w1") == "failed"
    job = load(job_id)
    assert job.error["type"] == "KeyError" and "no_such_kind" in job.error["message"]
    assert job.device == "unavailable"


def test_a_cancel_requested_at_the_final_report_keeps_the_result(
    stack_env: dict[str, str], kinds: dict[str, JobKind]
) -> None:
    # The cancel arrives once the runner has its result: the final progress report (run_kind's "done")
    # is no checkpoint, so the computed result is kept.
    job_ids: list[str] = []

    def cancelled_as_it_returns(params: TableParams, ctx: RunContext) -> TableResult:
        with session_scope() as session:
            job = job_store.request_cancel(session, job_ids[0], "tester")
            assert job is not None and job.cancel_requested
        return TableResult(rows=None, on_gpu=ctx.on_gpu)

    kinds["test_late_cancel"] = dataclasses.replace(TABLE_KIND, name="test_late_cancel", run=cancelled_as_it_returns)
    job_ids.append(submit("test_late_cancel", {"dataset_id": "unused", "read": False}, {}))
    assert execute_job(job_ids[0], worker="w1") == "succeeded"
    job = load(job_ids[0])
    assert job.status == "succeeded" and job.result is not None and job.result["rows"] is None
    assert (job.progress, job.stage) == (1.0, "done")


def test_a_runner_returning_the_wrong_model_fails_the_job(
    stack_env: dict[str, str], kinds: dict[str, JobKind]
) -> None:
    kinds["test_wrong_result"] = dataclasses.replace(
        TABLE_KIND, name="test_wrong_result", run=lambda params, ctx: {"rows": 1}
    )
    job_id = submit("test_wrong_result", {"dataset_id": "unused", "read": False}, {})
    assert execute_job(job_id, worker="w1") == "failed"
    assert load(job_id).error["type"] == "TypeError" and load(job_id).result is None
