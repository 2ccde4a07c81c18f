"""Job statuses: the one spelling of each, shared by the store, the API, the worker and the CLI.

``queued -> running -> succeeded | failed | cancelled``; ``queued -> cancelled``; ``running -> queued``
(re-queued after a lost worker, or handed back by a worker that is shutting down). ``store/jobs.py`` makes
each transition one conditional UPDATE.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """A job's status; a ``str`` (``JobStatus.QUEUED == "queued"``), stored and sent as its value."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
# A job in one of these may still read its datasets.
ACTIVE_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.QUEUED, JobStatus.RUNNING})


class JobPriority(StrEnum):
    """A job's place in its queue: ``high`` runs before ``normal``, ``normal`` before ``low`` (a sweep's
    members default to ``low``, so a single job does not wait behind a sweep)."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"

    @property
    def rank(self) -> int:
        """Larger runs first."""
        return {JobPriority.LOW: 0, JobPriority.NORMAL: 1, JobPriority.HIGH: 2}[self]
