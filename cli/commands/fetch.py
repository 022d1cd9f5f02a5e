"""Fetches artifacts from a Training Job.

Downloads everything the job's entry point wrote under FLEXAI_OUTPUT_DIR as `output_0.zip`
(`_0` is the node index) into the current directory, or into --output-dir: a job on several
nodes gives `output_0.zip`, `output_1.zip`, ... (--node-index K fetches one). The bytes come
straight from the artifact store. Each file appears only once it is complete and its SHA-256
is the one the job's ledger recorded (a file whose bytes differ is refused, naming both
hashes); an existing file of that name is replaced. An interrupted download resumes where it
stopped, also when `fetch` is run again.

A job that was preempted or retried ran several attempts, each with its own output: --attempt K
fetches attempt K's (default: the last attempt that recorded outputs, else the last).

A deleted job keeps its artifacts: `--id JOB_ID` (from `flexai training history NAME --all`)
fetches them, until an admin purges them (`flexai admin purge`: then it says when).
"""

from __future__ import annotations

import argparse
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cli.commands import add_attempt_flag, add_owner_flag


def _node_index(value: str) -> int:
    try:
        index = int(value)
    except ValueError:
        index = -1
    if index < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 0, not {value!r}")
    return index


def configure(parser: argparse.ArgumentParser) -> None:
    add_owner_flag(parser)
    parser.add_argument("name", metavar="NAME", nargs="?", help="the training job's name")
    parser.add_argument(
        "--id", dest="job_id", metavar="JOB_ID", type=_job_id,
        help="the job's id instead of its name: a deleted job's too, for audit",
    )  # fmt: skip
    parser.add_argument(
        "--output-dir",
        "-o",
        metavar="DIR",
        type=Path,
        default=Path("."),
        help="where to write the zip (default: the current directory)",
    )
    parser.add_argument(
        "--node-index",
        type=_node_index,
        default=None,
        metavar="INDEX",
        help="whose output to fetch, for multi-node jobs (default: every node's)",
    )
    add_attempt_flag(parser, "the output",
                     "the last attempt that recorded outputs, else the last")  # fmt: skip


def _job_id(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r:.80} is not a job id (a UUID)") from None


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.errors import UsageError

    if (args.name is None) == (args.job_id is None):
        raise UsageError("give the job's NAME or --id JOB_ID (one of them)",
                         prog="flexai training fetch")  # fmt: skip
    with ApiClient.from_config(owner=args.owner) as client:
        indices = [args.node_index]
        if args.node_index is None:
            job = (client.get_job(args.name) if args.job_id is None
                   else client.audit_state(args.job_id))  # fmt: skip
            indices = list(range(max(len(job.get("placements") or []), 1)))
        with _directory(args.output_dir) as directory:
            for index in indices:
                _download(client, args, index, directory)
    return 0


@contextlib.contextmanager
def _directory(directory: Path) -> Iterator[Path]:
    """``--output-dir``, made if missing (and taken away again if nothing came into it)."""
    from cli.errors import CliError

    if directory.exists() and not directory.is_dir():
        raise CliError(f"--output-dir {directory} is a file, not a directory: name a directory "
                       "(it is made if missing)")  # fmt: skip
    made = [folder for folder in [directory, *directory.parents] if not folder.exists()]
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CliError(f"cannot make --output-dir {directory}: {error.strerror or error}; "
                       "name a directory you can write to") from None  # fmt: skip
    try:
        yield directory
    except BaseException:
        for folder in made:  # innermost first
            if any(folder.iterdir()):
                break
            folder.rmdir()
        raise


def _download(client: Any, args: argparse.Namespace, index: int, directory: Path) -> None:
    from cli.errors import CliError
    from cli.output.formats import format_size

    target = (directory / f"output_{index}.zip").resolve()
    if target.is_dir():
        raise CliError(f"{target} is a directory, where the archive would go: move it away, or "
                       "fetch into another --output-dir")  # fmt: skip
    try:
        if args.job_id is not None:
            fetched = client.fetch_output_by_id(args.job_id, index, target, args.attempt)
        else:
            fetched = client.fetch_output(args.name, index, target, args.attempt)
    except OSError as error:
        raise CliError(f"cannot write {target}: {error.strerror or error}; free the place (or "
                       "the space) and run the same fetch again: it resumes where it stopped"
                       ) from None  # fmt: skip
    checked = f", SHA-256 {fetched.sha256}" if fetched.verified else ""
    print(f"Downloaded {target} ({format_size(fetched.size)}, {fetched.size} bytes{checked})")
