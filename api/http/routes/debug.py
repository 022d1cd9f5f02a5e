"""Debug sessions: `flexai training debug-ssh`, an SSH session into a running job.

The user's CLI asks for a session (its ephemeral public key), the node's agent hears of it
through a long poll and connects a WebSocket with the session's host key, the CLI's ``ssh``
connects another through its proxy command, and this server relays the bytes between the two
(:mod:`api.debug.sessions`). Each session is recorded on the job's ledger: ``DebugSessionOpened``
and ``DebugSessionClosed``.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Annotated
from uuid import UUID, uuid4

from fastapi import APIRouter, Depends, Header, Query, Response, WebSocket, WebSocketDisconnect
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from api.debug.sessions import (
    CLOSED,
    CONNECT_TIMEOUT_S,
    READY,
    TAKE_TIMEOUT_S,
    WAITING,
    DebugSession,
    key_fingerprint,
    relay,
)
from api.http.debug_schemas import (
    DebugSessionCreate,
    DebugSessionHello,
    DebugSessionOffer,
    DebugSessionOffers,
    DebugSessionPublic,
)
from api.http.deps import (
    CurrentNode,
    CurrentUser,
    JobOwner,
    LedgerWritable,
    ServicesDep,
    bearer_token,
    check_agent_certificate,
    resolve_caller,
    tell_position,
)
from api.http.problems import Problem, problem_response
from api.http.routes.agent import AgentId, require_own_node
from api.http.routes.jobs import find_job
from api.identity.identities import Caller
from api.services import Services
from common.contract import AGENT_ID_HEADER
from domain.actors import Actor, agent, scheduler, user
from domain.errors import JobNotRunning
from domain.statuses import Status

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/jobs", tags=["debug sessions"])
agent_router = APIRouter(prefix="/v1/agent", tags=["agents"])
MAX_WAIT_S = 30.0
HELLO_TIMEOUT_S = 10.0
STOPPED = "the control plane stopped"
_tasks: set[asyncio.Future[None]] = set()  # the sessions' timers, held until they end

SessionId = Annotated[str, Query(max_length=64)]
Wait = Annotated[float, Query(ge=0, description="seconds to wait for a change (at most 30)")]


def _not_found(session_id: str) -> Problem:
    return Problem(
        404, "debug-session-not-found", "Debug session not found",
        f"no debug session {session_id[:64]} of yours on this server; open one with "
        "`flexai training debug-ssh NAME` (with several server replicas, the CLI and the agent "
        "must reach the same one)",
    )  # fmt: skip


def public(session: DebugSession) -> DebugSessionPublic:
    return DebugSessionPublic(
        id=session.id, job=session.job_name, node=session.node_name,
        node_index=session.node_index, state=session.state,  # type: ignore[arg-type]
        host_key=session.host_key, reason=session.reason,
    )  # fmt: skip


# -- users ---------------------------------------------------------------------------------


@router.post("/{name}/debug-sessions", status_code=201, dependencies=[Depends(LedgerWritable)])
async def open_debug_session(
    name: str, body: DebugSessionCreate, services: ServicesDep, me: CurrentUser,
    owner: JobOwner, response: Response,
) -> DebugSessionPublic:  # fmt: skip
    """Open a debug session into a running job: the agent of its node will let in this key."""
    document = await run_in_threadpool(find_job, services, owner, name, me)
    status = Status(document["status"])
    if status != Status.IN_PROGRESS:
        raise _not_running(name, status)
    placements = document.get("placements") or []
    if body.node_index >= len(placements):
        raise Problem(
            422, "invalid-request", "No such node",
            f"job '{name}' runs on {len(placements)} node(s): give --node-index 0 to "
            f"{len(placements) - 1}", field="node_index",
        )  # fmt: skip
    try:
        fingerprint = key_fingerprint(body.public_key)
    except ValueError as error:
        raise Problem(422, "invalid-request", "Invalid public key", f"public_key {error}",
                      field="public_key") from None  # fmt: skip
    session_id = uuid4().hex
    await run_in_threadpool(services.presence.hold)  # the session names this server its relay
    try:
        outcome = await run_in_threadpool(
            services.jobs.open_debug_session, UUID(document["id"]), session_id,
            body.node_index, fingerprint, user(me), services.presence.instance_id,
        )  # fmt: skip
    except JobNotRunning as refused:
        raise _not_running(name, refused.status) from None
    await run_in_threadpool(services.projector.wait, outcome.position)
    tell_position(response, outcome.position)
    placement = placements[body.node_index]
    session = DebugSession(
        id=session_id, job_id=document["id"], job_name=name, user=me,
        node_id=placement["node_id"], node_name=placement["node"],
        node_index=body.node_index, public_key=body.public_key,
    )  # fmt: skip
    services.debug_sessions.add(session)
    _keep(asyncio.ensure_future(_expire(services, session)))
    return public(session)


def _not_running(name: str, status: Status) -> Problem:
    return Problem(409, "job-not-running", "Job not running", str(JobNotRunning(name, status)),
                   current_status=status.value)  # fmt: skip


def _own_session(services: Services, session_id: str, me: str) -> DebugSession:
    session = services.debug_sessions.get(session_id)
    if session is None or session.user != me:
        raise _not_found(session_id)
    return session


@router.get("/{name}/debug-sessions/{session_id}")
async def debug_session(
    name: str, session_id: str, services: ServicesDep, me: CurrentUser, wait: Wait = 0
) -> DebugSessionPublic:
    """A debug session's state; with ``wait``, answered once the node took it (or it ended)."""
    session = _own_session(services, session_id, me)
    if session.state == WAITING and wait > 0:
        with suppress(TimeoutError):
            await asyncio.wait_for(session.ready.wait(), min(wait, MAX_WAIT_S))
    return public(session)


