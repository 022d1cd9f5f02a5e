"""A job's attempts, named in one place for the server, the agent and the CLI alike.

A job preempted or retried runs again as its next attempt (1, 2, ...), and each attempt keeps
its own logs and outputs. The first attempt's are where every job's were before retries, so
older jobs, older agents and older servers read the same; a later attempt's are beside them,
named by its number (:func:`attempt_key`): the server's store keys them ``<job id>/attempts/K``,
the agent's work directory ``job.attempt-K.log``, ``output.attempt-K``. A request names a
later attempt with an ``attempt`` parameter and the first with none (:func:`attempt_query`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

FIRST = 1
MAX_ATTEMPT = 1000
"""The highest attempt a request may name."""
IN_STORE = "/attempts/"
"""What joins a job's id and a later attempt in the server's artifact keys."""
IN_FILES = ".attempt-"
"""What joins a name and a later attempt in an agent's file names."""


def attempt_key(base: str, attempt: int = FIRST, joiner: str = IN_STORE) -> str:
    """What ``attempt``'s artifacts are kept under, from what the job's are (its id, a file's
    name): ``base`` itself for the first attempt, ``base`` + ``joiner`` + K for attempt K."""
    return base if attempt <= FIRST else f"{base}{joiner}{attempt}"


def later_attempts_prefix(base: str, joiner: str = IN_STORE) -> str:
    """The start of the :func:`attempt_key` of every attempt after the first."""
    return f"{base}{joiner}"


def attempt_query(attempt: int) -> dict[str, int]:
    """The query parameters that name ``attempt``: none for the first (what an older server,
    or a fake in a test, takes)."""
    return {} if attempt <= FIRST else {"attempt": attempt}


def current_attempt(document: Mapping[str, Any]) -> int:
    """A job's attempt now, from its view (1 for a job never preempted or retried, and for a
    document folded before attempts existed)."""
    return int(document.get("attempt") or FIRST)


def last_attempt(document: Mapping[str, Any]) -> int:
    """The highest attempt the job has had."""
    listed = [int(entry.get("attempt") or 0) for entry in document.get("attempts") or []]
    return max([current_attempt(document), *listed])


def output_attempt(document: Mapping[str, Any], output: Mapping[str, Any]) -> int:
    """The attempt whose output a recorded one is: as the view says, else the last attempt
    that had started when it was recorded (the views keep a node's last output only)."""
    if output.get("attempt"):
        return int(output["attempt"])
    recorded = _moment(output.get("at"))
    if recorded is None or not document.get("attempts"):
        return current_attempt(document)
    started = [int(entry["attempt"]) for entry in document.get("attempts") or []
               if entry.get("attempt") and (moment := _moment(entry.get("started_at")))
               and moment <= recorded]  # fmt: skip
    return max(started, default=1)


def outputs_attempt(document: Mapping[str, Any]) -> int:
    """The default attempt of a fetch: the last one that recorded outputs, else the last."""
    recorded = [output_attempt(document, output) for output in document.get("outputs") or []]
    return max(recorded, default=current_attempt(document))


def _moment(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None
