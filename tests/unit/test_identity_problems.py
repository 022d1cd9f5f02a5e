"""Users' and tokens' refusals say what went wrong; how HTTP answers each is the API's alone
(the identity room knows no status code)."""

from __future__ import annotations

import pytest

from api.http.problems import from_identity
from api.identity import identities
from api.identity.identities import IdentityError, check_user_name


@pytest.mark.parametrize(("error", "status", "slug", "title"), [
    (identities.UserNotFound("there is no user bob"), 404, "user-not-found", "User not found"),
    (identities.UserExists("there is a user bob already"), 409, "user-exists", "User exists"),
    (identities.TokenNotFound("no token"), 404, "token-not-found", "Token not found"),
    (identities.InvalidIdentityValue("a quota of -1", "Invalid quota"), 422, "invalid-request",
     "Invalid quota"),
    (IdentityError("refused"), 409, "conflict", "Refused"),
])  # fmt: skip
def test_each_refusal_is_answered_with_its_problem(
    error: IdentityError, status: int, slug: str, title: str
) -> None:
    problem = from_identity(error)
    assert (problem.status, problem.slug, problem.title, problem.detail) == (
        status, slug, title, str(error))  # fmt: skip


def test_an_invalid_user_name_says_what_a_name_may_be() -> None:
    with pytest.raises(identities.InvalidIdentityValue, match="user name 'Bad Name' is not valid"):
        check_user_name("Bad Name")
    assert not hasattr(IdentityError("x"), "status")
