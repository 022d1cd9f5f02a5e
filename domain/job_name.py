"""Job names: the rule a name follows, and the JobName aggregate that holds one owner's name
for one live job at a time."""

from __future__ import annotations

from uuid import UUID, uuid5

from eventsourcing.domain import Aggregate, event

from common.contract import Refusal, check_job_name
from domain.errors import InvalidJobSpec, NameTaken
from domain.ids import NAMESPACE


def check_name(name: str) -> None:
    """The wire contract's rule (:data:`common.contract.JOB_NAME_RULE`), in its words."""
    try:
        check_job_name(name)
    except Refusal as refusal:
        raise InvalidJobSpec(f"job name {refusal}", "name") from None


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
