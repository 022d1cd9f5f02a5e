"""Request and response bodies of the artifact transfers: upload sessions, their parts, and
the output archives a job's nodes leave (``UploadCreate``, ``UploadStarted``, ...)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

import domain.values as values

MAX_PART_NUMBERS = 100
"""Part targets asked for in one request."""
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="64 lower-case hex digits")]
PartNumber = Annotated[int, Field(ge=1, le=10_000)]


class UploadCreate(BaseModel):
    """An agent's upload of one checkpoint or output archive of a job it runs."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["checkpoint", "output"]
    name: str | None = Field(
        default=None, max_length=values.MAX_CHECKPOINT_STRING,
        description="a checkpoint's name (the directory or file under the checkpoint folder)",
    )  # fmt: skip
    node_id: str = Field(pattern=r"^[0-9a-fA-F-]{32,36}$")
    node_index: int = Field(default=0, ge=0, lt=values.MAX_NODES)
    size_hint: int | None = Field(
        default=None, ge=0, le=values.BIGINT_MAX,
        description="about how many bytes the archive holds (its files' bytes): the part size "
        "follows from it",
    )  # fmt: skip


class OutputPublic(BaseModel):
    """One node's output archive, as the ledger records it."""

    node_index: int
    size: int
    sha256: str


class RecordedOutput(OutputPublic):
    at: str


class UploadStarted(BaseModel):
    """A session to send the archive in parts of ``part_size`` bytes (all but the last); or,
    with ``recorded``, nothing to send: the ledger holds that artifact already."""

    id: str | None
    part_size: int | None
    recorded: dict[str, object] | None = Field(
        default=None, description="the CheckpointPublic or OutputPublic already recorded"
    )


class PartNumbers(BaseModel):
    model_config = ConfigDict(extra="forbid")

    numbers: list[PartNumber] = Field(min_length=1, max_length=MAX_PART_NUMBERS)


class PartTarget(BaseModel):
    number: int
    url: str = Field(
        description="absolute (the store itself, presigned: send no token) or a path of this "
        "API (send the agent's token)"
    )
    headers: dict[str, str] = Field(default_factory=dict)


class PartTargets(BaseModel):
    parts: list[PartTarget]


class PartDone(BaseModel):
    number: PartNumber
    etag: str = Field(min_length=1, max_length=1024)


class UploadComplete(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parts: list[PartDone] = Field(min_length=1, max_length=10_000)
    size: int = Field(ge=1, le=values.BIGINT_MAX, description="the archive's bytes")
    sha256: Sha256


class UploadAborted(BaseModel):
    id: str
    aborted: bool = Field(description="false when the upload was completed already")