@router.delete("/{name}/debug-sessions/{session_id}")
async def close_debug_session(
    name: str, session_id: str, services: ServicesDep, me: CurrentUser
) -> DebugSessionPublic:
    """End a debug session (the CLI does when its ssh exits); ending one ended is no error."""
    session = _own_session(services, session_id, me)
    await end_session(services, session, "the user ended it", user(me))
    return public(session)


@router.websocket("/{name}/debug-sessions/{session_id}/stream")
async def debug_stream(websocket: WebSocket, name: str, session_id: str) -> None:
    """The user's side of the relay: the bytes of the CLI's ``ssh`` (its proxy command)."""
    services: Services = websocket.app.state.services
    try:
        caller = await _caller(websocket, services)
        if caller.user is None:
            raise Problem(403, "user-token-needed", "User token needed",
                          "a debug session is a user's: use a user's token")  # fmt: skip
        session = _own_session(services, session_id, caller.user)
        if session.state != READY:
            raise Problem(
                409, "debug-session-not-ready", "Debug session not ready",
                f"debug session {session_id} is {session.state}"
                + (f" ({session.reason})" if session.reason else "")
                + "; open another with `flexai training debug-ssh NAME`",
            )  # fmt: skip
    except Problem as problem:
        await _deny(websocket, problem)
        return
    await websocket.accept()
    reason, side = "the connection broke", "server"
    try:
        reason, side = await relay(session, websocket)
    finally:  # recorded even when this request is cancelled
        by = agent(session.node_name) if side == "node" else user(session.user)
        _keep(asyncio.ensure_future(end_session(services, session, reason, by)))


# -- agents --------------------------------------------------------------------------------


@agent_router.get("/nodes/{node_id}/debug-sessions")  # node-auth
async def debug_session_offers(
    node_id: str, agent_id: AgentId, services: ServicesDep, node: CurrentNode, wait: Wait = 0
) -> DebugSessionOffers:
    """The debug sessions this node's agent is asked to take; with ``wait``, answered as soon
    as there is one (or after ``wait`` seconds)."""
    await run_in_threadpool(_require_holder, services, node_id, agent_id, node)
    sessions = services.debug_sessions
    deadline = asyncio.get_running_loop().time() + min(wait, MAX_WAIT_S)
    async with sessions.watching(node_id) as waiter:
        while True:
            waiting = sessions.waiting_for(node_id)
            left = deadline - asyncio.get_running_loop().time()
            if waiting or left <= 0 or sessions.closing:
                break
            await waiter.sleep(left)
    return DebugSessionOffers(sessions=[
        DebugSessionOffer(id=s.id, job_id=s.job_id, node_index=s.node_index,
                          public_key=s.public_key)
        for s in waiting
    ])  # fmt: skip


