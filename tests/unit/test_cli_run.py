"""`flexai training run`: argv splitting, flag parsing and local validation."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cli.commands.run import build_job, in_flags, repository_url, split_entry_point
from cli.errors import CliError, UsageError
from cli.main import build_parser, main


@pytest.fixture(autouse=True)
def checkout(tmp_path: Path) -> None:
    """``tmp_path``, which most tests give as ``-u``, is a git checkout's root (its ``.git``)."""
    (tmp_path / ".git").mkdir()


def parse_run(argv: list[str]) -> argparse.Namespace:
    head, entry_point = split_entry_point(argv)
    args = build_parser().parse_args(["training", "run", *head])
    args.entry_point = entry_point
    return args


def test_argv_is_split_at_the_first_double_dash_only() -> None:
    head, tail = split_entry_point(["job", "-u", "x", "--", "train.py", "--", "--lr", "0.1"])
    assert head == ["job", "-u", "x"]
    assert tail == ["train.py", "--", "--lr", "0.1"]


def test_argv_without_double_dash_has_no_entry_point() -> None:
    assert split_entry_point(["job", "-u", "x"]) == (["job", "-u", "x"], None)


def test_entry_point_flags_are_not_taken_for_run_flags(tmp_path: Path) -> None:
    args = parse_run(["my-job", "-u", str(tmp_path), "--", "-m", "pkg.train", "-a", "7"])
    job = build_job(args)
    assert job["entry_point"] == ["-m", "pkg.train", "-a", "7"]
    assert job["accels"] == 1


def test_repeatable_flags_are_collected_into_the_job(tmp_path: Path) -> None:
    args = parse_run(
        [
            "my-job", "-u", str(tmp_path), "-a", "2", "-n", "3",
            "-E", "LR=0.1", "--env", "EMPTY=", "-E", "EQ=a=b",
            "-S", "HF_TOKEN=hf-secret", "--secret", "WANDB_KEY=wandb",
            "-D", "mnist", "--dataset", "cifar", "-C", "ckpt-1",
            "--repository-revision", "v1", "--requirements-path", "reqs/dev.txt",
            "--", "train.py", "--epochs", "3",
        ]
    )  # fmt: skip
    job = build_job(args)
    assert job == {
        "name": "my-job",
        "repository_url": str(tmp_path),
        "repository_revision": "v1",
        "requirements_path": "reqs/dev.txt",
        "accels": 2,
        "nodes": 3,
        "env": {"LR": "0.1", "EMPTY": "", "EQ": "a=b"},
        "secrets": {"HF_TOKEN": "hf-secret", "WANDB_KEY": "wandb"},
        "datasets": ["mnist", "cifar"],
        "checkpoint": "ckpt-1",
        "entry_point": ["train.py", "--epochs", "3"],
    }


def test_unset_optional_fields_are_left_for_the_server_to_default(tmp_path: Path) -> None:
    job = build_job(parse_run(["my-job", "-u", str(tmp_path), "--", "train.py"]))
    assert "repository_revision" not in job
    assert "requirements_path" not in job
    assert "checkpoint" not in job
    assert (job["accels"], job["nodes"], job["env"], job["datasets"]) == (1, 1, {}, [])


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("-E", "NOVALUE", "argument --env/-E: expected KEY=VALUE, got 'NOVALUE'"),
        ("-E", "1BAD=x", "'1BAD' is not an environment variable name"),
        ("-S", "TOKEN=", "argument --secret/-S: expected ENV_VAR=<secret name>, got 'TOKEN='"),
        ("-a", "0", "argument --accels/-a: must be a whole number of at least 1, not '0'"),
        ("-n", "two", "argument --nodes/-n: must be a whole number of at least 1, not 'two'"),
    ],
)
def test_bad_flag_values_are_usage_errors_that_say_what_is_wrong(
    flag: str, value: str, expected: str
) -> None:
    with pytest.raises(UsageError) as caught:
        parse_run(["my-job", "-u", "x", flag, value, "--", "train.py"])
    assert expected in str(caught.value)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("ab", "is 2 characters long; use 3 to 63"),
        ("_leading", "must start"),
        ("trailing_", "must start and end with a letter or a digit"),
        ("has space", "may hold only letters, digits, '-' and '_'"),
        ("dot.name", "may hold only letters, digits, '-' and '_'"),
        ("é-accent", "may hold only letters, digits, '-' and '_'"),
        ("x" * 64, "is 64 characters long; use 3 to 63"),
    ],
)
def test_names_breaking_the_rule_are_refused_in_the_servers_words(name: str, problem: str) -> None:
    with pytest.raises(UsageError) as caught:
        build_job(parse_run([name, "-u", "x", "--", "train.py"]))
    assert f"job name {name!r} {problem}" in str(caught.value)


