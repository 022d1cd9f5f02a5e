"""Job names: the rule a name follows, and the JobName aggregate that holds one owner's name
for one live job at a time."""

from __future__ import annotations

import re
from uuid import UUID, uuid5

from eventsourcing.domain import Aggregate, event

from domain.errors import InvalidJobSpec, NameTaken
from domain.ids import NAMESPACE

NAME_PATTERN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{1,61})[A-Za-z0-9]")


def check_name(name: str) -> None:
    """Names: 3 to 63 of ``[A-Za-z0-9_-]``, starting and ending with a letter or digit."""
    if NAME_PATTERN.fullmatch(name):
        return
    if not 3 <= len(name) <= 63:
        problem = f"is {len(name)} characters long; use 3 to 63"
    elif re.search(r"[^A-Za-z0-9_-]", name):
        problem = "may hold only letters, digits, '-' and '_'"
    else:
        problem = "must start and end with a letter or a digit"
    raise InvalidJobSpec(f"job name '{name}' {problem}", "name")


class JobName(Aggregate):
    """Holds one owner's job name in the ledger, so a name is unique among live jobs."""

    @staticmethod
    def create_id(owner: str, name: str) -> UUID:
        return uuid5(NAMESPACE, f"job-name\x00{owner}\x00{name}")

    @event("Created")
    def __init__(self, owner: str, name: str, job_id: UUID) -> None:
        self.owner = owner
        self.name = name
        self.job_id: UUID | None = job_id

    def claim(self, job_id: UUID) -> None:
        if self.job_id is not None:
            raise NameTaken(self.name)
        self._claimed(job_id=job_id)

    def release(self, job_id: UUID) -> None:
        if self.job_id == job_id:
            self._released(job_id=job_id)

    @event("Claimed")
    def _claimed(self, job_id: UUID) -> None:
        self.job_id = job_id

    @event("Released")
    def _released(self, job_id: UUID) -> None:
        self.job_id = None
