"""The ``flexai secret`` subcommands, one module each (see :mod:`cli.commands` for the shape).
Imports: cli.client, cli.commands, cli.errors, cli.output, common.contract."""

from __future__ import annotations

import argparse

from cli.commands import add_named
from common.contract import SECRET_RULE, check_secret_name

# In the order `flexai secret --help` lists them.
SECRET_COMMANDS = ("create", "list", "delete")


def add_secret_name(parser: argparse.ArgumentParser) -> None:
    add_named(parser, "secret", SECRET_RULE, check_secret_name)
