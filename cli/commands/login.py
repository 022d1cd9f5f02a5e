"""Logs in: checks a control plane's URL and your API token, then keeps them (mode 0600).

The token is checked (`GET /v1/whoami`) before anything is written; the client config
(`$FLEXAI_CONFIG`, else ~/.config/flexai/config.json) is then written readable by you alone
(mode 0600). On a terminal it prompts (the token is not echoed); otherwise give --url and the
token on standard input with --token-stdin, e.g. `flexai login --url URL --token-stdin <
alice.token`. An admin makes tokens: `flexai admin user create NAME`.
"""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", metavar="URL", help="the control plane's URL, e.g. http://host:8000")
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
        current = read_client_file(path).get("api_url")
    except ConfigError:
        current = None  # a broken file is replaced
    current = os.environ.get("FLEXAI_API_URL") or current
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
    with ApiClient(url, token) as client:
        me = client.whoami()
    if me.get("kind") != "user":
        raise CliError(f"this is node {me.get('node')}'s token: it is for its agent "
                       "(`flexai agent --token-file`), not for logging in; use a user's token")
    from common.client_config import write_client_config

    written = write_client_config(ClientConfig(url.rstrip("/"), token), path)
    role = " (admin)" if me.get("admin") else ""
    print(f"logged in to {url.rstrip('/')} as {me.get('user')}{role}; the token is kept in "
          f"{written} (readable by you alone)")  # fmt: skip
    return 0
