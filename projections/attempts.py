"""A job's attempts in its document: which attempt runs, each attempt's nodes, start, end and
cause, the preemption asked of it, and the checkpoint a next attempt resumes from.

Documents folded before attempts existed lack these keys; readers use ``.get`` with the
defaults of a first attempt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.attempts import current_attempt


def open_attempt(document: dict[str, Any], at: str) -> None:
    """The job started (again): its current attempt runs from ``at`` on its nodes."""
    attempts = document.setdefault("attempts", [])
    attempt = current_attempt(document)
    if attempts and attempts[-1]["attempt"] == attempt:
        return
    nodes = [placement["node"] for placement in document.get("placements") or []]
    attempts.append({"attempt": attempt, "nodes": nodes, "started_at": at, "ended_at": None,
                     "cause": None})  # fmt: skip


def close_attempt(document: dict[str, Any], at: str, cause: str) -> None:
    """The current attempt ended at ``at``, for ``cause`` (a status, ``preempted by ...``,
    ``node_lost``, ``exit code 137``)."""
    attempts = document.get("attempts") or []
    if attempts and attempts[-1]["ended_at"] is None:
        attempts[-1].update(ended_at=at, cause=cause)


def _preemption_requested(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    document["preemption"] = {"requested_at": at, "by_job": facts["for_job"],
                              "by_owner": facts["for_owner"]}  # fmt: skip


def _node_yielded(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    index = facts.get("node_index")
    if index is not None and index < len(document["placements"]):
        document["placements"][index]["exit_code"] = facts.get("exit_code")


def _preempted(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    close_attempt(document, at, f"preempted by {facts['for_owner']}'s job {facts['for_job']}")
    document["attempt"] = int(facts["attempt"]) + 1
    document["preemption"] = None
    document["accelerators"] = []
    for placement in document["placements"]:
        placement.update(accelerators=[], exit_code=None)


def _retried(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    """Retried while it ran, or (its agent failed) while it built or waited: an attempt that
    never started is listed too, with no start."""
    attempts = document.setdefault("attempts", [])
    attempt = int(facts["attempt"])
    if not attempts or attempts[-1]["attempt"] != attempt:
        nodes = [placement["node"] for placement in document.get("placements") or []]
        attempts.append({"attempt": attempt, "nodes": nodes, "started_at": None,
                         "ended_at": None, "cause": None})  # fmt: skip
    close_attempt(document, at, str(facts["cause"]))
    document["retries_left"] = int(facts["retries_left"])
    document["attempt"] = attempt + 1
    document["preemption"] = None
    document["node"] = document["node_id"] = None
    document["accelerators"], document["placements"] = [], []
    document["rendezvous"], document["waiting_on"] = None, []


def _checkpoint_recorded(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    document["last_checkpoint_id"] = facts["checkpoint"]["id"]


ATTEMPT_FOLDERS: dict[str, Callable[[dict[str, Any], dict[str, Any], str], None]] = {
    "PreemptionRequested": _preemption_requested,
    "NodeYielded": _node_yielded,
    "Preempted": _preempted,
    "Retried": _retried,
    "CheckpointRecorded": _checkpoint_recorded,
}
