"""The secret store: values sealed with AES-GCM under a key of the server's own, bound to
their owner and name, and a key that is made once, kept 0600, or given and checked."""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.identity.secrets import (
    KEY_FILE,
    KEY_VARIABLE,
    SecretExists,
    SecretKeyError,
    SecretStore,
    SecretUnreadable,
    load_key,
)
from ledger.database import SQLiteDatabase

VALUE = "hf_correct-horse-battery-staple"


@pytest.fixture
def database(tmp_path: Path) -> Iterator[SQLiteDatabase]:
    database = SQLiteDatabase(str(tmp_path / "flexai.sqlite3"))
    yield database
    database.close()


@pytest.fixture
def store(database: SQLiteDatabase) -> SecretStore:
    return SecretStore(database, os.urandom(32))


def raw_rows(database: SQLiteDatabase) -> list[dict[str, object]]:
    with database.transaction() as cursor:
        cursor.execute("SELECT * FROM user_secrets ORDER BY owner, name")
        return cursor.fetchall()


def test_a_value_comes_back_to_its_owner_and_is_stored_sealed(
    store: SecretStore, database: SQLiteDatabase, tmp_path: Path
) -> None:
    store.create("alice", "hf", VALUE)
    assert store.values("alice", ["hf"]) == ({"hf": VALUE}, [])
    assert all(VALUE not in str(row.values()) for row in raw_rows(database))
    assert VALUE.encode() not in (tmp_path / "flexai.sqlite3").read_bytes()


def test_each_user_has_their_own_names(store: SecretStore) -> None:
    store.create("alice", "hf", VALUE)
    store.create("bob", "hf", "bob's")
    assert store.values("bob", ["hf"]) == ({"hf": "bob's"}, [])
    assert store.values("carol", ["hf"]) == ({}, ["hf"])
    assert [secret.name for secret in store.listed("alice")] == ["hf"]
    assert store.delete("alice", "hf") and not store.delete("alice", "hf")
    assert store.values("bob", ["hf"])[0] == {"hf": "bob's"}


def test_create_refuses_a_name_in_use_and_put_replaces_the_value(store: SecretStore) -> None:
    store.create("alice", "hf", VALUE)
    with pytest.raises(SecretExists):
        store.create("alice", "hf", "other")
    stored, created = store.put("alice", "hf", "new value")
    assert not created and stored.updated_at >= stored.created_at
    assert store.values("alice", ["hf"])[0] == {"hf": "new value"}
    assert store.put("alice", "wandb", "w")[1]


def test_a_sealed_value_moved_to_another_owner_or_name_does_not_open(
    store: SecretStore, database: SQLiteDatabase
) -> None:
    store.create("alice", "hf", VALUE)
    store.create("mallory", "hf", "mine")
    store.create("alice", "other", "x")
    with database.transaction(write=True) as cursor:
        cursor.execute("UPDATE user_secrets SET sealed = (SELECT sealed FROM user_secrets "
                       "WHERE owner = 'alice' AND name = 'hf') WHERE owner = 'mallory'")
        cursor.execute("UPDATE user_secrets SET sealed = (SELECT sealed FROM user_secrets "
                       "WHERE owner = 'alice' AND name = 'hf') WHERE name = 'other'")  # fmt: skip
    for owner, name in (("mallory", "hf"), ("alice", "other")):
        with pytest.raises(SecretUnreadable) as refused:
            store.values(owner, [name])
        assert "altered" in str(refused.value) and VALUE not in str(refused.value)


def test_a_server_with_another_key_says_so_instead_of_failing_to_open(
    store: SecretStore, database: SQLiteDatabase
) -> None:
    store.create("alice", "hf", VALUE)
    other = SecretStore(database, os.urandom(32))
    with pytest.raises(SecretUnreadable, match="FLEXAI_SECRET_KEY"):
        other.values("alice", ["hf"])


def test_the_key_is_made_once_in_the_data_dir_readable_by_its_owner_only(
    tmp_path: Path,
) -> None:
    key = load_key(tmp_path, {})
    assert len(key) == 32
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    assert load_key(tmp_path, {}) == key


def test_a_key_from_the_environment_wins_and_must_be_32_bytes_of_base64(
    tmp_path: Path,
) -> None:
    key = os.urandom(32)
    assert load_key(tmp_path, {KEY_VARIABLE: base64.b64encode(key).decode()}) == key
    assert not (tmp_path / KEY_FILE).exists()
    for bad in ("not base64!", base64.b64encode(os.urandom(16)).decode()):
        with pytest.raises(SecretKeyError, match="32 random bytes in base64") as refused:
            load_key(tmp_path, {KEY_VARIABLE: bad})
        assert bad not in str(refused.value)
