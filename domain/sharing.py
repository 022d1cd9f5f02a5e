"""What a job asks of a shared fleet: its priority, whether it may be preempted, how often it
is retried. These live in the job's spec (:class:`common.job_spec.JobSpec` holds their defaults
and what they say: its rank, whether it may be preempted); here, their bounds, and what failures
a job is retried on.

Imports: domain.values and domain.failures only (and the wire contract's limits and job spec).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.contract import MAX_RETRIES, MAX_RETRY_CODES, PRIORITIES
from common.job_spec import JobSpec
from domain.failures import is_infrastructure
from domain.values import InvalidValue, check_int

EXITED = "entry_point_failed"
"""The code of an entry point's own exit: the only failure an exit code is retried on (the
time limit's SIGTERM is not, whatever code it ends with)."""


def check_sharing(spec: Mapping[str, Any]) -> None:
    """The sharing fields of a spec within their bounds."""
    priority = spec.get("priority")
    if priority is not None and priority not in PRIORITIES:
        raise InvalidValue("priority", f"must be one of {', '.join(PRIORITIES)}, "
                           f"not {str(priority)[:40]!r}")  # fmt: skip
    value = spec.get("preemptible")
    if value is not None and not isinstance(value, bool):
        raise InvalidValue("preemptible", f"must be true or false, not {value!r:.40}")
    if spec.get("max_retries") is not None:
        check_int(spec["max_retries"], "max_retries", 0, MAX_RETRIES)
    codes = spec.get("retry_on_exit_codes")
    if codes is None:
        return
    if not isinstance(codes, list) or len(codes) > MAX_RETRY_CODES:
        raise InvalidValue("retry_on_exit_codes",
                           f"must be a list of at most {MAX_RETRY_CODES} exit codes")  # fmt: skip
    for index, code in enumerate(codes):
        check_int(code, f"retry_on_exit_codes[{index}]", 1, 255)
    if len(set(codes)) != len(codes):
        raise InvalidValue("retry_on_exit_codes", "names an exit code twice")


def retry_cause(spec: JobSpec, code: str, exit_code: int | None) -> str | None:
    """Why an attempt that ended so is retried (``node_lost``, ``exit code 137``): every
    failure of the infrastructure (:mod:`domain.failures`), and an entry point's exit with a
    code the job names; None: the job fails for good (what retries it has left is the job's
    to count)."""
    if is_infrastructure(code):
        return code
    if code == EXITED and exit_code is not None and exit_code in spec.retry_codes:
        return f"exit code {exit_code}"
    return None
