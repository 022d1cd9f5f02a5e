"""Commands of one process that change the same node take turns.

A job's start and end change its nodes' aggregates (indices, lines), so two reports of jobs on
one node (one built, another exited) saved at once are bound to conflict: the second save fails
and its command runs again. Under load that is a wasted attempt for many commands (about one a
job with eight jobs a node). Each command takes its nodes' turns (sorted, so two commands never
wait for each other) from loading them to its save, and the second simply goes after the first.
Other processes (replicas) still meet the first's change as a conflict, and retry.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager


class NodeTurns:
    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._turns: dict[str, threading.RLock] = {}

    @contextmanager
    def holding(self, node_ids: Iterable[str]) -> Iterator[None]:
        """The turn of each node in ``node_ids``, for as long as the block runs."""
        wanted = sorted(set(node_ids))
        if not wanted:
            yield
            return
        with self._mutex:
            turns = [self._turns.setdefault(node_id, threading.RLock()) for node_id in wanted]
        with ExitStack() as held:
            for turn in turns:
                held.enter_context(turn)
            yield
