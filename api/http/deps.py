"""Dependencies for the routes, as ``Annotated`` aliases.

They are coroutines: FastAPI runs a plain function dependency in a worker thread, a hop (and a
wait for a free thread) per dependency per request. Whatever may block runs in a thread here.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from api.http.client_certificates import AGENT_CA_FLAG, client_certificate
from api.http.problems import Problem, forbidden, revoked_token, unauthorized, views_halted
from api.identity.identities import Caller, Identities, Revoked
from api.identity.sessions import SESSION_COOKIE
from api.services import Services
from common.contract import MIN_POSITION_HEADER, POSITION_HEADER
from projections.projector import ProjectionHalted, ProjectionTimeout


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def bearer_token(scope: Any) -> str | None:
    """The bearer token of an HTTP or WebSocket request's scope, if it sends one."""
    for key, value in scope.get("headers", ()):
        if key == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


async def resolve_caller(identities: Identities, token: str | None) -> Caller:
    """The caller of a bearer token; 401 problems for none, an unknown or a revoked one. A
    remembered token costs no worker thread."""
    if not token:
        raise unauthorized()
    found: Caller | Revoked | None = identities.known_caller(token)
    if found is None:
        found = await run_in_threadpool(identities.resolve, token)
    if found is None:
        raise unauthorized()
    if isinstance(found, Revoked):
        raise revoked_token(found.token_id, found.revoked_at)
    return found


async def current_caller(request: Request, services: ServicesDep) -> Caller:
    """The token's caller; the body limits already resolved it for requests with a body.

    A read without a token may come from the web console: its session cookie then stands
    for the token it was opened with (a download link of a console page). Writes always
    need the token itself."""
    known: Caller | None = getattr(request.state, "caller", None)
    if known is not None:
        return known
    token = bearer_token(request.scope)
    session = request.cookies.get(SESSION_COOKIE)
    if token is None and session and request.method in ("GET", "HEAD"):
        from_session = await run_in_threadpool(services.sessions.resolve, session)
        if from_session is not None:
            request.state.caller = from_session
            return from_session
    caller = await resolve_caller(services.identities, token)
    request.state.caller = caller
    return caller


CurrentCaller = Annotated[Caller, Depends(current_caller)]


async def current_user(caller: CurrentCaller) -> str:
    """The user a user's token acts for; a node token is refused (403)."""
    if caller.user is None:
        raise forbidden(
            "user-token-needed", "User token needed",
            f"this is node {caller.node}'s token: it reaches only the agent routes "
            "(/v1/agent/...); use a user's token (`flexai login`)",
        )  # fmt: skip
    return caller.user


CurrentUser = Annotated[str, Depends(current_user)]
"""The calling user's name: whose jobs, datasets and secrets a request reads and writes."""


async def current_admin(caller: CurrentCaller, user: CurrentUser) -> Caller:
    if not caller.admin:
        raise forbidden(
            "admin-only", "Admin only",
            f"this needs an admin's token, and user {user} is no admin (the first admin's "
            "token is <data-dir>/admin.token; `flexai admin user create NAME --admin` makes "
            "others)",
        )  # fmt: skip
    return caller


CurrentAdmin = Annotated[Caller, Depends(current_admin)]


async def current_node(request: Request, services: ServicesDep, caller: CurrentCaller) -> str:
    """The node a node token acts for; a user's token is refused (403), and so is a node's
    that came without the client certificate the server requires of agents."""
    if caller.node is None:
        raise forbidden(
            "node-token-needed", "Node token needed",
            "the agent routes need a node token, not a user's: an admin makes one with "
            "`flexai admin node-token create NODE_NAME`; start the agent with it "
            "(`flexai agent --token-file FILE`, or FLEXAI_TOKEN)",
        )  # fmt: skip
    check_agent_certificate(request.scope, services, caller.node)
    return caller.node


def check_agent_certificate(scope: Any, services: Services, node: str) -> None:
    """Refuse (403) an agent's request without a client certificate where the server
    requires them (``--agent-client-ca``); the handshake already checked one presented."""
    if services.settings.agent_client_certificates and client_certificate(scope) is None:
        raise forbidden(
            "client-certificate-needed", "Client certificate needed",
            f"this server requires agents to present a client certificate signed by its "
            f"agents' CA ({AGENT_CA_FLAG}), and node {node}'s agent presented none: start "
            "it with `flexai agent --client-cert FILE --client-key FILE`",
        )  # fmt: skip


CurrentNode = Annotated[str, Depends(current_node)]
"""The name of the node whose agent calls: it acts for that node and its jobs alone."""

ALL_OWNERS = "*"


async def job_owner(
    caller: CurrentCaller,
    user: CurrentUser,
    owner: Annotated[
        str | None,
        Query(
            max_length=63, pattern=r"^([a-z][a-z0-9_-]{0,62}|\*)$",
            description="whose jobs (admins only; `*`: every user's, where a list is asked)",
        ),
    ] = None,
) -> str:
    """Whose jobs a request acts on: the caller's own; an admin may name another user."""
    if owner is None or owner == user:
        return user
    if not caller.admin:
        raise forbidden(
            "admin-only", "Admin only",
            f"only an admin may act on another user's jobs (owner={owner}); leave `owner` out "
            "to act on your own",
        )  # fmt: skip
    return owner


JobOwner = Annotated[str, Depends(job_owner)]
"""The owner of the jobs a request reads or acts on (``*`` for every owner: lists only)."""


async def ledger_writable(services: ServicesDep) -> None:
    """Writes wait while the views are halted: an event recorded now could not be shown, and
    read-your-writes would hang. Nothing is recorded; reads keep answering from the views."""
    halted = services.projector.halted
    if halted is not None:
        raise views_halted(ProjectionHalted(halted))


LedgerWritable = ledger_writable

READ_AFTER_WAIT_S = 5.0


async def read_after(request: Request, services: ServicesDep) -> None:
    """Hold a read until the views reach the position the client asks for (a write it made,
    maybe through another replica, answered with it): no fixed sleep, no stale answer."""
    value = request.headers.get(MIN_POSITION_HEADER)
    if value is None:
        return
    try:
        position = int(value)
    except ValueError:
        position = -1
    if not 0 <= position < 2**63:
        raise Problem(
            422, "invalid-request", "Invalid position",
            f"{MIN_POSITION_HEADER} must be a ledger position (a whole number from 0), as a "
            f"write's {POSITION_HEADER} answer header gave it", field=MIN_POSITION_HEADER,
        )  # fmt: skip
    if position == 0:
        return
    try:  # in a worker thread: even reading where the views stand is a query
        await run_in_threadpool(services.projector.wait, position, READ_AFTER_WAIT_S)
    except ProjectionTimeout:
        raise Problem(
            503, "views-behind", "Views behind",
            f"this server's views did not reach ledger position {position} within "
            f"{READ_AFTER_WAIT_S:g} s; try again", headers={"Retry-After": "1"},
        ) from None  # fmt: skip


ReadAfter = Depends(read_after)


def tell_position(response: Response, position: int | None) -> None:
    """Put a write's ledger position on its answer (nothing recorded: none)."""
    if position is not None:
        response.headers[POSITION_HEADER] = str(position)
