"""The agent's sandbox flags (``--job-uids``, ``--job-memory``, ``--job-pids``,
``--no-sandbox``) and what they make at start: how this node sandboxes jobs, and the one line
it says about it."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from pathlib import Path

from node_agent.models import marker_prefix
from node_agent.run.jobuser import JobUser
from node_agent.sandbox.identities import (
    DEFAULT_RANGE,
    IdentityError,
    JobIdentities,
    check_range,
    parse_range,
)
from node_agent.sandbox.isolation import NONE, SANDBOX, Isolation, detect
from node_agent.sandbox.jobs import DEFAULT_PIDS, JobSandboxes, Limits

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def add_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--job-uids", type=_uids, default=DEFAULT_RANGE, metavar="FIRST-LAST",
        help="the user ids jobs run as, one per live job, in their sandboxes; no user or group "
             "of the host may have one (70000-70999)")  # fmt: skip
    add("--job-memory", type=_memory, default="share", metavar="SIZE",
        help="each job's memory limit: 'share' (its accelerators' share of the host's "
             "memory, the default), a size (64G) or 'none'")  # fmt: skip
    add("--job-pids", type=_pids, default=DEFAULT_PIDS, metavar="N",
        help=f"how many processes and threads a job may have at once ({DEFAULT_PIDS}; 'none')")
    add("--no-sandbox", action="store_true",
        help="run jobs without a sandbox, as --job-user (nobody), all as that one user: they "
             "then see one another (only for hosts where bubblewrap cannot run)")  # fmt: skip


def sandboxes(args: argparse.Namespace, work_dir: Path, shared: JobUser | None,
              accels: int, gpus: Mapping[int, tuple[str, str]]) -> JobSandboxes:  # fmt: skip
    """How this node sandboxes jobs. ``gpus``: index -> (device node, UUID)."""
    if args.no_sandbox:
        isolation = Isolation(NONE if shared is None or shared.is_agent else "user",
                              "sandbox turned off (--no-sandbox): every job runs as the same "
                              "user and sees the others")  # fmt: skip
    else:
        named = args.job_user if args.job_user else None
        isolation = detect(named, want_cgroups=args.job_memory != "none" or bool(args.job_pids))
    if isolation.cgroups is not None:
        isolation.cgroups.sweep(marker_prefix(work_dir))  # an agent killed earlier left them
    identities = None
    if isolation.level == SANDBOX and not args.job_user:
        try:
            check_range(args.job_uids)
        except IdentityError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        identities = JobIdentities(args.job_uids, work_dir / "scratch")
    return JobSandboxes(
        isolation, work_dir, identities, Limits(args.job_memory, args.job_pids), accels,
        {index: node for index, (node, _) in gpus.items()},
        {index: uuid for index, (_, uuid) in gpus.items() if uuid},
    )  # fmt: skip


def _uids(text: str) -> range:
    try:
        return parse_range(text)
    except IdentityError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _memory(text: str) -> str:
    if text in ("share", "none"):
        return text
    found = _SIZE.fullmatch(text.strip())
    if not found:
        raise argparse.ArgumentTypeError(f"expected share, none or a size like 64G, not {text!r}")
    unit = (found[2] or "").upper().rstrip("B").rstrip("I")
    size = int(float(found[1]) * _UNITS[unit])
    if size < 2**24:
        raise argparse.ArgumentTypeError(f"{text}: a job needs at least 16M")
    return str(size)


def _pids(text: str) -> int | None:
    if text == "none":
        return None
    if not text.isdigit() or int(text) < 16:
        raise argparse.ArgumentTypeError(f"expected a number of 16 or more, or none, not {text!r}")
    return int(text)
