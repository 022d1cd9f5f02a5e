"""An archive's bytes as an upload's parts: cut at every ``part_size`` bytes as they are
written, with the SHA-256 and size of the whole computed on the way.

Nothing is copied but where a part ends inside a write: a part is the list of the writes that
make it. The SHA-256 runs in a thread of its own (hashlib lets go of the GIL), beside the
zipping, whose reads and CRC-32 then set the pace; it is handed each MiB-sized write as it is
(batches of a MiB: the zip's small headers ride with the next write), never joined into a copy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from common.behind import Behind

HASH_BATCH = 2**20
HASH_AHEAD = 16
Deliver = Callable[[int, list[bytes]], None]
"""Takes part ``number`` (from 1): its bytes, as the writes that make them."""


class PartCutter:
    """A writer that hands on parts of ``part_size`` bytes (the last one shorter, never none)."""

    def __init__(self, part_size: int, deliver: Deliver) -> None:
        self.part_size = part_size
        self.deliver = deliver
        self.size = 0
        self.count = 0
        self._sha = hashlib.sha256()
        self._digest = Behind(self._sha, batch=HASH_BATCH, ahead=HASH_AHEAD)
        self._pieces: list[bytes] = []
        self._held = 0

    @property
    def sha256(self) -> str:
        """The whole's SHA-256, once :meth:`close` handed the last part on."""
        self._digest.close()
        return self._sha.hexdigest()

    def write(self, data: bytes) -> int:
        data = data if isinstance(data, bytes) else bytes(data)  # kept: must never change
        self._digest.feed(data)
        self.size += len(data)
        start = 0
        while start < len(data):
            room = self.part_size - self._held
            piece = data if start == 0 and len(data) <= room else data[start : start + room]
            self._pieces.append(piece)
            self._held += len(piece)
            start += len(piece)
            if self._held == self.part_size:
                self._hand_on()
        return len(data)

    def flush(self) -> None:
        """Parts go once full."""

    def close(self) -> None:
        if self._pieces or self.count == 0:
            self._hand_on()
        self._digest.close()

    def abandon(self) -> None:
        """The upload failed: no SHA-256 is wanted."""
        self._pieces = []
        self._digest.close()

    def _hand_on(self) -> None:
        self.count += 1
        pieces, self._pieces, self._held = self._pieces, [], 0
        self.deliver(self.count, pieces)
