"""Everything the CLI prints for people: tables, the YAML-like inspect view, JSON.

Only the standard library here, so that importing it costs nothing.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

EMPTY = "-"

JOB_COLUMNS = ("NAME", "STATUS", "ACCELS", "NODES", "CREATED", "DURATION")
CHECKPOINT_COLUMNS = (
    "ID",
    "NAME",
    "NODE",
    "STEP",
    "TRAIN LOSS",
    "EVAL LOSS",
    "MODEL",
    "VERSION",
    "INFERENCE READY",
    "TIMESTAMP",
)


# --- scalars -------------------------------------------------------------------------------


def format_duration(seconds: float | int | None) -> str:
    """``42s``, ``1m 05s``, ``2h 03m 04s``, ``3d 04h 05m``; ``-`` when unknown."""
    if seconds is None:
        return EMPTY
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def format_timestamp(value: str | None) -> str:
    """An ISO 8601 UTC timestamp shown in local time, to the second; ``-`` when absent."""
    if not value:
        return EMPTY
    try:
        moment = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return str(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def format_size(size: int | None) -> str:
    """``512 B``, ``1.5 KiB``, ``12.3 MiB``."""
    if size is None:
        return EMPTY
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - the loop always returns


def format_cell(value: Any) -> str:
    """One table cell: ``-`` for nothing, ``yes``/``no`` for booleans, lists comma-joined."""
    if value is None or value == "" or value == [] or value == {}:
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, ".6g")
    if isinstance(value, list | tuple):
        return ",".join(format_cell(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


# --- tables --------------------------------------------------------------------------------


def render_table(headers: Sequence[str] | None, rows: Iterable[Sequence[Any]]) -> str:
    """Columns aligned with two spaces between them, the header (if any) first."""
    lines = [[format_cell(cell) for cell in row] for row in rows]
    if headers is not None:
        lines.insert(0, [str(header) for header in headers])
    if not lines:
        return ""
    count = max(len(line) for line in lines)
    widths = [max(len(line[i]) if i < len(line) else 0 for line in lines) for i in range(count)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in lines
    )


REASON_WIDTH = 70


def render_jobs_table(jobs: Sequence[Mapping[str, Any]], *, owners: bool = False) -> str:
    """The ``list`` table, in the order the server gave (newest first); a REASON column says
    why waiting jobs wait, when some do; with ``owners``, an OWNER column first."""
    if owners:
        inner = render_jobs_table(jobs).splitlines()
        width = max([len("OWNER"), *(len(str(job.get("owner") or EMPTY)) for job in jobs)])
        cells = ["OWNER", *(str(job.get("owner") or EMPTY) for job in jobs)]
        lines = zip(cells, inner, strict=True)
        return "\n".join(f"{cell:<{width}}  {line}".rstrip() for cell, line in lines)
    rows = [
        (
            job.get("name"),
            job.get("status"),
            job.get("accels"),
            job.get("nodes"),
            format_timestamp(job.get("created_at")),
            format_duration(job.get("duration_seconds")),
        )
        for job in jobs
    ]
    if not any(job.get("reason") for job in jobs):
        return render_table(JOB_COLUMNS, rows)
    reasons = [_shorten(job.get("reason")) for job in jobs]
    with_reasons = [(*row, reason) for row, reason in zip(rows, reasons, strict=True)]
    return render_table((*JOB_COLUMNS, "REASON"), with_reasons)


def _shorten(text: str | None) -> str | None:
    if not text or len(text) <= REASON_WIDTH:
        return text
    return text[: REASON_WIDTH - 1] + "\u2026"


def render_checkpoints_table(checkpoints: Sequence[Mapping[str, Any]]) -> str:
    """The ``checkpoints`` table; empty cells are ``-``."""
    rows = [
        (
            checkpoint.get("id"),
            checkpoint.get("name"),
            checkpoint.get("node"),
            checkpoint.get("step"),
            checkpoint.get("train_loss"),
            checkpoint.get("eval_loss"),
            checkpoint.get("model"),
            checkpoint.get("version"),
            checkpoint.get("inference_ready"),
            format_timestamp(checkpoint.get("created_at")),
        )
        for checkpoint in checkpoints
    ]
    return render_table(CHECKPOINT_COLUMNS, rows)


# --- YAML-like -----------------------------------------------------------------------------


def _scalar(value: Any) -> str:
    if value is None or value == [] or value == {}:
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, Mapping | list) and item:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml_lines(item, indent + 2))
            elif isinstance(item, str) and "\n" in item:
                lines.append(f"{pad}{key}: |")
                lines.extend(f"{pad}  {line}" for line in item.splitlines())
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, Mapping) and item:
                nested = _yaml_lines(item, indent + 2)
                lines.append(f"{pad}- {nested[0].lstrip()}")
                lines.extend(nested[1:])
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    else:
        lines.append(f"{pad}{_scalar(value)}")
    return lines


def render_yaml(data: Mapping[str, Any]) -> str:
    """A YAML-like view of nested mappings and lists, for people rather than parsers."""
    return "\n".join(_yaml_lines(data, 0))


def _by(by: Any) -> str:
    if isinstance(by, Mapping):
        kind, who = by.get("kind"), by.get("id")
        if kind and who and kind != who:
            return f"{kind} {who}"
        return str(who or kind or EMPTY)
    return _scalar(by)


def _facts(facts: Any) -> str:
    if not isinstance(facts, Mapping):
        return "" if facts is None else str(facts)
    return " ".join(f"{key}={format_cell(value)}" for key, value in facts.items())


def history_lines(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """One aligned line per event: time, status, event, who, key facts."""
    rows = [
        (
            format_timestamp(entry.get("at")),
            entry.get("status"),
            entry.get("event"),
            f"by {_by(entry.get('by'))}",
        )
        for entry in history
    ]
    facts = [_facts(entry.get("facts")) for entry in history]
    lines = render_table(None, rows).splitlines() if rows else []
    width = max((len(line) for line in lines), default=0)
    return [
        f"{line.ljust(width)}  {fact}".rstrip() for line, fact in zip(lines, facts, strict=True)
    ]


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
    stop = job.get("stop")
    if stop:
        detail["stop"] = {
            "accelerators allocated": stop.get("accelerators_allocated"),
            "reason": stop.get("reason"),
        }
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
        "time limit": _seconds(spec.get("time_limit_s")),
        "stop grace": _seconds(spec.get("stop_grace_s")),
    }
    placements = job.get("placements") or []
    if len(placements) > 1:
        detail["nodes"] = [_placement_line(p) for p in placements]
    else:
        detail["node"] = job.get("node")
    detail["accelerators"] = format_cell(job.get("accelerators"))
    detail["timestamps"] = {
        "created": format_timestamp(job.get("created_at")),
        "started": format_timestamp(job.get("started_at")),
        "ended": format_timestamp(job.get("ended_at")),
        "updated": format_timestamp(job.get("updated_at")),
        "duration": format_duration(job.get("duration_seconds")),
    }
    detail["history"] = history_lines(job.get("history") or [])
    return detail


def _seconds(value: Any) -> str | None:
    from common.durations import human_duration

    return human_duration(value) if isinstance(value, int | float) else None


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
    asked = waiting.get("asked") or {}
    shown: dict[str, Any] = {"reason": waiting.get("reason")}
    shown["asked for"] = (f"{asked.get('accels')} accelerator(s) on each of "
                          f"{asked.get('nodes')} node(s)")  # fmt: skip
    nodes = []
    for node in waiting.get("nodes") or []:
        if "free" in node:
            held = ", ".join(f"{h['job']} {format_cell(h['accelerators'])}"
                             for h in node.get("held_by") or []) or "nobody"  # fmt: skip
            line = f"{node['node']}: {node['free']} of {node['accels']} free; held by {held}"
            if node.get("ahead"):
                line += f"; ahead in line: {', '.join(node['ahead'])}"
        else:
            state = "live" if node.get("alive") else (
                f"offline, last heard of {format_timestamp(node.get('last_heard'))}")
            line = f"{node['node']}: {node['accels']} accelerators, {state}"
        nodes.append(line)
    shown["nodes"] = nodes
    if waiting.get("place") is not None:
        of = f" of {waiting['of']}" if waiting.get("of") else ""
        shown["place in line"] = f"{waiting['place']}{of}"
    return shown


def render_job(job: Mapping[str, Any]) -> str:
    """The ``inspect`` view of a JobPublic answer."""
    return render_yaml(job_detail(job))


# --- datasets ------------------------------------------------------------------------------

DATASET_COLUMNS = ("NAME", "SIZE", "FILES", "HASH", "PUSHED")
DATASET_VERSION_COLUMNS = ("VERSION", "HASH", "SIZE", "FILES", "PUSHED", "BY")
SHORT_HASH = 12


def short_hash(content_hash: str | None) -> str:
    return content_hash[:SHORT_HASH] if content_hash else EMPTY


def dataset_pins(spec: Mapping[str, Any]) -> list[str]:
    """A job's datasets, each with the version it was given (``name @ hash``) if pushed."""
    pins: Mapping[str, str] = spec.get("dataset_hashes") or {}
    return [f"{name} @ {short_hash(pins[name])}" if pins.get(name) else str(name)
            for name in spec.get("datasets") or []]  # fmt: skip


