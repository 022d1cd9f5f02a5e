"""The ``flexai dataset`` subcommands, one module each (see :mod:`cli.commands` for the shape).
Imports: cli.client, cli.commands, cli.errors, cli.output, common.contract."""

from __future__ import annotations

import argparse

from common.contract import DATASET_RULE, Refusal, check_dataset_name

# In the order `flexai dataset --help` lists them.
DATASET_COMMANDS = ("push", "list", "inspect")



def dataset_name(value: str) -> str:
    try:
        return check_dataset_name(value)
    except Refusal as refusal:
        raise argparse.ArgumentTypeError(f"dataset name {refusal}") from None


def add_dataset_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", metavar="NAME", type=dataset_name, help=f"the dataset's name: {DATASET_RULE}"
    )
