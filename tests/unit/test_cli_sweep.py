"""`flexai training run --sweep`: parsing, the jobs of a sweep, and the lists they are sent in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.commands.run import build_job
from cli.errors import UsageError
from cli.sweeps import MAX_JOBS, PER_REQUEST, REQUEST_BYTES, in_requests, sweep_jobs
from tests.unit.test_cli_run import checkout, parse_run

__all__ = ["checkout"]  # its fixture applies here too: tmp_path is a git checkout's root


def jobs_of(tmp_path: Path, *flags: str, name: str = "grid") -> list[dict[str, object]]:
    args = parse_run([name, "-u", str(tmp_path), *flags, "--", "train.py"])
    return sweep_jobs(build_job(args), args.sweep)


def usage_error(tmp_path: Path, *flags: str, name: str = "grid") -> str:
    with pytest.raises(UsageError) as refused:
        jobs_of(tmp_path, *flags, name=name)
    return str(refused.value)


def test_each_combination_is_a_job_named_in_order_with_its_values_in_its_env(
    tmp_path: Path,
) -> None:
    jobs = jobs_of(tmp_path, "--sweep", "LR=0.1,0.01", "--sweep", "BS=16,32,64", "-E", "S=1")
    assert [job["name"] for job in jobs] == [f"grid-{index}" for index in range(1, 7)]
    assert [job["env"] for job in jobs] == [
        {"S": "1", "LR": lr, "BS": bs} for lr in ("0.1", "0.01") for bs in ("16", "32", "64")
    ]
    assert all(job["entry_point"] == ["train.py"] for job in jobs)
    assert all(job["repository_url"] == str(tmp_path) for job in jobs)


@pytest.mark.parametrize("stem", ["sw", "s", "run_", "lr-"])
def test_a_sweeps_name_is_the_stem_of_valid_names_so_it_may_be_short(
    tmp_path: Path, stem: str
) -> None:
    jobs = jobs_of(tmp_path, "--sweep", "LR=0.1,0.01", name=stem)
    assert [job["name"] for job in jobs] == [f"{stem}-1", f"{stem}-2"]
    with pytest.raises(UsageError, match="a --sweep's NAME is the stem"):
        build_job(parse_run([stem, "-u", str(tmp_path), "--", "train.py"]))


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("LR", "expected KEY=V1,V2,..."),
        ("LR=", "expected KEY=V1,V2,..."),
        ("=1,2", "is not an environment variable name"),
        ("1LR=1,2", "is not an environment variable name"),
        ("LR=1,,2", "has an empty value"),
        ("LR=1,2,", "has an empty value"),
        ("LR=1,2,1", "gives '1' twice"),
    ],
)
def test_a_malformed_sweep_says_what_is_wrong_and_how_to_write_it(
    tmp_path: Path, flag: str, says: str
) -> None:
    with pytest.raises(UsageError) as refused:
        parse_run(["grid", "-u", str(tmp_path), "--sweep", flag, "--", "train.py"])
    assert says in str(refused.value)


def test_a_key_swept_twice_or_also_in_env_or_secret_is_refused(tmp_path: Path) -> None:
    twice = usage_error(tmp_path, "--sweep", "LR=1,2", "--sweep", "LR=3")
    assert "--sweep LR is given twice" in twice and "one --sweep LR=V1,V2" in twice
    assert "LR is given both with --env and --sweep" in usage_error(
        tmp_path, "--sweep", "LR=1,2", "-E", "LR=3")  # fmt: skip
    assert "HF is given both with --secret and --sweep" in usage_error(
        tmp_path, "--sweep", "HF=1,2", "-S", "HF=token")  # fmt: skip


def test_too_many_combinations_or_too_long_a_name_is_refused(tmp_path: Path) -> None:
    values = ",".join(str(value) for value in range(101))
    many = usage_error(tmp_path, "--sweep", f"A={values}", "--sweep", f"B={values}")
    assert f"the sweep makes 10201 jobs (101 A x 101 B); at most {MAX_JOBS}" in many
    long = usage_error(tmp_path, "--sweep", "A=1,2,3,4,5,6,7,8,9,10", name="n" * 61)
    assert "'" + "n" * 61 + "-10', over 63 characters" in long and "at most 60" in long


def test_jobs_are_sent_in_lists_the_server_takes() -> None:
    small = [{"name": f"job-{index}", "env": {}} for index in range(2 * PER_REQUEST + 1)]
    assert [len(chunk) for chunk in in_requests(small)] == [PER_REQUEST, PER_REQUEST, 1]
    big = [{"name": f"job-{index}", "env": {"X": "x" * 10_000}} for index in range(200)]
    chunks = list(in_requests(big))
    assert len(chunks) > 1 and sum(len(chunk) for chunk in chunks) == 200
    assert all(len(json.dumps(chunk)) <= REQUEST_BYTES for chunk in chunks)
    assert [job for chunk in chunks for job in chunk] == big
