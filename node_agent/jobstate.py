"""One job on this node as the stages of its supervisor share it: the control plane's latest
word on it (its assignment, read and waited for under ``changed``), the attempt this node runs,
its folders and confinement, and the signals that end its entry point: the user's stop, the
control plane's preemption (:mod:`node_agent.preemption`), the agent's shutdown.

The agent's thread writes it (:meth:`JobState.update`, :meth:`JobState.stop`,
:meth:`JobState.abort`); the job's own thread reads it, stage after stage.
"""

from __future__ import annotations

import logging
import threading

from node_agent.jobdirs import JobDirs
from node_agent.models import STOP_IN_PROGRESS, Assignment
from node_agent.sandbox.jobs import Confinement

log = logging.getLogger("flexai.agent")

SHUTTING_DOWN = ("[agent] the node agent is stopping: it ended the job's processes on this "
                 "node")  # fmt: skip
WITHDRAWN = ("[agent] the job no longer runs on this node (it ended or was stopped elsewhere: "
             "`flexai training inspect` says why): its processes here were ended")  # fmt: skip


class JobState:
    """What the stages of one job's supervisor share; a job listed ``stop in progress`` is
    stopping from the start."""

    def __init__(self, assignment: Assignment, dirs: JobDirs, confinement: Confinement) -> None:
        self.assignment = assignment
        self.job_id = assignment.job_id
        self.attempt = assignment.attempt
        """The job's attempt this node runs (or ran last)."""
        self.dirs = dirs
        """The folders of that attempt."""
        self.confinement = confinement
        """The job's user, sandbox and cgroup here, once its folders are made."""
        self.changed = threading.Condition()  # a new assignment, or a stop
        self.stopping = threading.Event()  # the user's stop, or the agent's shutdown
        self.preempted = threading.Event()  # this attempt makes way for a higher-priority job
        self.halt = threading.Event()  # either of the two above: the entry point must end
        self.aborting = threading.Event()  # the agent's shutdown: no more reports
        self.aborted_because = SHUTTING_DOWN
        """What the job's log says last when the agent ends it (:meth:`abort`)."""
        if assignment.status == STOP_IN_PROGRESS:
            self.stopping.set()
            self.halt.set()

    def update(self, assignment: Assignment) -> None:
        """The control plane's latest word on the job, for the stages that wait for it."""
        with self.changed:
            self.assignment = assignment
            self.changed.notify_all()

    def stop(self) -> None:
        """The user's stop: the entry point must end, and nothing more start."""
        if not self.stopping.is_set():
            log.info("job %s: stopping", self.job_id)
        self.stopping.set()
        self.halt.set()
        with self.changed:
            self.changed.notify_all()

    def make_way(self) -> None:
        """The control plane's preemption: this attempt's entry point must end."""
        self.preempted.set()
        self.halt.set()

    def abort(self, shutting_down: bool) -> None:
        """The agent's stop, which reports nothing: it shuts down, or the job is no longer this
        node's."""
        self.aborted_because = SHUTTING_DOWN if shutting_down else WITHDRAWN
        self.aborting.set()
        self.stop()

    def next_attempt(self, attempt: int) -> None:
        """Run ``attempt`` of the job from now on, in folders of its own, unless stopped."""
        self.attempt = attempt
        self.dirs = self.dirs.for_attempt(attempt)
        self.preempted.clear()
        if not self.stopping.is_set():
            self.halt.clear()
