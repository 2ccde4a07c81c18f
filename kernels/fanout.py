"""A kind's fan-out split: how one job splits into chunks whose reduction is its single run.

A kind that splits names the module holding its :class:`Split` (``JobKind.split_module``, the module's
``SPLIT``); the worker (``worker/fanout.py``) drives it: plan, lead, chunks on any worker of the queue, then a
reduction or a finish. The split is numerics only: the worker hands its planner what it needs
(:class:`PlanInputs`), never the database.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kernels.spec import ResultModel

if TYPE_CHECKING:
    from kernels.context import RunContext

Spec = dict[str, Any]  # a chunk's spec or output, as JSON


@dataclass(frozen=True)
class PlanInputs:
    """What a planner is handed: ``chunks`` (``GPUEST_FANOUT_CHUNKS``), ``min_blocks``
    (``GPUEST_FANOUT_MIN_BLOCKS``: the fewest blocks or batches of the single run worth splitting), ``min_work``
    (the kind's own threshold: its ``GPUEST_FANOUT_MIN_WORK`` entry, else :attr:`Split.min_work`) and
    ``dataset_rows`` (params field -> the stored rows of the dataset it names)."""

    chunks: int
    min_blocks: int
    min_work: float | None = None
    dataset_rows: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Split:
    """How a kind splits into chunks whose reduction is its single run.

    ``plan(params, xp, inputs)``: the chunk specs (JSON) without the lead's, or None when the job is too small
    to split; ``lead(params, ctx, specs)``: computes the lead and returns its spec and output and the specs
    completed with what the lead fixed; ``run(params, ctx, spec)``: one chunk's output (its context reads the
    job's datasets). Then one of: ``reduce(params, specs, outputs)``: the result from every chunk in order, the
    lead first (in the chord's callback, on no device); ``finish(params, ctx, specs, outputs)``: the same, run
    as a job on a worker (tables, device, artifacts). ``min_work``: the default of the kind's fan-out
    threshold (``GPUEST_FANOUT_MIN_WORK``), in the units its planner compares with; None for a kind whose
    planner needs none beyond ``min_blocks``."""

    plan: Callable[[Any, ModuleType, PlanInputs], list[Spec] | None]
    lead: Callable[[Any, RunContext, list[Spec]], tuple[Spec, Spec, list[Spec]]]
    run: Callable[[Any, RunContext, Spec], Spec]
    reduce: Callable[[Any, Sequence[Spec], Sequence[Spec]], ResultModel] | None = None
    finish: Callable[[Any, RunContext, Sequence[Spec], Sequence[Spec]], ResultModel] | None = None
    min_work: float | None = None