@pytest.mark.parametrize("name", ["abc", "a_b-c", "Job-2024", "9" * 63])
def test_names_following_the_rule_are_accepted(name: str, tmp_path: Path) -> None:
    assert build_job(parse_run([name, "-u", str(tmp_path), "--", "t.py"]))["name"] == name


@pytest.mark.parametrize("argv_tail", [[], ["--"]])
def test_a_missing_entry_point_says_to_put_it_after_double_dash(
    argv_tail: list[str], tmp_path: Path
) -> None:
    with pytest.raises(UsageError) as caught:
        build_job(parse_run(["my-job", "-u", str(tmp_path), *argv_tail]))
    assert "the entry point is missing: put it after `--`" in str(caught.value)


def test_a_missing_entry_point_exits_2_with_one_error_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["training", "run", "my-job", "-u", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: the entry point is missing")
    assert err.count("\n") == 1


def test_a_missing_repository_url_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["training", "run", "my-job", "--", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the following arguments are required: --repository-url/-u")


def test_the_same_env_var_twice_is_refused(tmp_path: Path) -> None:
    args = parse_run(["my-job", "-u", str(tmp_path), "-E", "A=1", "-S", "A=s", "--", "t.py"])
    with pytest.raises(UsageError, match="A is given both with --env and --secret"):
        build_job(args)
    args = parse_run(["my-job", "-u", str(tmp_path), "-E", "A=1", "-E", "A=2", "--", "t.py"])
    with pytest.raises(UsageError, match="--env A is given twice"):
        build_job(args)


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/org/repo.git",
        "file:///srv/repos/demo",
        "git@github.com:org/repo.git",
        "ssh://git@host/repo",
    ],
)
def test_remote_and_file_urls_are_passed_as_given(url: str) -> None:
    assert repository_url(url) == url


def test_a_local_path_becomes_absolute(tmp_path: Path) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    assert repository_url("repo", cwd=tmp_path) == str(tmp_path / "repo")
    assert repository_url("./repo/../repo", cwd=tmp_path) == str(tmp_path / "repo")


def test_a_local_path_that_does_not_exist_is_refused_here(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="does not exist: give a git URL"):
        repository_url("no-such-repo", cwd=tmp_path)


