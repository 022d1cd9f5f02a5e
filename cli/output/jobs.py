"""The ``inspect`` view of a job: its detail arranged for people, why it waits, its history."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from cli.output.datasets import dataset_pins
from cli.output.formats import (
    format_by,
    format_cell,
    format_duration,
    format_facts,
    format_seconds,
    format_size,
    format_timestamp,
)
from cli.output.sharing import attempts_detail, max_retries, retries_left, sharing_spec
from cli.output.tables import render_table
from cli.output.yaml_like import render_yaml
from common.wording import asked_for, node_lines, place_in_line, whose_failure


def render_job(job: Mapping[str, Any]) -> str:
    """The ``inspect`` view of a JobPublic answer."""
    return render_yaml(job_detail(job))


def job_detail(job: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a JobPublic answer, arranged for the ``inspect`` view."""
    spec: Mapping[str, Any] = job.get("spec") or {}
    entry_point = spec.get("entry_point")
    if isinstance(entry_point, list):
        entry_point = shlex.join(str(part) for part in entry_point)
    detail: dict[str, Any] = {"name": job.get("name")}
    if job.get("id"):
        detail["id"] = job["id"]
    detail["status"] = job.get("status")
    detail["owner"] = job.get("owner")
    failure = job.get("failure")
    if failure:
        detail["failure"] = {"code": failure.get("code"), "message": failure.get("message")}
        whose = whose_failure(failure, max_retries(spec), retries_left(job))
        if whose:
            detail["failure"]["kind"] = whose
    stop = job.get("stop")
    if stop:
        detail["stop"] = {
            "requested": format_timestamp(stop.get("requested_at")),
            "by": format_by(stop.get("requested_by")),
            "from status": stop.get("from_status"),
            "accelerators allocated": stop.get("accelerators_allocated"),
        }
        if stop.get("reason"):  # why the stop failed
            detail["stop"]["reason"] = stop["reason"]
        if stop.get("exit_code") is not None:  # the entry point ended as the stop came
            detail["stop"]["exit code"] = stop["exit_code"]
    waiting = job.get("waiting")
    if waiting:
        detail["waiting"] = waiting_detail(waiting)
    logs = job.get("logs_unavailable")
    if logs:
        detail["logs"] = {
            "unavailable": f"stored up to byte {logs.get('offset')} of {logs.get('written')}",
            "reason": logs.get("message"),
            "since": format_timestamp(logs.get("at")),
        }
    detail["spec"] = {
        "repository": {
            "url": spec.get("repository_url"),
            "revision": spec.get("repository_revision") or "(default branch)",
            "commit": job.get("commit"),
        },
        "requirements": spec.get("requirements_path"),
        "accels": spec.get("accels", job.get("accels")),
        "nodes": spec.get("nodes", job.get("nodes")),
        "entry point": entry_point,
        "env": dict(spec.get("env") or {}),
        "secrets": dict(spec.get("secrets") or {}),
        "datasets": dataset_pins(spec),
        "checkpoint": spec.get("checkpoint"),
        "time limit": format_seconds(spec.get("time_limit_s")),
        "stop grace": format_seconds(spec.get("stop_grace_s")),
        **sharing_spec(spec),
    }
    if spec.get("runtime"):
        detail["spec"]["runtime"] = runtime_detail(job, spec)
    detail.update(attempts_detail(job))
    placements = job.get("placements") or []
    if len(placements) > 1:
        detail["nodes"] = [_placement_line(p) for p in placements]
    else:
        detail["node"] = job.get("node")
    detail["accelerators"] = format_cell(job.get("accelerators"))
    outputs = job.get("outputs") or []
    if outputs:
        detail["outputs"] = [f"output_{o.get('node_index')}.zip: {format_size(o.get('size'))}, "
                             f"SHA-256 {o.get('sha256')}" for o in outputs]  # fmt: skip
    detail["timestamps"] = {
        "created": format_timestamp(job.get("created_at")),
        "started": format_timestamp(job.get("started_at")),
        "ended": format_timestamp(job.get("ended_at")),
        "updated": format_timestamp(job.get("updated_at")),
        "duration": format_duration(job.get("duration_seconds")),
    }
    detail["history"] = history_lines(job.get("history") or [])
    return detail


def runtime_detail(job: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The runtime a job runs in: its image as pinned at submission, the digest its node
    pulled (once built), and the secret its registry was logged in to with."""
    shown = {"name": spec.get("runtime"), "image": spec.get("runtime_image"),
             "digest": job.get("image_digest") or "(none reported)"}  # fmt: skip
    if spec.get("registry_secret"):
        shown["registry secret"] = f"{spec.get('registry_secret_owner')}/{spec['registry_secret']}"
    return shown


def _placement_line(placement: Mapping[str, Any]) -> str:
    parts = [f"{placement.get('index')}: {placement.get('node')}"]
    if placement.get("address"):
        parts[0] += f" ({placement['address']})"
    if placement.get("accelerators"):
        parts.append(f"accelerators {format_cell(placement['accelerators'])}")
    if placement.get("exit_code") is not None:
        parts.append(f"exit code {placement['exit_code']}")
    return ", ".join(parts)


def waiting_detail(waiting: Mapping[str, Any]) -> dict[str, Any]:
    """Why a job waits: what it asked for, each node it waits for, its place in line."""
    shown: dict[str, Any] = {"reason": waiting.get("reason"), "asked for": asked_for(waiting)}
    shown["nodes"] = node_lines(waiting, format_timestamp, ",")
    if (place := place_in_line(waiting)) is not None:
        shown["place in line"] = place
    if waiting.get("order"):  # why it is at that place: priority, then fair share
        shown["order"] = waiting["order"]
    return shown


def history_lines(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """One aligned line per event: time, status, event, who, key facts."""
    rows = [
        (
            format_timestamp(entry.get("at")),
            entry.get("status"),
            entry.get("event"),
            f"by {format_by(entry.get('by'))}",
        )
        for entry in history
    ]
    facts = [format_facts(entry.get("facts")) for entry in history]
    lines = render_table(None, rows).splitlines() if rows else []
    width = max((len(line) for line in lines), default=0)
    return [
        f"{line.ljust(width)}  {fact}".rstrip() for line, fact in zip(lines, facts, strict=True)
    ]
