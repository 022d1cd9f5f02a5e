"""Which attempt of a job a request means: a job preempted or retried runs several attempts,
and each keeps its own logs and outputs (:func:`common.attempts.attempt_key`).

Agents name the attempt their bytes are of (``attempt``, 1 when absent); users name the one
they want to read (default: the job's current attempt for logs, the last one that recorded
outputs for outputs). An attempt the job has not had is a 404 problem naming those it has; so is a
node the job does not run on.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query

from api.http.problems import Problem
from common.attempts import FIRST, MAX_ATTEMPT, current_attempt, last_attempt

AgentAttempt = Annotated[int, Query(
    ge=1, le=MAX_ATTEMPT, description="the job's attempt these bytes are of (from 1)",
)]  # fmt: skip
UserAttempt = Annotated[int | None, Query(
    ge=1, le=MAX_ATTEMPT,
    description="which attempt of the job (from 1; default: the last one)",
)]  # fmt: skip


def chosen_attempt(document: dict[str, Any], attempt: int | None, default: int | None = None,
                   ) -> int:  # fmt: skip
    """``attempt`` when the job had it (``default``, else its current one, when None); a 404
    problem naming the attempts it had otherwise."""
    if attempt is None:
        return default or current_attempt(document)
    last = last_attempt(document)
    if not FIRST <= attempt <= last:
        had = "attempt 1" if last == 1 else f"attempts 1 to {last}"
        raise Problem(
            404, "attempt-not-found", "No such attempt",
            f"job '{document['name']}' has had {had}, not attempt {attempt}: name one of "
            f"those (`flexai training inspect {document['name']}` lists them)",
            attempts=list(range(1, last + 1)),
        )  # fmt: skip
    return attempt


def chosen_node(document: dict[str, Any], node_index: int) -> int:
    """``node_index`` when the job runs on that node; a 404 problem naming its nodes otherwise
    (a one-node job has node 0 only)."""
    nodes = max(len(document.get("placements") or []), int(document.get("nodes") or 1))
    if node_index >= nodes:
        which = "node 0 only" if nodes == 1 else f"nodes 0 to {nodes - 1}"
        raise Problem(
            404, "node-not-found", "No such node",
            f"job '{document['name']}' runs on {which}, not node {node_index}: name one of "
            "those, or leave the node index out",
            nodes=nodes,
        )  # fmt: skip
    return node_index
