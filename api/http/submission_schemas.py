"""The bodies of many jobs in one ``POST /v1/jobs``: ``JobSubmissions`` (one job, or a list),
``SubmissionResults`` (the 207 answer to a list)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, PlainValidator

from api.http.problems import ProblemDetails
from api.http.schemas import JobCreate, JobPublic
from common.contract import MAX_SUBMISSIONS


def _one_or_many(value: Any) -> Any:
    """One job is checked as ever (a 422 for the request); a list is left for the route to
    check job by job, so that an invalid job fails alone."""
    if isinstance(value, list):
        return value
    return JobCreate.model_validate(value, from_attributes=True)


JobSubmissions = Annotated[
    JobCreate | list[Any],
    PlainValidator(_one_or_many, json_schema_input_type=JobCreate | Annotated[
        list[JobCreate], Field(min_length=1, max_length=MAX_SUBMISSIONS)]),
]  # fmt: skip


class SubmissionResult(BaseModel):
    """One job of a list: 201 and the job (as a single submission's answer), or the status
    and the problem that refused it alone."""

    status: int
    job: JobPublic | None = None
    problem: ProblemDetails | None = None


class SubmissionResults(BaseModel):
    """The answer (207) to a list of jobs: one result per job, in the order sent."""

    results: list[SubmissionResult]
    created: int
    failed: int
