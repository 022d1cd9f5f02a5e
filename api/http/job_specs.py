"""A job's body as the spec that the job specs' service (:mod:`api.job_specs`) records, what it
refuses answered as a problem. Used by single and list submissions alike (``routes/jobs.py``,
``routes/submissions.py``)."""

from __future__ import annotations

from typing import Any

from api.http.problems import Problem
from api.http.schemas import JobCreate
from api.job_specs import JobSpecs, SpecRefused
from common.job_spec import JobSpec


def recorded_spec(specs: JobSpecs, body: JobCreate) -> JobSpec:
    """The spec recorded for the job ``body`` asks for (its name aside)."""
    try:
        return specs.recorded(JobSpec.from_dict(body.model_dump(exclude={"name"})))
    except SpecRefused as refused:
        where: dict[str, Any] = {"field": refused.field} if refused.field else {}
        raise Problem(refused.status, refused.slug, refused.title, refused.detail,
                      **where) from None  # fmt: skip
