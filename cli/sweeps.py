"""`flexai training run --sweep`: one job per combination of the swept values (their cartesian
product, the first `--sweep` varying slowest), named NAME-1, NAME-2, ... in that order, each
with its values added to the job's environment, sent as lists in as few `POST /v1/jobs` as
the server's limits allow."""

from __future__ import annotations

import argparse
import itertools
import json
import math
from collections.abc import Iterator
from typing import Any

from cli.errors import UsageError
from common.contract import MAX_JOB_NAME, MAX_SUBMISSIONS, Refusal, check_env_name

MAX_JOBS = 10_000
"""The most jobs one sweep may make (a typo in a grid should not submit a million)."""
PER_REQUEST = MAX_SUBMISSIONS
"""The most jobs the server takes in one list."""
REQUEST_BYTES = 768 * 1024
"""A list's JSON is kept under this, well within the server's default --max-request-bytes."""
PROG = "flexai training run"
_EXAMPLE = "e.g. --sweep LR=0.1,0.01,0.001"

Sweep = list[tuple[str, list[str]]]
"""Each ``--sweep``'s key and its values, in the order given."""


def sweep_assignment(value: str) -> tuple[str, list[str]]:
    """An argparse type: ``KEY=V1,V2,...`` with an environment variable name as key and at
    least one value, none empty and none twice."""
    key, sep, rest = value.partition("=")
    if not sep or not rest:
        raise argparse.ArgumentTypeError(
            f"expected KEY=V1,V2,... (a variable and its values, separated by commas), got "
            f"{value!r}: {_EXAMPLE}"
        )
    try:
        check_env_name(key)
    except Refusal as refusal:
        raise argparse.ArgumentTypeError(f"{refusal}, in {value!r}: {_EXAMPLE}") from None
    values = rest.split(",")
    if "" in values:
        raise argparse.ArgumentTypeError(
            f"{value!r} has an empty value: put one value between each pair of commas, with "
            "no comma at either end (a value cannot hold a comma)"
        )
    twice = sorted({item for item in values if values.count(item) > 1})
    if twice:
        raise argparse.ArgumentTypeError(
            f"{value!r} gives {twice[0]!r} twice: give each value once"
        )
    return key, values


def sweep_jobs(job: dict[str, Any], sweep: Sweep) -> list[dict[str, Any]]:
    """The jobs of the sweep: ``job`` (its name the stem) once per combination of values."""
    keys = [key for key, _ in sweep]
    for key in keys:
        if keys.count(key) > 1:
            raise UsageError(f"--sweep {key} is given twice: give all its values in one "
                             f"--sweep {key}=V1,V2,...", prog=PROG)  # fmt: skip
        for flag, given in (("--env", job.get("env", {})), ("--secret", job.get("secrets", {}))):
            if key in given:
                raise UsageError(f"{key} is given both with {flag} and --sweep: keep one of "
                                 "them", prog=PROG)  # fmt: skip
    count = math.prod(len(values) for _, values in sweep)
    if count > MAX_JOBS:
        sizes = " x ".join(f"{len(values)} {key}" for key, values in sweep)
        raise UsageError(f"the sweep makes {count} jobs ({sizes}); at most {MAX_JOBS} are "
                         "allowed: sweep fewer values", prog=PROG)  # fmt: skip
    last = f"{job['name']}-{count}"
    if len(last) > MAX_JOB_NAME:
        raise UsageError(
            f"the sweep's last job would be named {last!r}, over {MAX_JOB_NAME} characters: give a "
            f"NAME of at most {MAX_JOB_NAME - len(str(count)) - 1} characters", prog=PROG,
        )  # fmt: skip
    combinations = itertools.product(*(values for _, values in sweep))
    return [
        {**job, "name": f"{job['name']}-{index}",
         "env": {**job.get("env", {}), **dict(zip(keys, values, strict=True))}}
        for index, values in enumerate(combinations, 1)
    ]  # fmt: skip


def in_requests(jobs: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """The jobs cut into lists the server takes: at most PER_REQUEST jobs, REQUEST_BYTES."""
    chunk: list[dict[str, Any]] = []
    size = 0
    for job in jobs:
        job_size = len(json.dumps(job)) + 2
        if chunk and (len(chunk) == PER_REQUEST or size + job_size > REQUEST_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(job)
        size += job_size
    if chunk:
        yield chunk


def swept_values(job: dict[str, Any], sweep: Sweep) -> str:
    """The swept variables of a job as ``KEY=VALUE`` words."""
    return " ".join(f"{key}={job['env'][key]}" for key, _ in sweep)
