"""``sccs_analyses`` split into parts: the exposure-outcome analyses in contiguous groups, kept apart from
the service so that it is tested as numerics (``tests/kernels/sccs/test_sccs_analyses_chunks.py``).

Which analyses a job runs, and in what order, is known only once its tables are read (every exposure of every
outcome unless ``pairs`` or ``exposures`` name them), so the plan fixes no analyses: part i of n reads and builds
the tables itself (as the single run does), lists the job's analyses as the single run lists them
(:func:`kernels.sccs.analyses_job.load_analyses`), and fits the i-th of n contiguous groups of them of near-equal work,
weighed by their columns' nonzeros (:func:`kernels.ranges.weighted_range`: an analysis's columns can differ a
hundredfold, and in the SCCS paper-sized synthetic tables the first 13 of 1,428 drugs hold half the nonzeros; a
part holds none when there are fewer analyses than parts). The lead fixes nothing and fits nothing: the worker
that claimed the job is free at once to take a part.

Why the result is the single run's bit for bit: an analysis's estimate, interval and likelihood ratio come from
sums over its own column's nonzeros and touched cases only, each added in a fixed order on either backend
(``kernels/sccs/analyses.py``), and the bisections are element-wise per analysis; so an analysis gets the same
bits in any batch. Parts must run on the kind of device the lead ran on (NumPy's bits are not a GPU's).

The **finish** runs on any worker of the queue as the single run would, taking the parts' fits in order instead
of computing them: the MDRRs, calibration, the rows and the ``analyses`` artifact, which need the tables (their
ids, names and exposure statistics), so it is a job run, as ``sccs_fit``'s finish is (``worker/fanout.py``).
Fits travel through the database as the IEEE bytes of their arrays (``kernels/sccs/chunks.py``'s JSON).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from kernels.backend import to_host
from kernels.context import RunContext
from kernels.fanout import PlanInputs, Split
from kernels.ranges import weighted_range
from kernels.sccs import ANALYSES_KIND
from kernels.sccs import chunks as fit_chunks
from kernels.sccs.analyses import SingleFits, single_covariate_fits
from kernels.sccs.analyses_job import load_analyses, run_analyses
from kernels.sccs.data import SccsData
from kernels.sccs.spec import SccsAnalysesParams, SccsAnalysesResult

KIND = ANALYSES_KIND
# Fan out only a job whose covariates table has at least this many rows (the design's nonzeros, which its batch's
# work follows: about 7.5 ns a row on an H200 when every exposure is analysed, against 4 ns a row to read and
# build the tables): below it a part's tables and the hand-overs outweigh the analyses it takes off the others
# (the SCCS paper's largest tables, 95M rows, run whole; docs/scaling.md). GPUEST_FANOUT_MIN_WORK's
# sccs_analyses entry overrides it.
MIN_ROWS = 200_000_000


def plan(covariate_rows: int | None, chunks: int, min_rows: float) -> list[dict[str, Any]] | None:
    """The part specs of a fan-out into ``chunks`` parts, the lead's aside, or None when the job is too small: its
    covariates table (the design's nonzeros, which the batch's work follows) has fewer than ``min_rows`` rows, or
    its row count is unknown."""
    if covariate_rows is None or covariate_rows < min_rows:
        return None
    return [{"part": [index, chunks], "size": 1} for index in range(chunks)]


def lead(
    params: SccsAnalysesParams, ctx: RunContext, specs: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The lead's spec and output (nothing: see the module docstring), and the part specs with the backend."""
    backend = fit_chunks.backend_name(ctx.xp)
    return {"part": [0, 0], "backend": backend, "size": 0}, {}, [{**spec, "backend": backend} for spec in specs]


def part_fits(params: SccsAnalysesParams, ctx: RunContext, index: int, parts: int) -> tuple[range, int, SingleFits]:
    """Part ``index`` of ``parts``: which of the job's analyses it fits, how many the job has, and their fits."""
    ctx.progress(0.0, "loading tables")
    tables, columns = load_analyses(params, ctx)
    chosen = weighted_range(work_of(tables.built.data, columns), parts, index)
    ctx.progress(0.2, f"fitting analyses {chosen.start + 1}-{chosen.stop} of {columns.size}")
    with ctx.stage("analyses"):
        fits = single_covariate_fits(tables.built.data, columns[chosen.start:chosen.stop], params.level)
    return chosen, int(columns.size), fits


def work_of(data: SccsData, columns: np.ndarray) -> np.ndarray:
    """Each analysis's share of the batch's work: its column's nonzeros (every bisection step passes over them),
    plus one (a column without nonzeros still costs its steps)."""
    col_ptr = np.asarray(to_host(data.col_ptr), dtype=np.int64)
    return (col_ptr[columns + 1] - col_ptr[columns] + 1).astype(np.float64)


def run(params: SccsAnalysesParams, ctx: RunContext, spec: dict[str, Any]) -> dict[str, Any]:
    """One part's output: the range of the job's analyses it fitted, their count, and the fits (JSON)."""
    fit_chunks.check_backend(spec, ctx.xp)
    index, parts = spec["part"]
    chosen, total, fits = part_fits(params, ctx, int(index), int(parts))
    return {"analyses": [chosen.start, chosen.stop], "total": total, "fits": fits_to_json(fits)}


def computed_fits(outputs: Sequence[dict[str, Any]]) -> SingleFits:
    """Every part's fits in order (the lead's output aside), checked to cover the job's analyses once, in order."""
    parts = list(outputs[1:])
    bounds = [part["analyses"] for part in parts]
    totals = {part["total"] for part in parts}
    if (
        not parts
        or len(totals) != 1
        or bounds[0][0] != 0
        or bounds[-1][1] != totals.pop()
        or any(left[1] != right[0] for left, right in itertools.pairwise(bounds))
    ):
        raise ValueError(f"the parts' analyses {bounds} do not cover the job's analyses once, in order")
    fits = [fits_from_json(part["fits"]) for part in parts]
    return SingleFits(**{field.name: np.concatenate([getattr(item, field.name) for item in fits])
                         for field in dataclasses.fields(SingleFits)})  # fmt: skip


def finish(
    params: SccsAnalysesParams, ctx: RunContext, specs: Sequence[dict[str, Any]], outputs: Sequence[dict[str, Any]]
) -> SccsAnalysesResult:
    """The job's result: the single run, with the fits its parts computed."""
    for spec in specs:
        fit_chunks.check_backend(spec, ctx.xp)
    return run_analyses(params, ctx, computed_fits(outputs))


def fits_to_json(fits: SingleFits) -> dict[str, Any]:
    return {field.name: fit_chunks.array_to_json(getattr(fits, field.name)) for field in dataclasses.fields(fits)}


def fits_from_json(data: dict[str, Any]) -> SingleFits:
    return SingleFits(**{field.name: fit_chunks.array_from_json(data[field.name])
                         for field in dataclasses.fields(SingleFits)})  # fmt: skip


def _plan_parts(params: SccsAnalysesParams, xp: ModuleType, inputs: PlanInputs) -> list[dict[str, Any]] | None:
    """The parts of a job by its covariates table's stored rows."""
    min_rows = MIN_ROWS if inputs.min_work is None else inputs.min_work
    return plan(inputs.dataset_rows.get("covariates_dataset_id"), inputs.chunks, min_rows)


SPLIT = Split(_plan_parts, lead, run, finish=finish, min_work=MIN_ROWS)
