"""Many new jobs at once (``TrainingJobs.submit_many``): each job and the claim of its name
staged for one save, a refused one (its name taken, its spec invalid) set aside alone.

The names are first taken for new ones, unread (a sweep's names usually are): a conflict on
saving says some were claimed before, and then every name is read and the save made again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import RecordConflictError

from domain.actors import Actor, scheduler
from domain.errors import DomainError, NameGivenTwice
from domain.job import TrainingJob
from domain.job_facts import GivenSpec
from domain.job_name import JobName

T = TypeVar("T")
NameReader = Callable[[str], JobName | None]
"""The stored claim of a name, or None for a name never claimed."""
Saved = tuple[UUID, int] | DomainError
"""A job saved (its id and ledger position), or why it was refused."""


@dataclass
class Staged:
    """What each submission came to, in order (its new job, or why it was refused), and
    every aggregate to save for the accepted ones."""

    results: list[TrainingJob | DomainError] = field(default_factory=list)
    names: dict[str, JobName] = field(default_factory=dict)

    @property
    def aggregates(self) -> list[Any]:
        jobs = [result for result in self.results if isinstance(result, TrainingJob)]
        return [*jobs, *self.names.values()]

    def saved(self, recordings: Sequence[Any]) -> list[Saved]:
        """Each accepted job's id and ledger position once saved (the last of its events and
        its name's), each refused one's error."""
        last: dict[UUID, int] = {}
        for recording in recordings:
            originator = recording.domain_event.originator_id
            last[originator] = max(last.get(originator, 0), recording.notification.id)
        return [
            result if isinstance(result, DomainError)
            else (result.id, max(last[result.id], last[self.names[result.name].id]))
            for result in self.results
        ]  # fmt: skip


def submit_all(
    app: Application[UUID], owner: str, submissions: Sequence[tuple[str, GivenSpec]],
    by: Actor, *, schedule: bool, retrying: Callable[[Callable[[], list[Saved]]], list[Saved]],
) -> list[Saved]:  # fmt: skip
    """Each job of ``submissions`` saved, or why it was refused, in one save (``retrying``
    it on conflicts once the names are read)."""

    def run(read: NameReader) -> list[Saved]:
        staged = stage(owner, submissions, by, read, schedule=schedule)
        return staged.saved(app.save(*staged.aggregates) if staged.aggregates else [])

    def claimed(name: str) -> JobName | None:
        with suppress(AggregateNotFoundError):
            index: JobName = app.repository.get(JobName.create_id(owner, name))
            return index
        return None

    try:
        return run(lambda name: None)
    except RecordConflictError:
        return retrying(lambda: run(claimed))


def stage(
    owner: str, submissions: Sequence[tuple[str, GivenSpec]], by: Actor, read: NameReader,
    *, schedule: bool = False,
) -> Staged:  # fmt: skip
    """Each ``(name, spec)`` made a job whose name is claimed: a name claimed earlier in the
    batch, or by a live job (``read``), refuses that job alone. With ``schedule``, each job's
    scheduling starts in the same save (as ``TrainingJobs.submit`` does)."""
    staged = Staged()
    for name, spec in submissions:
        try:
            if name in staged.names:
                raise NameGivenTwice(name)
            job = TrainingJob.submit(owner=owner, name=name, spec=spec, by=by)
            index = read(name)
            if index is None:
                index = JobName(owner=owner, name=name, job_id=job.id)
            else:
                index.claim(job.id)
        except DomainError as refused:
            staged.results.append(refused)
            continue
        if schedule:
            job.begin_scheduling(by=scheduler())
        staged.names[name] = index
        staged.results.append(job)
    return staged
