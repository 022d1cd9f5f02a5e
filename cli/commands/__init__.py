"""The ``flexai training`` subcommands, one module each.

Each module's docstring is its help text (first line: the summary in the command list) and it
defines ``configure(parser)`` and ``execute(args) -> int``. Modules import only the standard
library at the top; the HTTP client is imported inside ``execute`` so that ``--help`` is instant.
"""

from __future__ import annotations

import argparse
from typing import Protocol

# In the order `flexai training --help` lists them.
TRAINING_COMMANDS = (
    "run", "list", "inspect", "history", "logs", "checkpoints", "fetch", "stop", "delete",
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
