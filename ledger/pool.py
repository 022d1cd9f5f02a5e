"""The PostgreSQL connection pool that both the views and the ledger use: it answers
:class:`DatabaseUnavailable` soon when no connection comes, hands out no connection the server
has hung up on, and tries again at a steady pace while the server is away, so that a server
that is back is found within a second.

psycopg_pool's own pace doubles each wait (1, 2, 4 s...): two pools of one server, the views'
and the ledger's, could then find a returning server seconds apart, reads answered while
writes still said 503.
"""

from __future__ import annotations

import select
import time
from typing import Any

import psycopg
import psycopg_pool
from eventsourcing import postgres
from psycopg_pool.abc import CT
from psycopg_pool.base import AttemptWithBackoff

RECONNECT_S = 5.0
"""A pool gives up a chain of reconnection attempts after this long and starts a fresh one on
the next request (psycopg_pool's own default, five minutes, keeps one chain going that long)."""
RETRY_FIRST_S = 0.25
"""The first wait before connecting again once an attempt failed."""
RETRY_MAX_S = 1.0
"""No wait between attempts is longer: a server that is back is found within this."""


class DatabaseUnavailable(Exception):
    """The database cannot be reached (down, restarting, out of connections) right now."""


class SteadyAttempt(AttemptWithBackoff):
    """psycopg_pool's attempt, its waits growing from ``RETRY_FIRST_S`` to ``RETRY_MAX_S``."""

    INITIAL_DELAY = RETRY_FIRST_S

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, RETRY_MAX_S)


class FailFastPool(postgres.ConnectionPool[CT]):
    """A pool that hands out only connections the server has not hung up on, and says
    :class:`DatabaseUnavailable` (which eventsourcing does not retry) when none came in time.

    eventsourcing retries each recorder call ten times on its OperationalError, the pool's
    timeout included: with its own pool that is ten waits, over ten seconds, per request.
    """

    def getconn(self, timeout: float | None = None) -> CT:
        wait_s = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait_s
        while True:
            try:
                connection = super().getconn(timeout=deadline - time.monotonic())
            except psycopg_pool.PoolTimeout as error:
                raise DatabaseUnavailable(
                    f"no connection to PostgreSQL within {wait_s:g} s: the server is down, "
                    "restarting, unreachable, or every connection is busy"
                ) from error
            if not _hung_up(connection):
                return connection
            connection.close()
            self.putconn(connection)  # discarded; the pool connects a new one in its place

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        """psycopg_pool's, each chain of attempts paced by :class:`SteadyAttempt`."""
        if attempt is None:
            attempt = SteadyAttempt(timeout=self.reconnect_timeout)
        super()._add_connection(attempt, growing=growing)


def connection_lost(connection: psycopg.Connection[Any]) -> bool:
    """Whether the server has hung up on this idle connection (no round trip; see below)."""
    return _hung_up(connection)


def _hung_up(connection: psycopg.Connection[Any]) -> bool:
    """Whether the server has closed this idle connection (it restarted, crashed, or a network
    in between dropped it).

    An idle connection has nothing to read, so anything readable is its goodbye: the end of the
    stream, or a FATAL such as "terminating connection due to administrator command". Unlike a
    ping this costs no round trip, and it cannot hang on a server that has gone silent.
    """
    if connection.closed or connection.broken:
        return True
    poller = select.poll()
    poller.register(connection.fileno(), select.POLLIN)
    return bool(poller.poll(0))
