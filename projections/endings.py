"""How a job's end folds into its view document: a node's exit code, a failure (with whose
it was: :mod:`domain.failures`), a stop asked, failed or done."""

from __future__ import annotations

from typing import Any

from domain.failures import failure_kind


def exited(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    index = facts.get("node_index")
    if index is not None and index < len(document["placements"]):
        document["placements"][index]["exit_code"] = facts.get("exit_code")


def failed(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    code = facts.get("code", "stop_failed")
    document["failure"] = {"code": code, "message": facts["message"]}
    if code != "stop_failed":  # a stop that failed is no attempt's failure: it has no kind
        document["failure"]["kind"] = failure_kind(code).value
    if facts.get("exit_code") is not None:
        exited(document, facts, at)


def stop_requested(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    document["stop"] = {
        "requested_at": at, "from_status": facts["stopping_from"], "requested_by": facts["by"],
        "accelerators_allocated": bool(document.get("accelerators")),
    }  # fmt: skip


def stop_failed(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    failed(document, facts, at)
    document["stop"] = {**(document["stop"] or {}), "reason": facts["message"]}


def stopped(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    released = facts.get("accelerators_released", [])
    document["stop"] = {
        **(document["stop"] or {}),
        "accelerators_allocated": bool(released),
        "accelerators_released": released,
        "exit_code": facts.get("exit_code"),
    }
    document["accelerators"] = []
