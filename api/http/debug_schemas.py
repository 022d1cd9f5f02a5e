"""Bodies of the debug session routes (`flexai training debug-ssh`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from domain.values import MAX_NODES

PUBLIC_KEY_PATTERN = r"^ssh-ed25519 [A-Za-z0-9+/]{60,100}={0,3}( [\x21-\x7e]{1,100})?$"
HOST_KEY_PATTERN = r"^ssh-ed25519 [A-Za-z0-9+/]{60,100}={0,3}$"


class DebugSessionCreate(BaseModel):
    public_key: str = Field(max_length=300, pattern=PUBLIC_KEY_PATTERN)
    """The CLI's ephemeral ed25519 public key, one OpenSSH line: the only key let in."""
    node_index: int = Field(default=0, ge=0, lt=MAX_NODES)
    """Which node of the job to enter (multi-node jobs)."""


class DebugSessionPublic(BaseModel):
    id: str
    job: str
    node: str
    node_index: int
    state: Literal["waiting", "ready", "connected", "closed"]
    host_key: str | None = None
    """The agent's host key for this session alone (an OpenSSH public key line), once ready."""
    reason: str | None = None
    """Why it closed."""


class DebugSessionOffer(BaseModel):
    """A session the node's agent is asked to take."""

    id: str
    job_id: str
    node_index: int
    public_key: str


class DebugSessionOffers(BaseModel):
    sessions: list[DebugSessionOffer]


class DebugSessionHello(BaseModel):
    """The agent's first WebSocket message: its host key, or why it refuses the session."""

    host_key: str | None = Field(default=None, max_length=300, pattern=HOST_KEY_PATTERN)
    refused: str | None = Field(default=None, max_length=1000)
