"""Nodes: the hosts that run jobs, each holding the ledger of its accelerator indices."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid5

from eventsourcing.domain import Aggregate, event

import domain.values as values
from domain.actors import Actor
from domain.errors import DomainError, checked
from domain.ids import NAMESPACE


class Node(Aggregate):
    """A host that runs jobs, registered by its agent; it holds the ledger of its accelerator
    indices, so that two jobs never share one: each index is allocated to one job at a time,
    and jobs waiting for this node's accelerators line up first come, first served."""

    @staticmethod
    def create_id(name: str) -> UUID:
        return uuid5(NAMESPACE, f"node\x00{name}")

    @classmethod
    def register(
        cls, name: str, accels: int, accel_type: str, by: Actor, address: str | None = None,
        gpus: list[dict[str, Any]] | None = None, isolation: dict[str, Any] | None = None,
    ) -> Node:  # fmt: skip
        checked(values.check_node_name, name)
        _check_capacity(accels, accel_type, address)
        _check_isolation(isolation)
        return cls(name=name, accels=accels, accel_type=accel_type, address=address,
                   gpus=list(gpus or []), by=by, isolation=isolation)  # fmt: skip

    # ``isolation``: how its agent keeps jobs apart ({level, detail, limits}); events stored
    # before it existed have none.
    @event("Registered")
    def __init__(
        self, name: str, accels: int, accel_type: str, by: Actor, address: str | None = None,
        gpus: list[dict[str, Any]] | None = None, isolation: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.name = name
        self.accels = accels
        self.accel_type = accel_type
        self.address = address
        self.gpus = list(gpus or [])
        self.isolation = isolation
        self.allocations: dict[str, list[int]] = {}
        """job id -> the indices it holds."""
        self.queue: dict[str, str] = {}
        """job id -> its place key (its submission time): who waits for this node's
        accelerators, oldest first."""

    def update(
        self, accels: int, accel_type: str, by: Actor, address: str | None = None,
        gpus: list[dict[str, Any]] | None = None, isolation: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        _check_capacity(accels, accel_type, address)
        _check_isolation(isolation)
        gpus = list(gpus or [])
        if (accels, accel_type, address, gpus, isolation) != (
            self.accels, self.accel_type, self.address, getattr(self, "gpus", []),
            getattr(self, "isolation", None),
        ):  # fmt: skip
            self._updated(accels=accels, accel_type=accel_type, address=address, gpus=gpus,
                          by=by, isolation=isolation)  # fmt: skip

    @event("Updated")
    def _updated(
        self, accels: int, accel_type: str, by: Actor, address: str | None = None,
        gpus: list[dict[str, Any]] | None = None, isolation: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.accels = accels
        self.accel_type = accel_type
        self.address = address
        self.gpus = list(gpus or [])
        self.isolation = isolation

    # -- accelerators ----------------------------------------------------------------------

    def free_indices(self) -> list[int]:
        held = {index for indices in self.allocations.values() for index in indices}
        return [index for index in range(self.accels) if index not in held]

    def ahead_of(self, job_id: str, place: str) -> list[str]:
        """The jobs waiting for this node that came before ``job_id``."""
        earlier = sorted((key, other) for other, key in self.queue.items()
                         if other != job_id and key < place)  # fmt: skip
        return [other for _, other in earlier]

    def can_allocate(self, job_id: str, count: int, place: str) -> bool:
        """Whether ``count`` indices are free and no earlier job waits for them."""
        if job_id in self.allocations:
            return True
        return len(self.free_indices()) >= count and not self.ahead_of(job_id, place)

    def allocate(self, job_id: str, count: int, place: str, by: Actor) -> list[int]:
        """The lowest free indices for ``job_id`` (its own, if it holds some already)."""
        if job_id in self.allocations:
            return list(self.allocations[job_id])
        if not self.can_allocate(job_id, count, place):
            raise DomainError(
                f"node '{self.name}' cannot give {count} accelerator(s) to job {job_id} now"
            )
        indices = self.free_indices()[:count]
        self._allocated(job_id=job_id, indices=indices, by=by)
        return indices

    def release(self, job_id: str, by: Actor) -> bool:
        if job_id not in self.allocations:
            return False
        self._released(job_id=job_id, by=by)
        return True

    def enqueue(self, job_id: str, place: str, by: Actor) -> None:
        if job_id not in self.queue:
            self._queued(job_id=job_id, place=place, by=by)

    def dequeue(self, job_id: str, by: Actor) -> None:
        if job_id in self.queue:
            self._dequeued(job_id=job_id, by=by)

    @event("Allocated")
    def _allocated(self, job_id: str, indices: list[int], by: Actor) -> None:
        self.allocations[job_id] = list(indices)
        self.queue.pop(job_id, None)

    @event("Released")
    def _released(self, job_id: str, by: Actor) -> None:
        self.allocations.pop(job_id, None)

    @event("Queued")
    def _queued(self, job_id: str, place: str, by: Actor) -> None:
        self.queue[job_id] = place

    @event("Dequeued")
    def _dequeued(self, job_id: str, by: Actor) -> None:
        self.queue.pop(job_id, None)


ISOLATION_LEVELS = ("sandbox", "user", "none")
"""How a node's agent keeps jobs apart: each in a sandbox of its own, all as one user, or
all as the agent's own user."""


def _check_isolation(isolation: dict[str, Any] | None) -> None:
    if isolation is None:
        return
    if not isinstance(isolation, dict) or set(isolation) != {"level", "detail", "limits"}:
        raise DomainError("a node's isolation holds its level, detail and limits")
    if isolation["level"] not in ISOLATION_LEVELS:
        raise DomainError(f"a node's isolation level is one of {', '.join(ISOLATION_LEVELS)}")
    checked(values.check_message, isolation["detail"], "isolation.detail")
    if not isinstance(isolation["limits"], bool):
        raise DomainError("a node's isolation says whether it limits jobs (true or false)")


def _check_capacity(accels: int, accel_type: str, address: str | None = None) -> None:
    checked(values.check_int, accels, "accels", 0, values.MAX_ACCELS)
    checked(values.check_text, accel_type, "accel_type", max_length=values.MAX_ACCEL_TYPE)
    if address is not None:
        checked(values.check_address, address)
