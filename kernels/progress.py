"""The channel a runner reports through: progress, cancellation and artifacts.

Runners receive an object satisfying :class:`Progress`. The worker's implementation writes progress to
the job row and raises :class:`JobCancelled` once a cancel was requested; :class:`LocalProgress` serves
tests, benchmarks and library use.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

# How often a long loop reports at most (a report is where cancellation and a warm shutdown take effect).
CHECKPOINT_SECONDS = 1.0


class JobCancelled(Exception):
    """Raised at a progress checkpoint once the job's cancellation was requested."""


class Progress(Protocol):
    def __call__(self, fraction: float, stage: str | None = None) -> None:
        """Report progress in [0, 1]; raises :class:`JobCancelled` if the job should stop."""

    def save_artifact(self, name: str, value: Any) -> None:
        """Keep a large output (NumPy array, dict of arrays, or pandas DataFrame) beside the result."""


class LocalProgress:
    """In-memory :class:`Progress`: records every report and artifact; cancel with :meth:`cancel`."""

    def __init__(self) -> None:
        self.reports: list[tuple[float, str | None]] = []
        self.artifacts: dict[str, Any] = {}
        self._cancelled = threading.Event()

    def __call__(self, fraction: float, stage: str | None = None) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress fraction {fraction} outside [0, 1]")
        self.reports.append((fraction, stage))
        if self._cancelled.is_set():
            raise JobCancelled("cancelled")

    def save_artifact(self, name: str, value: Any) -> None:
        self.artifacts[name] = value

    def cancel(self) -> None:
        self._cancelled.set()


class Pacer:
    """Paces a long loop's checkpoints by the clock: :meth:`due` is true once ``every_seconds`` passed since
    the last time it was (or since the pacer was made). A loop asks every iteration, however long its
    iterations are, and reports only when due: cancellation and a warm shutdown act within about
    ``every_seconds`` plus one iteration, and a fast loop does not report per iteration."""

    def __init__(self, every_seconds: float = CHECKPOINT_SECONDS) -> None:
        self.every_seconds = every_seconds
        self._last = time.monotonic()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.every_seconds:
            return False
        self._last = now
        return True
