"""Encryption at rest and compression of stored events, fixed by the first server to write."""

from __future__ import annotations

import base64
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from pydantic import SecretStr

from api.ledger.format import LedgerFormatMismatch, LedgerKeyError, fingerprint, read_key_file
from api.services import Services, build_services
from api.settings import Settings
from domain.actors import user

MARKER = "plaintext-marker-7f3a91"
ROOT = Path(__file__).resolve().parents[2]


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def open_services(tmp_path: Path, database_url: str, **ledger: Any) -> Services:
    return build_services(Settings(data_dir=tmp_path, database_url=database_url, **ledger))


def submit(services: Services, name: str) -> UUID:
    spec = {"repository_url": "https://example.com/org/repo.git", "entry_point": ["train.py"],
            "accels": 1, "nodes": 1, "env": {"SECRET_HINT": MARKER}}  # fmt: skip
    outcome = services.jobs.submit("alice", name, spec, by=user("alice"))
    services.projector.catch_up()
    return outcome.job_id


def raw_states(database_url: str) -> list[bytes]:
    """Every stored event's state, read from the raw table."""
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as connection:
            rows = connection.execute("SELECT state FROM stored_events").fetchall()
    else:
        with psycopg.connect(database_url) as connection:
            rows = connection.execute("SELECT state FROM flexai_events").fetchall()
    assert rows, "no stored events"
    return [bytes(row[0]) for row in rows]


@pytest.mark.parametrize("compress", [False, True])
def test_encrypted_events_hold_no_plaintext_and_read_back(
    tmp_path: Path, database_url: str, compress: bool
) -> None:
    key = SecretStr(new_key())
    services = open_services(tmp_path, database_url, ledger_key=key, compress_events=compress)
    try:
        job_id = submit(services, "secret-job")
        assert services.jobs.job(job_id).spec["env"]["SECRET_HINT"] == MARKER
    finally:
        services.close()
    states = raw_states(database_url)
    assert not any(MARKER.encode() in state or b"secret-job" in state for state in states)
    again = open_services(tmp_path, database_url, ledger_key=key, compress_events=compress)
    try:  # a restart with the same key folds the job from the encrypted events
        assert again.jobs.job(job_id).spec["env"]["SECRET_HINT"] == MARKER
        assert again.queries.job_by_name("alice", "secret-job") is not None
    finally:
        again.close()


def test_compressed_events_are_smaller_and_read_back(tmp_path: Path, database_url: str) -> None:
    services = open_services(tmp_path, database_url, compress_events=True)
    try:
        job_id = submit(services, "squeezed")
        assert services.jobs.job(job_id).name == "squeezed"
    finally:
        services.close()
    assert not any(MARKER.encode() in state for state in raw_states(database_url))


def test_plain_ledger_is_the_default(tmp_path: Path, database_url: str) -> None:
    services = open_services(tmp_path, database_url)
    try:
        submit(services, "plain")
    finally:
        services.close()
    assert any(MARKER.encode() in state for state in raw_states(database_url))


def test_a_server_must_match_how_the_ledger_was_written(
    tmp_path: Path, database_url: str
) -> None:
    key = new_key()
    first = open_services(tmp_path, database_url, ledger_key=SecretStr(key))
    try:
        submit(first, "kept")
    finally:
        first.close()
    with pytest.raises(LedgerFormatMismatch, match="start it with --ledger-key-file"):
        open_services(tmp_path, database_url)
    other = new_key()
    with pytest.raises(LedgerFormatMismatch, match=f"fingerprint is {fingerprint(key)}"):
        open_services(tmp_path, database_url, ledger_key=SecretStr(other))
    with pytest.raises(LedgerFormatMismatch, match="start it with --compress-events|drop"):
        open_services(tmp_path, database_url, ledger_key=SecretStr(key), compress_events=True)


def test_a_written_plain_ledger_cannot_be_encrypted_later(
    tmp_path: Path, database_url: str
) -> None:
    first = open_services(tmp_path, database_url)
    try:
        submit(first, "plain-first")
    finally:
        first.close()
    with pytest.raises(LedgerFormatMismatch, match="cannot be encrypted after it was written"):
        open_services(tmp_path, database_url, ledger_key=SecretStr(new_key()))


def test_key_files_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "ledger.key"
    with pytest.raises(LedgerKeyError, match="cannot read"):
        read_key_file(path)
    path.write_text(new_key() + "\n")
    path.chmod(0o644)
    with pytest.raises(LedgerKeyError, match="chmod 600"):
        read_key_file(path)
    path.chmod(0o600)
    assert len(base64.b64decode(read_key_file(path))) == 32
    path.write_text("not base64 at all!\n")
    with pytest.raises(LedgerKeyError, match="16, 24 or 32 bytes"):
        read_key_file(path)


def test_the_server_command_says_what_to_do(tmp_path: Path) -> None:
    """The real `flexai server`: a bad key file, then a ledger written with another key."""
    env = {**os.environ, "FLEXAI_CONFIG": str(tmp_path / "config.json"), "PYTHONPATH": str(ROOT)}
    key = tmp_path / "ledger.key"
    key.write_text("short\n")
    key.chmod(0o600)
    server = [sys.executable, "-m", "cli.main", "server", "--data-dir", str(tmp_path / "data"),
              "--port", "1", "--ledger-key-file", str(key)]  # fmt: skip
    result = subprocess.run(server, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "must hold 16, 24 or 32 bytes" in result.stderr
    assert "Traceback" not in result.stderr
    key.write_text(new_key() + "\n")
    data = tmp_path / "data"
    services = build_services(Settings(data_dir=data, ledger_key=SecretStr(new_key())))
    services.close()
    result = subprocess.run(server, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "pass the key whose fingerprint is" in result.stderr
    assert "Traceback" not in result.stderr
