"""Starts a new Training Job.

The job clones the repository at the given revision, installs its requirements into a fresh
environment on a node that has the accelerators asked for, and runs the entry point given after
`--`: a repository-relative `.py` file (run with the job's Python), `-m module ...`, or an
executable, followed by its arguments.

Inside the job FLEXAI_OUTPUT_DIR (fetched with `flexai training fetch`),
FLEXAI_OUTPUT_CHECKPOINT_DIR (each file or directory written there becomes a checkpoint),
FLEXAI_INPUT_CHECKPOINT_DIR (the --checkpoint) and FLEXAI_INPUT_DIR (the --dataset's) are set,
with the --env and --secret variables and CUDA_VISIBLE_DEVICES (and torchrun's NODE_RANK,
NNODES, WORLD_SIZE, MASTER_ADDR, ...): the node sets those, so --env cannot.

On a shared fleet --priority orders the jobs waiting for the same accelerators; a preemptible
job (--preemptible, the default for low priority) may be stopped for a high-priority one and
resumes later from its last checkpoint; --max-retries N runs a job again from its last
checkpoint when its node is lost (or it ends with a --retry-on-exit-codes code).

With --sweep KEY=V1,V2,... (repeatable) it starts one job per combination of the values,
named NAME-1, NAME-2, ... (the first --sweep varying slowest), each with its values in its
environment as --env sets them; it prints each job's name, and fails (exit status 1) if any
job was not started, saying why.

Examples:
  flexai training run my-job -u https://github.com/org/repo -a 2 -E LR=0.1 -- train.py --epochs 3
  flexai training run grid -u ./repo --sweep LR=0.1,0.01 --sweep BS=16,32 -- train.py  # 4 jobs
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from cli.commands import add_json_flag, contract_type
from cli.errors import CliError, UsageError
from cli.sharing_flags import add_sharing_flags, sharing_fields
from cli.sweeps import MAX_JOBS, in_requests, sweep_assignment, sweep_jobs, swept_values
from common.contract import (
    JOB_NAME_RULE,
    Refusal,
    check_env_name,
    check_job_name,
    check_runtime_name,
    looks_remote,
    repository_kind,
)
from common.durations import human_duration

USAGE = "flexai training run NAME -u REPOSITORY_URL [options] -- ENTRY_POINT [ARGS ...]"
MISSING_ENTRY_POINT = (
    "the entry point is missing: put it after `--`, "
    "e.g. `flexai training run NAME -u URL -- train.py --lr 0.1`"
)


# --- argv and values -----------------------------------------------------------------------


def split_entry_point(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Split at the first ``--``: the flags before it, the entry point and its args after.

    The second part is ``None`` when there is no ``--`` at all.
    """
    if "--" not in argv:
        return list(argv), None
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def job_name(value: str) -> str:
    """An argparse type: a job name, or a sweep's stem (its jobs are NAME-1, ...): letters,
    digits, '-' and '_', from a letter or digit on. :func:`build_job` checks the whole rule."""
    try:
        return check_job_name(value, stem=True)
    except Refusal as refusal:
        raise argparse.ArgumentTypeError(f"job name {refusal}") from None


