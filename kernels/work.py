"""A job's size in one number per kind: what an operator's CPU cap (``GPUEST_CPU_MAX_WORK``) is compared with.

Each kind declares its measure (``JobKind.work``, beside its runner in its folder: ``kernels/<family>/work.py``);
the units differ between kinds, hence one cap per kind. A kind without a measure is never capped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernels.registry import DatasetRows, Work, registry


def job_work(kind: str, params: Any, dataset_rows: DatasetRows) -> Work | None:
    """The job's work, or None for a kind without a measure (never capped) or unknown here."""
    found = registry().get(kind)
    return None if found is None or found.work is None else found.work(params, dataset_rows)


def cap_problem(kind: str, params: Any, dataset_rows: DatasetRows, caps: Mapping[str, float]) -> tuple[str, str] | None:
    """(field, message) when the job's work passes its kind's CPU cap; None within it or without a cap."""
    cap = caps.get(kind)
    if not cap or cap <= 0:
        return None
    work = job_work(kind, params, dataset_rows)
    if work is None or work.units <= cap:
        return None
    return work.field, (
        f"{kind} work {work.formula} = {work.units:.3g} exceeds this server's CPU cap of {cap:.3g} for {kind} "
        f"(jobs here run on CPU workers); make the job smaller ({work.field}), run it on a GPU worker, or ask the "
        f'operator to raise the cap: GPUEST_CPU_MAX_WORK=\'{{"{kind}": {work.units:.3g}}}\''
    )
