"""``echo``: the smallest kind that declares everything a kind can (params, result, runner, example, work
measure, fan-out split, plots), for the tests that show a kind needs its folder and one registry line.

A job sums the squares of ``0 .. size - 1`` in blocks of :data:`BLOCK` (a checkpoint after each). Integer sums are
exact, so a fanned-out job (the lead's block, then contiguous ranges of blocks) gives the single run's result
exactly, as a product kind's split must.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from pydantic import Field

from kernels.backend import to_host
from kernels.context import RunContext
from kernels.fanout import PlanInputs, Spec, Split
from kernels.ranges import even_ranges
from kernels.registry import DatasetRows, JobKind, KindExample, Work
from kernels.spec import JobParams, ResultModel

KIND = "echo"
BLOCK = 1_000  # values per block: the unit of progress and of the fan-out
MIN_SIZE = 10_000  # the default fan-out threshold (GPUEST_FANOUT_MIN_WORK's echo entry), in values


class EchoParams(JobParams):
    size: int = Field(1_000, ge=1, le=1_000_000, description="how many values: 0 .. size - 1")


class EchoResult(ResultModel):
    size: int
    blocks: int
    sum_of_squares: int


def _blocks(size: int) -> int:
    return -(-size // BLOCK)


def _block_sum(ctx: RunContext, size: int, block: int) -> int:
    xp = ctx.xp
    values = xp.arange(block * BLOCK, min(size, (block + 1) * BLOCK), dtype=xp.int64)
    return int(to_host((values * values).sum()))


def _sum_blocks(ctx: RunContext, size: int, blocks: range) -> int:
    total = 0
    with ctx.stage("squares"):
        for done, block in enumerate(blocks):
            total += _block_sum(ctx, size, block)
            ctx.progress((done + 1) / len(blocks), f"blocks {done + 1}/{len(blocks)}")
    return total


def run_echo(params: EchoParams, ctx: RunContext) -> EchoResult:
    blocks = _blocks(params.size)
    return EchoResult(size=params.size, blocks=blocks, sum_of_squares=_sum_blocks(ctx, params.size, range(blocks)))


def echo_work(params: EchoParams, _rows: DatasetRows) -> Work:
    return Work(float(params.size), "size", "params.size")


# -- the split: block 0 as the lead, the other blocks in contiguous ranges -----------------------------------


def plan(params: EchoParams, xp: ModuleType, inputs: PlanInputs) -> list[Spec] | None:
    blocks = _blocks(params.size)
    min_size = MIN_SIZE if inputs.min_work is None else inputs.min_work
    if params.size < min_size or blocks < max(inputs.min_blocks, 2):
        return None
    return [{"blocks": [part.start + 1, part.stop + 1], "size": len(part)}
            for part in even_ranges(blocks - 1, inputs.chunks) if len(part)]


def lead(params: EchoParams, ctx: RunContext, specs: list[Spec]) -> tuple[Spec, Spec, list[Spec]]:
    return {"blocks": [0, 1], "size": 1}, {"sum": str(_sum_blocks(ctx, params.size, range(1)))}, specs


def run(params: EchoParams, ctx: RunContext, spec: Spec) -> Spec:
    return {"sum": str(_sum_blocks(ctx, params.size, range(*spec["blocks"])))}  # as text: JSON numbers are doubles


def reduce(params: EchoParams, specs: Sequence[Spec], outputs: Sequence[Spec]) -> EchoResult:
    return EchoResult(size=params.size, blocks=_blocks(params.size),
                      sum_of_squares=sum(int(output["sum"]) for output in outputs))


SPLIT = Split(plan, lead, run, reduce=reduce, min_work=MIN_SIZE)

KINDS = [
    JobKind(
        name=KIND,
        params_model=EchoParams,
        result_model=EchoResult,
        run=run_echo,
        example=KindExample({"size": 2_500}),
        summary="The sum of the squares of 0 .. size - 1 (a test kind)",
        work=echo_work,
        split_module="tests.kinds.echo",
        plots_module="tests.kinds.echo_plots",
    ),
]
