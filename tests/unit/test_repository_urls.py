"""Repository URLs: only https://, ssh://, user@host:path and local paths by default (the
server's --allowed-repo-schemes), never what git reads as an option or a transport helper;
the CLI refuses those before it sends anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.server import _settings, parse
from api.settings import Settings
from cli.commands.run import repository_url
from cli.errors import CliError
from domain.specs import check_repository_url, check_spec, repository_kind
from domain.values import InvalidValue


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("https://github.com/org/repo.git", "https"),
        ("ssh://git@host:2222/org/repo", "ssh"),
        ("git+ssh://host/org/repo", "ssh"),
        ("git@github.com:org/repo.git", "scp"),
        ("host.internal:repos/demo", "scp"),
        ("/srv/repos/demo", "file"),
        ("/srv/my repos/demo", "file"),
        ("file:///srv/repos/demo", "file"),
        ("http://example.com/r.git", "http"),
        ("git://example.com/r.git", "git"),
    ],
)
def test_each_kind_of_repository_url_is_recognised(url: str, kind: str) -> None:
    assert repository_kind(url) == kind


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("--upload-pack=touch /tmp/pwned", "starts with '-'"),
        ("-oProxyCommand=x", "starts with '-'"),
        ("ext::sh -c touch% /tmp/pwned", "transport helper"),
        ("fd::7", "transport helper"),
        ("file::/srv/repo", "transport helper"),
        ("ssh://-oProxyCommand=touch%20x/repo", "starting with '-'"),
        ("ssh://git@-oProxyCommand=x/repo", "starting with '-'"),
        ("https:///no-host", "no host"),
        ("evil://host/repo", "unknown scheme 'evil'"),
        ("https://host/re po", "holds a space"),
        ("https://host/repo\n", "control character"),
        ("https://host/\x00", "NUL"),
        ("repo", "relative path"),
        ("../repo", "relative path"),
        ("", "must not be empty"),
    ],
)
def test_a_url_git_would_misread_is_refused_saying_what_to_give(url: str, says: str) -> None:
    with pytest.raises(InvalidValue) as refused:
        repository_kind(url)
    assert refused.value.field == "repository_url" and says in str(refused.value)


def test_the_model_refuses_such_a_url_too_whatever_the_caller() -> None:
    spec = {"repository_url": "ext::sh -c id", "entry_point": ["train.py"], "accels": 1,
            "nodes": 1}  # fmt: skip
    with pytest.raises(InvalidValue, match="transport helper"):
        check_spec(spec)


def test_a_kind_left_out_of_the_allowed_ones_is_refused_naming_those_accepted() -> None:
    with pytest.raises(InvalidValue) as refused:
        check_repository_url("/srv/repos/demo", allowed={"https", "ssh"})
    message = str(refused.value)
    assert "give https://, ssh://" in message and "--allowed-repo-schemes" in message
    assert check_repository_url("https://h/r", allowed={"https"}) == "https://h/r"


def test_the_server_flag_sets_the_allowed_kinds_and_refuses_unknown_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse([]).allowed_repo_schemes == {"https", "ssh", "scp", "file"}
    args = parse(["--allowed-repo-schemes", "https, HTTP"])
    assert _settings(args).allowed_repo_schemes == {"https", "http"}
    with pytest.raises(SystemExit):
        parse(["--allowed-repo-schemes", "https,ext"])
    assert "unknown kind 'ext'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown kind"):
        Settings(data_dir=Path("/tmp"), allowed_repo_schemes=frozenset({"ext"}))


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("--upload-pack=touch /tmp/pwned", "starts with '-'"),
        ("ext::sh -c touch% /tmp/pwned", "transport helper"),
        ("evil://host/repo", "unknown scheme"),
        ("https://host/repo\x1b[2J", "control character"),
    ],
)
def test_the_cli_refuses_such_a_url_before_it_sends_anything(url: str, says: str) -> None:
    with pytest.raises(CliError) as refused:
        repository_url(url)
    assert says in str(refused.value) and "https://" in str(refused.value)
