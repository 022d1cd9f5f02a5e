"""The ``flexai admin`` subcommands, one module each (see :mod:`cli.commands` for the shape).

They reach the server through its HTTP API with the admin token, like every other command."""

from __future__ import annotations

# In the order `flexai admin --help` lists them.
ADMIN_COMMANDS = ("verify", "rebuild-projections")
"""A command ``a-b`` is the module ``a_b``."""
