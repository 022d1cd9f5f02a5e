"""The log path pieces shared by bench/ledger.py, and its peak-RSS child process.

Run as ``python -m bench.logpath store|plain DIR``: one write+read round of the log in a fresh
process that imports nothing but ``api.artifacts.local``, printing ``{"rss_growth": bytes}`` (the
growth of ``ru_maxrss``, which only rises, so it must start low for the growth to show).
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api.artifacts.local import LocalArtifactStore

LOG_LINES = 20_000
LOG_LINE_BYTES = 50
LOG_BATCH = 256 * 1024  # node_agent.logs.shipper.MAX_BATCH
READ_CHUNK = 1 << 20  # read_log's default limit


def timed(action: Callable[[], Any]) -> float:
    gc.collect()
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def log_chunks() -> list[bytes]:
    """LOG_LINES lines of LOG_LINE_BYTES bytes, batched like the agent (<= 256 KiB, whole
    lines)."""
    chunks: list[bytes] = []
    batch: list[bytes] = []
    size = 0
    for index in range(LOG_LINES):
        text = f"step {index:6d} loss {1.0 / (index + 1):.6f} lr 1.0e-04 ep 3"
        line = text.ljust(LOG_LINE_BYTES - 1).encode() + b"\n"
        if size + len(line) > LOG_BATCH:
            chunks.append(b"".join(batch))
            batch, size = [], 0
        batch.append(line)
        size += len(line)
    if batch:
        chunks.append(b"".join(batch))
    return chunks


def store_round(store: LocalArtifactStore, job_id: str, chunks: list[bytes]) -> tuple[
    float, float]:
    """append_log chunk by chunk, then read_log the whole file in 1 MiB pieces."""

    def write() -> None:
        offset = 0
        for chunk in chunks:
            offset = store.append_log(job_id, offset, chunk)

    def read() -> None:
        offset = 0
        while True:
            data = store.read_log(job_id, offset, READ_CHUNK)
            if not data:
                break
            offset += len(data)

    return timed(write), timed(read)


def plain_round(path: Path, chunks: list[bytes]) -> tuple[float, float]:
    """The baseline: open('ab').write + fsync per chunk, then a plain chunked read."""

    def write() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        for chunk in chunks:
            with open(path, "ab") as handle:
                handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())

    def read() -> None:
        with open(path, "rb") as handle:
            while handle.read(READ_CHUNK):
                pass

    return timed(write), timed(read)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def main() -> None:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    chunks = log_chunks()
    store = LocalArtifactStore(directory)
    gc.collect()
    before = peak_rss_bytes()
    if mode == "store":
        store_round(store, str(uuid.uuid4()), chunks)
    else:
        plain_round(directory / "plain.txt", chunks)
    print(json.dumps({"rss_growth": peak_rss_bytes() - before}))


if __name__ == "__main__":
    main()
