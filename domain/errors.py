"""The commands the model refuses, each error saying what to do instead."""

from __future__ import annotations

from typing import Any

from domain.statuses import TERMINAL, Status
from domain.values import InvalidValue


class DomainError(Exception):
    """A command that the model refuses; the message says what to do."""


class IllegalTransition(DomainError):
    def __init__(self, name: str, current: Status, attempted: Status) -> None:
        self.current = current
        self.attempted = attempted
        super().__init__(
            f"job '{name}' is '{current}' and cannot become '{attempted}'"
        )


class InvalidJobSpec(DomainError):
    """A value out of its bounds; ``field`` names it for the API's problem details."""

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


def checked(check: Any, *args: Any, **kwargs: Any) -> Any:
    """Run one bounds check of :mod:`domain.values`; its refusal becomes InvalidJobSpec."""
    try:
        return check(*args, **kwargs)
    except InvalidValue as error:
        raise InvalidJobSpec(f"{error}", field=error.field) from None


class NameTaken(DomainError):
    def __init__(self, name: str) -> None:
        super().__init__(
            f"a job named '{name}' already exists; pick another name, or delete that job "
            f"first (`flexai training delete {name}`)"
        )


class JobNotTerminal(DomainError):
    def __init__(self, name: str, status: Status) -> None:
        self.status = status
        super().__init__(
            f"job '{name}' is '{status}' and only a finished job can be deleted; "
            f"stop it first (`flexai training stop {name}`)"
        )


class JobNotRunning(DomainError):
    """Something only a job ``in progress`` allows (a debug session into it)."""

    def __init__(self, name: str, status: Status) -> None:
        self.status = status
        if status in TERMINAL:
            what = "it has ended; run it again to debug it (`flexai training run`)"
        else:
            what = (f"wait until it is 'in progress' (`flexai training inspect {name}` shows "
                    "its status)")  # fmt: skip
        super().__init__(
            f"job '{name}' is '{status}': a debug session needs a running job; {what}"
        )


class JobDeleted(DomainError):
    def __init__(self, name: str) -> None:
        super().__init__(f"job '{name}' was deleted; its history stays readable for audit")
