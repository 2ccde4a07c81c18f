"""A job group's state, aggregated from its members whenever it is read: how many are in each status, the
group's status and progress. Below both the groups repository (store/groups.py) and the webhooks that announce
a finished group (store/webhooks.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.status import TERMINAL_STATUSES, JobStatus
from store.models import Job, JobGroup


@dataclass
class GroupSummary:
    """The members' state: how many are in each status, and the group's progress (finished members count 1)."""

    counts: dict[str, int] = field(default_factory=dict)
    progress: float = 0.0

    @property
    def present(self) -> int:
        return sum(self.counts.values())

    @property
    def status(self) -> JobStatus:
        """queued while every member is; succeeded once all did; failed once all ended and one failed;
        cancelled once all ended, none failed and one was cancelled; otherwise running."""
        counts = {JobStatus(status): count for status, count in self.counts.items() if count}
        if not counts or set(counts) == {JobStatus.QUEUED}:
            return JobStatus.QUEUED
        if not set(counts) <= TERMINAL_STATUSES:
            return JobStatus.RUNNING
        if JobStatus.FAILED in counts:
            return JobStatus.FAILED
        if JobStatus.CANCELLED in counts:
            return JobStatus.CANCELLED
        return JobStatus.SUCCEEDED


def summarize(session: Session, group: JobGroup) -> GroupSummary:
    """Counts per status and progress of the group's members (deleted members count as done)."""
    rows = session.execute(
        select(Job.status, func.count(), func.coalesce(func.sum(Job.progress), 0.0))
        .where(Job.group_id == group.id)
        .group_by(Job.status)
    ).all()
    counts = {status.value: 0 for status in JobStatus}
    done = 0.0
    for status, count, progress_sum in rows:
        counts[str(status)] = int(count)
        done += count if status in TERMINAL_STATUSES else float(progress_sum)
    deleted = max(group.member_count - sum(counts.values()), 0)
    progress = (done + deleted) / group.member_count if group.member_count else 1.0
    return GroupSummary(counts=counts, progress=min(max(progress, 0.0), 1.0))
