"""What a training job's state says: the questions its commands, the lifecycle table's guards
and the application ask of it. :class:`~domain.job.TrainingJob` holds this state and changes
it, through its events only."""

from __future__ import annotations

from typing import Any

from common.job_spec import JobSpec
from domain.errors import InvalidJobSpec, JobDeleted
from domain.statuses import TERMINAL, Status


class JobState:
    """The state of a job that the questions below read."""

    name: str
    spec: dict[str, Any]
    """As the ``Submitted`` event stores it (and a snapshot keeps it): :attr:`job_spec` reads it."""
    status: Status
    deleted: bool
    placements: list[dict[str, Any]]
    """One per node of the job: ``node_id``, ``node_name``, ``address``, ``built``,
    ``accelerators``, ``exit_code``, ``stopped``."""
    debug_sessions: set[str]
    """The ids of the debug sessions open into the job."""
    accelerators: list[int]
    node_id: str | None
    node_name: str | None
    master_port: int | None
    checkpoint_ids: set[str]
    logs_unavailable_at: set[int]
    """The log offsets past which the job's logs could not be stored."""

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def job_spec(self) -> JobSpec:
        """The job's spec, typed (every field an older spec lacks at its default)."""
        return JobSpec.from_dict(self.spec)

    @property
    def nnodes(self) -> int:
        return self.job_spec.nodes

    @property
    def all_built(self) -> bool:
        return bool(self.placements) and all(p["built"] for p in self.placements)

    def placement_index(self, node_id: str, node_index: int | None) -> int | None:
        """The index of ``node_id`` in the job (``node_index`` when given), or None."""
        for index, placement in enumerate(self.placements):
            if placement["node_id"] == node_id and node_index in (None, index):
                return index
        return None

    def _placement(self, node_index: int) -> dict[str, Any]:
        if not 0 <= node_index < len(self.placements):
            raise InvalidJobSpec(
                f"job '{self.name}' has no node index {node_index}", "node_index"
            )
        return self.placements[node_index]

    def _on_node(self, message: str, node_index: int) -> str:
        """A multi-node job's failure names the node it happened on."""
        if self.nnodes <= 1 or not self.placements:
            return message
        node = self._placement(node_index)["node_name"]
        return f"{message} (node {node}, index {node_index})"

    def refuse_if_deleted(self) -> None:
        if self.deleted:
            raise JobDeleted(self.name)

    def recorded_output(self, node_index: int) -> str | None:
        """The SHA-256 of the output archive recorded for node ``node_index``, if any."""
        hashes: dict[str, str] = getattr(self, "output_hashes", {})  # jobs folded before them
        return hashes.get(str(node_index))

    @property
    def open_debug_sessions(self) -> set[str]:
        return set(getattr(self, "debug_sessions", ()))  # jobs folded before they existed

    # -- attempts (jobs folded before them have none: these give their defaults) ----------

    @property
    def attempt(self) -> int:
        """The current attempt, from 1."""
        return int(getattr(self, "attempt_number", 1))

    @property
    def retries_spent(self) -> int:
        return int(getattr(self, "retries", 0))

    @property
    def retries_left(self) -> int:
        return max(self.job_spec.max_retries - self.retries_spent, 0)

    @property
    def preemption(self) -> dict[str, Any] | None:
        """Who asked to take this running job's accelerators, while it stops for them."""
        return getattr(self, "preempting", None)
