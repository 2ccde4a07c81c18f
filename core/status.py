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
