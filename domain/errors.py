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


class JobNotStoppable(IllegalTransition):
    """A stop of a job that is stopping already, or has ended: says what to do instead."""

    def __init__(self, name: str, current: Status) -> None:
        super().__init__(name, current, Status.STOP_IN_PROGRESS)
        if current == Status.STOP_IN_PROGRESS:
            self.args = (f"job '{name}' is '{current}' already: wait until it is 'stopped' "
                         f"(`flexai training inspect {name}` shows its status)",)  # fmt: skip
        else:
            self.args = (f"{self}: it has ended, so there is nothing to stop (`flexai "
                         f"training delete {name}` takes it off the list)",)  # fmt: skip


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


class NameGivenTwice(NameTaken):
    """A name given to two jobs of one list: the second is refused (as a taken name is)."""

    def __init__(self, name: str) -> None:
        DomainError.__init__(
            self, f"the name '{name}' is given to an earlier job of this list too: give each "
            "job of a list a name of its own",
        )  # fmt: skip


class JobNotTerminal(DomainError):
    def __init__(self, name: str, status: Status) -> None:
        self.status = status
        if status == Status.STOP_IN_PROGRESS:
            advice = (f"its stop is under way: wait until it is 'stopped' (`flexai training "
                      f"inspect {name}`), then delete it")  # fmt: skip
        else:
            advice = f"stop it first (`flexai training stop {name}`)"
        super().__init__(
            f"job '{name}' is '{status}' and only a finished job can be deleted; {advice}"
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
