"""The CPU caps at submission: where the API knows its jobs run on CPU workers, a job whose work
(kernels/work.py) passes its kind's CPU work cap (``cpu_max_work``, else the kind's default), or whose memory
estimate passes ``cpu_max_job_bytes``, is refused with a 422 naming the field to shrink, the estimate, the cap,
the GPU alternative and how to raise it. Elsewhere the CPU worker refuses it before computing
(worker/execute.py)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from sqlalchemy.orm import Session

from api.job_checks import invalid
from api.problems import field_error
from core.settings import Settings
from kernels import backend
from kernels.registry import JobKind
from kernels.spec import JobParams
from kernels.work import cap_problem
from store.datasets import get_dataset


@cache
def _gpu_here() -> bool:
    return backend.gpu_available()


def jobs_run_on_cpu(kind: JobKind, settings: Settings) -> bool:
    """Whether the API can tell that this kind's jobs will run on a CPU: a host-only kind; GPUEST_DEVICE=cpu
    (the operator says so); or the embedded stack (the worker beside this process, on its broker file) with
    GPUEST_DEVICE=auto and no usable GPU here. With servers and auto, only the worker knows."""
    if kind.host_only:
        return True
    device = backend.requested_device()
    if device == "auto" and settings.broker_url is None:
        return not _gpu_here()
    return device == "cpu"


def dataset_rows(session: Session, owner: str, dataset_ids: Mapping[str, str]) -> dict[str, int]:
    rows = {}
    for field, dataset_id in dataset_ids.items():
        dataset = get_dataset(session, dataset_id, owner)
        if dataset is not None:
            rows[field] = int(dataset.n_rows)
    return rows


def cpu_cap_errors(session: Session, owner: str, kind: JobKind, params: JobParams, dataset_ids: Mapping[str, str],
                   settings: Settings) -> list[dict[str, object]]:
    if kind.work is None or not jobs_run_on_cpu(kind, settings):
        return []
    problem = cap_problem(kind.name, params, dataset_rows(session, owner, dataset_ids), settings.cpu_max_work,
                          settings.cpu_max_job_bytes)
    return [] if problem is None else [field_error(problem.field, problem.message, type_=problem.code)]


def check_cpu_work_cap(session: Session, owner: str, kind: JobKind, params: JobParams, dataset_ids: Mapping[str, str],
                       settings: Settings) -> None:
    errors = cpu_cap_errors(session, owner, kind, params, dataset_ids, settings)
    if errors:
        raise invalid(errors)
