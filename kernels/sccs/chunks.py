"""``sccs_fit`` split into chunks: what a fan-out of one job over several workers computes, kept apart
from the service so that it is tested as numerics (``tests/kernels/sccs/test_sccs_chunks.py``).

Two splits, one per job (the first that applies):

* **cross-validation** (``cross_validation`` set): the chunks are contiguous groups of folds, each fitted over the
  whole variance grid (a fold's fits chain through the grid by warm starts, so a fold is the unit; the fold of
  each case is Philox of the seed, so every chunk deals the same folds). The lead fixes nothing and fits nothing:
  the worker that claimed the job is free at once to take a chunk.
* **bootstrap** (``bootstrap`` set, no cross-validation): the chunks are contiguous ranges of replicates, whose
  case weights are drawn per replicate from Philox by index. Every replicate starts from the final fit, and
  every chunk fits it itself (the same bits on every worker of a kind of device: the premise below) instead of
  waiting for one worker to fit it: at the SCCS paper's largest size that lead, its tables and its fit, was
  1.1 s of a 2-GPU job's 8.4. The finish takes the first chunk's and checks that the others'
  are the same bits. The lead fixes nothing, as for cross-validation.

The **finish** then runs on any worker of the queue as the single run would, taking the chunks' fits instead of
computing them (:class:`kernels.sccs.fit_job.ComputedFits`): the CV curve and the chosen variance from every fold in
order, the final fit, the bootstrap's percentile intervals over every replicate in order, then profiles,
diagnostics, calibration and artifacts. It needs the tables and the device, so it is a job run, not a reduction
in the chord's callback (``worker/fanout.py``).

Why the result is the single run's bit for bit: a fit depends only on its own case weights, start and variance,
never on the other members of its batch. On NumPy the batch is a loop of independent fits. On the GPU every
kernel of the batch engine works row by row and adds in a fixed order (``kernels/sccs/gpu.py``: per-row block
partials, per-(column, row) numerators, no atomics), so a member gets the same bits alone, in any batch and at
any capacity, and a chunk fits only its own members. (Before the engine's sums were made so, a chunk handed the
engine the single run's whole batch, its fits in their rows and empty fits in the others: every chunk then paid
for the whole batch's per-row work, and 4 GPUs were no faster than 2.) Chunks must run on the kind of device the
lead ran on (NumPy's bits are not a GPU's). ``tests/kernels/sccs/test_sccs_chunks.py`` has a GPU test of each
premise (the same bits twice; a member's bits whatever else is in its batch).

Fits travel through the database as JSON: arrays as their IEEE bytes in base64 (``array_to_json``) and scalars
as exact hexadecimal text (``float.hex``), so no bit is lost.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any, TypeVar

import numpy as np

from kernels.backend import is_numpy
from kernels.context import RunContext
from kernels.fanout import PlanInputs, Split
from kernels.ranges import even_ranges
from kernels.sccs import FIT_KIND, ccd
from kernels.sccs import bootstrap as boot
from kernels.sccs import cv as crossval
from kernels.sccs.fit_job import ComputedFits, run_fit
from kernels.sccs.fit_plan import FitPlan, final_fit
from kernels.sccs.spec import SccsParams, SccsResult

KIND = FIT_KIND
CROSS_VALIDATION = "cross_validation"
BOOTSTRAP = "bootstrap"
# The unit the bootstrap's size is counted in to decide a fan-out: the NumPy run's batch of refits (the GPU's
# batches are larger and known only once the tables are on the device).
REFITS_PER_BATCH = 10


# -- the plan --------------------------------------------------------------------------------------------


def split_of(params: SccsParams) -> str | None:
    """Which part of the job its chunks compute: its cross-validation, else its bootstrap; None to run whole."""
    if params.cross_validation is not None:
        # Without a prior there is no variance to choose: the single run refuses it, and so does a whole run.
        return CROSS_VALIDATION if params.prior.type != "none" else None
    return BOOTSTRAP if params.bootstrap is not None else None


def split_range(count: int, chunks: int) -> list[range]:
    """``0 .. count - 1`` in at most ``chunks`` contiguous ranges whose sizes differ by one at most, in order."""
    return even_ranges(count, chunks)


def plan(params: SccsParams, chunks: int, min_batches: int) -> list[dict[str, Any]] | None:
    """The chunk specs (JSON) of a fan-out into at most ``chunks`` chunks, the lead's aside, or None when the job
    is too small: fewer than ``min_batches`` batches in its single run (one per variance of the grid, or one
    per ``REFITS_PER_BATCH`` bootstrap replicates)."""
    split = split_of(params)
    if split == CROSS_VALIDATION:
        spec = params.cross_validation
        assert spec is not None
        variances = len(spec.variances())
        if variances < min_batches:
            return None
        return [{"split": split, "folds": [folds.start, folds.stop], "size": len(folds) * variances}
                for folds in split_range(spec.folds, chunks)]  # fmt: skip
    if split == BOOTSTRAP:
        assert params.bootstrap is not None
        replicates = params.bootstrap.replicates
        if math.ceil(replicates / REFITS_PER_BATCH) < min_batches:
            return None
        return [{"split": split, "replicates": [part.start, part.stop], "size": len(part)}
                for part in split_range(replicates, chunks)]  # fmt: skip
    return None


def backend_name(xp: ModuleType) -> str:
    return "numpy" if is_numpy(xp) else "cupy"


def check_backend(spec: dict[str, Any], xp: ModuleType) -> None:
    """Every part of a job computes on the kind of device its lead did (the bits differ between kinds)."""
    if spec["backend"] != backend_name(xp):
        raise ValueError(
            f"this job's chunks were planned on {spec['backend']} and this worker computes on "
            f"{backend_name(xp)}: every worker of a queue must compute on the same kind of device"
        )


def lead(
    params: SccsParams, ctx: RunContext, specs: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The lead's spec and output, and the chunk specs completed with what it fixed (see the module docstring)."""
    backend = backend_name(ctx.xp)
    split = specs[0]["split"]
    field = "folds" if split == CROSS_VALIDATION else "replicates"
    lead_spec = {"split": split, "backend": backend, field: [0, 0], "size": 0}
    return lead_spec, {}, [{**spec, "backend": backend} for spec in specs]


