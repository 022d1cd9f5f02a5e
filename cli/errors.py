"""Errors the CLI shows to people as one line, and the exit codes that go with them."""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


class CliError(Exception):
    """Something went wrong that the user can act on; ``str(error)`` is the line they read.

    ``title``, ``status`` and ``slug`` are set when the error came from a problem-details
    answer of the control plane.
    """

    exit_code = EXIT_ERROR

    def __init__(
        self,
        message: str,
        *,
        title: str | None = None,
        status: int | None = None,
        slug: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.title = title
        self.status = status
        self.slug = slug


class UsageError(CliError):
    """The command line itself is wrong (exit code 2, as argparse uses)."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, prog: str | None = None) -> None:
        super().__init__(message)
        self.prog = prog

    def __str__(self) -> str:
        if self.prog:
            return f"{self.message} (see `{self.prog} --help`)"
        return self.message