def positive_int(value: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {value!r}")
    return number


def duration(value: str) -> int:
    """An argparse type: ``90s``, ``30m``, ``2h``, ``1d`` or seconds, as whole seconds."""
    from common.durations import parse_duration

    try:
        return parse_duration(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def duration_or_zero(value: str) -> int:
    return 0 if value.strip() in ("0", "0s") else duration(value)


def env_assignment(value: str) -> tuple[str, str]:
    """An argparse type: ``KEY=VALUE`` with an environment variable name as key."""
    key, sep, rest = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    _check_env_name(key, value)
    return key, rest


def secret_assignment(value: str) -> tuple[str, str]:
    """An argparse type: ``ENV_VAR=<secret name>``, both parts given."""
    key, sep, secret = value.partition("=")
    if not sep or not secret:
        raise argparse.ArgumentTypeError(f"expected ENV_VAR=<secret name>, got {value!r}")
    _check_env_name(key, value)
    return key, secret


def _check_env_name(key: str, value: str) -> None:
    try:
        check_env_name(key)
    except Refusal as refusal:
        raise argparse.ArgumentTypeError(f"{refusal}, in {value!r}") from None


def repository_url(value: str, cwd: Path | None = None) -> str:
    """Remote and ``file://`` URLs as given; a local path made absolute (the agent on this
    machine clones from there), after checking that it exists."""
    if not value.strip():
        raise CliError("the repository URL is empty; give a git URL, a file:// URL, or the path "
                       "of a local git repository")
    if looks_remote(value) or value.startswith("-"):
        try:
            repository_kind(value)  # the server checks it again, with the kinds it accepts
        except Refusal as refusal:
            raise CliError(f"the repository URL {refusal}") from None
        return value
    base = cwd or Path.cwd()
    path = Path(os.path.expanduser(value))
    absolute = Path(os.path.normpath(path if path.is_absolute() else base / path))
    if not absolute.exists():
        raise CliError(
            f"the repository path {absolute} does not exist: give a git URL, a file:// URL, "
            f"or the path of a local git repository"
        )
    bare = (absolute / "HEAD").is_file() and (absolute / "objects").is_dir()
    if not (absolute / ".git").exists() and not bare:
        raise CliError(
            f"the repository path {absolute} is not a git repository (no .git in it): give "
            f"the root of a git checkout, or a bare repository"
        )
    return str(absolute)


# --- the command ---------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    parser.add_argument(
        "name", metavar="NAME", type=job_name, help=f"the job's name: {JOB_NAME_RULE}"
    )
    parser.add_argument(
        "--repository-url",
        "-u",
        required=True,
        metavar="URL",
        help="the git repository: a remote URL, a file:// URL, or a local path",
    )
    parser.add_argument(
        "--repository-revision",
        metavar="REVISION",
        help="branch, tag or commit (default: the default branch)",
    )
    parser.add_argument(
        "--requirements-path",
        metavar="PATH",
        help="the requirements file, relative to the repository root (default: requirements.txt)",
    )
    parser.add_argument(
        "--accels", "-a", type=positive_int, default=1, help="accelerators per node (default: 1)"
    )
    parser.add_argument(
        "--nodes", "-n", type=positive_int, default=1, help="number of nodes (default: 1)"
    )
    parser.add_argument(
        "--env",
        "-E",
        type=env_assignment,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for the job (repeatable)",
    )
    parser.add_argument(
        "--secret",
        "-S",
        type=secret_assignment,
        action="append",
        default=[],
        metavar="ENV_VAR=SECRET",
        help="an environment variable set from your secret SECRET (`flexai secret create`), "
        "shown as *** in the logs (repeatable)",
    )
    parser.add_argument(
        "--dataset",
        "-D",
        action="append",
        default=[],
        metavar="DATASET[=MOUNT]",
        help="a dataset pushed with `flexai dataset push`, read-only at /input/<dataset> "
        "(FLEXAI_INPUT_DIR/<dataset>), or at /input/MOUNT, in the version current now "
        "(repeatable)",
    )
    parser.add_argument(
        "--checkpoint",
        "-C",
        metavar="CHECKPOINT",
        help="a checkpoint id or name, made available at FLEXAI_INPUT_CHECKPOINT_DIR",
    )
    parser.add_argument(
        "--time-limit",
        type=duration,
        metavar="DURATION",
        help="end the job (failed, time_limit_exceeded) once it has run this long: 90s, 30m, "
        "2h, 1d (default: the server's)",
    )
    parser.add_argument(
        "--stop-grace",
        type=duration_or_zero,
        metavar="DURATION",
        help="between SIGTERM and SIGKILL when the job is stopped or ended "
        "(default: the agent's --stop-grace)",
    )
    parser.add_argument(
        "--runtime", type=contract_type("runtime name", check_runtime_name), metavar="RUNTIME",
        help="run in this runtime's image (`flexai runtime list` shows them; default, or "
        "`host`: the node's own system)",
    )  # fmt: skip
    add_sharing_flags(parser)
    parser.add_argument(
        "--sweep",
        type=sweep_assignment,
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="start one job per value, NAME-1, NAME-2, ..., each with KEY set to its value as "
        "--env sets it; repeated, one job per combination of the values (at most "
        f"{MAX_JOBS:,}); a value cannot hold ','",
    )
    add_json_flag(parser)


def _unique_mapping(pairs: list[tuple[str, str]], flag: str) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for key, value in pairs:
        if key in mapping:
            raise UsageError(f"{flag} {key} is given twice", prog="flexai training run")
        mapping[key] = value
    return mapping


def build_job(args: argparse.Namespace, cwd: Path | None = None) -> dict[str, Any]:
    """The JobCreate body from the parsed flags; optional fields left unset are left out so
    the server's defaults apply."""
    entry_point = getattr(args, "entry_point", None)
    if not entry_point:
        raise UsageError(MISSING_ENTRY_POINT, prog="flexai training run")
    env = _unique_mapping(args.env, "--env")
    secrets = _unique_mapping(args.secret, "--secret")
    both = sorted(set(env) & set(secrets))
    if both:
        raise UsageError(
            f"{', '.join(both)} is given both with --env and --secret", prog="flexai training run"
        )
    if not getattr(args, "sweep", None):
        try:
            check_job_name(args.name)
        except Refusal as refusal:
            raise UsageError(f"job name {refusal} (a --sweep's NAME is the stem of its jobs' "
                             "names, NAME-1, ...)", prog="flexai training run") from None
    names = [item.partition("=")[0] for item in args.dataset]
    if len(set(names)) != len(names):
        raise UsageError("a --dataset is given twice", prog="flexai training run")
    job: dict[str, Any] = {
        "name": args.name,
        "repository_url": repository_url(args.repository_url, cwd),
        "accels": args.accels,
        "nodes": args.nodes,
        "env": env,
        "secrets": secrets,
        "datasets": list(args.dataset),
        "entry_point": list(entry_point),
    }
    optional = {
        "repository_revision": args.repository_revision,
        "requirements_path": args.requirements_path,
        "checkpoint": args.checkpoint,
        "time_limit_s": getattr(args, "time_limit", None),
        "stop_grace_s": getattr(args, "stop_grace", None),
        "runtime": getattr(args, "runtime", None),
    }
    job.update({key: value for key, value in optional.items() if value is not None})
    job.update(sharing_fields(args))
    return job


def execute(args: argparse.Namespace) -> int:
    job = build_job(args)
    if getattr(args, "sweep", None):
        return _run_sweep(job, args.sweep, as_json=args.json)

    from cli.client.api import ApiClient
    from cli.output.formats import render_json

    with ApiClient.from_config() as client:
        try:
            created = client.create_job(job)
        except CliError as refused:
            if refused.status == 422:
                refused.message = in_flags(refused.message)
            raise
    if args.json:
        print(render_json(created))
        return 0
    name = created.get("name", job["name"])
    out = sys.stdout
    out.write(f"Training job {name} started: status {created.get('status', 'pending')}.\n")
    pinned = (created.get("spec") or {}).get("input_checkpoint_id")
    if pinned and pinned != job.get("checkpoint"):  # a name: which checkpoint it named
        out.write(f"It starts from checkpoint {pinned}, the newest named {job['checkpoint']}.\n")
    out.write(f"Follow its logs:  flexai training logs {name} --follow\n")
    out.write(f"Inspect it:       flexai training inspect {name}\n")
    return 0


_FLAGS = {
    "repository_url": "--repository-url", "repository_revision": "--repository-revision",
    "requirements_path": "--requirements-path", "accels": "--accels", "nodes": "--nodes",
    "env": "--env", "secrets": "--secret", "datasets": "--dataset", "checkpoint": "--checkpoint",
    "time_limit_s": "--time-limit", "stop_grace_s": "--stop-grace", "priority": "--priority",
    "preemptible": "--preemptible", "max_retries": "--max-retries",
    "retry_on_exit_codes": "--retry-on-exit-codes", "entry_point": "the entry point (after --)",
    "runtime": "--runtime",
}  # fmt: skip
_FIELD = re.compile(r"\b(" + "|".join(_FLAGS) + r")(\[\d+\]|\.\w+)?(:| must| is)")
_SECONDS_BOUND = re.compile(r"(--time-limit|--stop-grace): must be at (most|least) (\d+)\b")


def in_flags(message: str) -> str:
    """A refusal of the control plane in the words of this command: its flags for the API's
    fields (``time_limit_s: must be at most 31622400`` is ``--time-limit: must be at most
    366d``)."""
    named = _FIELD.sub(_flag_of, message)
    return _SECONDS_BOUND.sub(
        lambda m: f"{m.group(1)}: must be at {m.group(2)} {human_duration(int(m.group(3)))}",
        named,
    )


def _flag_of(found: re.Match[str]) -> str:
    field, part, after = found.groups()
    if part and part.startswith("."):  # env.KEY: --env KEY
        return f"{_FLAGS[field]} {part[1:]}{after}"
    if part and field == "entry_point":
        return f"part {part[1:-1]} of the entry point (after --){after}"
    return f"{_FLAGS[field]}{part or ''}{after}"


def _run_sweep(job: dict[str, Any], sweep: list[tuple[str, list[str]]], as_json: bool) -> int:
    """Every job of the sweep, in as few requests as the server takes; each job's name, or
    why it was not started."""
    from cli.client.api import ApiClient
    from cli.output.formats import render_json

    jobs = sweep_jobs(job, sweep)
    results: list[dict[str, Any]] = []
    with ApiClient.from_config() as client:
        for chunk in in_requests(jobs):
            try:
                results += client.create_jobs(chunk)["results"]
            except CliError as refused:  # the whole list: its jobs, and those not sent yet
                if not results:
                    raise
                results += [{"problem": {"detail": refused.message}}] * (len(jobs) - len(results))
                break
    failed = [(sent, result) for sent, result in zip(jobs, results, strict=True)
              if not result.get("job")]  # fmt: skip
    if as_json:
        print(render_json({"results": results, "created": len(jobs) - len(failed),
                           "failed": len(failed)}))  # fmt: skip
        return 1 if failed else 0
    out = sys.stdout
    started = [sent for sent, result in zip(jobs, results, strict=True) if result.get("job")]
    out.write(f"Sweep {job['name']}: {len(started)} of {len(jobs)} jobs started.\n")
    for sent in started:
        out.write(f"  {sent['name']}  {swept_values(sent, sweep)}\n")
    if started:
        out.write(f"Follow one's logs:  flexai training logs {started[0]['name']} --follow\n")
        out.write(f"List them:          flexai training list --name-prefix {job['name']}-\n")
    for sent, result in failed:
        detail = in_flags((result.get("problem") or {}).get("detail", "refused"))
        sys.stderr.write(f"error: {sent['name']} ({swept_values(sent, sweep)}) was not "
                         f"started: {detail}\n")  # fmt: skip
    return 1 if failed else 0
