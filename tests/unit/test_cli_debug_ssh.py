"""`flexai training debug-ssh`'s command line and the `ssh` it runs."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from cli.commands import debug_ssh
from cli.main import main


@pytest.fixture
def configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXAI_API_URL", "http://127.0.0.1:9")  # nothing answers there
    monkeypatch.setenv("FLEXAI_TOKEN", "token")


def test_without_an_ssh_client_the_message_says_to_install_openssh_client(
    configured: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(debug_ssh.shutil, "which", lambda name: None)
    assert main(["training", "debug-ssh", "my-job", "--", "true"]) == 1
    assert "apt-get install openssh-client" in capsys.readouterr().err


def test_no_shell_and_a_command_together_are_refused(
    configured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["training", "debug-ssh", "my-job", "-N", "--", "true"]) == 2
    assert "-N runs no command" in capsys.readouterr().err


def test_ssh_trusts_the_sessions_host_key_alone_and_goes_through_the_proxy(
    tmp_path: Path,
) -> None:
    files = debug_ssh._SessionFiles(b"private", "ssh-ed25519 AAAAhostkey")
    with files:
        args = argparse.Namespace(name="my-job", local_forward=["6006:localhost:6006"],
                                  no_command=False, tty=False)  # fmt: skip
        argv = debug_ssh.ssh_command("/usr/bin/ssh", files, args, "abc123",
                                     ["sh", "-c", "echo $SOME_ENV; ls"])  # fmt: skip
        assert files.key.stat().st_mode & 0o777 == 0o600
        assert files.known_hosts.read_text() == "flexai-debug-session ssh-ed25519 AAAAhostkey\n"
        directory = files.directory
    assert not directory.exists()  # the key and known_hosts are gone afterwards
    options = dict(argv[i + 1].split("=", 1) for i, part in enumerate(argv) if part == "-o")
    assert argv[:3] == ["/usr/bin/ssh", "-F", "/dev/null"]
    assert options["StrictHostKeyChecking"] == "yes"
    assert options["UserKnownHostsFile"] == str(files.known_hosts)
    assert options["IdentitiesOnly"] == "yes"
    proxy = shlex.split(options["ProxyCommand"])
    assert proxy[-5:] == ["training", "debug-ssh", "my-job", "--proxy-session", "abc123"]
    assert argv[argv.index("-L") + 1] == "6006:localhost:6006"
    assert argv[-2:] == ["--", "sh -c 'echo $SOME_ENV; ls'"]  # one string: sh -c gets it whole
