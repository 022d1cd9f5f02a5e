"""Each attempt's entry point on this node, once the control plane gave the go: launched through
the shim with the job's environment, followed to its end (its checkpoints uploaded as they
appear), what it left running ended, and how it ended reported (:mod:`node_agent.shipping`).
The entry point runs through the shim (``node_agent/run/shim.py``), so an agent that restarted
follows it again, or says how it ended while the agent was down.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import replace
from pathlib import Path

from node_agent.accelerators import AcceleratorPool
from node_agent.artifacts.checkpoints import CheckpointWatcher
from node_agent.build.secrets import JobSecrets
from node_agent.gate import Start
from node_agent.jobstate import JobState
from node_agent.models import Rendezvous
from node_agent.network import LOOPBACK, free_port
from node_agent.reports import Answer
from node_agent.run.jobrun import JobRun
from node_agent.run.launch import Placement, job_environment
from node_agent.run.processes import end_processes, job_processes
from node_agent.run.watch import Ended, ended, watch
from node_agent.shipping import LOST_WHILE_AWAY, NEVER_LAUNCHED, JobShipping

log = logging.getLogger("flexai.agent")

ABORT_GRACE = 3.0
"""Seconds between SIGTERM and SIGKILL for the processes of a job the agent ends itself (its
shutdown, a job no longer this node's, processes an earlier build of it left)."""


class EntryPointRunner:
    """Runs one job's entry point, attempt after attempt, and reports how each ended; nothing
    is reported of one the agent ended itself (:meth:`JobState.abort`)."""

    def __init__(
        self,
        job: JobState,
        shipping: JobShipping,
        pool: AcceleratorPool,
        *,
        node_id: str,
        work_dir: Path,
        python: str,
        stop_grace: float,
        checkpoint_stable_for: float,
    ) -> None:
        self.job = job
        self.shipping = shipping
        self.pool = pool
        self.node_id = node_id
        self.work_dir = work_dir
        self.python = python
        """The interpreter of the shim."""
        self.stop_grace = stop_grace
        """The agent's ``--stop-grace``, for a job whose spec says none."""
        self.checkpoint_stable_for = checkpoint_stable_for
        self.job_env: dict[str, str] | None = None
        """The entry point's environment, once this agent launched it (`debug-ssh`)."""
        self.survivors: list[int] = []
        """The processes of the job that outlived its end: their accelerators stay held."""

    def run(self, argv: tuple[str, ...], start: Start, secrets: JobSecrets) -> Answer | None:
        """Launch and follow the entry point; the answer to the report of its end."""
        job, say = self.job, self.shipping.say
        assignment, spec = job.assignment, job.assignment.spec
        rendezvous = start.rendezvous or Rendezvous(LOOPBACK, free_port())
        placement = Placement(assignment.node_index, assignment.nnodes, spec.accels,
                              rendezvous.master_addr, rendezvous.master_port)  # fmt: skip
        # --env and --secret never name the same variable; the platform's win over both.
        env = job_environment(job.dirs, {**spec.env, **secrets.values}, start.accelerators,
                              placement, restart_count=job.attempt - 1)  # fmt: skip
        env = job.confinement.entry_env(env, start.accelerators)
        self.job_env = env  # a debug session's commands get the very same (`debug-ssh`)
        indices = ",".join(map(str, start.accelerators)) or "none"
        log.info("job %s: started on accelerators %s", job.job_id, indices)
        say(f"[agent] running {shlex.join(argv)} on accelerators {indices}")
        try:
            run = JobRun.launch(
                argv,
                dirs=job.dirs,
                env=env,
                python=self.python,
                as_user=job.confinement.entry_user(start.accelerators, job.dirs),
                work_dir=self.work_dir,
            )
        except OSError as error:
            say(f"[agent] cannot start the entry point: {error}")
            stopped = job.halt.is_set()
            return self.finish(Ended(None if stopped else 126, [], stopped=stopped), None)
        return self.follow(run)

    def follow(self, run: JobRun) -> Answer | None:
        """Follow the entry point to its end (a stop, its time limit), uploading its
        checkpoints meanwhile; the answer to the report of its end."""
        watcher = self._checkpoint_watcher()
        watcher.start()
        try:
            outcome = watch(
                run,
                stopping=self.job.halt,
                grace=self._grace,
                time_limit_s=self.job.assignment.spec.time_limit_s,
                say=self.shipping.say,
            )
        except BaseException:
            run.end(ABORT_GRACE)  # whatever went wrong here, no process outlives the job
            raise
        finally:
            watcher.stop_watching()
        return self.finish(outcome, watcher)

    def ended_while_away(self) -> Ended:
        """How the job ended while the agent was down, as its shim wrote it, if it did."""
        job, say = self.job, self.shipping.say
        stopped = job.stopping.is_set()
        gone = JobRun(job.dirs, shim_pid=None, started=0.0)
        if gone.returncode() is None:
            # The shim writes its pid before it starts the entry point: without it, none ran.
            lost = LOST_WHILE_AWAY if job.dirs.shim_pid_file.exists() else NEVER_LAUNCHED
            log.warning("job %s: %s", job.job_id, lost)
            say(f"[agent] {lost}")
            return Ended(None, self._end_leftovers(), stopped=stopped, lost=lost)
        say("[agent] the job ended while the node agent was down")
        outcome = ended(gone, [], say, stopped=stopped)
        return replace(outcome, survivors=self._end_leftovers())

    def finish(self, outcome: Ended, watcher: CheckpointWatcher | None) -> Answer | None:
        """Report how the entry point ended; the control plane's answer (None: not sent)."""
        job = self.job
        self.survivors = outcome.survivors
        self.pool.release(job.job_id, outcome.survivors)
        if job.aborting.is_set():
            # The agent ended it, not the job: a restarted agent must not report its code.
            job.dirs.exit_code_file.unlink(missing_ok=True)
            self.shipping.say(job.aborted_because)  # shipped with the last lines (supervisor)
            return None
        checkpoints = watcher or self._checkpoint_watcher()
        return self.shipping.report(outcome, checkpoints, job.assignment.spec.time_limit_s,
                                    out_of_memory=job.confinement.out_of_memory())  # fmt: skip

    def _end_leftovers(self) -> list[int]:
        """End what an entry point that exited left running; the pids that survived."""
        dirs = self.job.dirs
        if not (left := job_processes(dirs.marker)):
            return []
        grace = self._grace()
        count = f"{len(left)} process{'es' if len(left) != 1 else ''}"
        self.shipping.say(f"[agent] ending {count} the entry point left behind: SIGTERM, "
                          f"SIGKILL after {grace:g} s")  # fmt: skip
        log.info("job %s: ending processes %s the entry point left behind", self.job.job_id,
                 ", ".join(map(str, left)))  # fmt: skip
        return end_processes(lambda: job_processes(dirs.marker), grace)

    def _grace(self) -> float:
        if self.job.aborting.is_set():
            return ABORT_GRACE
        job_grace = self.job.assignment.spec.stop_grace_s
        return self.stop_grace if job_grace is None else job_grace

    def _checkpoint_watcher(self) -> CheckpointWatcher:
        job = self.job
        return CheckpointWatcher(
            self.shipping.uploader,
            job.job_id,
            self.node_id,
            job.dirs.output_checkpoint,
            stable_for=self.checkpoint_stable_for,
            say=self.shipping.say,
            node_index=job.assignment.node_index,
            record=job.dirs.checkpoint_record,
        )
