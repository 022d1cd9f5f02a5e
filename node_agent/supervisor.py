"""One job's life on this node: build, wait for the control plane's go, run, stop, report.

After the build the node reports ``built``; the control plane starts the job once every node of
it has built and their accelerators are free, either in its answer or, later, in an assignment
that lists the job ``in progress`` with this node's accelerators (:meth:`JobSupervisor.update`).
The entry point runs through the shim (``node_agent/run/shim.py``), so a supervisor of an agent
that restarted finds the job again (``adopting``), follows it to its end, or
says how it ended while the agent was down.

Then :class:`node_agent.shipping.JobShipping` ships what the job leaves and reports its end. A job
the control plane preempts (``preempt`` in its assignment) is stopped as by the user and reported
``stopped``; back ``enqueued``, it keeps its build here and waits for the go of its next attempt,
which runs from the checkpoint that attempt names (:mod:`node_agent.build.attempts`).
"""

from __future__ import annotations

import logging
import shlex
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from node_agent.accelerators import AcceleratorPool
from node_agent.artifacts.checkpoints import CheckpointWatcher
from node_agent.build.attempts import PREEMPTED, asked_to_make_way, prepare_attempt, runs_again
from node_agent.build.builder import (
    BuildCaches,
    BuildCancelled,
    BuildFailed,
    BuiltJob,
    CheckpointMissing,
    JobBuild,
)
from node_agent.build.datasets import DatasetCache
from node_agent.build.secrets import JobSecrets, fetch_secrets
from node_agent.build.unpack import ArchiveRefused
from node_agent.client import ApiError, ArtifactAltered, ControlPlaneClient
from node_agent.jobdirs import JobDirs
from node_agent.models import (
    BUILDING,
    ENQUEUED,
    IN_PROGRESS,
    STOP_IN_PROGRESS,
    Assignment,
    Rendezvous,
)
from node_agent.network import LOOPBACK, free_port
from node_agent.reports import Answer, JobReporter
from node_agent.run.jobrun import JobRun, recorded_exit
from node_agent.run.jobuser import JobUser
from node_agent.run.launch import Placement, job_environment
from node_agent.run.processes import end_processes, job_processes
from node_agent.run.watch import Ended, ended, watch
from node_agent.sandbox.jobs import Confinement, JobSandboxes
from node_agent.shipping import LOST_WHILE_AWAY, NEVER_LAUNCHED, JobShipping

log = logging.getLogger("flexai.agent")

ABORT_GRACE = 3.0
ABORT_SHIPPING_S = 5.0
"""How long a job ended by the agent (its shutdown, or a job no longer this node's) still ships
the last lines of its log, with the agent's line saying why it ended."""
SHUTTING_DOWN = ("[agent] the node agent is stopping: it ended the job's processes on this "
                 "node")  # fmt: skip
WITHDRAWN = ("[agent] the job no longer runs on this node (it ended or was stopped elsewhere: "
             "`flexai training inspect` says why): its processes here were ended")  # fmt: skip
CLAIM_PATIENCE = 60.0
"""How long a job waits for an accelerator still held by a job this agent is ending."""
_ON_ITS_WAY = (None, BUILDING, ENQUEUED, IN_PROGRESS, STOP_IN_PROGRESS)
"""What the job may be after ``built``; anything else (another node failed it) ends it here."""


@dataclass(frozen=True)
class SupervisorSettings:
    work_dir: Path
    datasets_dir: Path | None = None
    stop_grace: float = 10.0
    """Seconds between SIGTERM and SIGKILL when a job is stopped (unless its spec says)."""
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
    job_site_packages: bool = False
    """Jobs' environments also see ``job_python``'s own packages (``--job-site-packages``)."""
    sandboxes: JobSandboxes | None = None
    """How this node sandboxes each job (:mod:`node_agent.sandbox`); None: it does not."""


@dataclass(frozen=True)
class Start:
    """The control plane's go: this node's accelerators, and a multi-node job's rendezvous."""

    accelerators: tuple[int, ...]
    rendezvous: Rendezvous | None