@agent_router.websocket("/debug-sessions/{session_id}")  # node-auth
async def debug_agent_stream(
    websocket: WebSocket, session_id: str,
    agent_id: Annotated[str | None, Header(alias=AGENT_ID_HEADER)] = None,
) -> None:  # fmt: skip
    """The agent's side of the relay: its hello (the session's host key), then SSH's bytes."""
    services: Services = websocket.app.state.services
    try:
        caller = await _caller(websocket, services)
        session = services.debug_sessions.get(session_id)
        if session is None or caller.node is None or session.state != WAITING:
            raise _not_found(session_id)
        check_agent_certificate(websocket.scope, services, caller.node)
        await run_in_threadpool(_require_holder, services, session.node_id, agent_id or "",
                                caller.node)  # fmt: skip
    except Problem as problem:
        await _deny(websocket, problem)
        return
    await websocket.accept()
    try:
        async with asyncio.timeout(HELLO_TIMEOUT_S):
            hello = DebugSessionHello.model_validate(await websocket.receive_json())
    except (TimeoutError, ValidationError, ValueError, KeyError, RuntimeError,
            WebSocketDisconnect):  # fmt: skip
        hello = DebugSessionHello(refused="the node's agent did not say its host key")
    if hello.host_key is None or hello.refused or session.state == CLOSED:
        with suppress(RuntimeError, WebSocketDisconnect):  # the agent (or the server) went away
            await websocket.close()
        reason = f"node {session.node_name} refused: {hello.refused or 'no host key'}"
        await end_session(services, session, reason, agent(session.node_name))  # if still open
        return
    services.debug_sessions.take(session, websocket, hello.host_key)
    await session.closed.wait()  # the relay reads and closes this socket from now on


# -- helpers -------------------------------------------------------------------------------


async def end_session(services: Services, session: DebugSession, reason: str, by: Actor) -> None:
    """Close the session and record ``DebugSessionClosed``, once; the record is made even if
    the request that ends it goes away meanwhile."""
    if not services.debug_sessions.close(session, reason):
        return
    recording = _keep(asyncio.ensure_future(_record_end(services, session, reason, by)))
    await asyncio.shield(recording)


async def _record_end(services: Services, session: DebugSession, reason: str, by: Actor) -> None:
    try:
        outcome = await run_in_threadpool(
            services.jobs.close_debug_session, UUID(session.job_id), session.id, reason,
            session.seconds, by,
        )  # fmt: skip
        await run_in_threadpool(services.projector.wait, outcome.position)
    except Exception:  # the session is over anyway; the ledger keeps its opening
        log.exception("debug session %s: its end could not be recorded", session.id)


def _keep(task: asyncio.Future[None]) -> asyncio.Future[None]:
    """Hold a background task until it ends (the event loop holds only weak references)."""
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return task


async def settle(timeout: float = 5.0) -> None:
    """Wait (a while) for the sessions' background tasks: the ends they record touch the
    store, which must not be closed under them."""
    if _tasks:
        await asyncio.wait(list(_tasks), timeout=timeout)


def close_all(services: Services) -> None:
    """The server stops (on its event loop): every open session ends, its relay with it, and
    every agent's long poll answers; the ends are recorded in the background (see
    :func:`settle`)."""
    for session in services.debug_sessions.close_all(STOPPED):
        _keep(asyncio.ensure_future(_record_end(services, session, STOPPED, scheduler())))


async def _expire(services: Services, session: DebugSession) -> None:
    """End a session the node does not take, or that no SSH client connects to, in time."""
    try:
        await asyncio.wait_for(session.ready.wait(), TAKE_TIMEOUT_S)
    except TimeoutError:
        reason = (f"node {session.node_name} did not take the session within "
                  f"{TAKE_TIMEOUT_S:g} s; is its agent running?")  # fmt: skip
        await end_session(services, session, reason, scheduler())
        return
    try:
        await asyncio.wait_for(session.connected.wait(), CONNECT_TIMEOUT_S)
    except TimeoutError:
        reason = f"no SSH client connected within {CONNECT_TIMEOUT_S:g} s"
        await end_session(services, session, reason, scheduler())


def _require_holder(services: Services, node_id: str, agent_id: str, node: str) -> None:
    """Only the agent that holds the node takes its sessions."""
    require_own_node(node, node_id)
    holder = services.state.holder(node_id)
    if holder is None or holder.agent_id != agent_id:
        raise Problem(
            409, "node-taken", "Node held by another agent",
            f"node {node} is not held by this agent; it must not take the node's sessions",
        )  # fmt: skip


async def _caller(websocket: WebSocket, services: Services) -> Caller:
    """The caller of the socket's bearer token, as the HTTP routes find it."""
    return await resolve_caller(services.identities, bearer_token(websocket.scope))


async def _deny(websocket: WebSocket, problem: Problem) -> None:
    """Refuse a WebSocket with the problem as an HTTP answer (or a close, where the server
    cannot send one)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(
            problem_response(problem, None, path=websocket.url.path)
        )
    else:
        await websocket.close(code=1008, reason=problem.detail[:120])