def render_datasets_table(datasets: Sequence[Mapping[str, Any]]) -> str:
    """The ``dataset list`` table, by name."""
    rows = [
        (
            dataset.get("name"),
            format_size(dataset.get("size")),
            dataset.get("files"),
            short_hash(dataset.get("content_hash")),
            format_timestamp(dataset.get("pushed_at")),
        )
        for dataset in datasets
    ]
    return render_table(DATASET_COLUMNS, rows)


def render_secrets_table(secrets: Sequence[Mapping[str, Any]]) -> str:
    """The ``secret list`` table, by name: never a value (the server sends none)."""
    rows = [
        (secret.get("name"), format_timestamp(secret.get("created_at")),
         format_timestamp(secret.get("updated_at")))
        for secret in secrets
    ]  # fmt: skip
    return render_table(("NAME", "CREATED", "UPDATED"), rows)


def render_dataset(dataset: Mapping[str, Any]) -> str:
    """The ``dataset inspect`` view: the latest version, then every version."""
    versions = [
        (
            version.get("version"),
            short_hash(version.get("content_hash")),
            format_size(version.get("size")),
            version.get("files"),
            format_timestamp(version.get("pushed_at")),
            version.get("pushed_by"),
        )
        for version in dataset.get("versions") or []
    ]
    size = dataset.get("size")
    detail = {
        "name": dataset.get("name"),
        "version": dataset.get("version"),
        "content hash": dataset.get("content_hash"),
        "size": f"{format_size(size)} ({size} bytes)" if size is not None else None,
        "files": dataset.get("files"),
        "pushed": format_timestamp(dataset.get("pushed_at")),
        "pushed by": dataset.get("pushed_by"),
        "created": format_timestamp(dataset.get("created_at")),
        "versions": render_table(DATASET_VERSION_COLUMNS, versions).splitlines(),
    }
    return render_yaml(detail)