# -- a chunk ---------------------------------------------------------------------------------------------


def _chunk_progress(ctx: RunContext, stage: str, fits: int) -> ccd.CycleCallback:
    """The chunk's progress after every cycle (its cancel point and a warm shutdown's checkpoint)."""

    def report(finished: int, cycle: int) -> None:
        ctx.progress(min(finished / max(fits, 1), 0.99), f"{stage}: {finished}/{fits} fits done, cycle {cycle}")

    return report


def cross_validation_fits(params: SccsParams, fit_plan: FitPlan, folds: range) -> crossval.FoldFits:
    """The fits of ``folds`` over the grid, a batch of these folds per variance."""
    spec = params.cross_validation
    assert spec is not None
    grid = crossval.variance_grid(spec.variances())
    fitter = fit_plan.fitter(len(folds))
    with fit_plan.ctx.stage("cross_validation"):
        return crossval.fold_fits(
            fit_plan.data,
            fitter,
            grid,
            spec.folds,
            spec.seed,
            folds,
            _chunk_progress(fit_plan.ctx, "cross-validation", len(folds) * grid.size),
        )


def bootstrap_fits(
    params: SccsParams, fit_plan: FitPlan, replicates: range, batch: int, beta_hat: np.ndarray
) -> boot.ReplicateFits:
    """The refits of ``replicates`` from ``beta_hat``, ``batch`` at a time."""
    spec = params.bootstrap
    assert spec is not None
    fitter = fit_plan.fitter(batch)
    with fit_plan.ctx.stage("bootstrap"):
        return boot.replicate_fits(
            fit_plan.ctx.xp,
            fit_plan.data.n_cases,
            fitter,
            params.prior.variance,
            beta_hat,
            spec.replicates,
            replicates,
            spec.seed,
            batch,
            _chunk_progress(fit_plan.ctx, "bootstrap", len(replicates)),
        )


def run(params: SccsParams, ctx: RunContext, spec: dict[str, Any]) -> dict[str, Any]:
    """One chunk's output: its folds' or replicates' fits (JSON)."""
    check_backend(spec, ctx.xp)
    ctx.progress(0.0, "loading tables")
    fit_plan = FitPlan.load(params, ctx)
    if spec["split"] == CROSS_VALIDATION:
        return fits_to_json(cross_validation_fits(params, fit_plan, range(*spec["folds"])))
    replicates = range(*spec["replicates"])
    fit = final_fit(fit_plan, params.prior.variance)
    # A batch of this chunk's size, or what its device holds: a refit's bits do not depend on it (see above).
    batch = fit_plan.bootstrap_chunk(len(replicates))
    refits = bootstrap_fits(params, fit_plan, replicates, batch, fit.beta)
    return {**fits_to_json(refits), "final_fit": fit_to_json(fit)}


# -- the finish ------------------------------------------------------------------------------------------


def _covered(specs: Sequence[dict[str, Any]], field: str, count: int) -> None:
    """The chunks (the lead's aside) cover ``0 .. count - 1`` once, in order."""
    bounds = [spec[field] for spec in specs[1:]]
    if (
        not bounds
        or bounds[0][0] != 0
        or bounds[-1][1] != count
        or any(left[1] != right[0] for left, right in itertools.pairwise(bounds))
    ):
        raise ValueError(f"the chunks' {field} {bounds} do not cover 0 .. {count - 1} in order")


