"""The bodies of the secrets routes: a secret's value comes in, only its name and dates go
out (and, for the agent running a job, the values its ``--secret`` variables name)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

import domain.values as values
from api.http.schemas import bounded
from common.contract import SECRET_RULE


def _secret_value(value: str) -> str:
    """A value an environment variable can hold; an error never quotes it."""
    if "\x00" in value:
        raise ValueError("must not hold a NUL byte (an environment variable cannot)")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text") from None
    if size > values.MAX_SECRET_VALUE:
        raise ValueError(f"is {size} bytes; at most {values.MAX_SECRET_VALUE} are accepted")
    if len(value) < values.MIN_SECRET_VALUE:
        raise ValueError(
            f"is {len(value)} characters; a secret needs at least {values.MIN_SECRET_VALUE} (its "
            "logs show *** wherever it appears, so a shorter one would hide those characters "
            "everywhere in them)"
        )
    return value


SecretName = Annotated[str, bounded(values.check_secret_name)]
SecretText = Annotated[str, Field(min_length=1), AfterValidator(_secret_value)]


class SecretValue(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: SecretText = Field(description="the secret's value (UTF-8 text, 4 characters to 64 KiB)")


class SecretCreate(SecretValue):
    name: SecretName = Field(description=SECRET_RULE)


class SecretPublic(BaseModel):
    """A secret as its owner sees it: its name and dates, never its value."""

    name: str
    created_at: str
    updated_at: str


class SecretsPublic(BaseModel):
    secrets: list[SecretPublic]
    count: int


class SecretDeleted(BaseModel):
    name: str
    deleted_at: str


class JobSecretValues(BaseModel):
    """For the agent running the job: each ``--secret`` variable and its value."""

    secrets: dict[str, str]
