"""Users and tokens: who am I, users (admins make them, and set their quotas and leave to use
``priority: high``), API tokens, and the nodes' tokens."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from api.http.deps import CurrentAdmin, CurrentCaller, CurrentUser, ServicesDep
from api.http.problems import forbidden
from api.http.sharing_schemas import (
    STRICT,
    HighPriorityPublic,
    HighPrioritySet,
    QuotaPublic,
    QuotaSet,
)
from api.identity.identities import MAX_LABEL, USER_NAME, IssuedToken
from domain import values

router = APIRouter(prefix="/v1", tags=["identity"])
UserName = Annotated[str, Field(pattern=rf"^(?:{USER_NAME.pattern})$", max_length=63)]
Label = Annotated[str, Field(max_length=MAX_LABEL, pattern=r"^[^\x00-\x1f\x7f]*$")]


class Whoami(BaseModel):
    kind: str
    """``user`` or ``node``."""
    user: str | None
    admin: bool
    node: str | None
    token_id: str


class UserCreate(BaseModel):
    model_config = STRICT

    name: UserName
    admin: bool = False


class TokenCreate(BaseModel):
    model_config = STRICT

    label: Label = ""
    user: UserName | None = None
    """Whose token (admins only; yours when left out)."""


class NodeTokenCreate(BaseModel):
    model_config = STRICT

    node: Annotated[str, Field(min_length=1, max_length=253,
                                pattern=rf"^(?:{values.NODE_NAME.pattern})$")]  # fmt: skip
    label: Label = ""


class TokenIssued(BaseModel):
    """A new token: its value is shown this once, and stored only as a hash."""

    token: str
    token_id: str
    user: str | None
    node: str | None
    label: str
    created_at: str


class UserPublic(BaseModel):
    name: str
    admin: bool
    created_at: str
    created_by: str | None
    tokens: int
    """Its tokens that work (not revoked)."""
    quota_accels: int | None = None
    """The most accelerators its jobs may hold running at once; None: no quota."""
    high_priority: bool = False
    """Whether an admin allowed it ``priority: high`` (admins may always)."""


class UserCreated(BaseModel):
    user: UserPublic
    token: TokenIssued


class UsersPublic(BaseModel):
    users: list[UserPublic]


class TokenPublic(BaseModel):
    token_id: str
    kind: str
    user_name: str | None
    node_name: str | None
    label: str
    created_at: str
    created_by: str | None
    revoked_at: str | None
    revoked_by: str | None


class TokensPublic(BaseModel):
    tokens: list[TokenPublic]


class TokenRevoked(BaseModel):
    token_id: str
    revoked: bool


def _issued(issued: IssuedToken) -> TokenIssued:
    return TokenIssued(
        token=issued.token, token_id=issued.token_id, user=issued.user, node=issued.node,
        label=issued.label, created_at=issued.created_at,
    )  # fmt: skip


@router.get("/whoami")
def whoami(caller: CurrentCaller) -> Whoami:
    """Who this token acts for: a user (and whether an admin), or a node."""
    return Whoami(kind=caller.kind, user=caller.user, admin=caller.admin, node=caller.node,
                  token_id=caller.token_id)  # fmt: skip


@router.post("/admin/users", status_code=201)
def create_user(body: UserCreate, services: ServicesDep, admin: CurrentAdmin) -> UserCreated:
    """Make a user (an admin with ``admin``) and its first token, shown this once."""
    issued = services.identities.create_user(body.name, admin=body.admin, by=str(admin.user))
    user = next(row for row in services.identities.users() if row["name"] == body.name)
    return UserCreated(user=UserPublic(**user), token=_issued(issued))


@router.get("/admin/users")
def list_users(services: ServicesDep, _: CurrentAdmin) -> UsersPublic:
    """Every user, with how many working tokens each has."""
    return UsersPublic(users=[UserPublic(**row) for row in services.identities.users()])


@router.put("/admin/users/{name}/quota")
def set_quota(
    name: Annotated[str, Path(max_length=63)], body: QuotaSet, services: ServicesDep,
    admin: CurrentAdmin,
) -> QuotaPublic:  # fmt: skip
    """Set the most accelerators a user's jobs may hold running at once (null: no quota);
    its jobs past it wait, and say so."""
    services.identities.set_quota(name, body.accels, by=str(admin.user))
    return QuotaPublic(user=name, accels=body.accels)


@router.put("/admin/users/{name}/high-priority")
def set_high_priority(
    name: Annotated[str, Path(max_length=63)], body: HighPrioritySet, services: ServicesDep,
    admin: CurrentAdmin,
) -> HighPriorityPublic:  # fmt: skip
    """Allow a user ``priority: high`` jobs, or take that back (admins may always)."""
    services.identities.set_high_priority(name, body.allowed, by=str(admin.user))
    return HighPriorityPublic(user=name, allowed=body.allowed)


@router.post("/tokens", status_code=201)
def create_token(
    body: TokenCreate, services: ServicesDep, caller: CurrentCaller, me: CurrentUser
) -> TokenIssued:
    """A new token of yours (an admin: of ``user``), shown this once."""
    user = body.user or me
    if user != me and not caller.admin:
        raise forbidden(
            "admin-only", "Admin only",
            f"only an admin makes another user's tokens (user={user}); leave `user` out to "
            "make one of your own",
        )  # fmt: skip
    return _issued(services.identities.issue_user_token(user, label=body.label, by=me))


@router.get("/tokens")
def list_tokens(
    services: ServicesDep,
    caller: CurrentCaller,
    me: CurrentUser,
    user: Annotated[UserName | None, Query(description="whose (admins only)")] = None,
    all_users: Annotated[bool, Query(description="every user's and node's (admins only)")] = False,
) -> TokensPublic:
    """Your tokens (never their values); an admin's: a user's, or everyone's."""
    if (all_users or (user is not None and user != me)) and not caller.admin:
        raise forbidden(
            "admin-only", "Admin only",
            "only an admin lists other users' tokens; leave `user` and `all_users` out to list "
            "your own",
        )  # fmt: skip
    rows = services.identities.tokens(user or me, everyone=all_users)
    return TokensPublic(tokens=[TokenPublic(**row) for row in rows])


@router.delete("/tokens/{token_id}")
async def revoke_token(
    token_id: Annotated[str, Path(max_length=64)], services: ServicesDep,
    caller: CurrentCaller, _: CurrentUser,
) -> TokenRevoked:  # fmt: skip
    """Revoke a token of yours (an admin: anyone's, a node's too): it stops working at once,
    on every replica."""
    row = await run_in_threadpool(services.identities.revoke, token_id, caller)
    return TokenRevoked(token_id=str(row["token_id"]), revoked=True)


@router.post("/admin/node-tokens", status_code=201)
def create_node_token(
    body: NodeTokenCreate, services: ServicesDep, admin: CurrentAdmin
) -> TokenIssued:
    """A token for one node's agent, shown this once: it reaches the agent routes for that
    node alone."""
    issued = services.identities.issue_node_token(body.node, label=body.label, by=str(admin.user))
    return _issued(issued)

