"""A seekable, read-only file over an object of the bucket, read by ranged GETs.

zipfile reads an archive's end record, its central directory and, for a checkpoint, two small
JSON files: a few hundred KiB of a file of any size. Each read that misses the window fetches
at least :data:`READ_AHEAD` bytes, so zipfile's many small reads cost few requests.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable

READ_AHEAD = 64 * 2**10

Fetch = Callable[[int, int], bytes]
"""The object's bytes from ``start`` up to ``end`` (excluded)."""


class RangedReader(io.RawIOBase):
    def __init__(self, fetch: Fetch, size: int, read_ahead: int = READ_AHEAD) -> None:
        self._fetch = fetch
        self._size = size
        self._read_ahead = read_ahead
        self._position = 0
        self._window_start = 0
        self._window = b""
        self.bytes_fetched = 0
        self.requests = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            position = offset
        elif whence == os.SEEK_CUR:
            position = self._position + offset
        elif whence == os.SEEK_END:
            position = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if position < 0:
            raise OSError(22, "negative seek position")
        self._position = position
        return position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        """Fills ``buffer`` whole unless the object ends first (zipfile counts on it)."""
        target = memoryview(buffer).cast("B")
        wanted = max(0, min(len(target), self._size - self._position))
        done = 0
        while done < wanted:
            piece = self._from_window(wanted - done)
            if not piece:
                self._fill(wanted - done)
                continue
            target[done : done + len(piece)] = piece
            done += len(piece)
            self._position += len(piece)
        return done

    def readall(self) -> bytes:
        return self.read(max(0, self._size - self._position)) or b""

    def _from_window(self, count: int) -> bytes:
        offset = self._position - self._window_start
        if 0 <= offset < len(self._window):
            return self._window[offset : offset + count]
        return b""

    def _fill(self, wanted: int) -> None:
        start = self._position
        end = min(self._size, start + max(wanted, self._read_ahead))
        data = self._fetch(start, end)
        if len(data) != end - start:
            raise OSError(f"the object changed while it was read ({len(data)} bytes at {start}, "
                          f"{end - start} asked)")  # fmt: skip
        self.requests += 1
        self.bytes_fetched += len(data)
        self._window_start, self._window = start, data
