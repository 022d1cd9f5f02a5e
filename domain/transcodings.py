"""How the ledger stores what JSON cannot hold: the sets in a job's snapshot."""

from __future__ import annotations

from typing import Any

from eventsourcing.persistence import Transcoding


class SetAsList(Transcoding):
    """A set (a job's checkpoint ids, a node's refused reports), sorted for a stable record."""

    type = set
    name = "set"

    def encode(self, obj: set[Any]) -> list[Any]:
        try:
            return sorted(obj)
        except TypeError:  # items of kinds that do not compare
            return list(obj)

    def decode(self, data: list[Any]) -> set[Any]:
        return set(data)
