"""``crve_bootstrap`` split into ranges of draws: what a fan-out of one job over several workers
computes, kept apart from the service so that it is tested as numerics
(``tests/kernels/crve/test_bootstrap_chunks.py``).

A single run sets the test up (reads the dataset, builds the design, demeans, fits, builds the bootstrap
operator), computes its draws in chunks of bounded size (:class:`kernels.crve.bootstrap.DrawSchedule`: draws
[i c, (i + 1) c), one operator call each) and infers from every draw's sums. A fan-out into n parts:

* the **lead** fixes nothing and computes nothing (the worker that claimed the job is free at once to take a
  part): which draws a part computes depends on the run's chunk size, known only once the test is set up;
* **part** i of n sets the test up itself from the job's dataset (the very stages of the single run), cuts the
  run's draw chunks into n contiguous groups of near-equal size and computes the per-draw sums of group i
  (:func:`kernels.crve.bootstrap.bootstrap_draws`): every draw by the very call, with the very array shapes, of
  the single run. It sends back those sums and what the inference takes from the set-up (the fit, the test,
  facts of the rows: a few kilobytes), all exact (arrays as their IEEE bytes in base64, floats as hexadecimal
  text);
* the **finish**, run as a job on any worker of the queue (it saves the ``bootstrap_t`` artifact), puts the
  parts' sums in draw order and runs the single run's inference on them
  (:func:`kernels.crve.bootstrap.bootstrap_inference`): p-values, the confidence interval by test inversion,
  everything the result has. It reads no dataset and sets nothing up.

The result is the single run's bit for bit when every part's set-up is: weights are Philox of (seed, draw,
cluster) (``kernels/crve/weights.py``), so a draw is the same whichever part computes it. On NumPy the set-up
is deterministic. On a GPU, sums that add with atomics (CuPy's ``scatter_add`` and weighted ``bincount``, in
the demeaning of fixed effects and in the sums of cells by cluster when a cluster holds several cells) may
round differently from one run to the next, so on a GPU only designs without those are fanned out
(:func:`plan`); parts must run on the kind of device the plan was made for.

Why only the heteroskedastic and the synthetic designs are fanned out: the plan must know, before reading the
data, how many bootstrap clusters H the job has (the draws' work is H x B weights): H = the rows without
clusters (the dataset's stored row count), the synthetic clusters otherwise; an uploaded dataset's clusters
are known only once it is read. A clustered design's draws are a small part of its run unless it has
hundreds of thousands of bootstrap clusters (docs/scaling.md).
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from kernels.backend import is_numpy
from kernels.context import RunContext
from kernels.crve import BOOTSTRAP_KIND
from kernels.crve import jobs as crve_jobs
from kernels.crve.bootstrap import (
    DRAW_SUM_FIELDS,
    DrawSchedule,
    DrawSums,
    InferenceInputs,
    bootstrap_draws,
    bootstrap_inference,
    bootstrap_setup,
    draw_chunk_size,
    draw_schedule,
)
from kernels.crve.spec import BootstrapParams, BootstrapResult
from kernels.fanout import PlanInputs, Split
from kernels.ranges import even_range

KIND = BOOTSTRAP_KIND
SYNTHETIC_CLUSTER_COLUMN = "cluster"  # kernels/crve/synthetic.py's cluster column
MIN_CHUNKS_PER_PART = 2  # a part computes at least this many of the single run's draw chunks
# Fan out only a job that draws at least this many bootstrap weights (bootstrap clusters x B; about 0.1 ns each
# on an H100): its draws must outweigh the set-up each part repeats (docs/scaling.md). GPUEST_FANOUT_MIN_WORK's
# crve_bootstrap entry overrides it.
MIN_WEIGHTS = 3e10


# -- the plan --------------------------------------------------------------------------------------------


def bootstrap_clusters(params: BootstrapParams, dataset_rows: int | None) -> int | None:
    """The job's bootstrap clusters H as far as they are known before its data are read (an upper bound: rows
    dropped for weight 0 or as singletons are not counted out), or None when they are not."""
    rows = params.synthetic.n_obs if params.synthetic is not None else dataset_rows
    if params.cluster is None and params.bootcluster is None:
        return rows  # the heteroskedastic bootstrap: a bootstrap cluster per observation
    synthetic_clusters = params.synthetic is not None and params.cluster_columns == [SYNTHETIC_CLUSTER_COLUMN]
    if synthetic_clusters and params.bootcluster in (None, SYNTHETIC_CLUSTER_COLUMN):
        assert params.synthetic is not None
        return params.synthetic.n_clusters
    return None


def _deterministic_on(xp: ModuleType, params: BootstrapParams, fixed_effects: list[str]) -> bool:
    """Whether the set-up of ``params`` gives the same bits every time on ``xp``: always on NumPy; on a GPU
    without fixed effects (their demeaning adds with atomics) and with each cell its own variance cluster (one
    dimension, bootstrapped by itself: no sum of several cells per cluster)."""
    if is_numpy(xp):
        return True
    one_dimension = len(params.cluster_columns) <= 1 and params.bootcluster in (None, *params.cluster_columns)
    return not fixed_effects and one_dimension


def plan(
    params: BootstrapParams, xp: ModuleType, dataset_rows: int | None, parts: int, min_weights: float
) -> list[dict[str, Any]] | None:
    """The specs of the parts (the lead's aside) of a fan-out into at most ``parts`` parts, or None to run the
    job whole: a family of hypotheses or an IV formula (other runs), a design whose bootstrap clusters are
    not known yet or whose set-up is not deterministic on ``xp``, fewer than ``min_weights`` bootstrap
    weights (H x B) or too few draw chunks for two parts of ``MIN_CHUNKS_PER_PART`` each."""
    if params.family is not None or parts < 2:
        return None
    parsed = params.parsed_formula
    if parsed.iv is not None or not _deterministic_on(xp, params, parsed.fe_names):
        return None
    h_count = bootstrap_clusters(params, dataset_rows)
    if h_count is None or h_count * params.reps < min_weights:
        return None
    # The widest array of a chunk of draws has q x H rows (H with clusters that are the bootstrap clusters,
    # the rows themselves without): the single run's chunk, as kernels.crve.bootstrap._draw_schedule sizes it.
    restrictions = max(1, len(params.restriction_texts))
    chunk = draw_chunk_size(crve_jobs.draw_block_elements(not is_numpy(xp)), restrictions * h_count)
    n_chunks = -(-params.reps // chunk)
    count = min(parts, n_chunks // MIN_CHUNKS_PER_PART)
    if count < 2:
        return None
    backend = backend_name(xp)
    return [{"part": [index, count], "backend": backend, "size": len(part_chunks(n_chunks, count, index))}
            for index in range(count)]  # fmt: skip


def part_chunks(n_chunks: int, parts: int, index: int) -> range:
    """Part ``index``'s draw chunks of ``0 .. n_chunks - 1`` cut into ``parts`` contiguous groups whose sizes
    differ by one at most, in order (a part may get none when there are fewer chunks than parts)."""
    return even_range(n_chunks, parts, index)


def backend_name(xp: ModuleType) -> str:
    return "numpy" if is_numpy(xp) else "cupy"


def check_backend(spec: dict[str, Any], xp: ModuleType) -> None:
    """Every part of a job computes on the kind of device it was planned for (the bits differ between kinds)."""
    if spec["backend"] != backend_name(xp):
        raise ValueError(
            f"this job's parts were planned on {spec['backend']} and this worker computes on {backend_name(xp)}: "
            "every worker of a queue must compute on the same kind of device"
        )


def lead(
    params: BootstrapParams, ctx: RunContext, specs: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The lead fixes nothing (see the module docstring): its spec, its empty output, the parts' specs."""
    return {"part": [0, 0], "backend": backend_name(ctx.xp), "size": 0}, {}, specs


# -- a part ----------------------------------------------------------------------------------------------


@dataclass
class PartDraws:
    """What a part computed: the range of draws, the run's schedule, the per-draw sums, and what the inference
    and the result take from the set-up."""

    draws: range
    schedule: DrawSchedule
    sums: DrawSums
    inference: InferenceInputs
    labels: crve_jobs.DesignLabels


def part(params: BootstrapParams, ctx: RunContext, index: int, parts: int) -> PartDraws:
    """Part ``index`` of ``parts``: the single run's set-up, then the draws of its group of the run's chunks."""
    design = crve_jobs.bootstrap_design(params, ctx)
    if design.endogenous is not None or params.family is not None:
        raise ValueError("an IV formula or a family of hypotheses is not run in parts")
    restrictions = crve_jobs.single_restrictions(params, design.names)
    arrays = crve_jobs.to_device(design, ctx)
    options = crve_jobs.bootstrap_options(params, restrictions, ctx)
    setup = bootstrap_setup(ctx.xp, arrays, options, ctx.timer)
    schedule = draw_schedule(setup, options)
    draws = schedule.draws_of(part_chunks(schedule.n_chunks, parts, index))
    sums = bootstrap_draws(ctx.xp, setup, options, draws, crve_jobs.draw_report(ctx), ctx.timer)
    return PartDraws(draws, schedule, sums, setup.inference, crve_jobs.DesignLabels.of(design))


def run(params: BootstrapParams, ctx: RunContext, spec: dict[str, Any]) -> dict[str, Any]:
    """One part's output (JSON)."""
    check_backend(spec, ctx.xp)
    index, parts = spec["part"]
    return part_to_json(part(params, ctx, int(index), int(parts)))


# -- the finish ------------------------------------------------------------------------------------------


def concatenated(parts: Sequence[PartDraws]) -> tuple[DrawSums, PartDraws]:
    """Every draw's sums in draw order and the first part (whose set-up the inference takes; every part's is the
    same); refused unless the parts share one schedule and cover its draws once, in order."""
    first = parts[0]
    schedules = {item.schedule for item in parts}
    bounds = [(item.draws.start, item.draws.stop) for item in parts]
    covered = (
        bounds[0][0] == 0
        and bounds[-1][1] == first.schedule.reps
        and all(left[1] == right[0] for left, right in itertools.pairwise(bounds))
    )
    if len(schedules) != 1 or not covered:
        raise ValueError(f"the parts' draws {bounds} (schedules {sorted(map(str, schedules))}) do not cover the run's "
                         f"{first.schedule.reps} draws once, in order")  # fmt: skip
    return DrawSums.concatenate([item.sums for item in parts]), first


def finish_parts(params: BootstrapParams, ctx: RunContext, parts: Sequence[PartDraws]) -> BootstrapResult:
    """The job's result from every part, in part order: the single run's inference and result."""
    sums, first = concatenated(parts)
    restrictions = crve_jobs.single_restrictions(params, first.labels.names)
    options = crve_jobs.bootstrap_options(params, restrictions, ctx)
    ctx.progress(0.95, "inference")
    with ctx.stage("inference"):
        outcome = bootstrap_inference(first.inference, sums, options)
    return crve_jobs.bootstrap_test_result(params, restrictions, first.labels, outcome, ctx)


def finish(
    params: BootstrapParams, ctx: RunContext, specs: Sequence[dict[str, Any]], outputs: Sequence[dict[str, Any]]
) -> BootstrapResult:
    """The fan-out's finish: the parts' outputs in order, the lead's (empty) aside."""
    indices = [spec["part"] for spec in specs[1:]]
    if indices != [[index, len(indices)] for index in range(len(indices))]:
        raise ValueError(f"the job's parts {indices} are not parts 0 .. {len(indices) - 1} in order")
    return finish_parts(params, ctx, [part_from_json(output) for output in outputs[1:]])


# -- JSON: exact ---------------------------------------------------------------------------------------------


def part_to_json(item: PartDraws) -> dict[str, Any]:
    schedule = item.schedule
    return {
        "draws": [item.draws.start, item.draws.stop],
        "schedule": {"enumerated": schedule.enumerated, "reps": schedule.reps, "chunk": schedule.chunk},
        "sums": {name: value_to_json(getattr(item.sums, name)) for name in DRAW_SUM_FIELDS},
        "inference": value_to_json(item.inference.parts()),
        "labels": {"names": item.labels.names, "cluster_names": item.labels.cluster_names,
                   "fe_names": item.labels.fe_names},
    }  # fmt: skip


def part_from_json(data: dict[str, Any]) -> PartDraws:
    schedule = DrawSchedule(**data["schedule"])
    sums = DrawSums(schedule.enumerated, *(value_from_json(data["sums"][name]) for name in DRAW_SUM_FIELDS))
    labels = data["labels"]
    return PartDraws(
        draws=range(*data["draws"]),
        schedule=schedule,
        sums=sums,
        inference=InferenceInputs.from_parts(value_from_json(data["inference"])),
        labels=crve_jobs.DesignLabels(list(labels["names"]), list(labels["cluster_names"]), list(labels["fe_names"])),
    )


def value_to_json(value: Any) -> Any:
    """A value as tagged JSON that gives it back with its type and every bit: host arrays and NumPy scalars as
    their IEEE bytes in base64, floats as hexadecimal text, lists, tuples and dicts (string keys) of these."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return {"array": _bytes(array), "dtype": array.dtype.str, "shape": list(array.shape)}
    if isinstance(value, np.generic):  # before float: np.float64 is a float
        return {"scalar": _bytes(np.asarray(value)), "dtype": value.dtype.str}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, str):
        return {"str": value}
    if isinstance(value, list | tuple):
        return {type(value).__name__: [value_to_json(item) for item in value]}
    if isinstance(value, dict):
        return {"dict": {str(key): value_to_json(item) for key, item in value.items()}}
    raise TypeError(f"no exact JSON for a {type(value).__name__}")


def value_from_json(data: Any) -> Any:
    if data is None:
        return None
    if "array" in data:  # tagged by key, not by key order (PostgreSQL's jsonb orders keys its own way)
        raw = base64.b64decode(data["array"])
        return np.frombuffer(raw, dtype=np.dtype(data["dtype"])).reshape(data["shape"]).copy()
    if "scalar" in data:
        return np.frombuffer(base64.b64decode(data["scalar"]), dtype=np.dtype(data["dtype"]))[0]
    ((tag, payload),) = data.items()
    decoders = {
        "bool": bool,
        "int": int,
        "float": float.fromhex,
        "str": str,
        "list": lambda items: [value_from_json(item) for item in items],
        "tuple": lambda items: tuple(value_from_json(item) for item in items),
        "dict": lambda items: {key: value_from_json(item) for key, item in items.items()},
    }
    return decoders[tag](payload)


def _bytes(array: np.ndarray) -> str:
    return base64.b64encode(array.tobytes()).decode("ascii")


def _plan_parts(params: BootstrapParams, xp: ModuleType, inputs: PlanInputs) -> list[dict[str, Any]] | None:
    """The parts of a job by its bootstrap weights, counted from its dataset's stored rows where it has one."""
    min_weights = MIN_WEIGHTS if inputs.min_work is None else inputs.min_work
    return plan(params, xp, inputs.dataset_rows.get("dataset_id"), inputs.chunks, min_weights)


SPLIT = Split(_plan_parts, lead, run, finish=finish, min_work=MIN_WEIGHTS)
