"""Displays the logs from a Training Job.

The build and run output, as the node shipped it. With --follow, keeps streaming until the job
reaches a terminal status and every line was shown, then exits; press Ctrl-C to stop following
sooner. A job on several nodes shows every node's lines, each prefixed with its node index
(`[1] step 10 ...`), as they come; --node-index shows one node's, as they are.

A job that was preempted or retried ran several attempts, each with its own log: --attempt K
shows attempt K's (default: the last, the job's current one). A follow of an attempt ends when
the job moves on to its next attempt, saying how to follow that one.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO, Protocol

from cli.commands import add_attempt_flag, add_name, add_owner_flag


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
    add_attempt_flag(parser, "the log", "the last attempt, the job's current one")


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient

    out = Counted(sys.stdout.buffer)
    told = NextAttempt()
    with ApiClient.from_config(owner=args.owner) as client:
        if args.node_index is not None:
            _copy(client.iter_logs(args.name, follow=args.follow, node_index=args.node_index,
                                   attempt=args.attempt, moved_on=told), out)  # fmt: skip
        else:
            _every_node(client, args, out, told)
        if not out.written:
            _say_why_empty(client, args.name)
    return 0


def _every_node(client: Any, args: argparse.Namespace, out: Output, told: NextAttempt) -> None:
    job = client.get_job(args.name)
    nodes = max(len(job.get("placements") or []), int(job.get("nodes") or 1))
    # Every node's stream reads the same attempt, even if the job moves on meanwhile.
    attempt = args.attempt if args.attempt is not None else job.get("attempt")
    if nodes == 1:
        _copy(client.iter_logs(args.name, follow=args.follow, attempt=args.attempt,
                               moved_on=told), out)  # fmt: skip
    elif not args.follow:
        for index in range(nodes):
            prefix = Prefixer(index)
            for chunk in client.iter_logs(args.name, node_index=index, attempt=attempt):
                out.write(prefix.lines(chunk))
            out.write(prefix.rest())
        out.flush()
    else:
        _follow_all(client, args.name, nodes, out, attempt, told)


def _say_why_empty(client: Any, name: str) -> None:
    """An empty log, explained on stderr (stdout stays the log's bytes: none)."""
    from common.contract import TERMINAL

    status = str(client.get_job(name).get("status"))
    if status in TERMINAL:
        print(f"training job {name} ({status}) left no log lines: it ended before its node "
              f"wrote any; `flexai training inspect {name}` says why", file=sys.stderr)
    else:
        print(f"training job {name} ({status}) has no log lines yet; follow them with "
              f"`flexai training logs {name} --follow`", file=sys.stderr)


class Output(Protocol):
    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


class Counted:
    """A binary output that counts the bytes written to it."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.written = out, 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


class NextAttempt:
    """Says once, after a follow, that the job moved on past the followed attempt, why, and
    how to follow the next one."""

    def __init__(self) -> None:
        self._told = False
        self._lock = threading.Lock()

    def __call__(self, attempt: int, job: dict[str, Any]) -> None:
        with self._lock:
            if self._told:
                return
            self._told = True
        cause = next((str(entry["cause"]) for entry in job.get("attempts") or []
                      if entry.get("attempt") == attempt and entry.get("cause")),
                     "it ended")  # fmt: skip
        name = job.get("name") or "NAME"
        print(f"attempt {attempt} ended ({cause}); follow attempt {attempt + 1} with --attempt "
              f"{attempt + 1}: flexai training logs {name} --follow --attempt {attempt + 1}",
              file=sys.stderr, flush=True)  # fmt: skip


def _copy(chunks: Iterator[bytes], out: Output) -> None:
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


def _follow_all(client: Any, name: str, nodes: int, out: Output, attempt: int | None,
                told: NextAttempt) -> None:  # fmt: skip
    """Every node's stream in a thread of its own; lines are written whole, as they come."""
    chunks: queue.Queue[tuple[int, bytes | BaseException | None]] = queue.Queue()

    def follow(index: int) -> None:
        try:
            for chunk in client.iter_logs(name, follow=True, node_index=index, attempt=attempt,
                                          moved_on=told):  # fmt: skip
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
