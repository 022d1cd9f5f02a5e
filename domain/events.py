"""An event read back from the ledger: its name and the facts it carries."""

from __future__ import annotations

from typing import Any

ENVELOPE = frozenset({"originator_id", "originator_version", "timestamp", "by", "originator_topic"})


def event_name(domain_event: object) -> str:
    """``TrainingJob.Started`` -> ``Started``."""
    return type(domain_event).__name__


def event_facts(domain_event: object) -> dict[str, Any]:
    """The facts an event carries, without the envelope (id, version, time, actor)."""
    return {
        key: value
        for key, value in vars(domain_event).items()
        if key not in ENVELOPE and not key.startswith("_")
    }
