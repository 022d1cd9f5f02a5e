"""The ``flexai training`` subcommands, one module each.

Each module's docstring is its help text (first line: the summary in the command list) and it
defines ``configure(parser)`` and ``execute(args) -> int``. Modules import only the standard
library at the top; the HTTP client is imported inside ``execute`` so that ``--help`` is instant.
Imports: cli.client, cli.errors, cli.output, cli.sshproxy, cli.sweeps, cli.timetravel, common
(inside ``execute``, but for the standard library)."""

from __future__ import annotations

import argparse
from typing import Protocol

# In the order `flexai training --help` lists them.
TRAINING_COMMANDS = (
    "run", "list", "inspect", "history", "logs", "checkpoints", "fetch", "debug-ssh", "stop",
    "delete",
)  # fmt: skip


class Command(Protocol):
    __doc__: str | None

    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def execute(self, args: argparse.Namespace) -> int: ...


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the server's JSON answer as is, for scripts"
    )


def add_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the training job's name")


def add_owner_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--owner", metavar="USER",
        help="act on that user's job (admins only; your own by default)",
    )  # fmt: skip
