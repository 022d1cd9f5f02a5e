"""The ids derived from names (a job name's holder, a node, a checkpoint), so that the same
name always finds the same aggregate: changing the namespace would orphan every one stored."""

from __future__ import annotations

from uuid import UUID, uuid5

NAMESPACE = UUID("6f1d1c3e-2b9a-4f5e-9a51-3c1f0e8d7a42")


def checkpoint_id(job_id: UUID, name: str, node_index: int = 0) -> str:
    """Checkpoint ids derive from job, name and node, so a re-upload names the same
    checkpoint, and two nodes of a job writing one name keep two checkpoints."""
    node = "" if node_index == 0 else f"\x00{node_index}"
    return str(uuid5(NAMESPACE, f"checkpoint\x00{job_id}\x00{name}{node}"))
