"""The ``flexai secret`` subcommands, one module each (see :mod:`cli.commands` for the shape).
Imports: cli.client, cli.commands, cli.errors, cli.output."""

from __future__ import annotations

import argparse
import re

# In the order `flexai secret --help` lists them.
SECRET_COMMANDS = ("create", "list", "delete")

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
NAME_RULE = "1 to 63 letters, digits, '.', '-' and '_', starting with a letter or digit"


def secret_name(value: str) -> str:
    if not NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r:.60} is not a secret name: use {NAME_RULE}")
    return value


def add_secret_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", metavar="NAME", type=secret_name, help=f"the secret's name: {NAME_RULE}"
    )
