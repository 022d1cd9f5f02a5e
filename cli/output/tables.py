"""Aligned tables, and the ``list`` tables of jobs, checkpoints and secrets."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cli.output.formats import EMPTY, format_cell, format_duration, format_timestamp

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
REASON_WIDTH = 70


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
            "(final)" if checkpoint.get("name") == "" else checkpoint.get("name"),
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


def render_secrets_table(secrets: Sequence[Mapping[str, Any]]) -> str:
    """The ``secret list`` table, by name: never a value (the server sends none)."""
    rows = [
        (secret.get("name"), format_timestamp(secret.get("created_at")),
         format_timestamp(secret.get("updated_at")))
        for secret in secrets
    ]  # fmt: skip
    return render_table(("NAME", "CREATED", "UPDATED"), rows)


def render_runtimes_table(runtimes: Sequence[Mapping[str, Any]]) -> str:
    """The ``runtime list`` table, by name: each image, its digest and the nodes that hold it
    (``-`` until the agents report them)."""
    rows = [(runtime.get("name"), runtime.get("image"), runtime.get("digest"),
             runtime.get("nodes")) for runtime in runtimes]  # fmt: skip
    return render_table(("NAME", "IMAGE", "DIGEST", "NODES"), rows)
