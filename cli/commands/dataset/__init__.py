"""The ``flexai dataset`` subcommands, one module each (see :mod:`cli.commands` for the shape).
Imports: cli.client, cli.commands, cli.errors, cli.output."""

from __future__ import annotations

import argparse
import re

# In the order `flexai dataset --help` lists them.
DATASET_COMMANDS = ("push", "list", "inspect")

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
NAME_RULE = "1 to 128 letters, digits, '.', '-' and '_', starting with a letter or digit"


def dataset_name(value: str) -> str:
    if not NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r:.60} is not a dataset name: use {NAME_RULE}")
    return value


def add_dataset_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", metavar="NAME", type=dataset_name, help=f"the dataset's name: {NAME_RULE}"
    )
