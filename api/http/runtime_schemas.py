"""The bodies of the runtimes routes: an admin names an image for jobs to run in; every user
lists them; the agent building a job gets its registry's credentials."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

import domain.values as values
from api.http.schemas import bounded
from common.contract import (
    IMAGE_REF_RULE,
    MAX_IMAGE_REF,
    RUNTIME_RULE,
    Refusal,
    check_image_ref,
)


def _image(ref: str) -> str:
    """The reference with ``docker://`` written out; the contract's words where refused."""
    try:
        return check_image_ref(ref)
    except Refusal as refusal:
        raise ValueError(str(refusal)) from None


RuntimeName = Annotated[str, bounded(values.check_runtime_name)]
ImageRef = Annotated[str, AfterValidator(_image)]


class RuntimeCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: RuntimeName = Field(description=RUNTIME_RULE)
    image: ImageRef = Field(description=IMAGE_REF_RULE)
    registry_secret: Annotated[str, bounded(values.check_secret_name)] | None = Field(
        default=None,
        description="the name of a secret of yours whose value is USER:PASSWORD, for a "
        "private registry (the runtime keeps its name, never its value)",
    )


class RuntimePublic(BaseModel):
    """A runtime as every user sees it."""

    name: str
    image: str
    registry_secret: str | None
    """The name of the secret its registry is logged in to with..."""
    registry_secret_owner: str | None
    """...of this user's."""
    created_by: str
    created_at: str
    digest: str | None = None
    """The digest (``sha256:...``) of the image the nodes hold (that of the node that said so
    last, where they differ); None while none holds it."""
    nodes: list[str] = Field(default_factory=list)
    """The live nodes that hold the image (pulled), by name; empty while none does."""


class RuntimesPublic(BaseModel):
    runtimes: list[RuntimePublic]
    count: int


class RuntimeDeleted(BaseModel):
    name: str
    deleted_at: str


MAX_HELD_IMAGES = 10_000


class HeldImage(BaseModel):
    reference: str = Field(max_length=MAX_IMAGE_REF, description=IMAGE_REF_RULE)
    digest: str = Field(max_length=71, description="sha256:HEX, the image's manifest's")


class NodeHeartbeat(BaseModel):
    """A node's heartbeat: it is alive, and (when that changed) which images it holds."""

    images: list[HeldImage] | None = Field(
        default=None, max_length=MAX_HELD_IMAGES,
        description="every image the node's cache holds; absent: as it last said",
    )  # fmt: skip


class RegistryCredentials(BaseModel):
    """For the agent building a job: how to log in to its image's registry."""

    image: str
    username: str
    password: str
