"""The `flexai` entry point: `flexai training <subcommand>`, `flexai dataset <subcommand>`,
`flexai secret <subcommand>`, `flexai runtime list`, `flexai server`, `flexai agent`.

Exit codes: 0 done; 1 the server refused or something went wrong (one `error: ` line on
stderr); 2 the command line is wrong; 130 interrupted with Ctrl-C; 141 the reader of stdout went
away (e.g. `| head`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, cast

from cli.commands import TRAINING_COMMANDS, Command
from cli.commands.admin import ADMIN_COMMANDS
from cli.commands.dataset import DATASET_COMMANDS
from cli.commands.run import split_entry_point
from cli.commands.runtime import RUNTIME_COMMANDS
from cli.commands.secret import SECRET_COMMANDS
from cli.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    UsageError,
)

ACCOUNT_COMMANDS = ("login", "whoami")
"""Top-level commands of their own: ``flexai login``, ``flexai whoami``."""

# `flexai server` and `flexai agent` hand the rest of the command line to these, imported only
# when they run so that the CLI never pays for FastAPI or the agent's dependencies, which are
# extras of the package: `pip install 'flexai-control-plane[server]'` (or `[agent]`).
EXTERNAL_COMMANDS = {
    "server": ("api.server", "runs the control plane: the HTTP API, scheduler and projections"),
    "agent": ("node_agent.main", "runs a node agent on a GPU host"),
}
DISTRIBUTION = "flexai-control-plane"
OURS = ("api", "node_agent", "cli", "common", "domain", "projections")


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are raised, to be shown as one `error: ` line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, prog=self.prog)


class _VersionAction(argparse.Action):
    """`--version`, reading the installed version only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"flexai {version()}")
        parser.exit()


