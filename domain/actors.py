"""Who causes an event: every event of the ledger records it in its ``by``."""

from __future__ import annotations

Actor = dict[str, str]
"""Who caused an event: ``{"kind": "user" | "scheduler" | "agent", "id": ...}``."""


def user(user_id: str) -> Actor:
    return {"kind": "user", "id": user_id}


def scheduler() -> Actor:
    return {"kind": "scheduler", "id": "scheduler"}


def agent(node_name: str) -> Actor:
    return {"kind": "agent", "id": node_name}
