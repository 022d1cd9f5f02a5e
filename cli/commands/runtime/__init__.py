"""The ``flexai runtime`` subcommands, one module each (see :mod:`cli.commands` for the shape);
admins make and delete runtimes with ``flexai admin runtime``.
Imports: cli.client, cli.commands, cli.output."""

from __future__ import annotations

# In the order `flexai runtime --help` lists them.
RUNTIME_COMMANDS = ("list",)
