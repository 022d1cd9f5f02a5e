"""The statuses of a training job, as users see them (SPEC.md's lifecycle); which transitions
lead from one to another is :mod:`domain.lifecycle`'s table."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    PENDING = "pending"
    SCHEDULING = "scheduling"
    REJECTED = "rejected"
    BUILDING = "building"
    IN_PROGRESS = "in progress"
    ENQUEUED = "enqueued"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOP_IN_PROGRESS = "stop in progress"
    STOPPED = "stopped"
    STOP_FAILED = "stop failed"


TERMINAL = frozenset(
    {Status.REJECTED, Status.SUCCEEDED, Status.FAILED, Status.STOPPED, Status.STOP_FAILED}
)
ON_A_NODE = frozenset(
    {Status.BUILDING, Status.ENQUEUED, Status.IN_PROGRESS, Status.STOP_IN_PROGRESS}
)
