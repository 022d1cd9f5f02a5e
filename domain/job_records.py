"""What a job records beside its status: checkpoints, outputs, logs it could not keep, debug
sessions, and that its artifacts were purged. :class:`~domain.job.TrainingJob` inherits these
commands and makes each body below one of its events (``job_event``), under its own topics."""

from __future__ import annotations

from typing import Any

import domain.values as values
from domain.actors import Actor
from domain.errors import DomainError, checked
from domain.job_facts import check_debug_session, check_log_loss, check_output, clean_checkpoint
from domain.job_state import JobState
from domain.lifecycle import require


class JobRecords(JobState):
    """The commands that record what a job made or met, and their events' bodies."""

    def note_logs_unavailable(self, message: str, offset: int, written: int, by: Actor) -> bool:
        """Record that the job's logs could not be stored past ``offset``; once per offset."""
        require(self, "LogsUnavailable")
        check_log_loss(message, offset, written)
        if offset in self.logs_unavailable_at:
            return False
        self._logs_unavailable(message=message, offset=offset, written=written, by=by)
        return True

    def record_checkpoint(self, checkpoint: dict[str, Any], by: Actor) -> bool:
        """Record a checkpoint once; returns False when it is already recorded."""
        self.refuse_if_deleted()
        if checkpoint["id"] in self.checkpoint_ids:  # a resend, whatever the status since
            return False
        require(self, "CheckpointRecorded")
        self._checkpoint_recorded(checkpoint=clean_checkpoint(checkpoint), by=by)
        return True

    def record_outputs(self, node_index: int, size: int, sha256: str, by: Actor) -> bool:
        """Record one node's output archive (another one of the node replaces it); False for
        a resend, whatever the status since."""
        self.refuse_if_deleted()
        check_output(self.nnodes, node_index, size, sha256)
        if self.recorded_output(node_index) == sha256:
            return False
        require(self, "OutputsRecorded")
        self._outputs_recorded(node_index=node_index, size=size, sha256=sha256, by=by)
        return True

    # -- debug sessions (`flexai training debug-ssh`): recorded, never a status change ------

    def open_debug_session(
        self, session_id: str, node_index: int, key_fingerprint: str, by: Actor,
        relay: str | None = None,
    ) -> None:  # fmt: skip
        """A user opens an SSH session into the running job on its node ``node_index``,
        its bytes relayed by the server process whose instance id is ``relay``."""
        require(self, "DebugSessionOpened")
        check_debug_session(session_id, key_fingerprint, relay)
        if session_id in self.open_debug_sessions:
            raise DomainError(f"debug session {session_id} of job '{self.name}' is open already")
        node = self._placement(node_index)["node_name"]
        self._debug_session_opened(session_id=session_id, node=node, node_index=node_index,
                                   key_fingerprint=key_fingerprint, by=by, relay=relay)  # fmt: skip

    def close_debug_session(self, session_id: str, reason: str, seconds: float, by: Actor) -> bool:
        """The session ended (``seconds`` after it opened); False when it is closed already."""
        if session_id not in self.open_debug_sessions:
            return False
        checked(values.check_message, reason, "reason")
        seconds = round(max(0.0, float(seconds)), 3)
        self._debug_session_closed(session_id=session_id, reason=reason, seconds=seconds, by=by)
        return True

    def purge_artifacts(self, objects: int, by: Actor) -> bool:
        """The deleted job's artifacts left the store (``objects`` of them); False once said."""
        if getattr(self, "artifacts_purged", False):  # jobs folded before purges lack it
            return False
        require(self, "ArtifactsPurged")
        checked(values.check_int, objects, "objects", 0, values.BIGINT_MAX)
        self._artifacts_purged(objects=objects, by=by)
        return True

    # -- events' bodies (TrainingJob records them as events): they only mutate -------------

    def _logs_unavailable(self, message: str, offset: int, written: int, by: Actor) -> None:
        self.logs_unavailable_at.add(offset)

    def _checkpoint_recorded(self, checkpoint: dict[str, Any], by: Actor) -> None:
        self.checkpoint_ids.add(checkpoint["id"])

    def _outputs_recorded(self, node_index: int, size: int, sha256: str, by: Actor) -> None:
        self.output_hashes = {**getattr(self, "output_hashes", {}), str(node_index): sha256}

    # ``relay``: the events stored before it existed have none, and load with None.
    def _debug_session_opened(self, session_id: str, node: str, node_index: int,
                              key_fingerprint: str, by: Actor,
                              relay: str | None = None) -> None:  # fmt: skip
        self.debug_sessions = {*getattr(self, "debug_sessions", ()), session_id}

    def _debug_session_closed(self, session_id: str, reason: str, seconds: float,
                              by: Actor) -> None:  # fmt: skip
        self.debug_sessions = set(getattr(self, "debug_sessions", ())) - {session_id}

    def _artifacts_purged(self, objects: int, by: Actor) -> None:
        self.artifacts_purged = True
