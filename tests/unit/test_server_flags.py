"""`flexai server` flags: every limit is a flag, a value out of bounds is one error line, and the
artifact store is local files unless an S3 bucket is named (and answers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.server import _settings, main, parse
from api.settings import Limits


def test_every_limit_is_a_flag_with_its_default(tmp_path: Path) -> None:
    settings = _settings(parse(["--data-dir", str(tmp_path)]))
    assert settings.limits == Limits()
    changed = parse(["--data-dir", str(tmp_path), "--max-log-followers", "5",
                     "--max-archive-entries", "7", "--skip-event", "3", "--skip-event", "9"])
    settings = _settings(changed)
    assert (settings.limits.log_followers, settings.limits.archive_entries) == (5, 7)
    assert settings.skip_events == frozenset({3, 9})


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--max-request-bytes", "10"], "--max-request-bytes"),
     (["--database-wait", "0"], "--database-wait"),
     (["--artifact-store", "s3://"], "--artifact-store"),
     (["--artifact-store", "https://bucket.example.com"], "--artifact-store"),
     (["--artifact-store", "s3://Not_A_Bucket/x"], "--artifact-store"),
     (["--artifact-store", "s3://bucket/../x"], "--artifact-store"),
     (["--artifact-store", "s3://bucket", "--s3-endpoint-url", "localhost:9000"],
      "--s3-endpoint-url"),
     (["--s3-region", "eu-west-1"], "--s3-region")],
)  # fmt: skip
def test_a_flag_out_of_bounds_is_one_error_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    assert main(["--data-dir", str(tmp_path / "data"), *flags]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {named}: ") and error.count("\n") == 1
    assert not (tmp_path / "data").exists()  # refused before anything was opened


def test_the_artifact_store_is_local_files_unless_a_bucket_is_named(tmp_path: Path) -> None:
    assert _settings(parse(["--data-dir", str(tmp_path)])).s3_location is None
    settings = _settings(parse([
        "--data-dir", str(tmp_path), "--artifact-store", "s3://ml-artifacts/fleet/a/",
        "--s3-endpoint-url", "http://127.0.0.1:8333", "--s3-region", "eu-west-1",
    ]))  # fmt: skip
    location = settings.s3_location
    assert location is not None
    assert (location.bucket, location.prefix) == ("ml-artifacts", "fleet/a/")
    assert (location.endpoint_url, location.region) == ("http://127.0.0.1:8333", "eu-west-1")
    assert location.url == "s3://ml-artifacts/fleet/a"


@pytest.mark.parametrize(
    ("environment", "said"),
    [({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}, "does not answer"),
     ({}, "no AWS credentials found")],
)  # fmt: skip
def test_a_bucket_that_cannot_be_reached_stops_the_start_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    environment: dict[str, str], said: str,
) -> None:  # fmt: skip
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    code = main(["--data-dir", str(tmp_path / "data"), "--no-client-config",
                 "--artifact-store", "s3://artifacts", "--s3-endpoint-url", "http://127.0.0.1:9",
                 "--s3-region", "us-east-1"])  # fmt: skip
    error = capsys.readouterr().err
    assert code == 1
    assert error.startswith("error: cannot store or read artifacts in s3://artifacts: ")
    assert said in error and error.count("\n") == 1
