"""`flexai secret`: create reads the value from stdin or a hidden prompt and never prints it,
list shows names and dates, delete, and help without heavy imports."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

from cli.client.api import ApiClient
from cli.main import main
from cli.output.tables import render_secrets_table
from tests.unit.test_cli_main import HEAVY, modules_loaded_by

VALUE = "hf_s3cr3t value"


class Stdin(io.TextIOWrapper):
    def __init__(self, data: bytes, tty: bool) -> None:
        super().__init__(io.BytesIO(data))
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, bool]]:
    calls: list[tuple[str, str, bool]] = []

    def create_secret(self: ApiClient, name: str, value: str, *, update: bool = False
                      ) -> dict[str, Any]:  # fmt: skip
        calls.append((name, value, update))
        later = "2026-12-03T10:00:00+00:00" if update else "2026-12-02T10:00:00+00:00"
        return {"name": name, "created_at": "2026-12-02T10:00:00+00:00", "updated_at": later}

    monkeypatch.setenv("FLEXAI_API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FLEXAI_TOKEN", "t")
    monkeypatch.setattr(ApiClient, "create_secret", create_secret)
    return calls


def test_create_reads_the_value_from_stdin_without_its_last_newline_and_never_prints_it(
    sent: list[tuple[str, str, bool]], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setattr(sys, "stdin", Stdin(f"{VALUE}\n".encode(), tty=False))
    assert main(["secret", "create", "hf-token"]) == 0
    assert sent == [("hf-token", VALUE, False)]
    out, err = capsys.readouterr()
    assert "Created secret hf-token" in out and "--secret ENV_VAR=hf-token" in out
    assert VALUE not in out + err


def test_update_replaces_the_value(
    sent: list[tuple[str, str, bool]], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setattr(sys, "stdin", Stdin(b"multi\nline\n", tty=False))
    assert main(["secret", "create", "pem", "--update"]) == 0
    assert sent == [("pem", "multi\nline", True)]
    assert "Updated secret pem" in capsys.readouterr().out


def test_on_a_terminal_the_value_is_asked_twice_without_echo(
    sent: list[tuple[str, str, bool]], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import getpass

    prompts: list[str] = []
    answers = iter([VALUE, VALUE, VALUE, "typo"])

    def ask(prompt: str = "") -> str:
        prompts.append(prompt)
        return next(answers)

    monkeypatch.setattr(sys, "stdin", Stdin(b"", tty=True))
    monkeypatch.setattr(getpass, "getpass", ask)
    assert main(["secret", "create", "hf-token"]) == 0
    assert sent == [("hf-token", VALUE, False)] and "hf-token" in prompts[0]
    assert main(["secret", "create", "other"]) == 1
    assert "the two values differ" in capsys.readouterr().err
    assert len(sent) == 1


@pytest.mark.parametrize(("data", "said"), [
    (b"\n", "is empty"),
    (b"\xff\xfe", "UTF-8"),
    (b"a\x00b", "NUL"),
    (b"abc\n", "is 3 characters; a secret needs at least 4"),
    ("ü€😀".encode(), "is 3 characters"),  # characters, not bytes
])  # fmt: skip
def test_a_value_that_cannot_be_stored_is_refused_before_anything_is_sent(
    sent: list[tuple[str, str, bool]], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], data: bytes, said: str,
) -> None:  # fmt: skip
    monkeypatch.setattr(sys, "stdin", Stdin(data, tty=False))
    assert main(["secret", "create", "hf-token"]) == 1
    assert said in capsys.readouterr().err and sent == []


def test_a_bad_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["secret", "delete", "../x"]) == 2
    assert "secret name '../x' is not valid: use 1 to 63" in capsys.readouterr().err


def test_list_is_a_table_of_names_and_dates() -> None:
    table = render_secrets_table([{"name": "hf-token", "created_at": None,
                                   "updated_at": None}])  # fmt: skip
    header, row = table.splitlines()
    assert header.split() == ["NAME", "CREATED", "UPDATED"]
    assert row.split() == ["hf-token", "-", "-"]


def test_list_and_delete_say_what_there_is_and_what_was_done(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deleted: list[str] = []
    monkeypatch.setenv("FLEXAI_API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FLEXAI_TOKEN", "t")
    monkeypatch.setattr(ApiClient, "list_secrets", lambda self: {"secrets": [], "count": 0})
    monkeypatch.setattr(ApiClient, "delete_secret", lambda self, name: deleted.append(name) or {})
    assert main(["secret", "list"]) == 0
    assert "No secrets. Create one with `flexai secret create NAME`." in capsys.readouterr().out
    assert main(["secret", "delete", "hf-token"]) == 0
    assert deleted == ["hf-token"] and "Deleted secret hf-token." in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["secret", "--help"], ["secret", "create", "--help"]])
def test_secret_help_imports_nothing_heavy(argv: list[str]) -> None:
    code, out, loaded = modules_loaded_by(argv)
    assert code == 0 and "usage: flexai secret" in out
    assert loaded.isdisjoint(HEAVY), loaded & set(HEAVY)
