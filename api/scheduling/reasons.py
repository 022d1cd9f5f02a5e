"""How a waiting job's wait is put to its user: the reason line and the detail behind it, for a
job not placed yet (``scheduling``) and for one in its nodes' lines (``enqueued``). The scheduler
writes them every round that plans (:mod:`api.scheduling.waits` keeps them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from domain.scheduling import NodeCapacity, Wait
from domain.statuses import Status


def scheduling_wait(row: dict[str, Any], decision: Wait) -> dict[str, Any]:
    """Why a job not placed yet waits. When each node was last heard of is looked up when it
    is read (:meth:`Waits.detail`): a heartbeat does not rewrite every waiting job's row."""
    return {
        "reason": decision.reason,
        "asked": {"accels": row["accels"], "nodes": row["nodes"]},
        "nodes": [
            {"node": node.name, "accels": node.accels, "alive": node.alive, "node_id": node.node_id}
            for node in decision.candidates
        ],  # fmt: skip
    }


def node_wait(
    row: dict[str, Any], placement: dict[str, Any], node: NodeCapacity | None,
    holders: list[dict[str, Any]], rank: Callable[[str], int],
) -> dict[str, Any]:  # fmt: skip
    """One node an enqueued job waits on: who holds its accelerators, who is ahead in line."""
    held_by = [
        {"job": holder["name"], "accelerators": holder["allocated"]}
        for holder in holders
        if holder["status"] in (Status.IN_PROGRESS.value, Status.STOP_IN_PROGRESS.value)
    ]
    ahead = [
        holder["name"] for holder in holders
        if holder["status"] == Status.ENQUEUED.value and holder["job_id"] != row["id"]
        and (-rank(holder["job_id"]), holder["created_at"], holder["job_id"])
        < (-rank(row["id"]), row["created_at"], row["id"])
    ]  # fmt: skip
    total = node.accels if node else 0
    held = node.held if node else 0
    return {"node": placement["node"], "accels": total, "free": max(total - held, 0),
            "held_by": held_by, "ahead": ahead, "alive": bool(node and node.alive)}  # fmt: skip


def enqueued_wait(row: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    busy = [node for node in nodes if node["free"] < row["accels"] or node["ahead"]]
    parts = []
    for node in busy or nodes:
        holders = ", ".join(h["job"] for h in node["held_by"]) or "no job"
        part = f"{node['node']} has {node['free']} of {node['accels']} free (held by {holders})"
        if node["ahead"]:
            part += f", {len(node['ahead'])} job(s) ahead in line"
        parts.append(part)
    accels = f"{row['accels']} accelerator{'s' if row['accels'] != 1 else ''}"
    return {
        "reason": f"waits for {accels}: " + "; ".join(parts),
        "asked": {"accels": row["accels"], "nodes": row["nodes"]},
        "nodes": nodes,
        "place": 1 + max((len(node["ahead"]) for node in nodes), default=0),
    }
