"""One job's life on this node, stage after stage: build (:mod:`node_agent.building`), wait for
the control plane's go (:mod:`node_agent.gate`), run the entry point (:mod:`node_agent.running`),
and report how it ended once its log and artifacts are shipped (:mod:`node_agent.shipping`). A
job the control plane preempts (:mod:`node_agent.preemption`) is stopped as by the user and
reported ``stopped``; back ``enqueued``, it keeps its build here and waits for the go of its
next attempt, which runs from the checkpoint that attempt names (:mod:`node_agent.build.attempts`).
What the stages share, and how a stop reaches them, is :class:`node_agent.jobstate.JobState`.

The entry point runs through the shim (``node_agent/run/shim.py``), so a supervisor of an agent
that restarted finds the job again (``adopting``), follows it to its end, or says how it ended
while the agent was down.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from node_agent.accelerators import AcceleratorPool
from node_agent.build.secrets import fetch_secrets
from node_agent.building import BuildStage
from node_agent.client import ControlPlaneClient
from node_agent.gate import StartGate
from node_agent.images.ensure import ImageSettings
from node_agent.jobdirs import JobDirs
from node_agent.jobstate import JobState
from node_agent.models import STOP_IN_PROGRESS, Assignment
from node_agent.network import LOOPBACK
from node_agent.preemption import PREEMPTED, asked_to_make_way, made_way, next_go
from node_agent.reports import Answer, JobReporter
from node_agent.run.jobrun import JobRun, recorded_exit
from node_agent.run.jobuser import JobUser
from node_agent.running import EntryPointRunner
from node_agent.sandbox.jobs import Confinement, JobSandboxes
from node_agent.shipping import JobShipping

log = logging.getLogger("flexai.agent")

ABORT_SHIPPING_S = 5.0
"""How long a job ended by the agent (its shutdown, or a job no longer this node's) still ships
the last lines of its log, with the agent's line saying why it ended."""


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
    images: ImageSettings = ImageSettings()
    """Where the images jobs name are cached, and which registries speak plain HTTP."""



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
        self.job_id = assignment.job_id
        self.client = client
        self.node_id = node_id
        self.pool = pool
        self.settings = settings
        self.adopting = adopting
        dirs = JobDirs.for_job(settings.work_dir, assignment.job_id, assignment.node_index,
                               assignment.attempt)  # fmt: skip
        self.job = JobState(assignment, dirs, Confinement(settings.sandboxes, settings.job_user))
        self.reporter = JobReporter(client, node_id, self.job_id, give_up=self.job.aborting,
                                    node_index=assignment.node_index)  # fmt: skip
        self._thread = threading.Thread(target=self._run, name=f"job-{self.job_id}", daemon=True)
        self.shipping = JobShipping(
            client,
            dirs,
            self.reporter,
            quiet=self.job.aborting,
            flush_interval=settings.log_flush_interval,
            drain_timeout=settings.log_drain_timeout,
            unavailable_after=settings.logs_unavailable_after,
        )
        self._say = self.shipping.say
        self.gate = StartGate(self.job, self.reporter, self.shipping, pool, address)
        self.building = BuildStage(
            self.job,
            client,
            self.shipping,
            self.reporter,
            work_dir=settings.work_dir,
            datasets_dir=settings.datasets_dir,
            python=settings.job_python,
            site_packages=settings.job_site_packages,
            images=settings.images,
            asked=time.monotonic(),  # after the job was submitted
        )
        self.runner = EntryPointRunner(
            self.job,
            self.shipping,
            pool,
            node_id=node_id,
            work_dir=settings.work_dir,
            python=settings.job_python,
            stop_grace=settings.stop_grace,
            checkpoint_stable_for=settings.checkpoint_stable_for,
        )
        self._keep_dirs = settings.keep_job_dirs
        self._started = False
        if adopting and asked_to_make_way(assignment, self.job.attempt):  # said once logs open
            self.job.make_way()

    @property
    def assignment(self) -> Assignment:
        return self.job.assignment

    @property
    def attempt(self) -> int:
        """The job's attempt this supervisor runs (or ran last)."""
        return self.job.attempt

    @property
    def dirs(self) -> JobDirs:
        return self.job.dirs

    @property
    def confinement(self) -> Confinement:
        """The job's user, sandbox and cgroup here, once its folders are made."""
        return self.job.confinement

    @property
    def job_env(self) -> dict[str, str] | None:
        """The entry point's environment, once this agent launched it (`debug-ssh`)."""
        return self.runner.job_env

    def start(self) -> None:
        self._thread.start()

    def update(self, assignment: Assignment) -> None:
        """The control plane's latest word on the job (each poll of the agent brings it)."""
        self.job.update(assignment)
        if assignment.status == STOP_IN_PROGRESS:
            self.stop()
        elif asked_to_make_way(assignment, self.job.attempt) and not self.job.preempted.is_set():
            log.info("job %s: preempted", self.job_id)
            self._say(PREEMPTED)
            self.job.make_way()

    def stop(self) -> None:
        """The user asked to stop: end the processes, then report ``stopped``."""
        self.job.stop()

    def abort(self, shutting_down: bool = True) -> None:
        """End the processes quickly and report nothing: the agent is shutting down (its
        work directory is kept for a quick exit), or the job is no longer this node's."""
        self._keep_dirs = self._keep_dirs or shutting_down
        self.job.abort(shutting_down)

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
            self.pool.release(self.job_id, self.runner.survivors)
            if self.shipping.logs is not None:
                aborting = self.job.aborting.is_set()
                self.shipping.logs.close(timeout=ABORT_SHIPPING_S if aborting else 30)
            self.job.confinement.close(self.job.dirs, kept=self._keep_dirs)
            if not self._keep_dirs:
                self.job.dirs.remove_all_but_log()

    def _build_and_run(self) -> None:
        self.building.end_earlier_processes()
        self.job.dirs.create_fresh()
        self._confine()
        secrets = fetch_secrets(self.client, self.job.assignment)  # before a byte of log ships
        self.building.open_log(secrets)
        built = self.building.build(secrets)
        start = self.gate.after_build(built) if built else None
        if built and start and self.gate.claim(start.accelerators):
            self._started = True
            self._run_attempts(self.runner.run(built.argv, start, secrets))

    def _run_attempts(self, answer: Answer | None) -> None:
        """After an attempt that ended with ``answer``: while it made way for another job,
        wait for the next attempt's go and run it."""
        while made_way(self.job, answer):
            go = next_go(self.job, self.gate, self.shipping)
            prepared = self.building.prepare_attempt(go[1]) if go else None
            if go is None or prepared is None or not self.gate.claim(go[0].accelerators):
                return
            argv, secrets = prepared
            answer = self.runner.run(argv, go[0], secrets)

    def _confine(self) -> None:
        """The job's user, sandbox and cgroup (its id taken, or found again after a restart)."""
        self.job.confinement = Confinement.of(self.settings.sandboxes, self.job.dirs,
                                              self.settings.job_user, self.job.assignment.name,
                                              self.job.assignment.spec.accels)  # fmt: skip

    # -- after the agent restarted -------------------------------------------------------

    def _follow_again(self) -> None:
        """After the agent restarted: follow the job's processes, or say how they ended."""
        self._confine()
        try:
            self._open_logs_again()
        except OSError as error:
            log.error("job %s: its log cannot be shipped any more: %s", self.job_id, error)
        # The entry point's end is its exit code, whatever it left running (a setsid child).
        dirs, assignment = self.job.dirs, self.job.assignment
        run = None if recorded_exit(dirs) is not None else JobRun.find(dirs)
        if run is None:
            self.runner.finish(self.runner.ended_while_away(), None)
            return
        log.info("job %s (%s): found running, followed again", self.job_id, assignment.name)
        self._say("[agent] the node agent restarted and found the job running; it follows it")
        if self.job.preempted.is_set():
            self._say(PREEMPTED)
        self._started = True
        if holder := self.pool.claim(self.job_id, assignment.accelerators or ()):
            log.error("job %s: %s", self.job_id, holder)
        self._run_attempts(self.runner.follow(run))

    def _open_logs_again(self) -> None:
        """Ship the log of a job found running; not at all if its secrets cannot be masked."""
        secrets = fetch_secrets(self.client, self.job.assignment)
        if secrets.failure is not None:
            log.error("job %s: its log is not shipped any more, as its secrets cannot be "
                      "masked: %s", self.job_id, secrets.failure.message)  # fmt: skip
            return
        self.shipping.open_logs(resume=True, secret_values=secrets.masked)
