"""What a job asks of the shared fleet (``JobCreate``'s priority, preemptible and retry fields,
bounded as :mod:`domain.sharing` bounds them), and the admin's bodies for a user's quota and
leave to use ``priority: high``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from common.contract import MAX_RETRIES, MAX_RETRY_CODES

STRICT = ConfigDict(extra="forbid", strict=True)
"""The config of an admin's or a token's body: no unknown field, no value taken for another
type (``"yes"`` is no ``true``)."""


def _distinct(codes: list[int]) -> list[int]:
    twice = sorted({code for code in codes if codes.count(code) > 1})
    if twice:
        raise ValueError(f"names the exit code {twice[0]} twice: give each code once")
    return codes


Priority = Annotated[
    Literal["low", "normal", "high"],
    Field(description="high starts before normal before low for the same accelerators; high "
          "is for admins and the users an admin allows it"),
]  # fmt: skip
Preemptible = Annotated[
    bool | None,
    Field(description="whether a high-priority job may stop this one to take its "
          "accelerators (it resumes later from its last checkpoint); default: true for low "
          "priority, false otherwise"),
]  # fmt: skip
MaxRetries = Annotated[
    int,
    Field(ge=0, le=MAX_RETRIES, description="how many times the job runs again (from its last "
          "checkpoint) after its node is lost, or after it ends with a retry_on_exit_codes code"),
]  # fmt: skip
RetryExitCodes = Annotated[
    list[Annotated[int, Field(ge=1, le=255)]],
    Field(max_length=MAX_RETRY_CODES, description="exit codes of the entry point that count "
          "as a retry (e.g. 137, 143) while max_retries allows"),
    AfterValidator(_distinct),
]  # fmt: skip


class QuotaSet(BaseModel):
    model_config = STRICT

    accels: int | None = Field(ge=0, le=2**31 - 1)
    """The most accelerators the user's jobs may hold running at once; null: no quota."""


class QuotaPublic(BaseModel):
    user: str
    accels: int | None


class HighPrioritySet(BaseModel):
    model_config = STRICT

    allowed: bool
    """Whether the user may submit ``priority: high`` jobs (admins always may)."""


class HighPriorityPublic(BaseModel):
    user: str
    allowed: bool


class JobAttemptsPublic(BaseModel):
    """A job's attempts, as ``inspect`` shows them (jobs from before attempts have one)."""

    attempt: int = 1
    """The current attempt, from 1: one more each time the job is preempted or retried."""
    attempts: list[dict[str, Any]] = Field(default_factory=list)
    """Each attempt that started (or, retried, was placed): attempt, nodes, started_at,
    ended_at, cause."""
    retries_left: int = 0
    """How many more times the job is run again after a failure it retries on (every failure
    of the infrastructure, and its ``retry_on_exit_codes``): ``max_retries`` less those spent."""
    preemption: dict[str, Any] | None = None
    """While a higher-priority job waits for this one's accelerators: requested_at, by_job,
    by_owner."""
