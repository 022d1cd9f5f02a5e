"""Checkpoints: each child of output-checkpoint/ uploaded once, as a zip, when it is complete."""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from node_agent.artifacts.checkpoints import CheckpointWatcher
from node_agent.artifacts.uploader import Artifact
from node_agent.artifacts.zipping import write_zip
from node_agent.client import ApiUnavailable


class RecordingClient:
    """An uploader that keeps what it was given, zipped as the real one zips it."""

    def __init__(self) -> None:
        self.uploads: list[tuple[str, dict[str, bytes]]] = []
        self.away = False  # the agent shuts down: every upload gives up

    def upload(self, artifact: Artifact) -> dict[str, Any]:
        assert (artifact.job_id, artifact.node_id, artifact.kind) == ("job-1", "node-1",
                                                                      "checkpoint")
        if self.away:
            raise ApiUnavailable("the agent is shutting down")
        sink = io.BytesIO()
        write_zip(artifact.source, sink, trusted=artifact.trusted)
        with zipfile.ZipFile(sink) as bundle:
            files = {info.filename: bundle.read(info) for info in bundle.infolist()}
        self.uploads.append((str(artifact.name), files))
        return {"name": artifact.name}

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.uploads]


@pytest.fixture
def client() -> RecordingClient:
    return RecordingClient()


def watcher(tmp_path: Path, client: RecordingClient, stable_for: float = 0.2) -> CheckpointWatcher:
    (tmp_path / "output-checkpoint").mkdir(exist_ok=True)
    return CheckpointWatcher(
        client,  # type: ignore[arg-type]
        "job-1",
        "node-1",
        tmp_path / "output-checkpoint",
        stable_for=stable_for,
        interval=0.05,
    )


def wait_for(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


def test_a_stable_checkpoint_directory_is_uploaded_once_with_its_contents(
    tmp_path: Path, client: RecordingClient
) -> None:
    watch = watcher(tmp_path, client)
    watch.start()
    step = tmp_path / "output-checkpoint" / "checkpoint-100"
    (step / "nested").mkdir(parents=True)
    (step / "model.safetensors").write_bytes(b"weights")
    (step / "nested" / "trainer_state.json").write_text("{}")
    wait_for(lambda: client.uploads)
    time.sleep(0.4)  # several more scans: no second upload
    watch.finish()
    assert client.uploads == [
        (
            "checkpoint-100",
            {"model.safetensors": b"weights", "nested/trainer_state.json": b"{}"},
        )
    ]


def test_a_checkpoint_still_being_written_is_not_uploaded_yet(
    tmp_path: Path, client: RecordingClient
) -> None:
    watch = watcher(tmp_path, client, stable_for=1.0)
    watch.start()
    growing = tmp_path / "output-checkpoint" / "checkpoint-1"
    growing.mkdir()
    for i in range(10):
        (growing / f"shard-{i}").write_bytes(b"x")
        time.sleep(0.05)
        assert client.uploads == []
    watch.finish()
    assert client.names == ["checkpoint-1"]
    assert len(client.uploads[0][1]) == 10


def test_a_single_file_checkpoint_is_zipped_under_its_name(
    tmp_path: Path, client: RecordingClient
) -> None:
    watch = watcher(tmp_path, client)
    (tmp_path / "output-checkpoint" / "final.pt").write_bytes(b"tensor")
    watch.finish()
    assert client.uploads == [("final.pt", {"final.pt": b"tensor"})]


def test_the_final_scan_uploads_what_is_left_oldest_first_but_no_temporary_names(
    tmp_path: Path, client: RecordingClient
) -> None:
    watch = watcher(tmp_path, client)
    root = tmp_path / "output-checkpoint"
    for name in ("checkpoint-1", "checkpoint-2", "tmp-checkpoint-3", ".partial"):
        (root / name).mkdir()
        (root / name / "w").write_bytes(b"w")
        time.sleep(0.02)
    watch.finish()
    assert client.names == ["checkpoint-1", "checkpoint-2"]


def test_a_checkpoint_not_uploaded_because_the_agent_shut_down_is_not_given_up(
    tmp_path: Path, client: RecordingClient
) -> None:
    watch = watcher(tmp_path, client)
    (tmp_path / "output-checkpoint" / "checkpoint-1").mkdir()
    (tmp_path / "output-checkpoint" / "checkpoint-1" / "w").write_bytes(b"w")
    client.away = True
    watch.finish()
    client.away = False
    watch.scan(final=True)  # as the restarted agent's watcher does
    assert client.names == ["checkpoint-1"]