def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("flexai-control-plane")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _summary(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if doc else ""


def _command(package: str, name: str) -> Command:
    return cast(Command, importlib.import_module(f"{package}.{name}"))


def _add_group(
    top: Any, name: str, summary: str, description: str, package: str, commands: Sequence[str]
) -> None:
    """``flexai NAME SUBCOMMAND``: one subcommand per module of ``package``."""
    formatter = argparse.RawDescriptionHelpFormatter
    group = top.add_parser(name, help=summary, description=description, formatter_class=formatter)
    group.set_defaults(help_parser=group)
    subcommands = group.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", parser_class=Parser)
    for command in commands:
        module = _command(package, command.replace("-", "_"))
        sub = subcommands.add_parser(
            command,
            help=_summary(module.__doc__),
            description=(module.__doc__ or "").strip(),
            formatter_class=formatter,
        )
        module.configure(sub)
        sub.set_defaults(execute=module.execute)


def build_parser() -> Parser:
    """The whole `flexai` command line but `server` and `agent`, which parse their own."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = Parser(
        prog="flexai",
        description="An open-source control plane for ML training jobs.",
        formatter_class=formatter,
    )
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument("--allow-http", action="store_true",
                        help="talk plain http:// to a control plane on another host (your token "
                             "then crosses the network in clear text; refused otherwise; "
                             "FLEXAI_ALLOW_HTTP=1 says the same)")  # fmt: skip
    top = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    _add_group(
        top, "training", "manage Training Jobs",
        "Manages Training Jobs: start them, follow their logs, inspect them, download their "
        "output artifacts, stop and delete them.",
        "cli.commands", TRAINING_COMMANDS,
    )  # fmt: skip
    _add_group(
        top, "dataset", "manage Datasets",
        "Manages Datasets: push a file or directory to the control plane, list them, inspect\n"
        "their versions. A job gets one with `flexai training run -D NAME`.",
        "cli.commands.dataset", DATASET_COMMANDS,
    )  # fmt: skip
    _add_group(
        top, "secret", "manage Secrets",
        "Manages Secrets: values kept encrypted by the control plane, which jobs get in an\n"
        "environment variable with `flexai training run --secret ENV_VAR=NAME`.",
        "cli.commands.secret", SECRET_COMMANDS,
    )  # fmt: skip
    _add_group(
        top, "runtime", "list Runtimes",
        "Lists Runtimes: the images an admin named for jobs to run in, with\n"
        "`flexai training run --runtime NAME`.",
        "cli.commands.runtime", RUNTIME_COMMANDS,
    )  # fmt: skip
    _add_group(
        top, "admin", "administer the control plane (users, tokens, the ledger)",
        "Administers the control plane through its API, with an admin's token: users, API\n"
        "tokens and nodes' tokens; check the ledger's hash chain and the views against it,\n"
        "rebuild the views.",
        "cli.commands.admin", ADMIN_COMMANDS,
    )  # fmt: skip
    for name in ACCOUNT_COMMANDS:
        module = _command("cli.commands", name)
        sub = top.add_parser(name, help=_summary(module.__doc__),
                             description=(module.__doc__ or "").strip(), formatter_class=formatter)
        module.configure(sub)
        sub.set_defaults(execute=module.execute, subcommand=name)
    for name, (_, summary) in EXTERNAL_COMMANDS.items():
        top.add_parser(name, help=summary, add_help=False)
    return parser


def _run_external(command: str, argv: list[str]) -> int:
    module_name = EXTERNAL_COMMANDS[command][0]
    try:
        module = importlib.import_module(module_name)
        entry = cast(Callable[[list[str]], int], module.main)
        return int(entry(argv) or 0)
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        if not missing or missing in OURS:
            raise CliError(
                f"`flexai {command}` is not available in this installation (no module {error.name})"
            ) from error
        raise CliError(
            f"`flexai {command}` needs packages this installation lacks (no module {missing}): "
            f"pip install '{DISTRIBUTION}[{command}]'"
        ) from error


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in EXTERNAL_COMMANDS:
        return _run_external(argv[0], argv[1:])
    head, entry_point = split_entry_point(argv)
    parser = build_parser()
    args = parser.parse_args(head)
    if args.allow_http:
        from common.tls import ALLOW_HTTP

        os.environ[ALLOW_HTTP] = "1"
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if getattr(args, "subcommand", None) is None:
        args.help_parser.print_help()
        return EXIT_USAGE
    if (args.command, args.subcommand) == ("training", "run"):
        args.entry_point = entry_point
    elif (args.command, args.subcommand) == ("training", "debug-ssh"):
        args.remote_command = entry_point
    elif entry_point is not None:
        raise UsageError(
            f"`flexai {args.command} {args.subcommand}` takes no arguments after `--`",
            prog=f"flexai {args.command} {args.subcommand}",
        )
    execute = cast(Callable[[argparse.Namespace], int], args.execute)
    return execute(args)


def _error(message: str) -> None:
    sys.stderr.write(f"error: {' '.join(message.split())}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """Run one `flexai` command line and return its exit code."""
    from common.client_config import ConfigError

    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(arguments)
    except SystemExit as done:  # --help, --version, and `server`/`agent` that exit
        code = done.code
        if code is None or isinstance(code, int):
            return code or 0
        _error(str(code))
        return EXIT_ERROR
    except CliError as error:
        _error(str(error))
        return error.exit_code
    except ConfigError as error:
        _error(str(error))
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away: silence the flush at exit, and say so the usual way
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as error:
        if os.environ.get("FLEXAI_DEBUG"):
            raise
        if _is_http_error(error):
            _error(f"talking to the control plane failed: {error}")
        else:
            _error(
                f"unexpected {type(error).__name__}: {error} "
                f"(set FLEXAI_DEBUG=1 to see where it came from)"
            )
        return EXIT_ERROR


def _is_http_error(error: Exception) -> bool:
    httpx = sys.modules.get("httpx")
    return httpx is not None and isinstance(error, httpx.HTTPError)


if __name__ == "__main__":
    sys.exit(main())
