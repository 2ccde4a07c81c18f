"""A job's size per kind: its work (compared with the kind's CPU cap, ``GPUEST_CPU_MAX_WORK``, else the kind's
default cap) and its peak memory (compared with ``GPUEST_CPU_MAX_JOB_BYTES``), for a job that runs on a CPU.

Each kind declares its measure (``JobKind.work``, beside its runner in its folder: ``kernels/<family>/work.py``)
and may declare a default work cap (``JobKind.cpu_max_work``); the units differ between kinds, hence one cap
per kind. A kind without a measure is never capped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from kernels.registry import DatasetRows, JobKind, Work, registry

WORK_CAP_CODE = "cpu_work_cap"
MEMORY_CAP_CODE = "cpu_memory_cap"
_GPU_HINT = "run it on a GPU worker (GPUEST_DEVICE=gpu on a host with a GPU)"


class CapProblem(NamedTuple):
    """Why a job may not run on a CPU: the params field to shrink, the message, and its code."""

    field: str
    message: str
    code: str


def job_work(kind: str, params: Any, dataset_rows: DatasetRows) -> Work | None:
    """The job's work, or None for a kind without a measure (never capped) or unknown here."""
    found = registry().get(kind)
    return None if found is None or found.work is None else found.work(params, dataset_rows)


def work_cap(kind: JobKind, caps: Mapping[str, float]) -> float | None:
    """The kind's CPU work cap: the operator's entry (0 or less: none), else the kind's default."""
    cap = caps.get(kind.name, kind.cpu_max_work)
    return cap if cap is not None and cap > 0 else None


def cap_problem(
    kind: str, params: Any, dataset_rows: DatasetRows, caps: Mapping[str, float], max_bytes: float = 0.0
) -> CapProblem | None:
    """The problem when the job's work passes its kind's CPU work cap or its memory passes ``max_bytes``
    (0 or less: no memory cap); None within both, or for a kind without a measure."""
    found = registry().get(kind)
    if found is None or found.work is None:
        return None
    work = found.work(params, dataset_rows)
    if 0 < max_bytes < work.bytes:
        return CapProblem(
            work.bytes_field or work.field,
            (
                f"{kind} needs about {_gib(work.bytes)} of memory ({work.bytes_formula}), beyond this server's CPU "
                f"memory cap of {_gib(max_bytes)} a job (jobs here run on CPU workers); make the job smaller "
                f"({work.bytes_field or work.field}), {_GPU_HINT}, or ask the operator to raise "
                f"GPUEST_CPU_MAX_JOB_BYTES to {work.bytes:.3g}"
            ),
            MEMORY_CAP_CODE,
        )
    cap = work_cap(found, caps)
    if cap is None or work.units <= cap:
        return None
    return CapProblem(
        work.field,
        (
            f"{kind} work {work.formula} = {work.units:.3g} exceeds this server's CPU cap of {cap:.3g} for {kind} "
            f"(jobs here run on CPU workers); make the job smaller ({work.field}), {_GPU_HINT}, or ask the "
            f"operator to raise the cap: GPUEST_CPU_MAX_WORK='{{\"{kind}\": {work.units:.3g}}}'"
        ),
        WORK_CAP_CODE,
    )


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 1024**3:.3g} GiB"