class JobSupervisor:
    """Runs one assignment in a thread of its own; :meth:`stop` is the user's stop.

    ``adopting``: the job is ``in progress`` (or ``stop in progress``) already and no build is
    to be done: an agent that restarted follows what it left running, if anything.
    """

    def __init__(
        self,
        assignment: Assignment,
        *,
        client: ControlPlaneClient,
        node_id: str,
        pool: AcceleratorPool,
        settings: SupervisorSettings,
        address: str = LOOPBACK,
        adopting: bool = False,
    ) -> None:
        self.assignment = assignment
        self.job_id = assignment.job_id
        self.client = client
        self.node_id = node_id
        self.pool = pool
        self.settings = settings
        self.address = address
        """How the job's other nodes reach this one."""
        self.adopting = adopting
        self.attempt = assignment.attempt
        """The job's attempt this supervisor runs (or ran last)."""
        self.dirs = JobDirs.for_job(settings.work_dir, assignment.job_id, assignment.node_index,
                                    assignment.attempt)  # fmt: skip
        self._changed = threading.Condition()  # a new assignment, or a stop
        self._stopping = threading.Event()  # the user's stop, or the agent's shutdown
        self._preempted = threading.Event()  # this attempt makes way for a higher-priority job
        self._halt = threading.Event()  # either of the two above: the entry point must end
        self._aborting = threading.Event()  # the agent's shutdown: no more reports
        self._aborted_because = SHUTTING_DOWN
        self.reporter = JobReporter(
            client, node_id, self.job_id, give_up=self._aborting, node_index=assignment.node_index
        )
        self._thread = threading.Thread(target=self._run, name=f"job-{self.job_id}", daemon=True)
        self.shipping = JobShipping(
            client,
            self.dirs,
            self.reporter,
            quiet=self._aborting,
            flush_interval=settings.log_flush_interval,
            drain_timeout=settings.log_drain_timeout,
            unavailable_after=settings.logs_unavailable_after,
        )
        self._say = self.shipping.say
        self._keep_dirs = settings.keep_job_dirs
        self._master_port: int | None = None  # node 0 of a multi-node job: the port it chose
        self._started = False
        self._taken_at = time.monotonic()  # after the job was submitted
        self._survivors: list[int] = []
        self.job_env: dict[str, str] | None = None
        """The entry point's environment, once this agent launched it (`debug-ssh`)."""
        self.confinement = Confinement(settings.sandboxes, settings.job_user)
        """The job's user, sandbox and cgroup here, once its folders are made."""
        if assignment.status == STOP_IN_PROGRESS:
            self._stopping.set()
            self._halt.set()
        elif adopting and asked_to_make_way(assignment, self.attempt):  # said once logs open
            self._preempted.set()
            self._halt.set()

    def start(self) -> None:
        self._thread.start()

    def update(self, assignment: Assignment) -> None:
        """The control plane's latest word on the job (each poll of the agent brings it)."""
        with self._changed:
            self.assignment = assignment
            self._changed.notify_all()
        if assignment.status == STOP_IN_PROGRESS:
            self.stop()
        elif asked_to_make_way(assignment, self.attempt) and not self._preempted.is_set():
            log.info("job %s: preempted", self.job_id)
            self._say(PREEMPTED)
            self._preempted.set()
            self._halt.set()

    def stop(self) -> None:
        """The user asked to stop: end the processes, then report ``stopped``."""
        if not self._stopping.is_set():
            log.info("job %s: stopping", self.job_id)
        self._stopping.set()
        self._halt.set()
        with self._changed:
            self._changed.notify_all()

    def abort(self, shutting_down: bool = True) -> None:
        """End the processes quickly and report nothing: the agent is shutting down (its
        work directory is kept for a quick exit), or the job is no longer this node's."""
        self._keep_dirs = self._keep_dirs or shutting_down
        self._aborted_because = SHUTTING_DOWN if shutting_down else WITHDRAWN
        self._aborting.set()
        self.stop()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # -- the life of the job -----------------------------------------------------------

    def _run(self) -> None:
        try:
            if self.adopting:
                self._follow_again()
            else:
                self._build_and_run()
        except Exception as error:  # one job's failure must never take the agent down
            log.exception("job %s: the agent failed", self.job_id)
            message = f"the node agent failed while running the job: {error}"
            self.shipping.failed("node_lost", message, started=self._started)
        finally:
            self.pool.release(self.job_id, self._survivors)
            if self.shipping.logs is not None:
                aborting = self._aborting.is_set()
                self.shipping.logs.close(timeout=ABORT_SHIPPING_S if aborting else 30)
            self.confinement.close(self.dirs, kept=self._keep_dirs)
            if not self._keep_dirs:
                self.dirs.remove_all_but_log()

    def _build_and_run(self) -> None:
        self._end_earlier_processes()
        self.dirs.create_fresh()
        self._confine()
        secrets = fetch_secrets(self.client, self.assignment)  # before a byte of log ships
        self._open_build_log(secrets)
        built = self._build(secrets)
        start = self._report_built(built) if built else None
        if built and start and self._claim(start.accelerators):
            self._started = True
            self._run_attempts(self._run_entry_point(built.argv, start, secrets))

    def _confine(self) -> None:
        """The job's user, sandbox and cgroup (its id taken, or found again after a restart)."""
        self.confinement = Confinement.of(self.settings.sandboxes, self.dirs,
                                          self.settings.job_user, self.assignment.name,
                                          self.assignment.spec.accels)  # fmt: skip

    def _open_build_log(self, secrets: JobSecrets) -> None:
        """A new log; or, built again after the agent restarted, the log the control plane
        holds the start of: appended to, so every byte it holds stays the node's."""
        if self.dirs.log_file.exists():
            try:
                self.shipping.open_logs(resume=True, secret_values=secrets.masked)
            except OSError as error:
                log.error("job %s: its log is started anew: %s", self.job_id, error)
                self.dirs.log_file.unlink(missing_ok=True)  # not truncated: it may be a link
            else:
                self._say("[agent] the node agent restarted before the job started; "
                          "building it again")  # fmt: skip
                return
        self.shipping.open_logs(resume=False, secret_values=secrets.masked)

    def _follow_again(self) -> None:
        """After the agent restarted: follow the job's processes, or say how they ended."""
        self._confine()
        try:
            self._open_logs_again()
        except OSError as error:
            log.error("job %s: its log cannot be shipped any more: %s", self.job_id, error)
        # The entry point's end is its exit code, whatever it left running (a setsid child).
        run = None if recorded_exit(self.dirs) is not None else JobRun.find(self.dirs)
        if run is None:
            self._finish(self._ended_while_away(), None)
            return
        log.info("job %s (%s): found running, followed again", self.job_id, self.assignment.name)
        self._say("[agent] the node agent restarted and found the job running; it follows it")
        if self._preempted.is_set():
            self._say(PREEMPTED)
        self._started = True
        if holder := self.pool.claim(self.job_id, self.assignment.accelerators or ()):
            log.error("job %s: %s", self.job_id, holder)
        self._run_attempts(self._follow(run))

    def _open_logs_again(self) -> None:
        """Ship the log of a job found running; not at all if its secrets cannot be masked."""
        secrets = fetch_secrets(self.client, self.assignment)
        if secrets.failure is not None:
            log.error("job %s: its log is not shipped any more, as its secrets cannot be "
                      "masked: %s", self.job_id, secrets.failure.message)  # fmt: skip
            return
        self.shipping.open_logs(resume=True, secret_values=secrets.masked)

    def _end_earlier_processes(self) -> None:
        """Processes of an earlier build of this job, left by an agent that restarted."""
        if not self.dirs.root.exists():
            return  # no build of the job began on this node: nothing of it can run here
        if earlier := job_processes(self.dirs.marker):
            log.warning(
                "job %s: ending processes %s of an earlier build of it",
                self.job_id,
                ", ".join(map(str, earlier)),
            )
            end_processes(lambda: job_processes(self.dirs.marker), ABORT_GRACE)

    def _build(self, secrets: JobSecrets) -> BuiltJob | None:
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
            as_user=self.confinement.user,
            python=self.settings.job_python,
            site_packages=self.settings.job_site_packages,
            caches=BuildCaches.in_work_dir(self.settings.work_dir),
            asked=self._taken_at,
            secrets=secrets,
        )
        try:
            if self._stopping.is_set():
                raise BuildCancelled()
            return build.run()
        except BuildCancelled:
            self.shipping.stopped_before_running()
        except BuildFailed as failure:
            log.info("job %s: build failed (%s): %s", self.job_id, failure.code, failure.message)
            self._say(f"[build] failed: {failure.message}")
            self.shipping.ship_logs()
            answer = self.reporter.build_failed(failure.code, failure.message, failure.commit)
            self.shipping.stopped_if_refused(answer)
        return None

    # -- the control plane's go --------------------------------------------------------

    def _report_built(self, built: BuiltJob) -> Start | None:
        """Report ``built``; the go, at once or once an assignment gives it; None: stopped."""
        if self.assignment.nnodes > 1 and self.assignment.node_index == 0:
            self._master_port = free_port(self.address)
        answer = self.reporter.built(built.commit, self._master_port)
        if answer.status == STOP_IN_PROGRESS:
            self._stopping.set()
        if not answer.accepted or answer.status not in _ON_ITS_WAY:
            if self._stopping.is_set():
                self.shipping.stopped_before_running()
            elif not answer.unreachable:
                log.warning("job %s: not started, the job is %s", self.job_id, answer.status)
            return None
        with self._changed:
            start = self._start_from(answer.status, answer.accelerators, answer.rendezvous)
        return start or self._wait_for_start(answer.status)

    def _wait_for_start(self, status: str | None) -> Start | None:
        if status == BUILDING:
            waiting_for = "the job's other nodes to build"
        else:
            count = self.assignment.spec.accels
            waiting_for = f"{count} accelerator{'s' if count != 1 else ''} to be free"
        log.info("job %s: built, waiting for %s", self.job_id, waiting_for)
        self._say(f"[agent] built; waiting for {waiting_for}")
        with self._changed:
            while not self._stopping.is_set():
                latest = self.assignment
                start = self._start_from(latest.status, latest.accelerators, latest.rendezvous)
                if start is not None:
                    return start
                self._changed.wait(1.0)
        self.shipping.stopped_before_running()
        return None

    def _start_from(
        self,
        status: str | None,
        accelerators: tuple[int, ...] | None,
        rendezvous: Rendezvous | None,
    ) -> Start | None:
        """The go, if the control plane gave it (call with ``_changed`` held)."""
        if status != IN_PROGRESS or accelerators is None:
            return None
        if self.assignment.nnodes <= 1:
            return Start(accelerators, None)
        rendezvous = rendezvous or self.assignment.rendezvous
        if rendezvous is None and self._master_port is not None:  # node 0 knows its own
            rendezvous = Rendezvous(self.address, self._master_port)
        return Start(accelerators, rendezvous) if rendezvous is not None else None

    def _claim(self, accelerators: Sequence[int]) -> bool:
        """Hold the accelerators the control plane allocated, unless something here still
        holds one of them (processes that would not die): then the job fails, not started."""
        holder = self.pool.claim(
            self.job_id, accelerators, patience=CLAIM_PATIENCE, cancel=self._stopping
        )
        if holder is None:
            return True
        if self._stopping.is_set():
            self.shipping.stopped_before_running()
            return False
        message = f"{holder}; the job was not started on this node"
        log.error("job %s: %s", self.job_id, message)
        self.shipping.failed("node_lost", message, started=True)
        return False

    # -- the entry point, attempt after attempt ----------------------------------------

    def _run_attempts(self, answer: Answer | None) -> None:
        """After an attempt that ended with ``answer``: while it made way for another job,
        wait for the next attempt's go and run it."""
        while self._made_way(answer):
            go = self._next_go()
            prepared = self._prepare_attempt(go[1]) if go else None
            if go is None or prepared is None or not self._claim(go[0].accelerators):
                return
            argv, secrets = prepared
            answer = self._run_entry_point(argv, go[0], secrets)

    def _made_way(self, answer: Answer | None) -> bool:
        """Whether the attempt that just ended was preempted, and the job waits its turn
        (``enqueued``; still ``in progress`` while its other nodes stop)."""
        if not self._preempted.is_set() or self._stopping.is_set() or answer is None:
            return False
        if not answer.accepted or answer.status not in (ENQUEUED, IN_PROGRESS):
            log.info("job %s: preempted, and ends here: the job is %s", self.job_id,
                     answer.status or "?")  # fmt: skip
            return False
        return True

    def _next_go(self) -> tuple[Start, Assignment] | None:
        """Wait enqueued, the build kept, for the go of an attempt after the one that ran;
        None when the job ends meanwhile (the user's stop, a terminal status)."""
        ran = self.attempt
        for stale in (self.dirs.exit_code_file, self.dirs.shim_pid_file,
                      self.dirs.sandbox_pid_file):  # not the next's  # fmt: skip
            stale.unlink(missing_ok=True)
        log.info("job %s: preempted, waiting for its accelerators again", self.job_id)
        go: tuple[Start, Assignment] | None = None
        with self._changed:
            while go is None and not self._stopping.is_set():
                latest = self.assignment
                if latest.status not in _ON_ITS_WAY:
                    log.info("job %s: not run again, the job is %s", self.job_id, latest.status)
                    return None
                start = self._start_from(latest.status, latest.accelerators, latest.rendezvous)
                if start is not None and runs_again(latest, ran):
                    go = (start, latest)
                else:
                    self._changed.wait(1.0)
        if go is None:
            self.shipping.stopped_before_running()
            return None
        self.attempt = go[1].attempt
        self.dirs = self.dirs.for_attempt(self.attempt)
        self.shipping.dirs = self.dirs
        self._preempted.clear()
        if not self._stopping.is_set():
            self._halt.clear()
        return go

    def _prepare_attempt(self, go: Assignment) -> tuple[tuple[str, ...], JobSecrets] | None:
        """The new attempt's log, folders and input checkpoint; its command line and secrets,
        or None when it cannot run (said in its log, and reported)."""
        secrets = fetch_secrets(self.client, go)
        checkpoint = go.input_checkpoint_id
        try:
            self.dirs.create_attempt()
            self.shipping.open_logs(resume=False, secret_values=secrets.masked)
            self._say(f"[agent] attempt {self.attempt} of the job: running again from "
                      f"{f'checkpoint {checkpoint}' if checkpoint else 'its start'}")  # fmt: skip
            argv = prepare_attempt(self.dirs, go, secrets=secrets,
                                   fetch_checkpoint=self._fetch_checkpoint, log=self._say,
                                   cancel=self._stopping, as_user=self.confinement.user,
                                   python=self.settings.job_python)  # fmt: skip
            return argv, secrets
        except BuildFailed as failure:
            log.info("job %s: attempt %d cannot run: %s", self.job_id, self.attempt,
                     failure.message)  # fmt: skip
            self.shipping.failed(failure.code, failure.message, started=True)
        except OSError as error:
            self.shipping.failed("node_lost", f"the job's folders cannot be made: {error}",
                               started=True)  # fmt: skip
        return None

    def _run_entry_point(
        self, argv: tuple[str, ...], start: Start, secrets: JobSecrets
    ) -> Answer | None:
        """Launch and follow the entry point; the answer to the report of its end."""
        assignment, spec = self.assignment, self.assignment.spec
        rendezvous = start.rendezvous or Rendezvous(LOOPBACK, free_port())
        placement = Placement(assignment.node_index, assignment.nnodes, spec.accels,
                              rendezvous.master_addr, rendezvous.master_port)  # fmt: skip
        # --env and --secret never name the same variable; the platform's win over both.
        env = job_environment(self.dirs, {**spec.env, **secrets.values}, start.accelerators,
                              placement, restart_count=self.attempt - 1)  # fmt: skip
        env = self.confinement.entry_env(env, start.accelerators)
        self.job_env = env  # a debug session's commands get the very same (`debug-ssh`)
        indices = ",".join(map(str, start.accelerators)) or "none"
        log.info("job %s: started on accelerators %s", self.job_id, indices)
        self._say(f"[agent] running {shlex.join(argv)} on accelerators {indices}")
        try:
            run = JobRun.launch(
                argv,
                dirs=self.dirs,
                env=env,
                python=self.settings.job_python,
                as_user=self.confinement.entry_user(start.accelerators, self.dirs),
                work_dir=self.settings.work_dir,
            )
        except OSError as error:
            self._say(f"[agent] cannot start the entry point: {error}")
            stopped = self._halt.is_set()
            return self._finish(Ended(None if stopped else 126, [], stopped=stopped), None)
        return self._follow(run)

    def _follow(self, run: JobRun) -> Answer | None:
        watcher = self._checkpoint_watcher()
        watcher.start()
        try:
            outcome = watch(
                run,
                stopping=self._halt,
                grace=self._grace,
                time_limit_s=self.assignment.spec.time_limit_s,
                say=self._say,
            )
        except BaseException:
            run.end(ABORT_GRACE)  # whatever went wrong here, no process outlives the job
            raise
        finally:
            watcher.stop_watching()
        return self._finish(outcome, watcher)

    def _ended_while_away(self) -> Ended:
        """How the job ended while the agent was down, as its shim wrote it, if it did."""
        stopped = self._stopping.is_set()
        gone = JobRun(self.dirs, shim_pid=None, started=0.0)
        if gone.returncode() is None:
            # The shim writes its pid before it starts the entry point: without it, none ran.
            lost = LOST_WHILE_AWAY if self.dirs.shim_pid_file.exists() else NEVER_LAUNCHED
            log.warning("job %s: %s", self.job_id, lost)
            self._say(f"[agent] {lost}")
            return Ended(None, self._end_leftovers(), stopped=stopped, lost=lost)
        self._say("[agent] the job ended while the node agent was down")
        outcome = ended(gone, [], self._say, stopped=stopped)
        return replace(outcome, survivors=self._end_leftovers())

    def _end_leftovers(self) -> list[int]:
        """End what an entry point that exited left running; the pids that survived."""
        if not (left := job_processes(self.dirs.marker)):
            return []
        grace = self._grace()
        count = f"{len(left)} process{'es' if len(left) != 1 else ''}"
        self._say(f"[agent] ending {count} the entry point left behind: SIGTERM, SIGKILL after "
                  f"{grace:g} s")  # fmt: skip
        log.info("job %s: ending processes %s the entry point left behind", self.job_id,
                 ", ".join(map(str, left)))  # fmt: skip
        return end_processes(lambda: job_processes(self.dirs.marker), grace)

    def _grace(self) -> float:
        if self._aborting.is_set():
            return ABORT_GRACE
        job_grace = self.assignment.spec.stop_grace_s
        return self.settings.stop_grace if job_grace is None else job_grace

    # -- the end -------------------------------------------------------------------------

    def _finish(self, outcome: Ended, watcher: CheckpointWatcher | None) -> Answer | None:
        """Report how the entry point ended; the control plane's answer (None: not sent)."""
        self._survivors = outcome.survivors
        self.pool.release(self.job_id, outcome.survivors)
        if self._aborting.is_set():
            # The agent ended it, not the job: a restarted agent must not report its code.
            self.dirs.exit_code_file.unlink(missing_ok=True)
            self._say(self._aborted_because)  # shipped with the last lines (``_run``)
            return None
        checkpoints = watcher or self._checkpoint_watcher()
        return self.shipping.report(outcome, checkpoints, self.assignment.spec.time_limit_s,
                                  out_of_memory=self.confinement.out_of_memory())

    # -- helpers -------------------------------------------------------------------------

    def _checkpoint_watcher(self) -> CheckpointWatcher:
        return CheckpointWatcher(
            self.shipping.uploader,
            self.job_id,
            self.node_id,
            self.dirs.output_checkpoint,
            stable_for=self.settings.checkpoint_stable_for,
            say=self._say,
            node_index=self.assignment.node_index,
            record=self.dirs.checkpoint_record,
        )

    def _fetch_checkpoint(self, checkpoint_id: str, destination: Path) -> None:
        try:
            self.client.download_checkpoint(checkpoint_id, destination)
        except ArtifactAltered as error:
            raise ArchiveRefused(str(error)) from None
        except ApiError as error:
            raise CheckpointMissing(str(error)) from None

