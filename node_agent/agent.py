"""The node agent: registers the node, beats its heart, and follows its assignments.

Two periodic tasks run until shutdown, each surviving its own errors: the heartbeat, and the
long poll of ``GET /v1/agent/nodes/{node_id}/assignments`` (answered as soon as the node's jobs
change) that starts a supervisor for each new job and passes each answer on to the job's
supervisor (the control plane's go, the user's stop). Each job lives in its own
:class:`JobSupervisor` thread, so one job's build, logs or uploads never hold up another's.
A third long poll, in a thread of its own, takes the debug sessions users open into the node's
running jobs (``node_agent/debug/sessions.py``).

An agent that (re)starts first ends the processes its predecessor left of jobs no longer listed
for the node, then follows again the jobs listed as running here (see ``node_agent/run/adopt.py``).

When any call answers ``node-taken`` (another agent took this node over while this one was
silent), the agent ends every job's processes at once, reports nothing, and stops: a job must
never run on two agents.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from node_agent.accelerators import AcceleratorPool, Gpu
from node_agent.client import ApiError, ApiUnavailable, ControlPlaneClient, Listing, NodeTaken
from node_agent.debug.sessions import DebugSessions, job_shell
from node_agent.debug.shell import JobShell
from node_agent.models import BUILDING, ENQUEUED, IN_PROGRESS, STOP_IN_PROGRESS, Assignment
from node_agent.network import LOOPBACK
from node_agent.run.adopt import end_orphans
from node_agent.running import ABORT_GRACE
from node_agent.supervisor import JobSupervisor, SupervisorSettings

log = logging.getLogger("flexai.agent")

_MISSING_POLLS_BEFORE_ABORT = 2
LONG_POLL_S = 20.0
"""How long one assignments request may wait on the control plane for a change."""


@dataclass(frozen=True)
class AgentSettings:
    name: str
    accels: int
    supervisor: SupervisorSettings
    accel_type: str = "cpu"
    gpus: tuple[Gpu, ...] = ()
    """The GPUs NVML found (none when the accelerators are stand-ins)."""
    address: str = LOOPBACK
    """How the node's peers reach it (where node 0 of a multi-node job holds the rendezvous)."""
    poll_interval: float = 0.5
    """The pause before asking again after a failed poll, or when the control plane does not
    hold polls (an older one); a control plane that does answers as soon as something changes."""
    heartbeat_interval: float = 2.0
    long_poll: float = LONG_POLL_S


