"""``crve_montecarlo`` split into chunks of replications: what a fan-out of one job over several
workers computes, kept apart from the service so that it is tested as numerics.

A run is cut into the blocks of its single-device plan (:func:`montecarlo.plan_simulation`, the same blocks
:func:`montecarlo.simulate` computes one after the other). The **lead** computes block 0, which fixes the
centre of the run's sums (its mean estimate). Each **chunk** computes the partial sums of a contiguous range
of the other blocks about that centre. The **reduction** adds the partials in block order, as the single run
adds them. Every replication draws its numbers from Philox at addresses fixed by its index
(``kernels/rng.py``), and every block is computed by the very call the single run makes, so the reduction is
the single run's summary bit for bit, whatever the chunks and whichever worker computed them
(``tests/kernels/crve/test_montecarlo_chunks.py``). Chunks must run on the kind of device the plan was made
for: a GPU's sums differ from NumPy's in the last bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kernels.backend import device_label
from kernels.context import RunContext
from kernels.crve import MONTECARLO_KIND
from kernels.crve import jobs as crve_jobs
from kernels.crve import montecarlo as mc
from kernels.crve.jobs import montecarlo_critical_values, montecarlo_design, montecarlo_result
from kernels.crve.spec import MonteCarloParams, MonteCarloResult
from kernels.fanout import PlanInputs, Spec, Split
from kernels.ranges import even_ranges

KIND = MONTECARLO_KIND


def plan(params: MonteCarloParams, xp: ModuleType) -> mc.SimulationPlan:
    """The blocks the single run of ``params`` on ``xp`` computes."""
    return mc.plan_simulation(
        xp, montecarlo_design(params), replications=params.replications, bootstrap_reps=_bootstrap_reps(params),
        weights_type=params.weights_type, numpy_block_elements=crve_jobs.NUMPY_BLOCK_ELEMENTS,
    )  # fmt: skip


def split_blocks(n_blocks: int, chunks: int) -> list[range]:
    """Blocks 1 .. n_blocks - 1 (block 0 is the lead's) in at most ``chunks`` contiguous ranges whose sizes
    differ by one at most, in order."""
    return [range(part.start + 1, part.stop + 1) for part in even_ranges(n_blocks - 1, chunks) if len(part)]


@dataclass(frozen=True)
class Lead:
    """Block 0 of a run: the centre of every block's sums and block 0's own partial."""

    shift: float
    partial: mc.BlockPartial


def _bootstrap_reps(params: MonteCarloParams) -> int | None:
    return params.bootstrap_reps if params.test == "wild_bootstrap" else None


def _compute(params: MonteCarloParams, ctx: RunContext) -> mc.BlockFunction:
    return mc.block_function(
        ctx.xp, montecarlo_design(params), test_coefficient=params.test_coefficient, ssc=params.ssc,
        bootstrap_reps=_bootstrap_reps(params), weights_type=params.weights_type, timer=ctx.timer,
    )  # fmt: skip


def lead(params: MonteCarloParams, ctx: RunContext, run_plan: mc.SimulationPlan) -> Lead:
    block = _compute(params, ctx)(*run_plan.bounds(0))
    shift = mc.first_block_shift(block)
    return Lead(shift, mc.block_partial(block, montecarlo_critical_values(params), shift))


def chunk(
    params: MonteCarloParams, ctx: RunContext, run_plan: mc.SimulationPlan, shift: float, blocks: range
) -> list[mc.BlockPartial]:
    """The partials of ``blocks`` about ``shift``; progress through ``ctx.progress`` after each block (its
    checkpoint: a cancel or a warm shutdown stops the chunk there)."""

    def report(done: int) -> None:
        ctx.progress(done / len(blocks), f"blocks {done}/{len(blocks)}")

    return mc.block_range_partials(run_plan, _compute(params, ctx), montecarlo_critical_values(params), shift,
                                   blocks, report)


def reduce(params: MonteCarloParams, shift: float, partials: Sequence[mc.BlockPartial]) -> MonteCarloResult:
    """The job's result from every block's partial, block 0 first and in block order."""
    crit = montecarlo_critical_values(params)
    design = montecarlo_design(params)
    summary = mc.summarise(shift, partials, crit)
    draws = mc.bootstrap_draws(params.weights_type, design.n_clusters, params.bootstrap_reps)
    return montecarlo_result(params, design, summary, draws if params.test == "wild_bootstrap" else 0, crit)


# The partials travel as JSON through the database: floats as exact hexadecimal text (float.hex), so no
# bit is lost and a NaN or an infinity is still text PostgreSQL accepts.


def partial_to_json(partial: mc.BlockPartial) -> dict[str, Any]:
    return {
        "count": partial.count,
        "rejections": {f"{level:.2f}": count for level, count in partial.rejections.items()},
        "sum_centred": partial.sum_centred.hex(),
        "sum_centred_sq": partial.sum_centred_sq.hex(),
        "sum_se": partial.sum_se.hex(),
    }


def partial_from_json(data: dict[str, Any]) -> mc.BlockPartial:
    rejections = {level: int(data["rejections"][f"{level:.2f}"]) for level in mc.LEVELS}
    return mc.BlockPartial(
        int(data["count"]), rejections, float.fromhex(data["sum_centred"]), float.fromhex(data["sum_centred_sq"]),
        float.fromhex(data["sum_se"]),
    )  # fmt: skip


# -- the split as the worker drives it (kernels/fanout.py): specs and outputs as JSON ----------------------


def _plan_chunks(params: MonteCarloParams, xp: ModuleType, inputs: PlanInputs) -> list[Spec] | None:
    run_plan = plan(params, xp)
    if run_plan.n_blocks < max(inputs.min_blocks, 3):
        return None
    return [{"blocks": [blocks.start, blocks.stop], "block": run_plan.block,
             "size": sum(run_plan.bounds(index)[1] for index in blocks)}
            for blocks in split_blocks(run_plan.n_blocks, inputs.chunks)]


def _run_plan(params: MonteCarloParams, xp: ModuleType, spec: Spec) -> mc.SimulationPlan:
    """This worker's plan, which must be the one the chunks were cut from: the same device kind (a GPU's
    blocks are not NumPy's)."""
    run_plan = plan(params, xp)
    if run_plan.block != spec["block"]:
        raise ValueError(f"this chunk was planned in blocks of {spec['block']} replications, and this worker "
                         f"({device_label(xp)}) computes blocks of {run_plan.block}: every worker of a queue must "
                         "compute on the same kind of device")
    return run_plan


def _lead_chunk(params: MonteCarloParams, ctx: RunContext, specs: list[Spec]) -> tuple[Spec, Spec, list[Spec]]:
    run_plan = _run_plan(params, ctx.xp, specs[0])
    first = lead(params, ctx, run_plan)
    shift = first.shift.hex()
    lead_spec = {"blocks": [0, 1], "block": run_plan.block, "size": run_plan.bounds(0)[1], "shift": shift}
    output = {"partials": [partial_to_json(first.partial)]}
    return lead_spec, output, [{**spec, "shift": shift} for spec in specs]


def _run_chunk(params: MonteCarloParams, ctx: RunContext, spec: Spec) -> Spec:
    run_plan = _run_plan(params, ctx.xp, spec)
    partials = chunk(params, ctx, run_plan, float.fromhex(spec["shift"]), range(*spec["blocks"]))
    return {"partials": [partial_to_json(partial) for partial in partials]}


def _reduce_chunks(params: MonteCarloParams, specs: Sequence[Spec], outputs: Sequence[Spec]) -> MonteCarloResult:
    partials = [partial_from_json(item) for output in outputs for item in output["partials"]]
    return reduce(params, float.fromhex(specs[0]["shift"]), partials)


SPLIT = Split(_plan_chunks, _lead_chunk, _run_chunk, reduce=_reduce_chunks)
