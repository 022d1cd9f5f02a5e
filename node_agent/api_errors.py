"""What the agent's client raises: the control plane's refusals, and its absence."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ApiError(Exception):
    """The control plane answered with a problem (4xx) that a retry would not change."""

    def __init__(self, status: int, problem: Mapping[str, Any]) -> None:
        self.status = status
        self.problem = dict(problem)
        detail = problem.get("detail") or problem.get("title") or "no detail given"
        super().__init__(f"{status} {self.slug or 'error'}: {detail}")

    @property
    def slug(self) -> str:
        return slug(self.problem)


class NodeTaken(ApiError):
    """Another live agent holds this node name (409 ``node-taken``)."""


class ArtifactAltered(ApiError):
    """A downloaded artifact's bytes are not the ones the ledger recorded (nothing was kept)."""


class ApiUnavailable(Exception):
    """The control plane could not be reached (or kept failing) for the whole retry budget.

    ``retry_after``: the seconds the server asked to wait (its last ``Retry-After``), if any.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def slug(problem: Mapping[str, Any]) -> str:
    """A problem's slug: the last segment of its ``type``."""
    return str(problem.get("type", "")).rsplit("/", 1)[-1]
