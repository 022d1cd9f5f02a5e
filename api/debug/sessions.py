"""Debug sessions (`flexai training debug-ssh`) while they live: a relay of bytes between two
WebSockets, the CLI's and the agent's, with no inbound port on the GPU host.

A session goes ``waiting`` (the CLI asked for it; the node's agent hears of it through its long
poll) -> ``ready`` (the agent connected and sent its host key for the session) -> ``connected``
(the CLI's ``ssh`` connected through its proxy: bytes flow both ways) -> ``closed``. SSH runs
end to end over the relayed bytes: the server sees only ciphertext.

Everything here lives in one server process, on its event loop: with several replicas, the CLI
and the agent must reach the same one (sticky routing), see ``docs/design.md``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import time
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

from api.scheduling.assignments import Waiter

TAKE_TIMEOUT_S = 30.0
"""How long the node's agent has to take a session (connect and send its host key)."""
CONNECT_TIMEOUT_S = 60.0
"""How long a ready session waits for the user's SSH client."""
KEEP_ENDED = 1000

WAITING, READY, CONNECTED, CLOSED = "waiting", "ready", "connected", "closed"


class Socket(Protocol):
    """What the relay needs of a WebSocket (Starlette's)."""

    async def receive(self) -> Any: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


@dataclass
class DebugSession:
    id: str
    job_id: str
    job_name: str
    user: str
    """Who opened it (the job's owner, or an admin)."""
    node_id: str
    node_name: str
    node_index: int
    public_key: str
    """The CLI's ephemeral key: the only one the agent lets in."""
    state: str = WAITING
    host_key: str | None = None
    reason: str | None = None
    opened_at: float = field(default_factory=time.monotonic)
    agent: Socket | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the agent took the session (or it closed first)."""
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.opened_at


def key_fingerprint(public_key: str) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a public key line (``ssh-ed25519 AAAA... x``)."""
    parts = public_key.split()
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (IndexError, binascii.Error):
        raise ValueError("is not an OpenSSH public key line (`ssh-ed25519 AAAA...`)") from None
    kind = parts[0].encode()
    if blob[:4] != len(kind).to_bytes(4, "big") or blob[4 : 4 + len(kind)] != kind:
        raise ValueError("holds a key of another type than it names")
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


class DebugSessions:
    """This server's live debug sessions, by id, and the agents waiting to hear of them."""

    def __init__(self) -> None:
        self._sessions: dict[str, DebugSession] = {}
        self._waiters: defaultdict[str, set[Waiter]] = defaultdict(set)
        self._ended: OrderedDict[str, DebugSession] = OrderedDict()
        """The last sessions that closed, so that their CLI reads why."""
        self.closing = False

    def __len__(self) -> int:
        return len(self._sessions)

    def add(self, session: DebugSession) -> None:
        self._sessions[session.id] = session
        self._wake(session.node_id)

    def get(self, session_id: str) -> DebugSession | None:
        """A live session, or one that closed lately."""
        return self._sessions.get(session_id) or self._ended.get(session_id)

    def waiting_for(self, node_id: str) -> list[DebugSession]:
        """The sessions the node's agent has yet to take."""
        return [s for s in self._sessions.values() if s.node_id == node_id and s.state == WAITING]

    @asynccontextmanager
    async def watching(self, node_id: str) -> AsyncIterator[Waiter]:
        """A waiter woken when a session for ``node_id`` comes (the agents' long poll)."""
        waiter = Waiter()
        self._waiters[node_id].add(waiter)
        try:
            yield waiter
        finally:
            waiters = self._waiters[node_id]
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[node_id]

    def take(self, session: DebugSession, agent: Socket, host_key: str) -> None:
        """The agent connected with its host key for the session."""
        session.agent, session.host_key, session.state = agent, host_key, READY
        session.ready.set()

    def close(self, session: DebugSession, reason: str) -> bool:
        """End the session; True the first time only (the caller records it once)."""
        if session.state == CLOSED:
            return False
        session.state, session.reason, session.agent = CLOSED, reason, None
        self._sessions.pop(session.id, None)
        self._ended[session.id] = session
        while len(self._ended) > KEEP_ENDED:
            self._ended.popitem(last=False)
        for event in (session.ready, session.connected, session.closed):
            event.set()
        return True

    def close_all(self, reason: str) -> list[DebugSession]:
        """The server stops: every session ends and every agent's long poll answers; returns
        the sessions that were open."""
        self.closing = True
        ended = [s for s in list(self._sessions.values()) if self.close(s, reason)]
        for node_id in list(self._waiters):
            self._wake(node_id)
        return ended

    def _wake(self, node_id: str) -> None:
        for waiter in self._waiters.get(node_id, ()):
            waiter.woken.set()


async def relay(session: DebugSession, user: Socket) -> tuple[str, str]:
    """Pass bytes between the user's socket and the agent's until one side goes, or the
    session is closed. Returns why it ended and which side ended it (``user``, ``node`` or
    ``server``); both sockets are closed afterwards."""
    agent = session.agent
    assert agent is not None
    session.state = CONNECTED
    session.connected.set()

    async def pump(source: Socket, sink: Socket, ended: tuple[str, str]) -> tuple[str, str]:
        while True:
            message = await source.receive()
            if message.get("type") == "websocket.disconnect":
                return ended
            data = message.get("bytes")
            if data is None:
                data = (message.get("text") or "").encode()
            await sink.send_bytes(data)

    async def until_closed() -> tuple[str, str]:
        await session.closed.wait()
        return session.reason or "the session was closed", "server"

    tasks = [
        asyncio.ensure_future(pump(user, agent, ("the SSH client disconnected", "user"))),
        asyncio.ensure_future(pump(agent, user, ("the node ended the session", "node"))),
        asyncio.ensure_future(until_closed()),
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        first = next(iter(done))
        ended = ("the connection broke", "server") if first.exception() else first.result()
    finally:
        for task in tasks:
            task.cancel()
        for socket in (user, agent):
            with suppress(Exception):
                await socket.close()
    return ended