def test_sharing_flags_become_job_fields_and_are_left_out_when_not_given(tmp_path: Path) -> None:
    plain = build_job(parse_run(["my-job", "-u", str(tmp_path), "--", "train.py"]))
    assert not {"priority", "preemptible", "max_retries", "retry_on_exit_codes"} & set(plain)
    job = build_job(parse_run([
        "my-job", "-u", str(tmp_path), "--priority", "low", "--no-preemptible",
        "--max-retries", "3", "--retry-on-exit-codes", "137, 143", "--", "train.py",
    ]))  # fmt: skip
    assert (job["priority"], job["preemptible"], job["max_retries"],
            job["retry_on_exit_codes"]) == ("low", False, 3, [137, 143])  # fmt: skip
    assert build_job(parse_run(["j-1", "-u", str(tmp_path), "--preemptible", "--",
                                "train.py"]))["preemptible"] is True  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--priority", "urgent"], "argument --priority: invalid choice: 'urgent'"),
        (["--max-retries", "21"], "must be a whole number from 0 to 20, not '21'"),
        (["--max-retries", "x"], "must be a whole number from 0 to 20, not 'x'"),
        (["--max-retries", "1", "--retry-on-exit-codes", "0"], "'0' in '0' is not an exit code"),
        (["--max-retries", "1", "--retry-on-exit-codes", "137,x"], "'x' in '137,x' is not an"),
        (["--max-retries", "1", "--retry-on-exit-codes", "137,137"], "gives 137 twice"),
        (["--max-retries", "1", "--retry-on-exit-codes", ",".join(map(str, range(1, 18)))],
         "gives 17 exit codes; at most 16"),
    ],
)  # fmt: skip
def test_bad_sharing_flags_are_usage_errors_that_say_what_is_wrong(
    flags: list[str], expected: str
) -> None:
    with pytest.raises(UsageError) as caught:
        parse_run(["my-job", "-u", "x", *flags, "--", "train.py"])
    assert expected in str(caught.value)
    assert caught.value.exit_code == 2


def test_retry_exit_codes_without_retries_are_refused_saying_to_add_them(tmp_path: Path) -> None:
    args = parse_run(["my-job", "-u", str(tmp_path), "--retry-on-exit-codes", "137", "--",
                      "train.py"])  # fmt: skip
    with pytest.raises(UsageError) as caught:
        build_job(args)
    assert "--max-retries N" in str(caught.value) and caught.value.exit_code == 2


def test_an_empty_url_or_a_folder_that_is_no_git_repository_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="the repository URL is empty"):
        repository_url("", cwd=tmp_path)
    (tmp_path / "plain").mkdir()
    with pytest.raises(CliError, match="plain is not a git repository"):
        repository_url("plain", cwd=tmp_path)
    bare = tmp_path / "bare.git"
    (bare / "objects").mkdir(parents=True)
    (bare / "HEAD").write_text("ref: refs/heads/main\n")
    assert repository_url("bare.git", cwd=tmp_path) == str(bare)


def test_a_name_with_a_trailing_newline_is_refused_here(tmp_path: Path) -> None:
    with pytest.raises((UsageError, SystemExit)):
        build_job(parse_run(["abc\n", "-u", str(tmp_path), "--", "t.py"]))


def test_the_servers_refusal_names_this_commands_flags_and_durations() -> None:
    said = in_flags("the request is invalid: time_limit_s: must be at most 31622400; "
                    "env.LR: must not be empty; entry_point[0] must not be empty")  # fmt: skip
    assert said == ("the request is invalid: --time-limit: must be at most 366d; --env LR: "
                    "must not be empty; part 0 of the entry point (after --) must not be empty")
    assert in_flags("stop_grace_s: must be at most 3600") == "--stop-grace: must be at most 1h"
    assert in_flags("a job named 'accels-2' already exists") == (
        "a job named 'accels-2' already exists"
    )


def test_flexais_runtime_form_puts_the_runtime_in_the_job_and_none_leaves_it_out(
    tmp_path: Path,
) -> None:
    job = build_job(parse_run(["my-job", "-u", str(tmp_path), "--runtime", "nvidia-25.06", "--",
                               "train.py"]))  # fmt: skip
    assert (job["runtime"], job["entry_point"]) == ("nvidia-25.06", ["train.py"])
    assert "runtime" not in build_job(parse_run(["my-job", "-u", str(tmp_path), "--", "t.py"]))
    with pytest.raises(UsageError, match="runtime name 'nvidia 25' is not valid"):
        parse_run(["my-job", "-u", str(tmp_path), "--runtime", "nvidia 25", "--", "t.py"])
