"""One job's life on this node: build, wait for accelerators, run, stop, and the final reports.

The end of a job follows the contract of ``docs/design.md``: every log line is shipped, the
remaining checkpoints and the output directory are uploaded, and only then is the terminal
report (``exited``, ``stopped``, ``stop_failed``) sent, so a terminal status means the logs are
complete. One exception: when the control plane cannot store logs, the supervisor waits for
them ``log_drain_timeout`` seconds at most, then reports anyway (the job must not sit
``in progress`` after its process ended); the job has been told ``logs_unavailable`` by then,
and its whole log stays in ``job.log`` on the node.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from node_agent.accelerators import AcceleratorPool
from node_agent.build import (
    BuildCaches,
    BuildCancelled,
    BuildFailed,
    BuiltJob,
    CheckpointMissing,
    JobBuild,
)
from node_agent.checkpoints import CheckpointWatcher, zip_tree
from node_agent.client import ApiError, ApiUnavailable, ControlPlaneClient
from node_agent.datasets import DatasetCache
from node_agent.jobuser import JobUser
from node_agent.launch import job_environment
from node_agent.logship import LogShipper
from node_agent.models import STOP_IN_PROGRESS, Assignment, JobDirs
from node_agent.processes import GroupProcess, exit_code
from node_agent.reports import TRY_ONCE, Answer, JobReporter

log = logging.getLogger("flexai.agent")

ABORT_GRACE = 3.0


@dataclass(frozen=True)
class SupervisorSettings:
    work_dir: Path
    datasets_dir: Path | None = None
    stop_grace: float = 10.0
    """Seconds between SIGTERM and SIGKILL when a job is stopped."""
    node_index: int = 0
    keep_job_dirs: bool = False
    log_flush_interval: float = 0.2
    log_drain_timeout: float = 60.0
    """Seconds to wait for the logs to be shipped once the job is over, before reporting."""
    logs_unavailable_after: float = 10.0
    """Seconds of failed log shipping before the job is told ``logs_unavailable``."""
    checkpoint_stable_for: float = 1.0
    job_user: JobUser | None = None
    """Who runs the job's own code (venv, pip, the entry point); None: the agent itself."""
    job_python: str = sys.executable
    """The interpreter jobs' virtual environments are made from."""


@dataclass(frozen=True)
class Ended:
    """How the entry point's processes ended."""

    exit_code: int | None
    """The entry point's (``128 + N`` when killed by signal N); None when not known."""
    survivors: list[int]
    """The pids of the job still alive after SIGKILL."""
    stopped: bool = False
    """Ended by the user's stop rather than by itself."""


