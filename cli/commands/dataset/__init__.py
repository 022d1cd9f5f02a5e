"""The ``flexai dataset`` subcommands, one module each (see :mod:`cli.commands` for the shape).
Imports: cli.client, cli.commands, cli.errors, cli.output, common.contract."""

from __future__ import annotations

import argparse

from cli.commands import add_named
from common.contract import DATASET_RULE, check_dataset_name

# In the order `flexai dataset --help` lists them.
DATASET_COMMANDS = ("push", "list", "inspect")


def add_dataset_name(parser: argparse.ArgumentParser) -> None:
    add_named(parser, "dataset", DATASET_RULE, check_dataset_name)
