"""Logs in: checks a control plane's URL and your API token, then keeps them (mode 0600).

The token is checked (`GET /v1/whoami`) before anything is written; the client config
(`$FLEXAI_CONFIG`, else ~/.config/flexai/config.json) is then written readable by you alone
(mode 0600). On a terminal it prompts (the token is not echoed); otherwise give --url and the
token on standard input with --token-stdin, e.g. `flexai login --url URL --token-stdin <
alice.token`. An admin makes tokens: `flexai admin user create NAME`.

A server whose certificate is signed by a private CA: give that CA's certificate (PEM) with
--ca-file; it is checked now and kept in the config for every later command. http:// is taken
for this host's own loopback only (else --allow-http: the token then crosses the network in
clear text).
"""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", metavar="URL",
                        help="the control plane's URL, e.g. https://cp.internal:8000")
    parser.add_argument("--ca-file", metavar="FILE",
                        help="a private CA's certificate (PEM) to verify the server with, "
                             "besides the system's CAs; kept in the config")
    parser.add_argument("--token-stdin", action="store_true",
                        help="read the token from standard input, not from a prompt")  # fmt: skip


def execute(args: argparse.Namespace) -> int:
    import getpass
    import os

    from cli.client.api import ApiClient
    from cli.errors import CliError
    from common.client_config import ClientConfig, ConfigError, config_path, read_client_file

    path = config_path()
    try:
        stored = read_client_file(path)
    except ConfigError:
        stored = {}  # a broken file is replaced
    current = os.environ.get("FLEXAI_API_URL") or stored.get("api_url")
    interactive = sys.stdin.isatty() and not args.token_stdin
    url = args.url
    if url is None and interactive:
        url = input(f"API URL [{current}]: " if current else "API URL: ").strip() or current
    url = url or current
    if not url:
        raise CliError("no API URL: pass --url URL (the control plane's, e.g. http://host:8000)")
    if interactive:
        token = getpass.getpass("API token: ").strip()
    elif args.token_stdin or not sys.stdin.isatty():
        token = sys.stdin.readline().strip()
    else:
        token = ""
    if not token:
        raise CliError("no API token given: paste it at the prompt, or pipe it to "
                       "`flexai login --token-stdin`")  # fmt: skip
    url = url.rstrip("/")
    ca_file = _ca_file(args.ca_file, stored if url == stored.get("api_url") else {})
    with ApiClient(url, token, ca_file=ca_file) as client:
        me = client.whoami()
    if me.get("kind") != "user":
        raise CliError(f"this is node {me.get('node')}'s token: it is for its agent "
                       "(`flexai agent --token-file`), not for logging in; use a user's token")
    from common.client_config import write_client_config

    written = write_client_config(ClientConfig(url, token, ca_file), path)
    role = " (admin)" if me.get("admin") else ""
    print(f"logged in to {url} as {me.get('user')}{role}; the token is kept in "
          f"{written} (readable by you alone)")  # fmt: skip
    return 0


def _ca_file(given: str | None, stored: dict[str, str]) -> str | None:
    """The CA to keep: the one given (absolute: later commands run elsewhere), else the one
    kept for this same URL."""
    from pathlib import Path

    from cli.errors import CliError

    if given is None:
        return stored.get("ca_file")
    path = Path(given).expanduser()
    if not path.is_file():
        raise CliError(f"--ca-file {given}: no such file; give the PEM certificate of the CA "
                       "that signed the server's certificate")  # fmt: skip
    return str(path.resolve())