def render_pushed_dataset(dataset: Mapping[str, Any], archive_size: int) -> str:
    """What ``dataset push`` says: the version, its size and files, its full hash."""
    name, version = dataset.get("name"), dataset.get("version")
    what = (
        f"{dataset.get('files')} files, {format_size(dataset.get('size'))} "
        f"(archive {format_size(archive_size)})"
    )
    if dataset.get("changed"):
        head = f"Pushed dataset {name} version {version}: {what}"
    else:
        head = f"Dataset {name} is unchanged: its version {version} holds this content ({what})"
    return "\n".join([
        head,
        f"sha256 {dataset.get('content_hash')}",
        f"Jobs get it with `flexai training run JOB -D {name} ...` at $FLEXAI_INPUT_DIR/{name}",
    ])  # fmt: skip


# --- the ledger: past states and event streams ---------------------------------------------

FACTS_WIDTH = 100


def _utc(value: Any) -> str:
    from cli.timetravel import utc_iso

    return utc_iso(value) if isinstance(value, str) else EMPTY


def render_past_job(state: Mapping[str, Any]) -> str:
    """The ``inspect --at`` view of an AuditJobState: a past state, and says so first."""
    event_by = state.get("event_by")
    lines = [
        f"as of {_utc(state.get('as_of'))} (version {state.get('version')} of "
        f"{state.get('latest_version')})",
        f"past state folded from the ledger: the job after its {state.get('event')} event "
        f"at {_utc(state.get('event_at'))}" + (f" by {_by(event_by)}" if event_by else ""),
    ]
    placements = list(state.get("placements") or [])
    detail = job_detail({**state, "history": []})
    del detail["timestamps"], detail["history"]
    detail["deleted"] = bool(state.get("deleted"))
    if len(placements) == 1:
        detail["exit code"] = placements[0].get("exit_code")
    detail["created"] = _utc(state.get("created_at"))
    return "\n".join(lines) + "\n" + render_yaml(detail)


def audit_event_lines(events: Sequence[Mapping[str, Any]], full: bool = False) -> list[str]:
    """One line per ledger event: version, UTC time, who, event, facts (cut unless
    ``full``)."""
    rows = [
        (event.get("version"), _utc(event.get("at")), _by(event.get("by")), event.get("type"))
        for event in events
    ]
    facts = [_facts(event.get("facts")) for event in events]
    if not full:
        facts = [f if len(f) <= FACTS_WIDTH else f[: FACTS_WIDTH - 1] + "\u2026" for f in facts]
    lines = render_table(("VERSION", "AT", "BY", "EVENT"), rows).splitlines()
    width = max(len(line) for line in lines)
    body = [f"{line.ljust(width)}  {fact}".rstrip() for line, fact in zip(lines[1:], facts,
                                                                          strict=True)]
    return [f"{lines[0].ljust(width)}  FACTS", *body]


def audit_job_header(job: Mapping[str, Any]) -> str:
    """``job ID  created ...  deleted|live  (status)``: one job among those of a name."""
    state = "deleted" if job.get("deleted") else "live"
    return (f"job {job.get('id')}  created {_utc(job.get('created_at'))}  {state}  "
            f"({job.get('status')})")  # fmt: skip


# --- JSON ----------------------------------------------------------------------------------


def render_json(data: Any) -> str:
    """The server's answer as indented JSON, for scripts."""
    return json.dumps(data, indent=2, ensure_ascii=False)
