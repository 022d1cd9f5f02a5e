"""Which node gets a job: a pure policy over what the scheduler knows of the nodes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeCapacity:
    node_id: str
    name: str
    accels: int
    busy_accels: int
    alive: bool

    @property
    def free_accels(self) -> int:
        return max(self.accels - self.busy_accels, 0)


@dataclass(frozen=True)
class Assign:
    node_id: str
    node_name: str


@dataclass(frozen=True)
class Reject:
    code: str
    message: str


@dataclass(frozen=True)
class Wait:
    reason: str


Decision = Assign | Reject | Wait


def choose_node(
    accels: int, nodes: int, candidates: list[NodeCapacity], waited_s: float, patience_s: float
) -> Decision:
    """Assign to the live node with the most free accelerators among those big enough.

    A request no registered node could ever meet is rejected at once; a request that only
    offline nodes (or no nodes yet) could meet waits ``patience_s``, then is rejected.
    """
    if nodes != 1:
        return Reject(
            "no_node_meets_request",
            f"multi-node jobs (--nodes {nodes}) are not supported by this control plane yet; "
            "run with --nodes 1",
        )
    big_enough = [node for node in candidates if node.accels >= accels]
    if candidates and not big_enough:
        largest = max(node.accels for node in candidates)
        return Reject(
            "no_node_meets_request",
            f"no registered node has {accels} accelerators (the largest has {largest}); "
            f"ask for at most {largest} with --accels",
        )
    live = [node for node in big_enough if node.alive]
    if live:
        best = max(live, key=lambda node: (node.free_accels, node.name))
        return Assign(best.node_id, best.name)
    if waited_s < patience_s:
        return Wait("no live node can take the job yet")
    if not candidates:
        return Reject(
            "no_node_available",
            f"no node was registered within {patience_s:.0f} s; start one with `flexai agent` "
            "and submit the job again",
        )
    return Reject(
        "no_node_available",
        f"every node with {accels} accelerators has been offline for {patience_s:.0f} s; "
        "restart its agent and submit the job again",
    )
