"""Long loops stop within seconds of a cancel: every loop that may run for minutes on a CPU reaches a progress
checkpoint about every second (kernels.progress.Pacer), where the worker's progress channel raises on a
cancel, a warm shutdown or the time limit. Each job here would run for many minutes; the channel cancels it a
moment into the loop under test, and the job must end within a few seconds of that."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from kernels.context import RunContext, run_kind
from kernels.progress import JobCancelled, LocalProgress, Pacer
from kernels.registry import get_kind

# A second between two checkpoints plus one iteration of the loop, with room for a busy CI machine.
LATENCY_SECONDS = 8.0


class CancelInside(LocalProgress):
    """Cancelled (from another thread, as a user's cancel arrives) ``delay`` seconds after the first report
    whose stage starts with ``stage``; records when."""

    def __init__(self, stage: str, delay: float = 1.0) -> None:
        super().__init__()
        self.stage, self.delay = stage, delay
        self.timer: threading.Timer | None = None
        self.cancelled_at: float | None = None

    def __call__(self, fraction: float, stage: str | None = None) -> None:
        if self.timer is None and stage is not None and stage.startswith(self.stage):
            self.timer = threading.Timer(self.delay, self._cancel_now)
            self.timer.start()
        super().__call__(fraction, stage)

    def _cancel_now(self) -> None:
        self.cancelled_at = time.monotonic()
        self.cancel()


def stops_within_seconds(kind: str, params: dict[str, object], stage: str) -> float:
    progress = CancelInside(stage)
    try:
        with pytest.raises(JobCancelled):
            run_kind(get_kind(kind), params, RunContext(np, progress))
    finally:
        if progress.timer is not None:
            progress.timer.cancel()
    assert progress.cancelled_at is not None, progress.reports[-5:]
    return time.monotonic() - progress.cancelled_at


def test_the_pacer_is_due_once_per_interval() -> None:
    pacer = Pacer(every_seconds=0.2)
    assert not pacer.due()
    time.sleep(0.25)
    assert pacer.due() and not pacer.due()


@pytest.mark.slow
def test_a_dualcontrol_simulation_stops_on_cancel() -> None:
    # a million paths of 5,000 periods: tens of minutes on a CPU after a solve of a few seconds
    axes = {
        axis: {"size": 8, "min": low, "max": high}
        for axis, low, high in (("x", -9.0, 11.0), ("mu", -4.0, 4.0), ("sigma", 0.02, 2.0))
    }
    params = {
        "policy": "myopic",
        "grid": axes,
        "quadrature_nodes": 4,
        "error_estimate": False,
        "report_states": [[1.0, 0.5, 0.5]],
        "simulation": {"paths": 1_000_000, "horizon": 5000},
    }
    assert stops_within_seconds("dualcontrol_solve", params, "simulating") < LATENCY_SECONDS


@pytest.mark.slow
def test_a_ks_policy_step_on_a_large_grid_stops_on_cancel() -> None:
    # 1,000 x 100 capital grids: each Euler step is 400,000 interpolations at four next states, and the policy
    # may take up to a million of them
    params = {
        "n_agents": 1_000,
        "periods": 200,
        "k_grid": {"size": 1000},
        "K_grid": {"size": 100},
        "policy_max_iterations": 1_000_000,
        "policy_tolerance": 1e-12,
        "den_haan_periods": 0,
    }
    assert stops_within_seconds("ks_solve", params, "setup") < LATENCY_SECONDS
