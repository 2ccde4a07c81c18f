"""Supervision of running work, a job or a chunk of a fanned-out job, the same for both: its progress (and with
it cancel, the warm shutdown and the soft time limit), its heartbeat, and the watchdog of its hard time limit."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from core.settings import get_settings
from store import work
from worker.progress import Heartbeat, JobProgress
from worker.time_limit import Deadline, TimeLimit, Watchdog


@dataclass(frozen=True)
class Supervised:
    """What a run gets: the progress its context reports to, and the deadline of its limits."""

    progress: JobProgress
    deadline: Deadline


@contextmanager
def supervised(model: work.WorkModel, row_id: str, worker: str, limit: TimeLimit | None,
               on_hard_limit: Callable[[TimeLimit, float], None]) -> Iterator[Supervised]:
    """Run the block under the work's heartbeat and time limits, from now. Past the hard limit, the heartbeat
    stops and ``on_hard_limit(limit, seconds run)`` records the failure and ends the process."""
    deadline = Deadline(limit)
    progress = JobProgress(row_id, worker, deadline=deadline, model=model)
    with Heartbeat(row_id, worker, get_settings().heartbeat_seconds, model=model) as heartbeat:

        def hard_limit() -> None:
            assert limit is not None
            heartbeat.stop()
            on_hard_limit(limit, time.monotonic() - deadline.started)

        with Watchdog(deadline, hard_limit):
            yield Supervised(progress, deadline)