class JobSupervisor:
    """Runs one assignment in a thread of its own; :meth:`stop` is the user's stop."""

    def __init__(
        self,
        assignment: Assignment,
        *,
        client: ControlPlaneClient,
        node_id: str,
        pool: AcceleratorPool,
        settings: SupervisorSettings,
    ) -> None:
        self.assignment = assignment
        self.job_id = assignment.job_id
        self.client = client
        self.node_id = node_id
        self.pool = pool
        self.settings = settings
        self.dirs = JobDirs.for_job(settings.work_dir, assignment.job_id)
        self._stopping = threading.Event()  # the user's stop, or the agent's shutdown
        self._aborting = threading.Event()  # the agent's shutdown: no more reports
        self.reporter = JobReporter(client, node_id, self.job_id, give_up=self._aborting)
        self._thread = threading.Thread(target=self._run, name=f"job-{self.job_id}", daemon=True)
        self._logs: LogShipper | None = None
        self._keep_dirs = settings.keep_job_dirs

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """The user asked to stop: end the processes, then report ``stopped``."""
        if not self._stopping.is_set():
            log.info("job %s: stopping", self.job_id)
        self._stopping.set()

    def abort(self, shutting_down: bool = True) -> None:
        """End the processes quickly and report nothing: the agent is shutting down (its
        work directory is kept for a quick exit), or the job is no longer this node's."""
        self._keep_dirs = self._keep_dirs or shutting_down
        self._aborting.set()
        self._stopping.set()
        if self._logs is not None:
            self._logs.abandon()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # -- the life of the job -----------------------------------------------------------

    def _run(self) -> None:
        started = False
        try:
            self.dirs.create_fresh()
            self._logs = LogShipper(
                self.client,
                self.job_id,
                self.dirs.log_file,
                flush_interval=self.settings.log_flush_interval,
                unavailable_after=self.settings.logs_unavailable_after,
                on_unavailable=self._report_logs_unavailable,
            )
            built = self._build()
            accelerators = self._allocate(built) if built else None
            if built and accelerators is not None:
                started = True
                self._run_entry_point(built, accelerators)
        except Exception as error:  # one job's failure must never take the agent down
            log.exception("job %s: the agent failed", self.job_id)
            self._report_crash(error, started)
        finally:
            self.pool.release(self.job_id)
            if self._logs is not None:
                self._logs.close(timeout=0 if self._aborting.is_set() else 30)
            if not self._keep_dirs:
                self.dirs.remove_all_but_log()

    def _build(self) -> BuiltJob | None:
        name, spec = self.assignment.name, self.assignment.spec
        log.info("job %s (%s): building from %s", self.job_id, name, spec.repository_url)
        build = JobBuild(
            spec,
            self.dirs,
            log=lambda line: self._say(f"[build] {line}"),
            cancel=self._stopping,
            datasets_dir=self.settings.datasets_dir,
            dataset_cache=DatasetCache.for_job(self.client, self.job_id, self.settings.work_dir),
            input_checkpoint_id=self.assignment.input_checkpoint_id,
            fetch_checkpoint=self._fetch_checkpoint,
            as_user=self.settings.job_user,
            python=self.settings.job_python,
            caches=BuildCaches.in_work_dir(self.settings.work_dir),
        )
        try:
            if self._stopping.is_set():
                raise BuildCancelled()
            return build.run()
        except BuildCancelled:
            self._finish_stopped()
        except BuildFailed as failure:
            log.info("job %s: build failed (%s): %s", self.job_id, failure.code, failure.message)
            self._say(f"[build] failed: {failure.message}")
            self._ship_logs()
            answer = self.reporter.build_failed(failure.code, failure.message, failure.commit)
            self._stopped_if_refused(answer)
        return None

    def _allocate(self, built: BuiltJob) -> list[int] | None:
        wanted = self.assignment.spec.accels
        if wanted > self.pool.count:
            message = f"the job asks for {wanted} accelerators; this node has {self.pool.count}"
            self._say(f"[agent] {message}")
            self._ship_logs()
            self._stopped_if_refused(
                self.reporter.build_failed("no_node_meets_request", message, built.commit)
            )
            return None

        def report_enqueued() -> None:
            log.info("job %s: waiting for %d accelerators", self.job_id, wanted)
            self._say(f"[agent] waiting for {wanted} accelerators to be free")
            if self.reporter.enqueued(built.commit).status == STOP_IN_PROGRESS:
                self._stopping.set()

        taken = self.pool.acquire(
            self.job_id, wanted, cancel=self._stopping, on_wait=report_enqueued
        )
        if taken is None:
            self._finish_stopped()
            return None
        answer = self.reporter.started(built.commit, taken)
        if answer.accepted:
            return taken
        self.pool.release(self.job_id)
        if answer.status == STOP_IN_PROGRESS or self._stopping.is_set():
            self._finish_stopped()
        else:
            log.warning("job %s: not started, the job is %s", self.job_id, answer.status)
        return None

    def _run_entry_point(self, built: BuiltJob, accelerators: list[int]) -> None:
        indices = ",".join(map(str, accelerators)) or "none"
        log.info("job %s: started on accelerators %s", self.job_id, indices)
        self._say(f"[agent] running {shlex.join(built.argv)} on accelerators {indices}")
        env = job_environment(self.dirs, self.assignment.spec.env, accelerators)
        watcher = CheckpointWatcher(
            self.client,
            self.job_id,
            self.node_id,
            self.dirs.output_checkpoint,
            self.dirs.scratch,
            stable_for=self.settings.checkpoint_stable_for,
        )
        watcher.start()
        try:
            ended = self._run_process(built.argv, env)
        finally:
            watcher.stop_watching()
        self.pool.release(self.job_id)
        if self._aborting.is_set():
            return
        if ended.stopped:
            self._say(f"[agent] {_stop_outcome(ended.survivors)}")
        self._ship_logs()
        watcher.finish()
        self._upload_outputs()
        if ended.stopped:
            self._report_stop(ended)
            return
        assert ended.exit_code is not None
        log.info("job %s: exited with code %d", self.job_id, ended.exit_code)
        self._stopped_if_refused(self.reporter.exited(ended.exit_code), ended.exit_code)

    def _run_process(self, argv: tuple[str, ...], env: dict[str, str]) -> Ended:
        """Run the entry point until it ends by itself or is stopped."""
        assert self._logs is not None
        try:
            process = GroupProcess(
                argv,
                cwd=self.dirs.repo,
                env=env,
                on_output=self._logs.write,
                as_user=self.settings.job_user,
            )
        except OSError as error:
            self._say(f"[agent] cannot start the entry point: {error}")
            return Ended(None, [], stopped=True) if self._stopping.is_set() else Ended(126, [])
        try:
            while (returncode := process.wait(0.2)) is None and not self._stopping.is_set():
                pass
        except BaseException:
            process.end(ABORT_GRACE)  # whatever went wrong here, no process outlives the job
            raise
        stopped = returncode is None
        if stopped:
            grace = ABORT_GRACE if self._aborting.is_set() else self.settings.stop_grace
            self._say(
                f"[agent] stopping: SIGTERM to the job's processes, SIGKILL after {grace:g} s"
            )
            survivors = process.end(grace)
        else:  # processes the entry point left behind go with it
            survivors = process.end(self.settings.stop_grace)
        process.finish_output()
        # A stopped entry point may have ended by itself just before the signal: its code,
        # whatever ended it, goes with the ``stopped`` report.
        returncode = process.wait(0) if returncode is None else returncode
        if returncode is None:  # the leader survived SIGKILL (stuck in the kernel)
            return Ended(None, survivors, stopped)
        code = exit_code(returncode)
        if returncode < 0:
            name = signal.Signals(-returncode).name
            self._say(f"[agent] the entry point was killed by {name} (exit code {code})")
        else:
            self._say(f"[agent] the entry point exited with code {code}")
        return Ended(code, survivors, stopped)

    # -- the end -------------------------------------------------------------------------

    def _finish_stopped(self) -> None:
        """Stopped before the entry point ran: there is no exit code."""
        if self._aborting.is_set():
            return
        self._say("[agent] stopped")
        self._ship_logs()
        self.reporter.stopped()

    def _report_stop(self, ended: Ended) -> None:
        if not ended.survivors:
            self.reporter.stopped(ended.exit_code)
            return
        log.error("job %s: %s", self.job_id, _stop_outcome(ended.survivors))
        self.reporter.stop_failed(_stop_outcome(ended.survivors))

    def _stopped_if_refused(self, answer: Answer, exit_code: int | None = None) -> None:
        """A report refused because the user stopped the job meanwhile becomes ``stopped``
        (with the exit code of an entry point that ended by itself as the stop came)."""
        if not answer.accepted and answer.status == STOP_IN_PROGRESS:
            self.reporter.stopped(exit_code)

    def _report_crash(self, error: Exception, started: bool) -> None:
        if self._aborting.is_set():
            return
        message = f"the node agent failed while running the job: {error}"
        self._say(f"[agent] {message}")
        self._ship_logs()
        if started:
            self._stopped_if_refused(self.reporter.failed("node_lost", message))
        else:
            self._stopped_if_refused(self.reporter.build_failed("node_lost", message, None))

    # -- helpers -------------------------------------------------------------------------

    def _say(self, line: str) -> None:
        if self._logs is not None:
            self._logs.write_line(line)

    def _ship_logs(self) -> None:
        """Wait for the logs (at most ``log_drain_timeout`` s), then stop shipping them."""
        logs = self._logs
        if logs is not None and not logs.close(timeout=self.settings.log_drain_timeout):
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
                f"the last {missing} bytes of the log could not be shipped within "
                f"{self.settings.log_drain_timeout:g} s; the full log stays on this node in "
                f"{self.dirs.log_file}",
                logs.acknowledged,
                logs.written,
            )

    def _report_logs_unavailable(self, message: str, offset: int, written: int) -> bool:
        if self._aborting.is_set():
            return True
        log.warning("job %s: %s", self.job_id, message)
        reporter = JobReporter(
            self.client, self.node_id, self.job_id, give_up=TRY_ONCE, retry_for=2.0
        )
        answer = reporter.logs_unavailable(message, offset, written)
        return not answer.unreachable

    def _upload_outputs(self) -> None:
        if _is_empty(self.dirs.output):
            return  # nothing to send: the control plane serves an ended job's as an empty zip
        archive = self.dirs.scratch / "output.zip"
        try:
            zip_tree(self.dirs.output, archive, trusted=self.dirs.root)
            # Bounded like the logs: the job's end must be reported even if storage is down.
            self.client.upload_outputs(self.job_id, self.settings.node_index, archive,
                                       retry_for=self.settings.log_drain_timeout)  # fmt: skip
        except (ApiError, ApiUnavailable, OSError) as error:
            log.error("job %s: the output directory was not uploaded: %s", self.job_id, error)
        finally:
            archive.unlink(missing_ok=True)

    def _fetch_checkpoint(self, checkpoint_id: str, destination: Path) -> None:
        try:
            self.client.download_checkpoint(checkpoint_id, destination)
        except ApiError as error:
            raise CheckpointMissing(str(error)) from None


def _is_empty(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _stop_outcome(survivors: list[int]) -> str:
    if not survivors:
        return "stopped"
    return (
        f"processes {', '.join(map(str, survivors))} of the job are still alive after SIGKILL "
        "(stuck in the kernel, e.g. on a hung GPU or file system); the node's operator must "
        "end them"
    )
