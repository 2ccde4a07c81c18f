"""A test kind that only sleeps: a kernel that hangs (``step_seconds`` unset: one sleep, no progress checkpoint)
or a slow one that reports progress (a checkpoint every ``step_seconds``). It exercises the worker's time limits."""

from __future__ import annotations

import time

from pydantic import Field

from kernels.context import RunContext
from kernels.registry import JobKind, KindExample
from kernels.spec import JobParams, ResultModel

KIND = "sleepy"


class SleepyParams(JobParams):
    seconds: float = Field(ge=0, le=60, description="How long the runner sleeps")
    step_seconds: float | None = Field(
        None, gt=0, le=60, description="Sleep in steps this long, with a progress checkpoint after each; unset: "
        "one sleep without a checkpoint (a hung kernel)",
    )


class SleepyResult(ResultModel):
    slept_seconds: float


def run(params: SleepyParams, ctx: RunContext) -> SleepyResult:
    started = time.monotonic()
    if params.step_seconds is None:
        time.sleep(params.seconds)
    else:
        while (elapsed := time.monotonic() - started) < params.seconds:
            ctx.progress(elapsed / params.seconds, "sleeping")
            time.sleep(min(params.step_seconds, params.seconds - elapsed))
    return SleepyResult(slept_seconds=time.monotonic() - started)


KINDS = [
    JobKind(KIND, SleepyParams, SleepyResult, run, KindExample({"seconds": 0.01}),
            summary="Sleeps (a test kind for the worker's time limits)"),
]
