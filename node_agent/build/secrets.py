"""The values of a job's ``--secret`` variables, fetched from the control plane right before
the job builds (and again by an agent that restarted under a running job, to mask its log).

They live in the agent's memory only: never in a file of the job's directory, on a command
line or in a log line. The job's entry point gets them in its environment, and the log
shipper masks them out of what it ships.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from node_agent.client import ApiError, ApiUnavailable, ControlPlaneClient
from node_agent.models import Assignment

SHOWN_NAMES = 5
"""Missing secrets a failure message names, at most."""


@dataclass(frozen=True)
class Failure:
    code: str
    message: str


@dataclass(frozen=True)
class JobSecrets:
    """Each ``--secret`` variable and its value, or why the values could not be had."""

    values: Mapping[str, str] = field(default_factory=dict, repr=False)
    failure: Failure | None = None

    @property
    def masked(self) -> tuple[str, ...]:
        """What the log shipper must never let through."""
        return tuple(self.values.values())


def fetch_secrets(client: ControlPlaneClient, assignment: Assignment) -> JobSecrets:
    wanted = dict(assignment.spec.secrets)
    if not wanted:
        return JobSecrets()
    try:
        values = client.job_secrets(assignment.job_id, assignment.node_index)
    except ApiError as error:
        if error.status == 404 and error.slug == "secret-not-found":
            said = error.problem.get("missing")
            names = [str(name) for name in said] if isinstance(said, list) else []
            return JobSecrets(failure=not_found(names or sorted(set(wanted.values())), wanted))
        return JobSecrets(failure=unavailable(str(error)))
    except ApiUnavailable as error:
        return JobSecrets(failure=unavailable(str(error)))
    absent = sorted({name for variable, name in wanted.items() if variable not in values})
    if absent:
        return JobSecrets(failure=not_found(absent, wanted))
    return JobSecrets({variable: values[variable] for variable in wanted})


def not_found(names: list[str], wanted: Mapping[str, str]) -> Failure:
    """``secret_not_found``: which names (and for which variables), and what to do."""
    shown = [
        f"'{name}' (for {', '.join(sorted(v for v, n in wanted.items() if n == name)) or '?'})"
        for name in names[:SHOWN_NAMES]
    ]  # fmt: skip
    more = f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else ""
    return Failure(
        "secret_not_found",
        f"the job's owner has no secret {', '.join(shown)}{more}: create it with "
        f"`flexai secret create {names[0]}` and run the job again",
    )


def unavailable(reason: str) -> Failure:
    return Failure(
        "secret_unavailable",
        f"the job's secrets could not be fetched from the control plane ({reason[:500]}); "
        "run the job again",
    )
