"""The ``inspect`` view of what a job asks of a shared fleet (priority, preemptible, retries)
and of its attempts and preemption. Written for documents of every age: a key an older server
or job lacks is left out, never an error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cli.output.formats import format_cell, format_timestamp
from cli.output.tables import render_table
from common.job_spec import DEFAULT_PRIORITY, default_preemptible
from common.wording import retries_line

ATTEMPT_COLUMNS = ("ATTEMPT", "NODES", "STARTED", "ENDED", "CAUSE")


def sharing_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Its priority always (a spec without one has the default, ``normal``); preemptible
    where the spec says so or its priority makes it so (low jobs are preemptible unless they
    say not: :mod:`common.job_spec` holds these defaults); its retries where it has any."""
    priority = str(spec.get("priority") or DEFAULT_PRIORITY)
    shown: dict[str, Any] = {"priority": priority}
    preemptible = spec.get("preemptible")
    if preemptible is not None or default_preemptible(priority):
        shown["preemptible"] = bool(default_preemptible(priority) if preemptible is None
                                    else preemptible)  # fmt: skip
    if spec.get("max_retries"):
        shown["max retries"] = spec["max_retries"]
        if spec.get("retry_on_exit_codes"):
            shown["retry on exit codes"] = format_cell(spec["retry_on_exit_codes"])
    return shown


def max_retries(spec: Mapping[str, Any]) -> int:
    value = spec.get("max_retries")
    return value if isinstance(value, int) else 0


def retries_left(job: Mapping[str, Any]) -> int:
    """What the job has left (an older server's answer without it: what it asked for)."""
    left = job.get("retries_left")
    return left if isinstance(left, int) else max_retries(job.get("spec") or {})


def attempts_detail(job: Mapping[str, Any]) -> dict[str, Any]:
    """``attempt``, ``retries`` (spent and left), ``attempts`` (a small table) and
    ``preemption``, where the job has them."""
    shown: dict[str, Any] = {}
    if isinstance(job.get("attempt"), int):
        shown["attempt"] = job["attempt"]
    retries = retries_line(max_retries(job.get("spec") or {}), retries_left(job))
    if retries:
        shown["retries"] = retries
    attempts = [a for a in job.get("attempts") or [] if isinstance(a, Mapping)]
    if attempts:
        rows = [(a.get("attempt"), _nodes(a.get("nodes")), format_timestamp(a.get("started_at")),
                 format_timestamp(a.get("ended_at")), a.get("cause"))
                for a in attempts]  # fmt: skip
        shown["attempts"] = render_table(ATTEMPT_COLUMNS, rows).splitlines()
    preemption = job.get("preemption")
    if isinstance(preemption, Mapping) and preemption:
        shown["preemption"] = {
            "requested": format_timestamp(preemption.get("requested_at")),
            "by job": preemption.get("by_job"),
            "by owner": preemption.get("by_owner"),
        }
    return shown


def _nodes(nodes: Any) -> str:
    """Node names, from a list of names or of placements (``{"node": ...}``)."""
    if isinstance(nodes, list):
        return format_cell([n.get("node") or n.get("name") if isinstance(n, Mapping) else n
                            for n in nodes])  # fmt: skip
    return format_cell(nodes)
