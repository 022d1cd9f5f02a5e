"""The scheduler: takes pending jobs, finds each a node, or rejects it with the reason."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from uuid import UUID

from api.services import Services
from domain.model import DomainError, Status
from domain.scheduling import Assign, NodeCapacity, Reject, choose_node
from projections.db import is_unavailable

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, services: Services) -> None:
        self.services = services
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> None:
        services = self.services
        if services.projector.halted is not None:
            return  # its decisions could not be shown; health says why
        for row in services.queries.jobs_in([Status.PENDING]):
            self._try(services.jobs.begin_scheduling, UUID(row["id"]))
        services.projector.catch_up()
        waiting = services.queries.jobs_in([Status.SCHEDULING])
        if not waiting:
            return
        capacity = self._capacity()
        for row in waiting:
            waited = datetime.now(UTC) - datetime.fromisoformat(row["updated_at"])
            decision = choose_node(
                row["accels"], row["nodes"], list(capacity.values()),
                waited.total_seconds(), services.settings.scheduling_patience_s,
            )  # fmt: skip
            job_id = UUID(row["id"])
            if isinstance(decision, Assign):
                if self._try(services.jobs.assign, job_id, decision.node_id, decision.node_name):
                    node = capacity[decision.node_id]
                    capacity[decision.node_id] = replace(
                        node, busy_accels=node.busy_accels + row["accels"]
                    )
            elif isinstance(decision, Reject):
                self._try(services.jobs.reject, job_id, decision.code, decision.message)
        services.projector.catch_up()

    def _capacity(self) -> dict[str, NodeCapacity]:
        services = self.services
        live = services.state.live_nodes(services.settings.node_timeout_s)
        busy = services.queries.busy_accels()
        return {
            row["id"]: NodeCapacity(
                node_id=row["id"], name=row["name"], accels=int(row["accels"]),
                busy_accels=busy.get(row["id"], 0), alive=row["id"] in live,
            )  # fmt: skip
            for row in services.queries.nodes()
        }

    @staticmethod
    def _try(command: Callable[..., object], *args: object) -> bool:
        """Run one command; another replica may have moved the job on already."""
        try:
            command(*args)
        except DomainError as error:
            log.info("scheduler skipped a job: %s", error)
            return False
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        wakeup = self.services.settings.scheduler_interval_s
        while not self._stop.is_set():
            self.services.scheduler_wakeup.wait(wakeup)
            self.services.scheduler_wakeup.clear()
            try:
                self.run_once()
            except Exception as error:  # each round survives its own errors
                if is_unavailable(error):
                    log.warning("scheduling waits for the database: %s", error)
                else:
                    log.exception("scheduling round failed")

    def stop(self) -> None:
        self._stop.set()
        self.services.scheduler_wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
