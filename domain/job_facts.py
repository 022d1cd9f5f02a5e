"""The facts a job's commands record, checked against the bounds of :mod:`domain.values`: a
value out of them is refused (InvalidJobSpec naming the field) before anything is recorded."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import domain.specs as specs
import domain.values as values
from common.job_spec import JobSpec
from domain.errors import InvalidJobSpec, checked
from domain.sharing import check_sharing

SESSION_ID = re.compile(r"[a-z0-9]{16,64}")
SESSION_ID_RULE = "16 to 64 lower-case letters and digits"


GivenSpec = JobSpec | Mapping[str, Any]
"""A spec as a submission gives it: typed (the API's), or as a dictionary (as stored)."""


def stored_spec(spec: GivenSpec) -> dict[str, Any]:
    """The dictionary the ``Submitted`` event stores: a typed spec's, or the one given."""
    return spec.to_dict() if isinstance(spec, JobSpec) else dict(spec)


def check_spec(spec: Mapping[str, Any]) -> None:
    if not spec.get("repository_url"):
        raise InvalidJobSpec("a repository URL is required (--repository-url)", "repository_url")
    if not spec.get("entry_point"):
        raise InvalidJobSpec("an entry point is required (after `--`)", "entry_point")
    checked(specs.check_spec, spec)
    checked(check_sharing, spec)


def end_moment(ended_at: Any) -> str | None:
    """When a node says its entry point ended, as UTC ISO 8601 text; a moment after now (a
    node's clock ahead) is taken as now. None when it did not say."""
    if ended_at is None:
        return None
    moment = checked(values.check_moment, ended_at, "ended_at")
    return min(moment, datetime.now(UTC)).astimezone(UTC).isoformat(timespec="microseconds")


def check_failure(code: str, message: str, exit_code: int | None = None) -> None:
    """A failure's code and message, and the entry point's exit code where it ended (a time
    limit's SIGTERM: 143, or what its handler exited with)."""
    checked(values.check_failure_code, code)
    checked(values.check_message, message)
    if exit_code is not None:
        checked(values.check_exit_code, exit_code)


def placed_nodes(name: str, nnodes: int, nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``{node_id, node_name, address}`` of each node of job ``name``, one per node index."""
    if len(nodes) != nnodes or len({n["node_id"] for n in nodes}) != len(nodes):
        raise InvalidJobSpec(
            f"job '{name}' runs on {nnodes} distinct node(s), not {len(nodes)}", "nodes"
        )
    for node in nodes:
        checked(values.check_node_name, node["node_name"], "node_name")
        if node.get("address") is not None:
            checked(values.check_address, node["address"])
    return [{key: node.get(key) for key in ("node_id", "node_name", "address")}
            for node in nodes]  # fmt: skip


def check_allocations(allocations: list[list[int]], placements: list[Any]) -> None:
    """The accelerator indices allocated on each node of a job placed on ``placements``."""
    for indices in allocations:
        checked(values.check_accelerators, indices)
    if placements and len(allocations) != len(placements):
        raise InvalidJobSpec("an allocation is needed for every node", "accelerators")


def check_log_loss(message: str, offset: int, written: int) -> None:
    checked(values.check_message, message)
    checked(values.check_int, offset, "offset", 0, values.BIGINT_MAX)
    checked(values.check_int, written, "written", offset, values.BIGINT_MAX)


def clean_checkpoint(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint as it is recorded: its name and node checked, its archive's size and
    SHA-256 (when given) checked, what its files claim of themselves kept only where it fits."""
    checked(values.check_checkpoint_name, checkpoint["name"], "checkpoint name")
    checked(values.check_optional, checkpoint.get("node"), "node", values.MAX_LABEL)
    if checkpoint.get("archive_size") is not None or checkpoint.get("sha256") is not None:
        check_archive(checkpoint.get("archive_size"), checkpoint.get("sha256"))
    return {**checkpoint, **values.clean_checkpoint_facts(checkpoint)}


def check_archive(size: Any, sha256: Any) -> None:
    """An artifact's archive as the ledger records it: its bytes and their SHA-256."""
    checked(values.check_int, size, "size", 0, values.BIGINT_MAX)
    checked(values.check_content_hash, sha256, "sha256")


def check_output(nnodes: int, node_index: int, size: int, sha256: str) -> None:
    checked(values.check_int, node_index, "node_index", 0, max(nnodes, 1) - 1)
    check_archive(size, sha256)


def check_debug_session(session_id: str, key_fingerprint: str, relay: str | None) -> None:
    checked(values.check_pattern, session_id, "session_id", SESSION_ID, SESSION_ID_RULE)
    checked(values.check_text, key_fingerprint, "key_fingerprint", max_length=values.MAX_LABEL)
    checked(values.check_optional, relay, "relay", values.MAX_LABEL)
