"""Secret values masked out of a job's log before it leaves the node.

:class:`SecretMask` turns a byte stream into the same stream with every occurrence of a secret
value replaced by ``***``. It is fed chunks as they are shipped, and its output does not depend
on where the chunks were cut: a value split across two chunks is masked all the same, because
the last ``len(longest value) - 1`` bytes of what it was fed wait for the next chunk (or for
the end, once the job has ended). At each position the longest value that starts there wins
(values that are substrings of others), and matches never overlap. So the masked log is a
function of the job's log alone, and a shipper that starts over (an agent that restarted)
sends the very same bytes at the very same offsets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = b"***"


class SecretMask:
    def __init__(self, values: Iterable[str | bytes]) -> None:
        encoded = {value.encode() if isinstance(value, str) else value for value in values}
        ordered = sorted((value for value in encoded if value), key=len, reverse=True)
        self.values = tuple(ordered)
        # Alternatives are tried in order: longest first, so the longest match wins.
        self._pattern = re.compile(b"|".join(map(re.escape, ordered))) if ordered else None
        self._hold = len(ordered[0]) - 1 if ordered else 0
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
        # A match found at a position with a whole longest value's length of bytes after it
        # is the one the whole stream has there; positions nearer the end must wait.
        settled = len(buffer) - self._hold
        out, position = bytearray(), 0
        for match in self._pattern.finditer(buffer):
            if match.start() >= settled:
                break
            out += buffer[position : match.start()] + MASK
            position = match.end()
        cut = max(position, settled)
        out += buffer[position:cut]
        self._pending = buffer[cut:]
        return bytes(out)

    def reset(self) -> None:
        """Forget what was fed: the next byte fed is the stream's first."""
        self._pending = b""


def mask_all(data: bytes, values: Iterable[str | bytes]) -> bytes:
    """``data`` with every secret value replaced, in one go."""
    return SecretMask(values).feed(data, final=True)