class Agent:
    def __init__(self, client: ControlPlaneClient, settings: AgentSettings) -> None:
        self.client = client
        self.settings = settings
        self.pool = AcceleratorPool()
        self.node_id = ""
        self.supervisors: dict[str, JobSupervisor] = {}
        self._finished: set[tuple[str, int]] = set()  # (job, attempt) seen to their end here
        self._missing: dict[str, int] = {}  # polls in a row a supervised job was not listed
        self._swept = False  # processes of jobs no longer listed were ended, at start
        self._shutdown = threading.Event()
        self._etag = ""  # of the last assignments answer: the next poll waits for a change
        self._images_told: list[tuple[str, str]] | None = None
        """The images the control plane was last told this node holds (None: not since the
        node registered): a heartbeat carries the list only when it differs."""
        self.displaced_by: NodeTaken | None = None
        """Set when another agent took this node over: the agent then stops."""
        client.when_node_taken(self._give_up_the_node)

    # -- lifecycle -----------------------------------------------------------------------

    def register(self, retry_for: float | None = None) -> str:
        settings = self.settings
        self._images_told = None  # the next heartbeat tells them
        self.node_id = self.client.register(
            settings.name,
            settings.accels,
            settings.accel_type,
            address=settings.address,
            gpus=[gpu.to_json() for gpu in settings.gpus],
            retry_for=retry_for,
            isolation=jobs.isolation.to_json() if (jobs := settings.supervisor.sandboxes)
            else None,
        )
        log.info(
            "registered node %s (id %s) with %d accelerators of type %s, reached at %s",
            settings.name,
            self.node_id,
            settings.accels,
            settings.accel_type,
            settings.address,
        )
        return self.node_id

    def run(self) -> None:
        """Heartbeat and poll until :meth:`request_shutdown`; then end every job's processes."""
        heartbeat = threading.Thread(
            target=self._every,
            args=("heartbeat", self.settings.heartbeat_interval, self.heartbeat),
            name="heartbeat",
            daemon=True,
        )
        heartbeat.start()
        debug_sessions = DebugSessions(self.client, lambda: self.node_id, self._job_shell)
        debug_sessions.start()
        try:
            self._every("poll", self.settings.poll_interval, self.poll_once, at_once=True)
        finally:
            debug_sessions.stop()
            self.abort_jobs()
            heartbeat.join(timeout=5)
            self._leave()

    def _leave(self) -> None:
        """Once its jobs' processes ended (and their last lines shipped), the agent tells the
        control plane it leaves, unless another agent holds the node now: its jobs are then
        not left showing ``in progress`` until the node's lease runs out, and no new job is
        sent to a node no agent runs."""
        if not self.node_id or self.displaced_by is not None:
            return
        try:
            jobs = self.client.leave(self.node_id)
        except (ApiError, ApiUnavailable) as error:
            log.warning("could not tell the control plane that this agent stops (%s): its "
                        "jobs move on once the node's lease runs out", error)  # fmt: skip
            return
        log.info("told the control plane this agent stops (%d job(s) moved on)", jobs)

    @property
    def shutting_down(self) -> bool:
        return self._shutdown.is_set()

    def request_shutdown(self) -> None:
        self._shutdown.set()
        self.client.stop_retrying()

    def _give_up_the_node(self, error: NodeTaken) -> None:
        if self.displaced_by is None and self.node_id:  # at registration main says it
            log.error("another agent holds node %s now (%s)", self.settings.name, error)
        self.displaced_by = self.displaced_by or error
        self.request_shutdown()

    def abort_jobs(self) -> None:
        """End every job's processes, reporting nothing (the agent is going away)."""
        running = [s for s in self.supervisors.values() if s.is_alive()]
        if running:
            log.info("ending the processes of %d job(s)", len(running))
        for supervisor in running:
            supervisor.abort()
        for supervisor in running:
            supervisor.join(timeout=ABORT_GRACE + 15)
            if supervisor.is_alive():
                log.error("job %s: its processes may still be running", supervisor.job_id)

    def _job_shell(self, job_id: str, node_index: int) -> JobShell | None:
        """Where a debug session into one of this node's running jobs runs its commands."""
        supervisor = self.supervisors.get(job_id)
        return job_shell(supervisor, node_index, self.settings.supervisor.job_user)

    # -- periodic tasks ------------------------------------------------------------------

    def heartbeat(self) -> None:
        """Tell the control plane the node is alive and, when they changed since it was last
        told (or the node registered again), which images its cache holds: a beat is then a
        few bytes, and the scheduler still learns of a pull within one beat."""
        supervisor = self.settings.supervisor
        images = supervisor.images.cache(supervisor.work_dir).held()
        changed = images if images != self._images_told else None
        try:
            self.client.heartbeat(self.node_id, images=changed)
        except ApiError as error:
            self._register_again_if_unknown(error)
            raise
        if changed is not None:
            self._images_told = changed

    def poll_once(self) -> bool:
        """Ask for this node's jobs, waiting on the control plane for a change since the last
        answer, and act on them; True when the next poll may follow at once."""
        since, started = self._etag, time.monotonic()
        try:
            listing = self._ask_for_assignments(since)
        except ApiError as error:
            self._etag = ""
            self._register_again_if_unknown(error)
            raise
        self._etag = listing.etag
        self._reap_finished()
        self.reconcile(listing.assignments)
        held = time.monotonic() - started >= self.settings.long_poll / 2
        return bool(listing.etag) and (listing.etag != since or held)

    def _ask_for_assignments(self, since: str) -> Listing:
        """The (long) poll, in a thread of its own: a shutdown does not wait for its answer."""
        answer: list[Listing | Exception] = []
        done = threading.Event()

        def ask() -> None:
            try:
                answer.append(
                    self.client.poll_assignments(
                        self.node_id, since=since or None, wait=self.settings.long_poll
                    )
                )
            except Exception as error:  # raised in the agent's loop below
                answer.append(error)
            finally:
                done.set()

        threading.Thread(target=ask, name="assignments", daemon=True).start()
        while not done.wait(0.1):
            if self._shutdown.is_set():
                raise ApiUnavailable("the agent is shutting down")
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    def reconcile(self, assignments: list[Assignment]) -> None:
        """Bring this node in line with what the control plane says its jobs are."""
        listed = {assignment.job_id for assignment in assignments}
        if not self._swept:  # before any job starts: no orphan may share its accelerators
            end_orphans(self.settings.supervisor.work_dir, listed, ABORT_GRACE)
            self._swept = True
        for assignment in assignments:
            if (assignment.job_id, assignment.attempt) in self._finished:
                continue  # a stale answer; a later attempt (a retry) is taken anew
            supervisor = self.supervisors.get(assignment.job_id)
            if supervisor is not None and self._retried(supervisor, assignment):
                self._etag = ""  # its old supervisor is ending: take it once that one ended
            elif supervisor is not None:
                supervisor.update(assignment)
            elif assignment.status in (BUILDING, ENQUEUED):
                self._take(assignment)
            elif assignment.status in (IN_PROGRESS, STOP_IN_PROGRESS):
                self._take(assignment, adopting=True)
        self._abort_unlisted(listed)
        listed_attempts = {(assignment.job_id, assignment.attempt) for assignment in assignments}
        self._finished &= listed_attempts  # one no longer listed will not be listed again

    @staticmethod
    def _retried(supervisor: JobSupervisor, assignment: Assignment) -> bool:
        """A later attempt that builds anew (a retry) while the supervisor of an earlier one
        still ends it (a preempted job's next attempt is its supervisor's to run)."""
        return assignment.attempt > supervisor.attempt and assignment.status == BUILDING

    # -- helpers -------------------------------------------------------------------------

    def _take(self, assignment: Assignment, adopting: bool = False) -> None:
        """Build and run a job; ``adopting``: a job already running here, that no supervisor
        follows (this agent restarted), is followed again, or its end reported."""
        what = "found again" if adopting else "taken"
        log.info("job %s (%s): %s", assignment.job_id, assignment.name, what)
        supervisor = JobSupervisor(
            assignment,
            client=self.client,
            node_id=self.node_id,
            pool=self.pool,
            settings=self.settings.supervisor,
            address=self.settings.address,
            adopting=adopting,
        )
        self.supervisors[assignment.job_id] = supervisor
        supervisor.start()

    def _reap_finished(self) -> None:
        for job_id, supervisor in list(self.supervisors.items()):
            if not supervisor.is_alive():
                del self.supervisors[job_id]
                self._missing.pop(job_id, None)
                self._finished.add((job_id, supervisor.attempt))
                log.info("job %s: done", job_id)

    def _abort_unlisted(self, listed: set[str]) -> None:
        """A job that left the node's list (ended or moved elsewhere) must not keep running."""
        for job_id, supervisor in self.supervisors.items():
            if job_id in listed:
                self._missing.pop(job_id, None)
                continue
            self._missing[job_id] = self._missing.get(job_id, 0) + 1
            if self._missing[job_id] < _MISSING_POLLS_BEFORE_ABORT:
                self._etag = ""  # the confirming answer comes at once, not after a long poll
            elif self._missing[job_id] == _MISSING_POLLS_BEFORE_ABORT:
                log.warning("job %s: no longer assigned to this node; ending it", job_id)
                supervisor.abort(shutting_down=False)

    def _register_again_if_unknown(self, error: ApiError) -> None:
        if error.slug == "node-not-found":
            log.warning("the control plane does not know this node any more; registering again")
            self.register()

    def _every(
        self, name: str, interval: float, task: Callable[[], object], at_once: bool = False
    ) -> None:
        """Run ``task`` every ``interval`` seconds; with ``at_once``, again at once whenever
        it returns True (a long poll that answered)."""
        failing = ""
        while not self._shutdown.is_set():
            started = time.monotonic()
            again = False
            try:
                again = task() is True and at_once
            except Exception as error:  # each task outlives its own errors
                if self._shutdown.is_set():
                    return  # a call the shutdown cut short is no failure to report
                message = str(error) or type(error).__name__
                if message != failing and isinstance(error, ApiError | ApiUnavailable | OSError):
                    log.warning("%s failed: %s", name, message)
                elif message != failing:
                    log.exception("%s failed", name)
                failing = message
            else:
                if failing:
                    log.info("%s works again", name)
                failing = ""
            if not again:
                self._shutdown.wait(max(0.0, interval - (time.monotonic() - started)))
