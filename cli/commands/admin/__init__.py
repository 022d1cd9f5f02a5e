"""The ``flexai admin`` subcommands, one module each (see :mod:`cli.commands` for the shape).

They reach the server through its HTTP API with an admin's token, like every other command
(``token`` serves every user for their own tokens).
Imports: cli.client, cli.commands, cli.errors, cli.output, common.contract."""

from __future__ import annotations

# In the order `flexai admin --help` lists them.
ADMIN_COMMANDS = ("user", "token", "node", "node-token", "runtime", "verify", "purge",
                  "rebuild-projections")  # fmt: skip
"""A command ``a-b`` is the module ``a_b``."""
