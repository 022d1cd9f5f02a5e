"""Displays the logs from a Training Job.

The build and run output, as the node shipped it. With --follow, keeps streaming until the job
reaches a terminal status and every line was shown, then exits; press Ctrl-C to stop following
sooner. A job on several nodes shows every node's lines, each prefixed with its node index
(`[1] step 10 ...`), as they come; --node-index shows one node's, as they are.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

from cli.commands import add_name, add_owner_flag


def configure(parser: argparse.ArgumentParser) -> None:
    add_owner_flag(parser)
    add_name(parser)
    parser.add_argument(
        "--follow", "-f", action="store_true", help="stream new lines until the job ends"
    )
    parser.add_argument(
        "--node-index", type=int, metavar="INDEX",
        help="one node's output only, for multi-node jobs (default: every node's, prefixed)",
    )  # fmt: skip


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient

    out = sys.stdout.buffer
    with ApiClient.from_config(owner=args.owner) as client:
        if args.node_index is not None:
            _copy(client.iter_logs(args.name, follow=args.follow, node_index=args.node_index), out)
            return 0
        job = client.get_job(args.name)
        nodes = max(len(job.get("placements") or []), int(job.get("nodes") or 1))
        if nodes == 1:
            _copy(client.iter_logs(args.name, follow=args.follow), out)
        elif not args.follow:
            for index in range(nodes):
                prefix = Prefixer(index)
                for chunk in client.iter_logs(args.name, node_index=index):
                    out.write(prefix.lines(chunk))
                out.write(prefix.rest())
            out.flush()
        else:
            _follow_all(client, args.name, nodes, out)
    return 0


def _copy(chunks: Iterator[bytes], out: BinaryIO) -> None:
    for chunk in chunks:
        out.write(chunk)
        out.flush()


class Prefixer:
    """Whole lines of one node's output, each prefixed with ``[index] ``."""

    def __init__(self, index: int) -> None:
        self.tag = f"[{index}] ".encode()
        self.pending = b""

    def lines(self, chunk: bytes) -> bytes:
        data = self.pending + chunk
        cut = data.rfind(b"\n") + 1
        self.pending = data[cut:]
        return b"".join(self.tag + line for line in data[:cut].splitlines(keepends=True))

    def rest(self) -> bytes:
        rest, self.pending = self.pending, b""
        return self.tag + rest + b"\n" if rest else b""


def _follow_all(client: Any, name: str, nodes: int, out: BinaryIO) -> None:
    """Every node's stream in a thread of its own; lines are written whole, as they come."""
    chunks: queue.Queue[tuple[int, bytes | BaseException | None]] = queue.Queue()

    def follow(index: int) -> None:
        try:
            for chunk in client.iter_logs(name, follow=True, node_index=index):
                chunks.put((index, chunk))
        except BaseException as error:  # surfaced in the main thread
            chunks.put((index, error))
        else:
            chunks.put((index, None))

    prefixes = [Prefixer(index) for index in range(nodes)]
    for index in range(nodes):
        threading.Thread(target=follow, args=(index,), daemon=True).start()
    running = nodes
    while running:
        index, item = chunks.get()
        if isinstance(item, BaseException):
            raise item
        if item is None:
            running -= 1
            out.write(prefixes[index].rest())
        else:
            out.write(prefixes[index].lines(item))
        out.flush()
