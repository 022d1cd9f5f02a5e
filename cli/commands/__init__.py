"""The ``flexai training`` subcommands, one module each.

Each module's docstring is its help text (first line: the summary in the command list) and it
defines ``configure(parser)`` and ``execute(args) -> int``. Modules import only the standard
library at the top; the HTTP client is imported inside ``execute`` so that ``--help`` is instant.
Imports: cli.client, cli.errors, cli.output, cli.sharing_flags, cli.sshproxy, cli.sweeps,
cli.timetravel, common
(inside ``execute``, but for the standard library)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, Protocol

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


def contract_type(what: str, check: Callable[[str], str]) -> Callable[[str], str]:
    """An argparse type checked by one rule of the contract, refused in its words."""

    def checked(value: str) -> str:
        from common.contract import Refusal

        try:
            return check(value)
        except Refusal as refusal:
            raise argparse.ArgumentTypeError(f"{what} {refusal}") from None

    return checked


def add_named(parser: argparse.ArgumentParser, kind: str, rule: str,
              check: Callable[[str], str]) -> None:  # fmt: skip
    """The ``NAME`` argument of a dataset or a secret, checked by the contract's rule."""
    parser.add_argument("name", metavar="NAME", type=contract_type(f"{kind} name", check),
                        help=f"the {kind}'s name: {rule}")  # fmt: skip


def print_listing(args: argparse.Namespace, answer: dict[str, Any], key: str,
                  render: Callable[[list[Any]], str], none: str) -> int:  # fmt: skip
    """A list's answer: as JSON with ``--json``, else its table, or ``none`` when it is empty."""
    from cli.output.formats import render_json

    if args.json:
        print(render_json(answer))
    else:
        print(render(answer.get(key) or []) if answer.get(key) else none)
    return 0


def add_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the training job's name")


def add_owner_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--owner", metavar="USER",
        help="act on that user's job (admins only; your own by default)",
    )  # fmt: skip


def _attempt(value: str) -> int:
    from common.attempts import FIRST, MAX_ATTEMPT

    try:
        attempt = int(value)
    except ValueError:
        attempt = 0
    if not FIRST <= attempt <= MAX_ATTEMPT:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from {FIRST} to {MAX_ATTEMPT}, not {value!r}")
    return attempt


def add_attempt_flag(parser: argparse.ArgumentParser, what: str, default: str) -> None:
    """``--attempt K``: which attempt of a job preempted or retried (each keeps its own)."""
    parser.add_argument(
        "--attempt", type=_attempt, metavar="K",
        help=f"{what} of the job's attempt K (1 is its first run; a job preempted or retried "
             f"runs again as the next attempt; default: {default})",
    )  # fmt: skip
