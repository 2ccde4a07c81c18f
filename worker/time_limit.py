"""A time limit per job, so that a hung kernel frees its device.

The worker runs Celery's solo pool, where Celery's own task time limits do not work, so the worker keeps its
own. Each job (and each chunk of a fanned-out job, with its job's limits) gets two:

- a **soft limit** derived from the kind's work estimate (:func:`kernels.work.job_work`, every loop at its
  iteration cap, so a job that converges early stays far within it): the estimated
  seconds (work units over the kind's throughput, ``GPUEST_TIME_LIMIT_WORK_PER_SECOND``, else
  ``GPUEST_TIME_LIMIT_DEFAULT_WORK_PER_SECOND``) times ``GPUEST_TIME_LIMIT_FACTOR``, at least
  ``GPUEST_TIME_LIMIT_MIN_SECONDS`` and at most ``GPUEST_TIME_LIMIT_MAX_SECONDS`` (a kind without a work
  measure gets the maximum). Past it, the job's next progress checkpoint raises :class:`TimeLimitExceeded`
  and the job fails with the error code ``time_limit``.
- a **hard limit**, ``GPUEST_TIME_LIMIT_GRACE_SECONDS`` behind the soft one, for a kernel that reaches no
  checkpoint: the :class:`Watchdog` stops the heartbeat, records the job as failed with the same error (not
  re-queued: a hung job would hang again) and ends the worker process, which frees the device; its supervisor
  (``gpuest serve``, Docker's restart policy) starts a fresh one.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from core.settings import Settings, get_settings
from kernels.registry import JobKind
from kernels.spec import JobParams
from kernels.work import job_work
from worker.dataset_loader import dataset_rows
from worker.infra import InfrastructureUnavailable

log = structlog.get_logger("gpuest.worker")

TIME_LIMIT_CODE = "time_limit"
# Exit status of a worker that ended itself on a job's hard time limit (EX_SOFTWARE): its supervisor restarts it.
EXIT_TIME_LIMIT = 70
TIME_LIMIT_ERROR_TYPE = "TimeLimitExceeded"


class TimeLimitExceeded(Exception):
    """Raised at a progress checkpoint once the job ran past its soft time limit."""


@dataclass(frozen=True)
class TimeLimit:
    """A job's soft and hard limits in seconds from its start, and how the soft one was derived (for the
    message that tells the user which limit stopped the job and how to raise it)."""

    kind: str
    soft_seconds: float
    grace_seconds: float
    derivation: str

    @property
    def hard_seconds(self) -> float:
        return self.soft_seconds + self.grace_seconds

    def message(self, hard: bool) -> str:
        which = (f"its hard time limit of {self.hard_seconds:.0f} s (the soft limit plus "
                 f"{self.grace_seconds:.0f} s of grace; the kernel reached no checkpoint to stop at)"
                 if hard else f"its soft time limit of {self.soft_seconds:.0f} s")
        return (f"the job ran past {which}; the soft limit is {self.derivation}. An operator raises it with "
                f"GPUEST_TIME_LIMIT_FACTOR, GPUEST_TIME_LIMIT_MIN_SECONDS, GPUEST_TIME_LIMIT_MAX_SECONDS or "
                f"the kind's throughput, GPUEST_TIME_LIMIT_WORK_PER_SECOND='{{\"{self.kind}\": <units per "
                f"second>}}'")

    def error(self, hard: bool) -> dict[str, Any]:
        return {"type": TIME_LIMIT_ERROR_TYPE, "code": TIME_LIMIT_CODE, "message": self.message(hard)}


def time_limit(kind: str, params: Any, dataset_rows: Mapping[str, int], settings: Settings) -> TimeLimit | None:
    """The limits of a job of ``kind`` with validated ``params``; None when time limits are off
    (``GPUEST_TIME_LIMIT_FACTOR=0``)."""
    if settings.time_limit_factor <= 0:
        return None
    floor, ceiling = settings.time_limit_min_seconds, settings.time_limit_max_seconds
    work = job_work(kind, params, dataset_rows)
    if work is None:
        return TimeLimit(kind, ceiling, settings.time_limit_grace_seconds,
                         f"the maximum, {ceiling:.0f} s ({kind} has no work estimate)")
    rate = settings.time_limit_work_per_second.get(kind, settings.time_limit_default_work_per_second)
    estimate = work.units / rate
    soft = min(ceiling, max(floor, settings.time_limit_factor * estimate))
    derivation = (f"{settings.time_limit_factor:g} x the estimated {estimate:.3g} s ({kind} work {work.formula} = "
                  f"{work.units:.3g} units at {rate:.3g} units/s), at least {floor:.0f} s and at most {ceiling:.0f} s")
    return TimeLimit(kind, soft, settings.time_limit_grace_seconds, derivation)


class Deadline:
    """A time limit running from the job's start: whether the soft one has passed, for the progress checkpoints."""

    def __init__(self, limit: TimeLimit | None, started: float | None = None) -> None:
        self.limit = limit
        self.started = time.monotonic() if started is None else started

    def check(self) -> None:
        """Raise :class:`TimeLimitExceeded` once the soft limit has passed."""
        if self.limit is not None and time.monotonic() - self.started > self.limit.soft_seconds:
            raise TimeLimitExceeded(self.limit.message(hard=False))


def end_worker_process() -> None:
    """End this worker process at once (a kernel past its hard time limit holds the device and may never
    return): the device is freed, and the supervisor (``gpuest serve``, Docker's restart policy) restarts it."""
    log.error("worker process ends itself: a job ran past its hard time limit", pid=os.getpid())
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # a closed stream must not keep the process alive
            pass
    os._exit(EXIT_TIME_LIMIT)


class Watchdog:
    """A daemon thread that calls ``on_hard_limit`` once the job's hard limit passes while it still runs (the
    context manager's block has not ended). ``on_hard_limit`` records the job as failed and ends the process."""

    def __init__(self, deadline: Deadline, on_hard_limit: Callable[[], None]) -> None:
        self._deadline, self._on_hard_limit = deadline, on_hard_limit
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gpuest-time-limit", daemon=True)
        self.fired = False

    def __enter__(self) -> Watchdog:
        if self._deadline.limit is not None:
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()

    def _watch(self) -> None:
        limit = self._deadline.limit
        assert limit is not None
        remaining = self._deadline.started + limit.hard_seconds - time.monotonic()
        if self._done.wait(max(0.0, remaining)):
            return  # the job ended in time
        self.fired = True
        self._on_hard_limit()


def limit_for(kind: JobKind, spec: JobParams, dataset_ids: Mapping[str, str]) -> TimeLimit | None:
    """The limits of a claimed job (or of a chunk: its job's), from its params model and its datasets' stored
    rows; datasets the database cannot say get the maximum."""
    settings = get_settings()
    if settings.time_limit_factor <= 0:
        return None
    try:
        rows = dataset_rows(dataset_ids)
    except InfrastructureUnavailable:
        return TimeLimit(kind.name, settings.time_limit_max_seconds, settings.time_limit_grace_seconds,
                         f"the maximum, {settings.time_limit_max_seconds:.0f} s (the job's datasets could not be "
                         "read to estimate its work)")
    return time_limit(kind.name, spec, rows, settings)