def computed_fits(
    params: SccsParams, specs: Sequence[dict[str, Any]], outputs: Sequence[dict[str, Any]]
) -> ComputedFits:
    """What the chunks computed, as the single run's :class:`ComputedFits`: the chunks in order, the lead first."""
    if specs[0]["split"] == CROSS_VALIDATION:
        spec = params.cross_validation
        assert spec is not None
        _covered(specs, "folds", spec.folds)
        fits = concatenate([fits_from_json(crossval.FoldFits, output) for output in outputs[1:]])
        return ComputedFits(cross_validation=crossval.summarise(crossval.variance_grid(spec.variances()), fits))
    assert params.bootstrap is not None
    _covered(specs, "replicates", params.bootstrap.replicates)
    refits = concatenate([fits_from_json(boot.ReplicateFits, output) for output in outputs[1:]])
    return ComputedFits(final_fit=_final_fit_of(outputs), bootstrap=boot.summarise(refits))


def _final_fit_of(outputs: Sequence[dict[str, Any]]) -> ccd.FitResult:
    """The final fit every bootstrap chunk made (and the lead, in a job fanned out before they did), checked to
    be the same bits in each: the refits of a chunk that started from another would not be the single run's."""
    fits = [output["final_fit"] for output in outputs if "final_fit" in output]
    if not fits:
        raise ValueError("no chunk of this bootstrap holds the final fit")
    if any(fit != fits[0] for fit in fits[1:]):
        raise ValueError(
            "the chunks of this bootstrap fitted different final models: every worker of a queue must compute "
            "on the same kind of device"
        )
    return fit_from_json(fits[0])


def finish(
    params: SccsParams, ctx: RunContext, specs: Sequence[dict[str, Any]], outputs: Sequence[dict[str, Any]]
) -> SccsResult:
    """The job's result: the single run, with the fits the lead and the chunks computed."""
    for spec in specs:
        check_backend(spec, ctx.xp)
    return run_fit(params, ctx, computed_fits(params, specs, outputs))


# -- JSON ------------------------------------------------------------------------------------------------

Fits = TypeVar("Fits", crossval.FoldFits, boot.ReplicateFits)


def concatenate(parts: Sequence[Fits]) -> Fits:
    """Fits of consecutive chunks as one, every array in chunk order."""
    first = parts[0]
    return type(first)(**{field.name: np.concatenate([getattr(part, field.name) for part in parts])
                          for field in dataclasses.fields(first)})  # fmt: skip


def array_to_json(values: np.ndarray) -> dict[str, Any]:
    """An array as its dtype (with byte order), shape and IEEE bytes in base64: exact, NaN payloads included."""
    values = np.ascontiguousarray(values)
    return {
        "dtype": values.dtype.str,
        "shape": list(values.shape),
        "data": base64.b64encode(values.tobytes()).decode("ascii"),
    }


def array_from_json(data: dict[str, Any]) -> np.ndarray:
    raw = base64.b64decode(data["data"])
    return np.frombuffer(raw, dtype=np.dtype(data["dtype"])).reshape(data["shape"]).copy()


def fits_to_json(fits: crossval.FoldFits | boot.ReplicateFits) -> dict[str, Any]:
    return {field.name: array_to_json(getattr(fits, field.name)) for field in dataclasses.fields(fits)}


def fits_from_json(kind: type[Fits], data: dict[str, Any]) -> Fits:
    return kind(**{field.name: array_from_json(data[field.name]) for field in dataclasses.fields(kind)})


def fit_to_json(fit: ccd.FitResult) -> dict[str, Any]:
    """A fit's fields: arrays in base64, floats as hexadecimal text, integers and flags as they are, None as null."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(fit):
        value = getattr(fit, field.name)
        if value is None:
            out[field.name] = {"none": None}
        elif isinstance(value, np.ndarray):
            out[field.name] = {"array": array_to_json(value)}
        elif isinstance(value, bool | np.bool_):
            out[field.name] = {"bool": bool(value)}
        elif isinstance(value, int | np.integer):
            out[field.name] = {"int": int(value)}
        else:
            out[field.name] = {"float": float(value).hex()}
    return out


def fit_from_json(data: dict[str, Any]) -> ccd.FitResult:
    def value(item: dict[str, Any]) -> Any:
        ((tag, content),) = item.items()
        if tag == "none":
            return None
        return {"array": array_from_json, "bool": bool, "int": int, "float": float.fromhex}[tag](content)

    return ccd.FitResult(**{name: value(item) for name, item in data.items()})


def _plan_chunks(params: SccsParams, xp: ModuleType, inputs: PlanInputs) -> list[dict[str, Any]] | None:
    return plan(params, inputs.chunks, inputs.min_blocks)


SPLIT = Split(_plan_chunks, lead, run, finish=finish)
