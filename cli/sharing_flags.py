"""`flexai training run`'s flags for a shared fleet: --priority, --preemptible or
--no-preemptible, --max-retries and --retry-on-exit-codes, and the JobCreate fields they give
(each left out when not given, so the server's default applies)."""

from __future__ import annotations

import argparse
from typing import Any

from cli.errors import UsageError

PRIORITIES = ("low", "normal", "high")
MAX_RETRIES = 20
MAX_RETRY_CODES = 16
PROG = "flexai training run"


def retry_count(value: str) -> int:
    """An argparse type: a number of retries, 0 to MAX_RETRIES."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= MAX_RETRIES:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 0 to {MAX_RETRIES}, not {value!r}"
        )
    return number


def exit_codes(value: str) -> list[int]:
    """An argparse type: ``137,143``, distinct exit codes from 1 to 255, at most
    MAX_RETRY_CODES."""
    codes: list[int] = []
    for part in value.split(","):
        text = part.strip()
        if not text.isdigit() or not 1 <= int(text) <= 255:
            raise argparse.ArgumentTypeError(
                f"{text!r} in {value!r} is not an exit code: give codes from 1 to 255 separated "
                "by commas, e.g. 137,143"
            )
        if int(text) in codes:
            raise argparse.ArgumentTypeError(f"{value!r} gives {text} twice: give each code once")
        codes.append(int(text))
    if len(codes) > MAX_RETRY_CODES:
        raise argparse.ArgumentTypeError(
            f"{value!r} gives {len(codes)} exit codes; at most {MAX_RETRY_CODES}"
        )
    return codes


def add_sharing_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--priority", choices=PRIORITIES,
        help="high starts before normal before low for the same accelerators (default: "
        "normal; high: for admins and the users an admin allows it)",
    )  # fmt: skip
    parser.add_argument(
        "--preemptible", action=argparse.BooleanOptionalAction,
        help="whether a high-priority job may stop this one to take its accelerators; it "
        "goes back to enqueued and resumes from its last checkpoint (default: yes for low "
        "priority, no otherwise)",
    )  # fmt: skip
    parser.add_argument(
        "--max-retries", type=retry_count, metavar="N",
        help="run the job again, from its last checkpoint, up to N times when the "
        "infrastructure fails it (its node is lost, its node agent restarts, ...) or it ends "
        f"with a --retry-on-exit-codes code: 0 to {MAX_RETRIES} (default: 0)",
    )  # fmt: skip
    parser.add_argument(
        "--retry-on-exit-codes", type=exit_codes, metavar="CODES",
        help="exit codes of the entry point that are retried too while --max-retries allows, "
        "e.g. 137,143",
    )  # fmt: skip


def sharing_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The JobCreate fields of the flags given."""
    fields = {
        "priority": getattr(args, "priority", None),
        "preemptible": getattr(args, "preemptible", None),
        "max_retries": getattr(args, "max_retries", None),
        "retry_on_exit_codes": getattr(args, "retry_on_exit_codes", None),
    }
    if fields["retry_on_exit_codes"] and not fields["max_retries"]:
        raise UsageError("--retry-on-exit-codes needs --max-retries N (1 or more): without "
                         "retries no exit code is retried", prog=PROG)  # fmt: skip
    return {key: value for key, value in fields.items() if value is not None}
