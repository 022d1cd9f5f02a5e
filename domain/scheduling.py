"""Which nodes get a job: a pure policy over what the scheduler knows of the fleet.

Jobs are placed oldest first. A job goes to the live nodes big enough for it that will free
their accelerators soonest (most free now, then fewest asked for by jobs already placed
there), even when they are busy; a job that names an image goes first to the nodes that hold
it among those free for it now (else among all), the others in the same order (no pull to wait
for, never a busy holder over a free node): it builds there meanwhile and waits ``enqueued`` in the
node's line, first come, first served (:mod:`domain.allocation`). A node takes at most one
node's worth of such jobs ahead of time (what jobs building or waiting there ask for stays
within its accelerators), so that a burst of a thousand jobs is not a thousand builds at once:
the others wait in ``scheduling`` for room, oldest first. The accelerator indices are handed
out by the ledger when the job starts, never here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeCapacity:
    node_id: str
    name: str
    accels: int
    busy_accels: int
    """Accelerators held by running jobs plus those asked for by jobs placed there."""
    alive: bool
    address: str | None = None
    held: int = 0
    """Of ``busy_accels``, those held by running jobs."""
    images: frozenset[str] = frozenset()
    """The references of the images the node holds (pulled), as :func:`choose_node`'s
    ``image`` is spelled."""

    @property
    def free_accels(self) -> int:
        return max(self.accels - self.busy_accels, 0)

    def has_room(self, accels: int) -> bool:
        """Whether a job asking for ``accels`` may line up here now: what jobs building or
        waiting here ask for stays within the node's accelerators."""
        return self.busy_accels - self.held + accels <= self.accels

    def taking(self, accels: int) -> NodeCapacity:
        """This node once a job asking for ``accels`` is placed on it."""
        return NodeCapacity(self.node_id, self.name, self.accels, self.busy_accels + accels,
                            self.alive, self.address, self.held, self.images)  # fmt: skip


@dataclass(frozen=True)
class Assign:
    nodes: tuple[NodeCapacity, ...]

    @property
    def node_id(self) -> str:
        return self.nodes[0].node_id

    @property
    def node_name(self) -> str:
        return self.nodes[0].name


@dataclass(frozen=True)
class Reject:
    code: str
    message: str


@dataclass(frozen=True)
class Wait:
    reason: str
    """One line: why the job waits (``flexai training list`` shows it)."""
    candidates: tuple[NodeCapacity, ...] = field(default=())
    """The registered nodes big enough for it, live or not (``inspect`` shows them)."""


Decision = Assign | Reject | Wait


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def choose_node(
    accels: int,
    nodes: int,
    candidates: Sequence[NodeCapacity],
    waited_s: float,
    patience_s: float,
    image: str | None = None,
) -> Decision:
    """Place a job asking for ``accels`` accelerators on each of ``nodes`` nodes; of the nodes
    it may go to, those holding ``image`` (the job's, if it names one) come first among those
    with the accelerators free now.

    A request no set of registered nodes could ever meet is rejected at once; one that only
    offline nodes (or nodes not registered yet) could meet waits ``patience_s``, then is
    rejected. Otherwise it is assigned: it never waits for free accelerators here.
    """
    big_enough = [node for node in candidates if node.accels >= accels]
    if candidates and len(big_enough) < nodes:
        return Reject("no_node_meets_request", _never_fits(accels, nodes, candidates))
    live = [node for node in big_enough if node.alive]
    if len(live) >= nodes:
        roomy = [node for node in live if node.has_room(accels)]
        if len(roomy) < nodes:  # it fits the fleet: it is never rejected, it waits its turn
            lines = "has a full line" if len(live) == 1 else "have full lines"
            return Wait(f"waits for its turn: the {_plural(len(live), 'live node')} big "
                        f"enough {lines} of jobs waiting to run", tuple(live))  # fmt: skip
        ranked = sorted(roomy, key=lambda node: (-node.free_accels, node.busy_accels, node.name))
        if image is not None:  # of those free for it now (else of all), the holders first
            ranked.sort(key=lambda node: (node.free_accels < accels, image not in node.images))
        return Assign(tuple(ranked[:nodes]))
    if waited_s < patience_s:
        wanted = f"{_plural(nodes, 'live node')} with {_plural(accels, 'accelerator')}"
        return Wait(f"waits for {wanted}; {len(live)} of the {len(big_enough)} registered "
                    "are live" if big_enough else f"waits for {wanted}; none is registered",
                    tuple(big_enough))  # fmt: skip
    if not candidates:
        return Reject(
            "no_node_available",
            f"no node was registered within {patience_s:.0f} s; start one with `flexai agent` "
            "and submit the job again",
        )
    return Reject(
        "no_node_available",
        f"only {len(live)} of the {_plural(nodes, 'node')} with {accels} accelerators this job "
        f"needs were live for {patience_s:.0f} s; restart their agents and submit the job again"
        if nodes > 1 else
        f"every node with {accels} accelerators has been offline for {patience_s:.0f} s; "
        "restart its agent and submit the job again",
    )  # fmt: skip


def _never_fits(accels: int, nodes: int, candidates: Sequence[NodeCapacity]) -> str:
    largest = max(node.accels for node in candidates)
    if nodes == 1:
        return (
            f"no registered node has {accels} accelerators (the largest has {largest}); "
            f"ask for at most {largest} with --accels"
        )
    enough = sum(node.accels >= accels for node in candidates)
    return (
        f"the job needs {nodes} nodes with {accels} accelerators each, and only {enough} of "
        f"the {_plural(len(candidates), 'registered node')} have that many; ask for at most "
        f"{max(enough, 1)} with --nodes, or fewer accelerators with --accels"
    )
