"""A user's named things (datasets, secrets) as the routes refuse them: a name out of the rules
is a 422 naming the rule, one that names nothing a 404 saying how to make it."""

from __future__ import annotations

from collections.abc import Callable

from api.http.problems import Problem
from domain.values import InvalidValue


def check_named(kind: str, check: Callable[[str], object], name: str) -> None:
    try:
        check(name)
    except InvalidValue as error:
        raise Problem(422, "invalid-request", f"Invalid {kind} name", f"{kind} {error}",
                      field="name") from None  # fmt: skip


def named_not_found(kind: str, name: str, make: str) -> Problem:
    """``make``: the command that makes one (``flexai dataset push NAME PATH``)."""
    return Problem(
        404, f"{kind}-not-found", f"{kind.capitalize()} not found",
        f"no {kind} named '{name}'; {make.replace('NAME', name)} (`flexai {kind} list` shows "
        "yours)",
    )  # fmt: skip
