"""What one job on this node sends the control plane, for the job's whole life: its log (from
the build's first line), its checkpoints and outputs, and, last, the report of how it ended.

The contract of ``docs/design.md``: every log line is shipped, the remaining checkpoints and the
output directory are uploaded, and only then is the terminal report (``exited``, ``failed``,
``stopped``, ``stop_failed``) sent, so a terminal status means the logs are complete and the
artifacts recorded. Checkpoints and outputs wait for the store for as long as it takes (never
dropped); an agent that shuts down meanwhile reports nothing, and uploads and reports once
restarted. One exception: when the control plane cannot store logs, the end waits for them
``log_drain_timeout`` seconds at most, then is reported anyway (the job must not sit
``in progress`` after its process ended); the job has been told ``logs_unavailable`` by then,
and its whole log stays in ``job.log`` on the node.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from node_agent.artifacts.checkpoints import CheckpointWatcher
from node_agent.artifacts.uploader import Artifact, ArtifactUploader
from node_agent.client import ApiError, ApiUnavailable, ControlPlaneClient
from node_agent.jobdirs import JobDirs
from node_agent.logs.shipper import LogShipper
from node_agent.models import STOP_IN_PROGRESS
from node_agent.reports import TRY_ONCE, Answer, JobReporter
from node_agent.run.watch import Ended, stop_outcome, time_limit_message

log = logging.getLogger("flexai.agent")

LOST_WHILE_AWAY = (
    "the node agent restarted and found no process of the job and no exit code: it ended "
    "while the agent was down"
)
NEVER_LAUNCHED = (
    "the node agent went down before it started the entry point, and no process of the job "
    "ran"
)


def ended_at(exit_code_file: Path) -> str | None:
    """When the shim wrote the entry point's exit code (ISO 8601, UTC): when it ended. None
    without such a plain file (the job owns the directory: a link is not followed)."""
    try:
        found = os.lstat(exit_code_file)
    except OSError:
        return None
    if not stat.S_ISREG(found.st_mode):
        return None
    return datetime.fromtimestamp(found.st_mtime, UTC).isoformat(timespec="microseconds")


class JobShipping:
    """One job's log shipper and artifact uploader, held from its build to its end, and its last
    word to the control plane once they are done; ``quiet``: the agent is going away (or the job
    is no longer this node's), so nothing more is reported."""

    def __init__(
        self,
        client: ControlPlaneClient,
        dirs: JobDirs,
        reporter: JobReporter,
        *,
        quiet: threading.Event,
        flush_interval: float,
        drain_timeout: float,
        unavailable_after: float,
    ) -> None:
        self.client = client
        self.uploader = ArtifactUploader(client, give_up=quiet)
        """Uploads the job's checkpoints and outputs (shared with its checkpoint watcher)."""
        self.dirs = dirs
        self.reporter = reporter
        self.job_id = reporter.job_id
        self.quiet = quiet
        self.flush_interval = flush_interval
        self.drain_timeout = drain_timeout
        """Seconds to wait for the logs to be shipped once the job is over, before reporting."""
        self.unavailable_after = unavailable_after
        """Seconds of failed log shipping before the job is told ``logs_unavailable``."""
        self.logs: LogShipper | None = None

    def open_logs(self, resume: bool, secret_values: Sequence[str] = ()) -> None:
        """Ship the job's log: a new one, or (``resume``) the one a job that ran on while the
        agent restarted appends to; ``secret_values`` are masked out of it."""
        self.logs = LogShipper(
            self.client,
            self.job_id,
            self.dirs.log_file,
            flush_interval=self.flush_interval,
            unavailable_after=self.unavailable_after,
            on_unavailable=self._report_logs_unavailable,
            node_index=self.reporter.node_index,
            resume=resume,
            secret_values=secret_values,
            attempt=self.dirs.attempt,
        )

    def say(self, line: str) -> None:
        if self.logs is not None:
            self.logs.write_line(line)

    # -- the reports ---------------------------------------------------------------------

    def report(
        self, outcome: Ended, checkpoints: CheckpointWatcher, time_limit_s: int | None,
        out_of_memory: str | None = None,
    ) -> Answer | None:  # fmt: skip
        """Ship the last checkpoints, the logs and the outputs, then report how it ended; the
        control plane's answer (None when the agent shuts down first). ``out_of_memory``: what
        to say of an entry point that failed after the OOM killer ended a process of the job's
        (``out_of_memory``, not its exit code alone)."""
        known = outcome.exit_code is not None  # else no process told when it ended
        self.reporter.ended_at = ended_at(self.dirs.exit_code_file) if known else None
        failed = known and outcome.exit_code != 0 and not (outcome.stopped or outcome.timed_out)
        out_of_memory = out_of_memory if failed else None
        if outcome.stopped:
            self.say(f"[agent] {stop_outcome(outcome.survivors)}")
        if out_of_memory:
            self.say(f"[agent] {out_of_memory}")
        checkpoints.finish()  # before the log closes: it may say a checkpoint was sent again
        self.ship_logs()
        if not self._upload_outputs():
            return None  # the agent shuts down: once restarted, it uploads and reports
        if outcome.stopped:
            return self._report_stop(outcome)
        if outcome.timed_out:
            message = time_limit_message(time_limit_s or 0)
            answer = self.reporter.failed("time_limit_exceeded", message, outcome.exit_code)
            self.stopped_if_refused(answer, outcome.exit_code)
        elif outcome.exit_code is None:
            answer = self.reporter.failed("node_lost", outcome.lost or LOST_WHILE_AWAY)
            self.stopped_if_refused(answer)
        elif out_of_memory:
            answer = self.reporter.failed("out_of_memory", out_of_memory, outcome.exit_code)
            self.stopped_if_refused(answer, outcome.exit_code)
        else:
            log.info("job %s: exited with code %d", self.job_id, outcome.exit_code)
            answer = self.reporter.exited(outcome.exit_code)
            self.stopped_if_refused(answer, outcome.exit_code)
        return answer

    def stopped_before_running(self) -> None:
        """Stopped before the entry point ran: there is no exit code."""
        if self.quiet.is_set():
            return
        self.say("[agent] stopped")
        self.ship_logs()
        self.reporter.stopped()

    def failed(self, code: str, message: str, started: bool) -> None:
        """The job cannot go on here (``build_failed`` until it ``started``, then ``failed``),
        said in its log first."""
        if self.quiet.is_set():
            return
        self.say(f"[agent] {message}")
        self.ship_logs()
        if started:
            self.stopped_if_refused(self.reporter.failed(code, message))
        else:
            self.stopped_if_refused(self.reporter.build_failed(code, message, None))

    def stopped_if_refused(self, answer: Answer, exit_code: int | None = None) -> None:
        """A report refused because the user stopped the job meanwhile becomes ``stopped``
        (with the exit code of an entry point that ended by itself as the stop came)."""
        if not answer.accepted and answer.status == STOP_IN_PROGRESS:
            self.reporter.stopped(exit_code)

    def _report_stop(self, outcome: Ended) -> Answer:
        if not outcome.survivors:
            return self.reporter.stopped(outcome.exit_code)
        log.error("job %s: %s", self.job_id, stop_outcome(outcome.survivors))
        return self.reporter.stop_failed(stop_outcome(outcome.survivors))

    # -- what the job leaves -------------------------------------------------------------

    def ship_logs(self) -> None:
        """Wait for the logs (at most ``drain_timeout`` s), then stop shipping them."""
        logs, drain = self.logs, self.drain_timeout
        if logs is None or logs.close(timeout=drain):
            return
        missing = logs.written - logs.acknowledged
        log.error(
            "job %s: %d bytes of its log were not shipped; the full log stays in %s",
            self.job_id,
            missing,
            self.dirs.log_file,
        )
        if logs.reported_unavailable_at == logs.acknowledged:
            return  # already said in the ledger
        self._report_logs_unavailable(  # said in the ledger before the end is reported
            f"the last {missing} bytes of the log could not be shipped within {drain:g} s; "
            f"the full log stays on this node in {self.dirs.log_file}",
            logs.acknowledged,
            logs.written,
        )

    def _report_logs_unavailable(self, message: str, offset: int, written: int) -> bool:
        if self.quiet.is_set():
            return True
        log.warning("job %s: %s", self.job_id, message)
        reporter = JobReporter(self.client, self.reporter.node_id, self.job_id,
                               give_up=TRY_ONCE, retry_for=2.0,
                               node_index=self.reporter.node_index)  # fmt: skip
        answer = reporter.logs_unavailable(message, offset, written)
        return not answer.unreachable

    def _upload_outputs(self) -> bool:
        """Upload the output directory, waiting for the store as long as it takes; False
        when the agent shuts down first (nothing more is reported then)."""
        if self.client.closing:
            return False
        if _is_empty(self.dirs.output):
            return True  # nothing to send: the control plane serves an ended job's as an empty zip
        artifact = Artifact(self.job_id, "output", None, self.reporter.node_id,
                            self.reporter.node_index, self.dirs.output, trusted=self.dirs.root,
                            attempt=self.dirs.attempt)  # fmt: skip
        try:
            self.uploader.upload(artifact)
        except ApiUnavailable as error:
            log.warning("job %s: %s not uploaded yet: %s", self.job_id, artifact.label, error)
            return False
        except (ApiError, OSError) as error:
            log.error("job %s: the output directory was not uploaded: %s", self.job_id, error)
        return True


def _is_empty(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return next(entries, None) is None
    except FileNotFoundError:  # the job's directory is gone (an agent that restarted)
        return True
    except OSError:
        return False
