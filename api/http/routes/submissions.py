"""Many jobs in one ``POST /v1/jobs`` (a sweep): each job checked and answered alone, every
accepted one recorded in one save (``TrainingJobs.submit_many``).

The answer is 207 Multi-Status whatever the outcome: one result per job, in the order sent,
each with its own status: 201 and the job, or the problem that refused that job alone (an
invalid spec, a name taken, a checkpoint not found). A list that is empty or longer than
``MAX_SUBMISSIONS`` is refused as a whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from api.http.deps import tell_position
from api.http.job_specs import recorded_spec
from api.http.problems import Problem, from_domain, invalid_values
from api.http.schemas import JobCreate, JobPublic
from api.http.submission_schemas import SubmissionResult, SubmissionResults
from api.job_specs import JobSpecs
from api.services import Services
from common.contract import MAX_SUBMISSIONS
from common.job_spec import JobSpec
from domain.actors import user
from domain.outcomes import Outcome

Present = Callable[[dict[str, Any]], JobPublic]
"""A job's document of the views as a single submission's answer shows it."""
PATH = "/v1/jobs"


def submit_jobs(
    items: Sequence[Any], services: Services, owner: str, present: Present
) -> JSONResponse:
    """Check each job as a single submission is checked, record the accepted ones in one
    save, and answer each in its place."""
    _check_count(len(items))
    specs = JobSpecs(services, owner)
    problems: list[Problem | None] = []
    accepted: list[tuple[str, JobSpec]] = []
    for item in items:
        try:
            body = JobCreate.model_validate(item, from_attributes=True)
            accepted.append((body.name, recorded_spec(specs, body)))
            problems.append(None)
        except (ValidationError, Problem) as refused:
            problems.append(refused if isinstance(refused, Problem) else _invalid(refused))
    leader = services.scheduler_leader.is_set()  # as for one job: scheduling starts at once
    outcomes = iter(services.jobs.submit_many(owner, accepted, by=user(owner), schedule=leader))
    results = [problem or _answered(next(outcomes)) for problem in problems]
    created = [result for result in results if isinstance(result, Outcome)]
    position = max((outcome.position or 0 for outcome in created), default=0) or None
    services.projector.wait(position)
    if created:
        services.scheduler_wakeup.set()
    answer = _answer(services, results, present)
    reply = JSONResponse(answer.model_dump(mode="json"), status_code=207)
    tell_position(reply, position)
    return reply


def _check_count(count: int) -> None:
    if count == 0:
        raise Problem(422, "invalid-request", "No jobs",
                      "the list of jobs is empty: send a job (an object) or a list of 1 to "
                      f"{MAX_SUBMISSIONS} jobs", field="body")  # fmt: skip
    if count > MAX_SUBMISSIONS:
        raise Problem(
            413, "too-many-jobs", "Too many jobs",
            f"the list holds {count} jobs; at most {MAX_SUBMISSIONS} are accepted in one "
            "request: send them in several lists (`flexai training run --sweep` does)",
            limit=MAX_SUBMISSIONS,
        )  # fmt: skip


def _answered(outcome: Outcome | Exception) -> Outcome | Problem:
    return outcome if isinstance(outcome, Outcome) else from_domain(outcome)


def _invalid(error: ValidationError) -> Problem:
    """The problem a single submission's invalid body gets, for one job of the list."""
    return invalid_values(error.errors(), "Invalid job", "the job", source=False)


def _answer(
    services: Services, results: list[Outcome | Problem], present: Present
) -> SubmissionResults:
    documents = services.queries.jobs([str(result.job_id) for result in results
                                       if isinstance(result, Outcome)])  # fmt: skip
    answered = [
        SubmissionResult(status=result.status, problem=_details(result))
        if isinstance(result, Problem)  # else the views reached the job's position:
        else SubmissionResult(status=201, job=present(documents[str(result.job_id)]))
        for result in results
    ]  # fmt: skip
    created = sum(result.job is not None for result in answered)
    return SubmissionResults(results=answered, created=created, failed=len(answered) - created)


def _details(problem: Problem) -> Any:
    """The problem as a single request's answer holds it (RFC 9457)."""
    return {
        "type": f"https://flexai.dev/problems/{problem.slug}", "title": problem.title,
        "status": problem.status, "detail": problem.detail, "instance": PATH, **problem.extra,
    }  # fmt: skip
