"""How values and a waiting job's reasons read, the same in the CLI and the web console."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

EMPTY = "-"


def plain(value: Any, separator: str = ", ") -> str:
    """One value as text: ``-`` for nothing, yes/no, lists joined, mappings as JSON."""
    if value is None or value == "" or value == [] or value == {}:
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, ".6g")
    if isinstance(value, list | tuple):
        return separator.join(plain(item, separator) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(separator, ": " if separator == ", " else ":"),
                          ensure_ascii=False, default=str)  # fmt: skip
    return str(value)


def asked_for(waiting: Mapping[str, Any]) -> str:
    asked = waiting.get("asked") or {}
    return f"{asked.get('accels')} accelerator(s) on each of {asked.get('nodes')} node(s)"


def node_lines(
    waiting: Mapping[str, Any], moment: Callable[[Any], str], separator: str = ", "
) -> list[str]:
    """One line per node a job waits for: what it has free and who holds the rest, or whether
    it is live."""
    lines = []
    for node in waiting.get("nodes") or []:
        if "free" in node:
            held = ", ".join(f"{holder['job']} {plain(holder['accelerators'], separator)}"
                             for holder in node.get("held_by") or []) or "nobody"  # fmt: skip
            line = f"{node['node']}: {node['free']} of {node['accels']} free; held by {held}"
            if node.get("ahead"):
                line += f"; ahead in line: {', '.join(node['ahead'])}"
        else:
            state = "live" if node.get("alive") else (
                f"offline, last heard of {moment(node.get('last_heard'))}")
            line = f"{node['node']}: {node['accels']} accelerators, {state}"
        lines.append(line)
    return lines


def place_in_line(waiting: Mapping[str, Any]) -> str | None:
    if waiting.get("place") is None:
        return None
    return f"{waiting['place']}" + (f" of {waiting['of']}" if waiting.get("of") else "")


def whose_failure(failure: Mapping[str, Any], max_retries: int, retries_left: int) -> str | None:
    """Whose a job's failure was and what its retries did, in one line (None for a failure
    without a kind: a stop that failed, or a view folded before kinds)."""
    kind = failure.get("kind")
    if kind == "user":
        return "the job's own (its code or its spec)"
    if kind != "infrastructure":
        return None
    if max_retries == 0:
        return ("the infrastructure's, not the job's; it was run without retries: with "
                "--max-retries N such a failure runs it again from its last checkpoint")
    if retries_left:  # a failure recorded before every infrastructure failure was retried
        return f"the infrastructure's, not the job's ({retries_left} retries were left)"
    return f"the infrastructure's, not the job's, after all {max_retries} retries were spent"


def retries_line(max_retries: int, retries_left: int) -> str | None:
    """How many retries a job spent and has left (None: it asked for none)."""
    if max_retries <= 0:
        return None
    spent = max_retries - retries_left
    return f"{spent} of {max_retries} spent, {retries_left} left"
