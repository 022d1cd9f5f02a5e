"""Job logs in the artifact store: one test case run on every store (a file per log under the
data directory; the S3 store's newest bytes in the database, SQLite or PostgreSQL, and the rest
in the bucket in parts).

Every byte an agent ships is kept once, in order, whichever replica it reaches and however often
it is resent; a log reads the same from held bytes and parts; and while the bucket is away no
line is lost: the database holds the bytes up to a bound, then the agent keeps them.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.artifacts.s3 import S3ArtifactStore
from api.artifacts.s3_logs import Stream
from api.artifacts.store import ArtifactStore, LogOffsetMismatch, StorageUnavailable
from tests.integration.stores import (
    LOG_PART,
    MAX_HELD,
    StoreMaker,
    database_urls,
    local_stores,
    s3_stores,
)
from tests.s3 import SeaweedFS

JOB = "4b1f2d9e-6a2c-4c1e-9d0b-1f7e3a5c8b42"


def log_text(lines: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    return b"".join(f"step {n:6d} loss {rng.random():.6f} {'x' * rng.randrange(200)}\n".encode()
                    for n in range(lines))  # fmt: skip


def chunks_of(data: bytes, size: int) -> list[tuple[int, bytes]]:
    return [(start, data[start : start + size]) for start in range(0, len(data), size)]


def read_all(store: ArtifactStore, limit: int = 1 << 20, node_index: int = 0) -> bytes:
    """The whole log, read as a follower does: from its offset, ``limit`` bytes at a time."""
    out = bytearray()
    while piece := store.read_log(JOB, len(out), limit, node_index=node_index):
        out += piece
    return bytes(out)


class LogsContract:
    replicas = 1
    """Store instances that may take appends of one log at once."""

    @pytest.fixture
    def stores(self) -> StoreMaker:
        raise NotImplementedError

    @pytest.fixture
    def store(self, stores: StoreMaker) -> ArtifactStore:
        return stores()

    def test_log_bytes_are_appended_once_in_order(self, store: ArtifactStore) -> None:
        assert store.append_log(JOB, 0, b"epoch 1\n") == 8
        assert store.append_log(JOB, 8, b"epoch 2\n") == 16
        assert store.append_log(JOB, 0, b"epoch 1\n") == 16  # a resend: acknowledged only
        assert store.append_log(JOB, 4, b"h 1\nepoch 2\nepoch 3\n") == 24  # the new tail only
        assert store.read_log(JOB, 0) == b"epoch 1\nepoch 2\nepoch 3\n"
        assert store.read_log(JOB, 8, 8) == b"epoch 2\n"
        assert store.log_size(JOB) == 24

    def test_bytes_past_the_end_are_refused_with_the_offset_to_resend_from(
        self, store: ArtifactStore
    ) -> None:
        with pytest.raises(LogOffsetMismatch) as refused:
            store.append_log(JOB, 1, b"x")
        assert refused.value.expected == 0
        store.append_log(JOB, 0, b"epoch 1\n")
        with pytest.raises(LogOffsetMismatch, match="offset 8") as refused:
            store.append_log(JOB, 20, b"epoch 3\n")
        assert refused.value.expected == 8
        assert store.read_log(JOB, 0) == b"epoch 1\n"

    def test_each_node_of_a_job_has_its_own_log(self, store: ArtifactStore) -> None:
        assert store.read_log(JOB, 0) == b"" and store.log_size(JOB, node_index=1) == 0
        store.append_log(JOB, 0, b"node 0\n")
        store.append_log(JOB, 0, b"node one\n", node_index=1)
        assert store.read_log(JOB, 0) == b"node 0\n"
        assert store.read_log(JOB, 0, node_index=1) == b"node one\n"
        assert store.read_log(JOB, 100) == b""

    def test_a_long_log_reads_the_same_from_any_offset(self, store: ArtifactStore) -> None:
        text = log_text(3000)  # several S3 parts, and held bytes after them
        for offset, chunk in chunks_of(text, 7000):
            store.append_log(JOB, offset, chunk)
        assert read_all(store) == text
        assert read_all(store, limit=50_000) == text
        rng = random.Random(1)
        for _ in range(20):
            offset, limit = rng.randrange(len(text) + 10), rng.randrange(1, 3 * LOG_PART)
            assert store.read_log(JOB, offset, limit) == text[offset : offset + limit]
        store.settle_logs([JOB])
        assert read_all(store, limit=30_000) == text
        assert store.append_log(JOB, len(text), b"after the end\n") == len(text) + 14

    def test_appends_racing_through_the_replicas_keep_each_byte_once(
        self, stores: StoreMaker
    ) -> None:
        """Agents resend from their last acknowledged offset, through any replica (one
        server's disk is one replica's; an S3 store's replicas share the database and the
        bucket, and their flushes race too)."""
        text = log_text(2500, seed=2)
        replicas = [stores() for _ in range(self.replicas)]
        errors: list[BaseException] = []

        def ship(store: ArtifactStore, seed: int) -> None:
            rng = random.Random(seed)
            acknowledged = 0
            try:
                while acknowledged < len(text):
                    offset = max(0, acknowledged - rng.randrange(3000))  # some resent bytes
                    chunk = text[offset : offset + rng.randrange(1000, 9000)]
                    try:
                        acknowledged = store.append_log(JOB, offset, chunk)
                    except LogOffsetMismatch as mismatch:
                        acknowledged = mismatch.expected
                    except StorageUnavailable:  # held bytes the bucket has yet to take
                        time.sleep(0.05)
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=ship, args=(replicas[n % len(replicas)], n))
                   for n in range(4)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors
        for store in replicas:
            assert read_all(store) == text
            assert store.log_size(JOB) == len(text)


class TestLocalLogs(LogsContract):
    @pytest.fixture
    def stores(self, tmp_path: Path) -> Iterator[StoreMaker]:
        with local_stores(tmp_path) as make:
            yield make


class TestS3Logs(LogsContract):
    replicas = 2

    @pytest.fixture(params=["sqlite", "postgres"])
    def stores(self, request: pytest.FixtureRequest, s3_server: SeaweedFS, s3_bucket: str,
               tmp_path: Path) -> Iterator[StoreMaker]:  # fmt: skip
        with (database_urls(request.param, tmp_path) as url,
              s3_stores(s3_server, s3_bucket, url) as make):  # fmt: skip
            yield make

    @staticmethod
    def parts_in_bucket(s3_server: SeaweedFS, bucket: str) -> list[str]:
        listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix="fleet-a/jobs/")
        return [item["Key"] for item in listed.get("Contents", ())]

    def test_settled_logs_are_in_the_bucket(
        self, store: ArtifactStore, s3_server: SeaweedFS, s3_bucket: str
    ) -> None:
        store.append_log(JOB, 0, b"the last line\n")
        assert self.parts_in_bucket(s3_server, s3_bucket) == []  # held: less than a part
        store.settle_logs([JOB])
        assert self.parts_in_bucket(s3_server, s3_bucket) == [
            f"fleet-a/jobs/{JOB}/logs/0/{0:020d}-{14:020d}"
        ]
        assert store.read_log(JOB, 0) == b"the last line\n"

    def test_while_the_bucket_is_away_the_database_holds_the_log_then_refuses(
        self, store: ArtifactStore, s3_server: SeaweedFS
    ) -> None:
        text = log_text(4000, seed=3)
        pieces = chunks_of(text, 20_000)
        before = 2 * LOG_PART
        acknowledged = 0
        for offset, chunk in pieces:
            if offset >= before:
                break
            acknowledged = store.append_log(JOB, offset, chunk)
        with s3_server.stopped():
            refused = None
            for offset, chunk in pieces:
                if offset < acknowledged:
                    continue
                started = time.monotonic()
                try:
                    acknowledged = store.append_log(JOB, offset, chunk)
                except StorageUnavailable as error:
                    refused = error
                    break
                finally:
                    assert time.monotonic() - started < 2.0
            assert refused is not None and "has not taken" in str(refused)
            assert acknowledged - before <= MAX_HELD + 20_000
            latest = store.read_log(JOB, acknowledged - 100, 100)  # held: readable still
            assert latest == text[acknowledged - 100 : acknowledged]
            with pytest.raises(StorageUnavailable):
                store.read_log(JOB, 0, 100)  # in a part, in the bucket that is away
        for offset, chunk in pieces:  # the agent resends from what was acknowledged
            if offset + len(chunk) > acknowledged:
                acknowledged = store.append_log(JOB, offset, chunk)
        assert read_all(store) == text
        store.settle_logs([JOB])
        assert read_all(store, limit=77_777) == text

    def test_held_bytes_that_waited_long_enough_go_to_the_bucket(
        self, stores: StoreMaker, s3_server: SeaweedFS, s3_bucket: str
    ) -> None:
        store = stores(max_wait_s=0.2)
        assert isinstance(store, S3ArtifactStore)
        store.append_log(JOB, 0, b"a quiet job's only line\n")
        assert store.logs.flush_waiting() == 0  # not yet
        time.sleep(0.3)
        assert store.logs.flush_waiting() == 1
        assert len(self.parts_in_bucket(s3_server, s3_bucket)) == 1
        assert store.append_log(JOB, 24, b"and another\n") == 36  # the next append flushes
        assert len(self.parts_in_bucket(s3_server, s3_bucket)) == 1
        time.sleep(0.3)
        store.append_log(JOB, 36, b"and a third\n")
        assert len(self.parts_in_bucket(s3_server, s3_bucket)) == 2
        assert read_all(store) == b"a quiet job's only line\nand another\nand a third\n"

    def test_a_flush_that_died_after_writing_its_part_serves_each_byte_once(
        self, store: ArtifactStore, stores: StoreMaker
    ) -> None:
        assert isinstance(store, S3ArtifactStore)
        store.append_log(JOB, 0, b"first line\n")
        stream = Stream(JOB, 0)
        # A replica wrote the held bytes' part to the bucket, then died before recording it.
        start, end, data = store.logs._next_part(stream)
        store.logs.bucket.put(stream.part_key(start, end), data)
        other = stores()
        assert other.append_log(JOB, 11, b"second line\n") == 23
        other.settle_logs([JOB])
        assert read_all(store) == b"first line\nsecond line\n"
        assert read_all(other, limit=5) == b"first line\nsecond line\n"
