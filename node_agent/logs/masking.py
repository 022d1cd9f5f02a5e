"""Secret values masked out of a job's log before it leaves the node.

:class:`SecretMask` turns a byte stream into the same stream with every occurrence of a secret
value replaced by ``***``: at each position the longest value that starts there wins (values
that are substrings of others), and matches never overlap, as one ``re.sub`` over the whole
stream with the values as alternatives, longest first, would do.

It is fed chunks as they are shipped, and its output does not depend on where the chunks were
cut. It holds back only the bytes that could still begin a value: the stream's positions whose
rest is a proper prefix of some value. Every byte before the first such position is settled
(whatever comes next, no value that starts there can reach past what was fed), so it ships at
once; a quiet job's last line is never held for a value it does not hold. The positions come
from an Aho-Corasick automaton over the values (:class:`PrefixAutomaton`), run over the last
``len(longest value) - 1`` bytes only, so each chunk costs a C-speed ``re`` scan plus a
bounded walk. The masked log is a function of the job's log alone: a shipper that starts over
(an agent that restarted) sends the very same bytes at the very same offsets.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable

MASK = b"***"


class PrefixAutomaton:
    """Aho-Corasick over byte strings, answering one question: which suffixes of a text are
    proper prefixes of some value (could still grow into one)."""

    def __init__(self, values: Iterable[bytes]) -> None:
        self._children: list[dict[int, int]] = [{}]
        self._depth = [0]
        for value in values:
            node = 0
            for byte in value:
                child = self._children[node].get(byte)
                if child is None:
                    child = len(self._children)
                    self._children.append({})
                    self._depth.append(self._depth[node] + 1)
                    self._children[node][byte] = child
                node = child
        self._fail = [0] * len(self._children)
        # Each node's nearest node on its failure chain (itself included) that has children:
        # the longest suffix of its path that is a proper prefix of a value.
        self._open = [0] * len(self._children)
        queue = deque(self._children[0].values())
        while queue:
            node = queue.popleft()
            for byte, child in self._children[node].items():
                self._fail[child] = self._step(self._fail[node], byte) if node else 0
                queue.append(child)
            self._open[node] = node if self._children[node] else self._open[self._fail[node]]

    @property
    def longest(self) -> int:
        return max(self._depth)

    def _step(self, node: int, byte: int) -> int:
        while True:
            child = self._children[node].get(byte)
            if child is not None:
                return child
            if node == 0:
                return 0
            node = self._fail[node]

    def open_suffixes(self, text: bytes) -> list[int]:
        """The lengths of the suffixes of ``text`` that are proper prefixes of a value,
        longest first; the empty suffix (0) ends the list."""
        node = 0
        for byte in text:
            node = self._step(node, byte)
        lengths = []
        node = self._open[node]
        while node:
            lengths.append(self._depth[node])
            node = self._open[self._fail[node]]
        lengths.append(0)
        return lengths


class SecretMask:
    def __init__(self, values: Iterable[str | bytes]) -> None:
        encoded = {value.encode() if isinstance(value, str) else value for value in values}
        ordered = sorted((value for value in encoded if value), key=len, reverse=True)
        self.values = tuple(ordered)
        # Alternatives are tried in order: longest first, so the longest match wins.
        self._pattern = re.compile(b"|".join(map(re.escape, ordered))) if ordered else None
        self._automaton = PrefixAutomaton(ordered)
        self._window = self._automaton.longest - 1
        self._pending = b""

    @property
    def held(self) -> int:
        """Bytes fed but not yet given back: they may begin a value."""
        return len(self._pending)

    def feed(self, data: bytes, final: bool = False) -> bytes:
        """The masked bytes that ``data`` (after what came before) settles; with ``final``
        (nothing more will come) everything that is left."""
        buffer = self._pending + data
        if self._pattern is None:
            self._pending = b""
            return buffer
        if final:
            self._pending = b""
            return self._pattern.sub(MASK, buffer)
        # Where the undecided rest may begin, from the right: a position whose rest could
        # still grow into a value. Every position before the first of them reached by the
        # scan is decided now: a value that starts there ends within the buffer, or never.
        tail = buffer[max(0, len(buffer) - self._window) :] if self._window else b""
        opens = [len(buffer) - length for length in self._automaton.open_suffixes(tail)]
        out, position = bytearray(), 0
        for match in self._pattern.finditer(buffer):
            if match.start() >= _first_at_or_after(opens, position):
                break
            out += buffer[position : match.start()] + MASK
            position = match.end()
        cut = _first_at_or_after(opens, position)
        out += buffer[position:cut]
        self._pending = buffer[cut:]
        return bytes(out)

    def reset(self) -> None:
        """Forget what was fed: the next byte fed is the stream's first."""
        self._pending = b""


def _first_at_or_after(positions: list[int], start: int) -> int:
    """The first of ``positions`` (ascending, ending with the buffer's length) at or after
    ``start``."""
    return next(position for position in positions if position >= start)


def mask_all(data: bytes, values: Iterable[str | bytes]) -> bytes:
    """``data`` with every secret value replaced, in one go."""
    return SecretMask(values).feed(data, final=True)
